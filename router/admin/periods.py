"""Changing the periods: give a cluster a period, and close the open-ended one where it starts.

The operator's ``feedrouter add-cluster`` and the rollover scheduler both go through
:func:`plan_period` and then :func:`apply_period`. Planning reads every cluster's
metadata and refuses, with every reason at once (:class:`PeriodChangeRefused`), any
change that would overlap another period or strand data:

* a boundary that would cut through stored documents: closing a period before its
  latest stored ``event_time``, or opening a period on a cluster that already holds
  documents outside it. Every record placed by its time counts (:data:`TIME_PLACED`: feed
  copies, pulled posts, seen markers, fan-out jobs), and no option waives it: the
  operator's ``--force`` waives only the notice running routers need (``min_notice``);
* a cluster that already owns a different period (periods are not moved here);
* a cluster that is not in ``clusters.yaml``;
* a layout the cluster's server cannot keep (``buckets`` appends to a document other
  writers also append to: a server that does not apply one document's filter and
  update atomically, FerretDB v1 among them, would lose copies).

Applying is idempotent and ordered so that a crash at any point leaves a valid map
and re-running finishes the job. Migrations run on the new cluster first, then the
indexes its layout lists (:meth:`~router.core.layouts.Layout.indexes`, for every layout:
:func:`~router.admin.indexes.create_feed_indexes`, the one place feed indexes are made):
a failure there changes no period. Then the previous period is closed, which at worst leaves a gap that refuses
writes, never an overlap. Last, the new cluster's metadata is written, with its ``layout``.

Example::

    change = plan_period(clusters, name="cluster_4", start=boundary, close_previous=True, creator="ops")
    for line in apply_period(clusters, change, migrations=discover()):
        print(line)
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta, timezone
from typing import Any

import attrs
import pymongo
from pymongo.errors import PyMongoError

from ..core.fanout import checkpoint
from ..core.notify import seen
from ..core.layouts import DEFAULT, LAYOUTS, outbox
from ..errors import PeriodChangeRefused
from ..model import ClusterMeta, to_utc
from ..storage.clusters import Clusters
from ..timemap import TimeMap, format_period
from .indexes import create_feed_indexes, index_commands
from .migrate import Migration, migrate_cluster

__all__ = ["TIME_PLACED", "Outside", "PeriodChange", "apply_period", "index_commands", "layout_problem", "plan_period",
           "retire", "stored_outside"]

log = logging.getLogger(__name__)
UTC = timezone.utc
#: Deadline for the stranded-data checks, which may scan a whole cluster.
STRAND_CHECK_SECONDS = 600


@attrs.frozen
class PeriodChange:
    """A checked plan: write ``new`` to its cluster, and close ``close`` (if any) at ``new.start_date``."""

    new: ClusterMeta
    close: ClusterMeta | None
    already_done: bool
    timemap: TimeMap

    def describe(self) -> list[str]:
        """The plan as lines of text."""
        if self.already_done:
            return [f"cluster {self.new.name!r} already owns {format_period(self.new.start_date, self.new.end_date)}: nothing to change"]
        lines = []
        if self.close is not None:
            lines.append(
                f"close cluster {self.close.name!r} at {self.new.start_date.isoformat()}: "
                f"{format_period(self.close.start_date, self.close.end_date)}"
            )
        lines.append(f"open cluster {self.new.name!r}: {format_period(self.new.start_date, self.new.end_date)}")
        return lines


#: The collections besides the feed whose documents live in the cluster that owns their ``event_time``: pulled
#: posts (``outbox``), seen markers (``seen``, :mod:`router.core.notify.seen`) and fan-out jobs (``fanouts``); the read
#: marks of groups in ``seen`` are placed by their ``read_time`` (:func:`~router.core.notify.seen.outside`). The
#: feed is counted by its layout. Every close and every new period counts them all: a seen marker left past its
#: cluster's end would be read as the receiver's marker while newer clusters' items counted as unseen, and a new mark
#: there would move it backwards; a read mark there would be looked for in another cluster; a pulled post there
#: would never be read again.
TIME_PLACED = ("outbox", "seen", "fanouts")
#: How each collection of :data:`TIME_PLACED` finds its documents outside a period (its own module knows its fields):
#: filters, each with the field that gives its documents' time (``seen`` holds two kinds, placed by two fields).
_OUTSIDE: dict[str, Callable[[datetime | None, datetime | None], list[tuple[dict[str, Any], str]]]] = {
    "outbox": lambda start, end: [outbox.outside(start, end)], "seen": seen.outside,
    "fanouts": lambda start, end: [checkpoint.outside(start, end)]}


@attrs.frozen
class Outside:
    """Time-placed documents of one cluster outside a period: how many in each collection, and the latest time."""

    counts: tuple[tuple[str, int], ...]
    latest: datetime | None

    @property
    def count(self) -> int:
        """How many in all."""
        return sum(n for _, n in self.counts)

    def by_collection(self) -> str:
        """``"1 feed, 2 seen"``: the collections that hold any, with their counts."""
        return ", ".join(f"{n} {name}" for name, n in self.counts)


def stored_outside(clusters: Clusters, name: str, start: datetime | None, end: datetime | None, *,
                   layout: str = DEFAULT) -> Outside:
    """The documents of cluster *name* placed by a time outside ``[start, end)`` (all of them when both are
    ``None``): the feed's (stored by *layout*) and every collection of :data:`TIME_PLACED`."""
    cluster = clusters[name]
    feed_query, feed_newest = LAYOUTS[layout].outside(start, end)
    asked = [("feed", cluster.feed, feed_query, feed_newest)] + [
        (collection, cluster.db[collection], query, newest) for collection in TIME_PLACED
        for query, newest in _OUTSIDE[collection](start, end)
    ]
    counts: dict[str, int] = {}
    latest: datetime | None = None
    try:
        # An admin check, run rarely, that may scan a whole cluster (no index starts with event_time,
        # to keep every insert cheap): it gets its own long deadline instead of socketTimeoutMS.
        with pymongo.timeout(STRAND_CHECK_SECONDS):
            for collection, coll, query, newest in asked:
                count = coll.count_documents(query)
                if not count:
                    continue
                counts[collection] = counts.get(collection, 0) + count
                doc = coll.find_one(query, sort=[(newest, -1)], projection={newest: 1})
                when = doc.get(newest) if doc else None
                if isinstance(when, datetime) and (latest is None or when > latest):
                    latest = when
    except PyMongoError as exc:
        raise cluster.error(exc, doing="counting stored documents") from exc
    return Outside(tuple(counts.items()), latest)


def _stranding(found: Outside) -> str:
    """``"(latest T; 1 feed, 2 seen)"``: what a refusal says of *found*."""
    return f"(latest {found.latest.isoformat() if found.latest else '?'}; {found.by_collection()})"


def plan_period(
    clusters: Clusters,
    *,
    name: str,
    start: datetime,
    end: datetime | None = None,
    creator: str = "",
    close_previous: bool = False,
    now: datetime | None = None,
    min_notice: timedelta | None = None,
    layout: str = DEFAULT,
) -> PeriodChange:
    """Check giving cluster *name* the period ``[start, end)``; raise :class:`PeriodChangeRefused` with every reason.

    With *close_previous*, an open-ended period that starts before *start* is closed
    at *start*; without it, such an overlap is refused. With *min_notice*, closing a
    period that has already started at a *start* less than that far from *now* is
    refused: routers that have not refreshed yet may still write there. *layout* is how the
    new period stores copies (:mod:`router.core.layouts`).
    """
    problems: list[str] = []
    start = to_utc(start, field="start")
    end = to_utc(end, field="end") if end is not None else None
    now = now or datetime.now(UTC)
    if name not in clusters.names:
        raise PeriodChangeRefused([f"cluster {name!r} is not in {clusters.config.source}: add its name and uri there first"])
    if end is not None and end <= start:
        raise PeriodChangeRefused([f"end {end.isoformat()} must be after start {start.isoformat()}"])
    problem = layout_problem(clusters, name, layout)
    if problem is not None:
        raise PeriodChangeRefused([problem])
    metas, meta_problems, down = clusters.inspect_metadata(allow_missing=clusters.names)
    if down:
        raise PeriodChangeRefused([f"{e} (every cluster must answer to check a change)" for e in down.values()])
    if meta_problems:
        raise PeriodChangeRefused(meta_problems)
    # Listed clusters without a period yet are fine while they hold nothing (added later, or standby).
    for unassigned in sorted(set(clusters.names) - {m.name for m in metas} - {name}):
        found = stored_outside(clusters, unassigned, None, None)
        if found.count:
            problems.append(
                f"cluster {unassigned!r} has no metadata document but holds {found.count} documents "
                f"({found.by_collection()}): restore its metadata first"
            )
    timemap = TimeMap(metas)
    new = ClusterMeta(name=name, start_date=start, end_date=end, creator_name=creator, created_at=now, layout=layout)
    existing = next((m for m in timemap.periods if m.name == name), None)
    if existing is not None:
        if (existing.start_date, existing.end_date, existing.layout) == (start, end, layout):
            return PeriodChange(new=existing, close=None, already_done=True, timemap=timemap)
        problems.append(
            f"cluster {name!r} already owns {format_period(existing.start_date, existing.end_date)}; "
            "add-cluster gives a period to a cluster without one and never moves an existing period"
        )
    close: ClusterMeta | None = None
    for other in timemap.periods:
        if other.name == name:
            continue
        overlaps = (end is None or other.start_date < end) and (other.end_date is None or start < other.end_date)
        if not overlaps:
            continue
        if other.end_date is None and other.start_date < start and close_previous:
            close = attrs.evolve(other, end_date=start)
            if min_notice is not None and other.start_date <= now and start < now + min_notice:
                problems.append(
                    f"closing the live period of cluster {other.name!r} at {start.isoformat()} leaves running routers "
                    f"less than {min_notice} to learn of it (they refresh every refresh_interval) and they may "
                    "still write there; choose a later start, or pass --force when no router is running"
                )
            found = stored_outside(clusters, other.name, None, start, layout=other.layout)
            if found.count:
                problems.append(
                    f"cluster {other.name!r} holds {found.count} documents at or after {start.isoformat()} "
                    f"{_stranding(found)}: closing its period there would strand them"
                )
        elif other.end_date is None and other.start_date < start:
            problems.append(
                f"overlaps the open-ended period of cluster {other.name!r} "
                f"{format_period(other.start_date, other.end_date)}; pass close_previous (--close-previous) "
                f"to end it at {start.isoformat()}"
            )
        else:
            problems.append(
                f"{format_period(start, end)} overlaps cluster {other.name!r} {format_period(other.start_date, other.end_date)}"
            )
    found = stored_outside(clusters, name, start, end, layout=layout)
    if found.count:
        problems.append(
            f"cluster {name!r} already holds {found.count} documents outside {format_period(start, end)} "
            f"{_stranding(found)}: they would be unreadable"
        )
    if problems:
        raise PeriodChangeRefused(problems)
    return PeriodChange(new=new, close=close, already_done=False, timemap=timemap)


def apply_period(
    clusters: Clusters, change: PeriodChange, *, migrations: Sequence[Migration], dry_run: bool = False
) -> list[str]:
    """Carry out *change* (migrations, close, open); return what was done, line by line.

    Safe to re-run; in a dry run nothing is written and the lines say what would be.
    """
    lines: list[str] = []
    target = clusters[change.new.name]
    report = migrate_cluster(target, clusters.config, migrations, dry_run=dry_run)
    lines.extend(f"{target.name}: {step}" for step in report.steps)
    if not report.applied:
        lines.append(f"{target.name}: migrations up to date ({len(report.already)} applied)")
    verb = "would " if dry_run else ""
    if change.already_done:
        lines.extend(change.describe())
        return lines
    # The new period's indexes before anything is closed: a failure here leaves the map as it was, with no gap.
    lines.extend(create_feed_indexes(target, LAYOUTS[change.new.layout], dry_run=dry_run))
    if change.close is not None:
        # Checked again right before closing: documents may have arrived since planning.
        found = stored_outside(clusters, change.close.name, None, change.new.start_date, layout=change.close.layout)
        if found.count:
            raise PeriodChangeRefused([
                f"cluster {change.close.name!r} received {found.count} documents at or after "
                f"{change.new.start_date.isoformat()} since the plan was checked {_stranding(found)}; nothing was changed"
            ])
        lines.append(f"{verb}close cluster {change.close.name!r}: end_date = {change.new.start_date.isoformat()}")
        if not dry_run:
            clusters[change.close.name].write_meta(change.close)
    layout = f", layout {change.new.layout}" if change.new.layout != DEFAULT else ""
    lines.append(f"{verb}write metadata of cluster {change.new.name!r}: "
                 f"{format_period(change.new.start_date, change.new.end_date)}{layout}")
    if not dry_run:
        target.write_meta(change.new)
        log.info("cluster %s now owns %s", change.new.name, format_period(change.new.start_date, change.new.end_date))
    return lines


def layout_problem(clusters: Clusters, name: str, layout: str) -> str | None:
    """Why cluster *name* cannot store a period in *layout* (an unknown layout, or one its server cannot keep), or None."""
    chosen = LAYOUTS.get(layout)
    if chosen is None:
        return f"cluster {name!r}: layout {layout!r:.80} is not one of {', '.join(sorted(LAYOUTS))}"
    if chosen.needs_atomic_updates:
        caps = clusters[name].capabilities()
        if not caps.atomic_updates:
            return (f"cluster {name!r} cannot use layout {layout!r}: its server ({caps.server} {caps.version}) does not "
                    "apply one document's filter and update atomically, so concurrent appends to one bucket would lose "
                    "copies; use layout 'copies' there")
    return None


def retire(clusters: Clusters, name: str, *, now: datetime | None = None, dry_run: bool = False) -> ClusterMeta:
    """Mark cluster *name* retired: reads skip it, writes to its period fail, deletes still reach it.

    Only a period that ended before *now* can be retired. Idempotent; returns the new metadata.
    """
    now = now or datetime.now(UTC)
    timemap = clusters.load_timemap()
    meta = next((m for m in timemap.periods if m.name == name), None)
    if meta is None:
        raise PeriodChangeRefused([f"cluster {name!r} has no period to retire"])
    if meta.end_date is None or meta.end_date > now:
        raise PeriodChangeRefused([
            f"cluster {name!r} {format_period(meta.start_date, meta.end_date)} has not ended yet; "
            "only a past period can be retired"
        ])
    retired = attrs.evolve(meta, retired=True)
    if not dry_run and not meta.retired:
        clusters[name].write_meta(retired)
        log.warning("cluster %s retired: reads skip it, deletes still reach it", name)
    return retired
