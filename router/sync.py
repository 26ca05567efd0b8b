"""FeedRouter: the synchronous front door, on ``MongoClient`` and threads.

Use it when one MongoDB cluster per period of ``event_time`` holds all feeds (fan-out
on write, one copy per receiver, plus each author's outbox). Do not use it for data
whose reads are not "newest first for one receiver": every other query would touch
every cluster. For asyncio services, :class:`~router.AsyncFeedRouter` has the same
operations as coroutines.

Every decision is made by the core (:mod:`router.core`); this class holds the clients,
the time map and its refresh thread, and runs the core's programs.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any, Literal, TypeVar, overload

from bson import ObjectId

from .config import RouterConfig, load_config
from .core import calls
from .core.checkpoint import JobStatus
from .core.fanout import FanOutJob
from .core.routing import Routing
from .core.seen import Unseen
from .core.settings import Settings
from .core.social import BackfillResult, PublishResult
from .core.steps import Program
from .core.tally import FanOutResult
from .core.writes import Prepared, prepare_or_stale
from .cursor import Position
from .errors import RouterClosed, RouterError, WriteFailed
from .fanout.threads import FanOutExecutor, FanOutHandle, FanOutRun
from .model import Activity, FeedItem, Page, utcnow
from .operations import documented
from .observe import Event, Metrics, Observer
from .storage.clusters import Clusters
from .timemap import TimeMap

__all__ = ["FeedRouter"]

log = logging.getLogger(__name__)
T = TypeVar("T")


class _Calls:
    """Calls in flight, and the switch that refuses new ones once ``close()`` begins."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._active = 0
        self.closed = False

    @contextmanager
    def call(self, name: str) -> Iterator[None]:
        with self._cond:
            if self.closed:
                raise RouterClosed(f"{name}(): this FeedRouter is closed")
            self._active += 1
        try:
            yield
        finally:
            with self._cond:
                self._active -= 1
                self._cond.notify_all()

    def close(self, wait: float) -> bool:
        """Refuse new calls; wait up to *wait* seconds for the ones in flight; True if none is left."""
        with self._cond:
            self.closed = True
            return self._cond.wait_for(lambda: self._active == 0, timeout=wait)


class FeedRouter:
    """Routes feed writes, reads and deletes to the cluster that owns each ``event_time``.

    Example::

        with FeedRouter.from_yaml("clusters.yaml") as feeds:
            feeds.write_many(items)                   # grouped per cluster, clusters in parallel
            page = feeds.read(receiver_id, limit=50)  # newest first, fewest clusters touched

    Construction connects to every cluster and loads the time map; a bad configuration
    or metadata fails here, not at the first write. A daemon thread then reloads the map
    every ``refresh_interval`` (``refresh=False`` turns it off) until :meth:`close`.
    *clock* (for tests) tells the router what "now" is. *event_listeners* go to every
    client (pymongo command monitoring, ``opentelemetry-instrumentation-pymongo``);
    *metrics* receives the router's events (:mod:`router.observe`), and *tracer_provider*
    (OpenTelemetry) gets a span per call and per request. Every call waits at most
    ``timeout`` (clusters.yaml) for any cluster; see "Guarantees under faults" in the docs.
    """

    def __init__(
        self, config: RouterConfig, *, clock: Callable[[], datetime] = utcnow, refresh: bool = True,
        fanout_workers: int = 2, event_listeners: Sequence[Any] = (), metrics: Metrics | None = None,
        tracer_provider: Any = None,
    ) -> None:
        self.config = config
        self._observe = Observer(metrics, tracer_provider)
        self.settings = Settings.from_config(config)
        self._clock = clock
        self._calls = _Calls()
        self._refresh_lock = threading.Lock()
        extra = {"event_listeners": list(event_listeners)} if event_listeners else None
        self._clusters = Clusters(config, refresh=self._refresh_for_core, extra_options=extra,
                                  metrics=self._observe.metrics, tracing=self._observe.tracing)
        started = clock()
        try:
            timemap = self._clusters.load_timemap()
        except BaseException:
            self._clusters.close()
            raise
        self._routing = Routing(timemap, started, config.rollover.lead_time if config.rollover else None)
        self._clusters.record(Event("timemap_loaded", started.timestamp()))
        if log.isEnabledFor(logging.INFO):  # the table of a thousand periods takes a while to format
            log.info("time map loaded from %d clusters:\n%s", len(self._clusters), timemap.describe())
        self._fanouts = FanOutExecutor(workers=fanout_workers)
        self._stop = threading.Event()
        self._refresher: threading.Thread | None = None
        if refresh:
            self._refresher = threading.Thread(target=self._refresh_loop, name="feed-router-refresh", daemon=True)
            self._refresher.start()

    @classmethod
    def from_yaml(
        cls, path: str | Path = "clusters.yaml", *, clock: Callable[[], datetime] = utcnow, refresh: bool = True,
        fanout_workers: int = 2, event_listeners: Sequence[Any] = (), metrics: Metrics | None = None,
        tracer_provider: Any = None,
    ) -> FeedRouter:
        """Load ``clusters.yaml``, connect to every cluster and build the time map."""
        return cls(load_config(path), clock=clock, refresh=refresh, fanout_workers=fanout_workers,
                   event_listeners=event_listeners, metrics=metrics, tracer_provider=tracer_provider)

    # -- state -------------------------------------------------------------------------

    @property
    def timemap(self) -> TimeMap:
        """The time map in use (replaced as a whole by :meth:`refresh`)."""
        return self._routing.timemap

    @property
    def routing(self) -> Routing:
        """The time map in use with the moment its load began and its horizon."""
        return self._routing

    @property
    def refreshed_at(self) -> datetime:
        """When the load of the map in use began (by the router's clock)."""
        return self._routing.loaded_at

    @property
    def clusters(self) -> Clusters:
        """The configured clusters and their clients."""
        return self._clusters

    @property
    def fanouts(self) -> FanOutExecutor:
        """Background fan-outs: at most ``fanout_workers`` jobs at once; closed by :meth:`close`."""
        return self._fanouts

    def _view(self) -> calls.View:
        return calls.View(self.config, self.settings, self._routing, tuple(self._clusters.names), self._clock())

    def _run(self, name: str, program: Program[T]) -> T:
        with self._calls.call(name), self._observe.call(name):
            return self._clusters.run(program)

    # -- refresh -----------------------------------------------------------------------

    @documented("refresh")
    def refresh(self) -> TimeMap:
        with self._calls.call("refresh"), self._observe.call("refresh"):
            return self._refresh().timemap

    def _refresh(self) -> Routing:
        with self._refresh_lock:
            started = self._clock()
            timemap = self._clusters.load_timemap(previous=self._routing.timemap)
            newer = self._routing.replaced_by(timemap, started)
            if newer is not None:
                self._routing = newer
                self._clusters.record(Event("timemap_loaded", started.timestamp()))
            return self._routing

    def _refresh_for_core(self) -> Routing | RouterError:
        try:
            return self._refresh()
        except RouterError as exc:
            return exc

    def _refresh_loop(self) -> None:
        interval = self.config.refresh_interval.total_seconds()
        while not self._stop.wait(interval):
            try:
                self.refresh()
            except RouterClosed:
                return
            except RouterError as exc:
                log.warning("metadata refresh failed; keeping the map loaded at %s: %s", self.refreshed_at.isoformat(), exc)

    def stop_refresh(self) -> None:
        """Stop the background refresh (the map stays as it is)."""
        self._stop.set()
        if self._refresher is not None and self._refresher is not threading.current_thread():
            self._refresher.join()
        self._refresher = None

    # -- writes ------------------------------------------------------------------------

    @documented("write")
    def write(self, item: FeedItem) -> ObjectId:
        try:
            return self._run("write", calls.write_many(self._view(), (item,), indexed=False))[0]
        except WriteFailed as exc:
            raise exc.failed[0] from exc

    @documented("write_many")
    def write_many(self, items: Iterable[FeedItem]) -> list[ObjectId]:
        return self._run("write_many", calls.write_many(self._view(), items))

    @documented("prepare")
    def prepare(self, items: Sequence[FeedItem]) -> Prepared:
        return prepare_or_stale(items, self._routing)

    # -- reads -------------------------------------------------------------------------

    @documented("read")
    def read(
        self, receiver_id: int | str, *, limit: int = 50, cursor: str | None = None, on_unavailable: str | None = None,
        pull: Sequence[int | str] | None = None, types: Sequence[int | str] | None = None,
    ) -> Page:
        return self._run("read", calls.read(
            self._view(), receiver_id, limit=limit, cursor=cursor, on_unavailable=on_unavailable, pull=pull, types=types
        ))

    # -- notifications -----------------------------------------------------------------

    @documented("mark_seen")
    def mark_seen(self, receiver_id: int | str, position: Position | FeedItem) -> Position:
        return self._run("mark_seen", calls.mark_seen(self._view(), receiver_id, position))

    @documented("seen_position")
    def seen_position(self, receiver_id: int | str) -> Position | None:
        return self._run("seen_position", calls.seen_position(self._view(), receiver_id))

    @documented("unseen_count")
    def unseen_count(self, receiver_id: int | str, *, cap: int = 99, pull: Sequence[int | str] | None = None) -> Unseen:
        return self._run("unseen_count", calls.unseen_count(self._view(), receiver_id, cap=cap, pull=pull))

    # -- edits -------------------------------------------------------------------------

    @documented("delete")
    def delete(self, data_key: str) -> int:
        return self._run("delete", calls.delete(self._view(), data_key))

    @documented("update")
    def update(self, data_key: str, data: Mapping[str, Any]) -> int:
        return self._run("update", calls.update(self._view(), data_key, data))

    @documented("unfollow")
    def unfollow(self, receiver_id: int | str, sender_id: int | str) -> int:
        return self._run("unfollow", calls.unfollow(self._view(), receiver_id, sender_id))

    # -- the social half -----------------------------------------------------------------

    @documented("backfill")
    def backfill(
        self, receiver_id: int | str, senders: Sequence[int | str], *, since: datetime | None = None, limit: int = 200,
    ) -> BackfillResult:
        return self._run("backfill", calls.backfill(self._view(), receiver_id, senders, since=since, limit=limit))

    @documented("follow")
    def follow(self, receiver_id: int | str, sender_id: int | str, *, limit: int = 50) -> BackfillResult:
        return self._run("backfill", calls.follow(self._view(), receiver_id, sender_id, limit=limit))

    @overload
    def publish(
        self, activity: Activity, followers: Iterable[int | str], *, active: calls.Active | None = ...,
        pull: bool | None = ..., background: Literal[False] = ..., batch_size: int | None = ...,
        concurrency: int | None = ..., job_id: str | None = ...,
    ) -> PublishResult: ...

    @overload
    def publish(
        self, activity: Activity, followers: Iterable[int | str], *, active: calls.Active | None = ...,
        pull: bool | None = ..., background: Literal[True], batch_size: int | None = ...,
        concurrency: int | None = ..., job_id: str | None = ...,
    ) -> PublishResult: ...

    @documented("publish")
    def publish(
        self, activity: Activity, followers: Iterable[int | str], *, active: calls.Active | None = None,
        pull: bool | None = None, background: bool = False, batch_size: int | None = None,
        concurrency: int | None = None, job_id: str | None = None,
    ) -> PublishResult:
        with self._observe.call("publish"):
            return self._publish(activity, followers, active=active, pull=pull, background=background,
                                 batch_size=batch_size, concurrency=concurrency, job_id=job_id)

    def _publish(
        self, activity: Activity, followers: Iterable[int | str], *, active: calls.Active | None, pull: bool | None,
        background: bool, batch_size: int | None, concurrency: int | None, job_id: str | None,
    ) -> PublishResult:
        slots = calls.concurrency(concurrency)
        publishing = self._run("publish", calls.publish(self._view(), activity, followers, pull=pull,
                                                        batch_size=batch_size, job_id=job_id))
        if publishing.path == "pull":
            return publishing.result()
        return publishing.result(self._fan_out_job(publishing.job, publishing.receivers, active=active,
                                                   concurrency=slots, background=background))

    # -- fan-out -------------------------------------------------------------------------

    @overload
    def fan_out(
        self, activity: Activity, receivers: Iterable[int | str], *, background: Literal[False] = ...,
        active: calls.Active | None = ..., batch_size: int | None = ..., concurrency: int | None = ...,
        job_id: str | None = ...,
    ) -> FanOutResult: ...

    @overload
    def fan_out(
        self, activity: Activity, receivers: Iterable[int | str], *, background: Literal[True],
        active: calls.Active | None = ..., batch_size: int | None = ..., concurrency: int | None = ...,
        job_id: str | None = ...,
    ) -> FanOutHandle: ...

    @documented("fan_out")
    def fan_out(
        self, activity: Activity, receivers: Iterable[int | str], *, background: bool = False,
        active: calls.Active | None = None, batch_size: int | None = None, concurrency: int | None = None,
        job_id: str | None = None,
    ) -> FanOutResult | FanOutHandle:
        with self._observe.call("fan_out"):
            slots = calls.concurrency(concurrency)
            job = self.plan_fan_out(activity, batch_size=batch_size, job_id=job_id)
            return self._fan_out_job(job, receivers, active=active, concurrency=slots, background=background)

    @documented("plan_fan_out")
    def plan_fan_out(self, activity: Activity, *, batch_size: int | None = None, job_id: str | None = None) -> FanOutJob:
        return self._run("plan_fan_out", calls.plan_fan_out(self._view(), activity, batch_size=batch_size, job_id=job_id))

    def _fan_out_job(
        self, job: FanOutJob, receivers: Iterable[Any], *, active: calls.Active | None, concurrency: int, background: bool,
    ) -> FanOutResult | FanOutHandle:
        run = FanOutRun(self._clusters, job, active=calls.active_filter(active), concurrency=concurrency,
                        policy=self.settings.write.policy, timeout=self.settings.timeout)
        if background:
            return self._fanouts.submit(run, receivers)
        with self._calls.call("fan_out"):
            return run.run(receivers)

    @documented("fan_out_status")
    def fan_out_status(self, job_id: str) -> JobStatus:
        return self._run("fan_out_status", calls.fan_out_status(self._view(), job_id))

    # -- lifecycle ---------------------------------------------------------------------

    def close(self) -> None:
        """Refuse new calls, let the ones in flight finish (each is bounded by ``timeout``), cancel background
        fan-outs between batches (resumable), stop the refresh thread, close every client."""
        self._stop.set()
        self._fanouts.close(drain=False)
        if not self._calls.close(self.settings.timeout + 5):
            log.warning("close(): calls still running after %.0f s; closing the clients under them", self.settings.timeout + 5)
        self.stop_refresh()
        self._clusters.close()

    def __enter__(self) -> FeedRouter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
