"""Planned rollover: before each period boundary, a fresh standby cluster takes over.

Lifecycle of one rollover at boundary B (here ``period: monthly``, ``lead_time: 7d``)::

      every tick: is a standby ready for B?  (error logged at once if not)
      |                 window opens      deadline           boundary B
    --+-----------------+-----------------+------------------+------------------>
                        B - 2*lead        B - lead           1 Dec 00:00Z
                        |<- rollover happens in here ->|
    before:  cluster_3 [1 Nov, open)
    after:   cluster_3 [1 Nov, 1 Dec)   cluster_4 [1 Dec, open)   (written at once)

* Every tick checks that a standby is ready for the next boundary B (reachable,
  every migration applied, no metadata, nothing stored). If none is, it logs an error
  at once, weeks before B, not at B.
* From ``B - 2·lead_time`` on, a tick takes a lease on the rollover of B (a
  document in the current cluster's ``leases`` collection) and then does the
  rollover. Closing the open period at B and giving the standby ``[B, open)``
  go through the same checked, idempotent path as ``add-cluster``. Two schedulers,
  or a rerun, therefore produce exactly one new period.
* The rollover is always done at least ``lead_time`` before B. Every router
  refreshes within ``refresh_interval`` (much shorter than ``lead_time``) and
  refuses to guess past ``refreshed_at + lead_time`` (:class:`StaleMetadata`),
  so no router writes an item at or after B to the old cluster.

Example::

    scheduler = RolloverScheduler(config)
    scheduler.tick()          # one check / rollover now; what the APScheduler job runs
    scheduler.run()           # blocking: APScheduler with an interval trigger
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta, timezone
from typing import Any

import attrs
from pymongo import ReturnDocument
from pymongo.errors import DuplicateKeyError, PyMongoError

from ..boundaries import next_boundary
from ..config import RolloverConfig, RouterConfig
from ..errors import ClusterError, PeriodChangeRefused, RolloverError
from ..observe import NO_METRICS, Event, Metrics
from ..storage.clusters import Clusters
from .migrate import Migration, applied_migrations, discover
from .periods import PeriodChange, apply_period, layout_problem, plan_period, stored_outside

__all__ = [
    "RolloverPlan",
    "RolloverScheduler",
    "plan_rollover",
    "do_rollover",
    "ready_standby",
    "upcoming_boundary",
    "LEASES_COLLECTION",
]

log = logging.getLogger(__name__)
UTC = timezone.utc
#: Where rollover leases live (in the cluster whose open period is being closed).
LEASES_COLLECTION = "leases"


def _utcnow() -> datetime:
    return datetime.now(UTC)


def _settings(config: RouterConfig) -> RolloverConfig:
    if config.rollover is None:
        raise RolloverError(f"{config.source}: has no rollover section (period, lead_time, standby)")
    return config.rollover


@attrs.frozen
class RolloverPlan:
    """The next rollover: at ``boundary``, ``previous`` is closed and ``standby`` opens.

    ``due`` is the latest moment it may happen (``boundary - lead_time``);
    ``change`` is ``None`` when the rollover of ``boundary`` is already done.
    """

    boundary: datetime
    due: datetime
    previous: str
    standby: str | None
    change: PeriodChange | None


def upcoming_boundary(open_start: datetime, *, now: datetime, settings: RolloverConfig) -> datetime:
    """The next boundary to roll over at: the first after the open period began that is still a lead time away."""
    return next_boundary(max(open_start, now + settings.lead_time), period=settings.period, anchor=settings.anchor)


def ready_standby(clusters: Clusters, config: RouterConfig, migrations: Sequence[Migration]) -> tuple[str | None, list[str]]:
    """The first standby cluster ready to take a period, and why each earlier one is not."""
    settings = _settings(config)
    reasons: list[str] = []
    metas, _problems, _down = clusters.inspect_metadata(allow_missing=clusters.names)
    has_period = {m.name for m in metas}
    for name in settings.standby:
        if name in has_period:
            continue  # used by an earlier rollover
        try:
            done = applied_migrations(clusters[name], config)
            found = stored_outside(clusters, name, None, None)
            unfit = layout_problem(clusters, name, settings.layout)  # (buckets: asks the server what it is)
        except ClusterError as exc:
            reasons.append(f"standby {exc}")
            continue
        missing = [m.id for m in migrations if m.id not in done]
        if unfit is not None:
            reasons.append(f"standby {unfit} (rollover.layout)")
        elif missing:
            reasons.append(
                f"standby cluster {name!r} is not migrated ({', '.join(missing)} pending): "
                f"run feedrouter migrate --cluster {name}"
            )
        elif found.count:
            reasons.append(f"standby cluster {name!r} already holds {found.count} documents ({found.by_collection()})")
        else:
            return name, reasons
    if not settings.standby:
        reasons.append("rollover.standby lists no cluster")
    elif not reasons:
        reasons.append("every standby cluster already has a period: list a new one under rollover.standby")
    return None, reasons


def plan_rollover(
    clusters: Clusters,
    config: RouterConfig,
    *,
    now: datetime,
    at: datetime | None = None,
    migrations: Sequence[Migration] | None = None,
) -> RolloverPlan:
    """Work out the next rollover (or the one at *at*) and check it can be done now.

    When the latest period is closed and nothing follows it, a rollover was
    interrupted between closing it and opening the next: the plan finishes that
    one, at the closed period's end, whatever the time (routers already refuse
    writes in the gap). Raises :class:`RolloverError` when there is no period, when
    *at* is not after the open period's start or less than ``lead_time`` away, or
    when no standby is ready.
    """
    settings = _settings(config)
    migrations = discover() if migrations is None else migrations
    timemap = clusters.load_timemap()
    current = timemap.open_period
    finishing = current is None
    if current is None:
        if not timemap.periods:
            raise RolloverError("no period at all: give the first cluster its period with add-cluster")
        current = timemap.periods[-1]
        assert current.end_date is not None
        boundary = current.end_date
        if at is not None and at != boundary:
            raise RolloverError(
                f"the rollover at {boundary.isoformat()} was interrupted ({current.name!r} is closed, nothing "
                "follows it): finish it first (rollover without --at)"
            )
        log.warning("finishing the interrupted rollover at %s", boundary.isoformat())
    else:
        boundary = at if at is not None else upcoming_boundary(current.start_date, now=now, settings=settings)
        if boundary <= current.start_date:
            raise RolloverError(
                f"boundary {boundary.isoformat()} is not after the start of the open period of "
                f"{current.name!r} ({current.start_date.isoformat()})"
            )
    due = boundary - settings.lead_time
    if now > due and not finishing:
        raise RolloverError(
            f"too late to roll over at {boundary.isoformat()}: it must happen at least {settings.lead_time} "
            f"before (by {due.isoformat()}), so every router knows the boundary in advance"
        )
    standby, reasons = ready_standby(clusters, config, migrations)
    if standby is None:
        raise RolloverError(
            f"no standby cluster is ready for the rollover at {boundary.isoformat()} (due by {due.isoformat()}): "
            + "; ".join(reasons)
        )
    try:
        change = plan_period(
            clusters, name=standby, start=boundary, close_previous=not finishing, creator="rollover", now=now,
            layout=settings.layout,
        )
    except PeriodChangeRefused as exc:
        raise RolloverError(f"rollover at {boundary.isoformat()} refused: " + "; ".join(exc.problems)) from exc
    return RolloverPlan(boundary=boundary, due=due, previous=current.name, standby=standby, change=change)


def _take_lease(clusters: Clusters, cluster: str, key: str, owner: str, *, now: datetime, ttl: timedelta) -> bool:
    """Take (or renew) the lease *key*; False when another owner holds it unexpired."""
    coll = clusters[cluster].db[LEASES_COLLECTION]
    try:
        coll.find_one_and_update(
            {"_id": key, "$or": [{"owner": owner}, {"expires_at": {"$lte": now}}]},
            {"$set": {"owner": owner, "expires_at": now + ttl, "taken_at": now}},
            upsert=True,
            return_document=ReturnDocument.AFTER,
        )
    except DuplicateKeyError:
        return False
    except PyMongoError as exc:
        raise clusters[cluster].error(exc, doing="taking the rollover lease") from exc
    return True


def do_rollover(
    clusters: Clusters,
    config: RouterConfig,
    *,
    now: datetime,
    owner: str,
    at: datetime | None = None,
    dry_run: bool = False,
    migrations: Sequence[Migration] | None = None,
) -> list[str]:
    """Plan and carry out one rollover under a lease; return what was done, line by line.

    Exactly one of several concurrent callers acts; the others get
    :class:`RolloverError` (lease held), or find the work done.
    """
    migrations = discover() if migrations is None else migrations
    plan = plan_rollover(clusters, config, now=now, at=at, migrations=migrations)
    assert plan.change is not None
    lines = [f"next boundary {plan.boundary.isoformat()} (due by {plan.due.isoformat()})", *plan.change.describe()]
    if dry_run:
        return lines + apply_period(clusters, plan.change, migrations=migrations, dry_run=True)
    key = f"rollover:{plan.boundary.isoformat()}"
    if not _take_lease(clusters, plan.previous, key, owner, now=now, ttl=_settings(config).lead_time / 2):
        raise RolloverError(f"another scheduler holds the lease {key!r} in cluster {plan.previous!r}")
    lines += apply_period(clusters, plan.change, migrations=migrations)
    log.warning("rolled over at %s: %s closes, %s opens", plan.boundary.isoformat(), plan.previous, plan.standby)
    return lines


def default_owner() -> str:
    """``host:pid``, the lease owner name of this process."""
    return f"{socket.gethostname()}:{os.getpid()}"


class RolloverScheduler:
    """Runs the rollover check on an APScheduler interval trigger derived from the config.

    Example::

        RolloverScheduler(load_config("clusters.yaml")).run()   # blocks; Ctrl-C stops it

    *clock* (for tests) is what the scheduler believes "now" is. ``last_error`` holds
    the error of the latest tick, if any. *metrics* receives ``standby_ready`` and
    ``next_boundary`` at every tick (:mod:`router.observe`).
    """

    def __init__(
        self,
        config: RouterConfig,
        *,
        clock: Callable[[], datetime] = _utcnow,
        owner: str | None = None,
        interval: timedelta | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        settings = _settings(config)
        self.config = config
        self.clock = clock
        self.owner = owner or default_owner()
        #: How often to check: a sixth of the lead time, at most hourly, so the
        #: rollover window (one lead time) gets several chances.
        self.interval = interval or min(timedelta(hours=1), settings.lead_time / 6)
        self.metrics = metrics if metrics is not None else NO_METRICS
        self.clusters = Clusters(config, metrics=self.metrics)
        self.migrations = discover()
        self.last_error: BaseException | None = None
        self._scheduler: Any = None

    def tick(self) -> list[str]:
        """Check readiness and roll over when the window is open; never raises, logs instead."""
        now = self.clock()
        settings = _settings(self.config)
        try:
            timemap = self.clusters.load_timemap()
            current = timemap.open_period
            if current is None:  # an interrupted rollover: finish it now
                lines = do_rollover(self.clusters, self.config, now=now, owner=self.owner, migrations=self.migrations)
                self.last_error = None
                return lines
            boundary = upcoming_boundary(current.start_date, now=now, settings=settings)
            standby, reasons = ready_standby(self.clusters, self.config, self.migrations)
            self.metrics.record(Event("next_boundary", boundary.timestamp()))
            self.metrics.record(Event("standby_ready", 1.0 if standby is not None else 0.0))
            if standby is None:
                raise RolloverError(
                    f"no standby cluster is ready for the rollover at {boundary.isoformat()} "
                    f"(due by {(boundary - settings.lead_time).isoformat()}): " + "; ".join(reasons)
                )
            if now < boundary - 2 * settings.lead_time:
                self.last_error = None
                log.info("next rollover at %s with %s; window opens %s", boundary.isoformat(), standby,
                         (boundary - 2 * settings.lead_time).isoformat())
                return []
            lines = do_rollover(self.clusters, self.config, now=now, owner=self.owner, at=boundary, migrations=self.migrations)
            self.last_error = None
            return lines
        except Exception as exc:  # a scheduler job must not die; the error is logged and kept
            self.last_error = exc
            log.error("rollover check failed: %s", exc)
            return []

    def start(self, *, blocking: bool = False) -> None:
        """Start APScheduler with the interval trigger (first run immediately)."""
        from apscheduler.schedulers.background import BackgroundScheduler
        from apscheduler.schedulers.blocking import BlockingScheduler
        from apscheduler.triggers.interval import IntervalTrigger

        scheduler = BlockingScheduler(timezone=UTC) if blocking else BackgroundScheduler(timezone=UTC)
        scheduler.add_job(
            self.tick,
            IntervalTrigger(seconds=self.interval.total_seconds(), timezone=UTC),
            id="feed-router-rollover",
            next_run_time=datetime.now(UTC),
            max_instances=1,
            coalesce=True,
        )
        self._scheduler = scheduler
        scheduler.start()

    def run(self) -> None:
        """Run until interrupted (SIGINT/SIGTERM)."""
        try:
            self.start(blocking=True)
        except (KeyboardInterrupt, SystemExit):
            pass
        finally:
            self.close()

    def close(self) -> None:
        """Stop the scheduler and close the connections."""
        if self._scheduler is not None and self._scheduler.running:
            self._scheduler.shutdown(wait=True)
        self._scheduler = None
        self.clusters.close()
