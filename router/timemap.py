"""The time map: which cluster owns which period of ``event_time``.

Pure logic, no I/O. Three questions, one method each:

* :meth:`TimeMap.cluster_for` -- where does a write go? Exactly one cluster or
  :class:`~router.errors.NoClusterForTime`; never a "closest" cluster.
* :meth:`TimeMap.clusters_for_read` -- which clusters may a page touch, newest first?
* :meth:`TimeMap.all_clusters` -- where may a ``data_key`` live? (every cluster)

Periods are half-open, ``[start_date, end_date)``; at most one is open-ended and it
is then necessarily the latest. Periods must not overlap; gaps are allowed but
reported in :attr:`TimeMap.gaps`, and a write into a gap fails.

Example::

    tm = TimeMap([meta_1, meta_2, meta_3])
    tm.cluster_for(datetime(2016, 6, 1, tzinfo=timezone.utc))        # 'cluster_1'
    tm.clusters_for_read(now=now, window=ReadWindow(clusters=2))      # ['cluster_3', 'cluster_2']
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

import attrs

from .errors import ClusterRetired, MetadataError, NoClusterForTime
from .model import ClusterMeta, to_utc

__all__ = ["TimeMap", "ReadWindow", "format_period"]


def _iso(t: datetime) -> str:
    return t.isoformat().replace("+00:00", "Z")


def format_period(start: datetime, end: datetime | None) -> str:
    """``[2016-05-01T00:00:00Z, 2016-08-01T00:00:00Z)``; an open end prints as ``open)``."""
    return f"[{_iso(start)}, {_iso(end) + ')' if end is not None else 'open)'}"


def _positive(_inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, timedelta)):
        raise ValueError(f"{attribute.name}: must be an int or a timedelta (got {value!r})")
    if (isinstance(value, int) and value < 1) or (isinstance(value, timedelta) and value <= timedelta(0)):
        raise ValueError(f"{attribute.name}: must be positive (got {value!r})")


@attrs.frozen(kw_only=True)
class ReadWindow:
    """How far back reads go: the ``clusters`` most recent started periods and/or
    periods that end less than ``max_age`` before now. ``None`` means no limit."""

    clusters: int | None = attrs.field(default=None, validator=_positive)
    max_age: timedelta | None = attrs.field(default=None, validator=_positive)


class TimeMap:
    """Sorted, validated periods, one per cluster. Build it from every cluster's metadata.

    Raises :class:`~router.errors.MetadataError` listing every problem at once:
    duplicate names, overlapping periods, more than one open-ended period.
    """

    __slots__ = ("_metas", "_starts", "_ends", "_names", "_layouts", "gaps", "retired")

    def __init__(self, metas: Iterable[ClusterMeta]) -> None:
        ordered = sorted(metas, key=lambda m: (m.start_date, m.name))
        problems = self.problems(ordered)
        if problems:
            raise MetadataError(problems)
        self._metas: tuple[ClusterMeta, ...] = tuple(ordered)
        self._starts = [m.start_date.timestamp() for m in ordered]
        self._ends = [m.end_date.timestamp() if m.end_date else float("inf") for m in ordered]
        self._names = [m.name for m in ordered]
        self._layouts = {m.name: m.layout for m in ordered}
        #: Clusters whose metadata says retired: reads skip them, writes to them fail.
        self.retired: frozenset[str] = frozenset(m.name for m in ordered if m.retired)
        #: ``(end of one period, start of the next)`` for every hole in the map.
        self.gaps: tuple[tuple[datetime, datetime], ...] = tuple(
            (a.end_date, b.start_date)
            for a, b in zip(ordered, ordered[1:])
            if a.end_date is not None and a.end_date < b.start_date
        )

    @staticmethod
    def problems(metas: Iterable[ClusterMeta]) -> list[str]:
        """Every reason *metas* cannot form a time map (empty when they can)."""
        ordered = sorted(metas, key=lambda m: (m.start_date, m.name))
        problems: list[str] = []
        seen: set[str] = set()
        for m in ordered:
            if m.name in seen:
                problems.append(f"cluster {m.name!r}: has more than one period")
            seen.add(m.name)
        open_ended = [m.name for m in ordered if m.end_date is None]
        if len(open_ended) > 1:
            problems.append(f"more than one open-ended period: {', '.join(open_ended)}")
        for i, a in enumerate(ordered):
            for b in ordered[i + 1 :]:
                if a.end_date is None or a.end_date > b.start_date:
                    problems.append(
                        f"cluster {a.name!r} {format_period(a.start_date, a.end_date)} overlaps "
                        f"cluster {b.name!r} {format_period(b.start_date, b.end_date)}"
                    )
                else:
                    break  # sorted by start: nothing later can overlap a
        return problems

    @property
    def open_period(self) -> ClusterMeta | None:
        """The open-ended period, if there is one (it is the latest)."""
        last = self._metas[-1] if self._metas else None
        return last if last is not None and last.end_date is None else None

    @property
    def periods(self) -> tuple[ClusterMeta, ...]:
        """The metadata of every cluster, oldest period first."""
        return self._metas

    def all_clusters(self) -> list[str]:
        """Every cluster that may hold a copy of an item, oldest first (retired ones included)."""
        return list(self._names)

    def __len__(self) -> int:
        return len(self._metas)

    def start_of(self, name: str) -> datetime:
        """When cluster *name*'s period starts; ``KeyError`` for a cluster not in the map."""
        return self._metas[self._names.index(name)].start_date

    def layout_of(self, name: str) -> str:
        """The layout cluster *name*'s metadata records (``copies`` for a cluster not in the map)."""
        return self._layouts.get(name, "copies")

    def lookup(self, ts: float) -> str | None:
        """The cluster whose period holds UTC epoch seconds *ts*, or ``None``; may be retired.

        The write path's inner loop: check :attr:`retired` before writing.
        """
        found = self.locate(ts)
        return found[0] if found is not None else None

    def locate(self, ts: float) -> tuple[str, float, float] | None:
        """Like :meth:`lookup`, with the owning period's bounds ``(name, start, end)`` in epoch seconds.

        A bulk write checks the bounds before looking up again: consecutive items
        mostly share a period.
        """
        i = bisect_right(self._starts, ts) - 1
        if i >= 0 and ts < self._ends[i]:
            return self._names[i], self._starts[i], self._ends[i]
        return None

    def cluster_for(self, event_time: datetime, *, index: int | None = None) -> str:
        """The cluster whose period holds *event_time*, or raise :class:`NoClusterForTime`."""
        t = to_utc(event_time)
        name = self.lookup(t.timestamp())
        if name is None or name in self.retired:
            raise self.no_cluster(t, index=index)
        return name

    def no_cluster(self, event_time: datetime, *, index: int | None = None) -> NoClusterForTime:
        """The error for an *event_time* no active period owns, naming the nearest periods."""
        t = to_utc(event_time)
        owner = self.lookup(t.timestamp())
        if owner is not None and owner in self.retired:
            m = next(m for m in self._metas if m.name == owner)
            return ClusterRetired(
                t,
                f"event_time {_iso(t)} belongs to cluster {owner!r} {format_period(m.start_date, m.end_date)}, "
                "which is retired: it takes no writes",
                index=index,
            )
        before = [m for m in self._metas if m.end_date is not None and m.end_date <= t]
        after = [m for m in self._metas if m.start_date > t]
        near = []
        if before:
            m = before[-1]
            near.append(f"{m.name!r} {format_period(m.start_date, m.end_date)} ends before it")
        if after:
            m = after[0]
            near.append(f"{m.name!r} {format_period(m.start_date, m.end_date)} starts after it")
        if not self._metas:
            near.append("the time map is empty")
        msg = f"no cluster owns event_time {_iso(t)}; nearest: " + "; ".join(near)
        return NoClusterForTime(t, msg, index=index)

    def clusters_for_read(
        self, *, now: datetime, window: ReadWindow | None = None, before: datetime | None = None
    ) -> list[str]:
        """The clusters a page may touch, newest period first.

        Only periods that have started by *now* are read, and never a retired
        cluster. *window* keeps the
        ``clusters`` most recent of those and/or those ending within ``max_age``
        of *now*. *before* (the cursor's time) drops periods starting after it, as
        they cannot hold older items.
        """
        now = to_utc(now)
        started = [m for m in reversed(self._metas) if m.start_date <= now and not m.retired]
        if window is not None:
            if window.clusters is not None:
                started = started[: window.clusters]
            if window.max_age is not None:
                horizon = now - window.max_age
                started = [m for m in started if m.end_date is None or m.end_date > horizon]
        if before is not None:
            b = to_utc(before)
            started = [m for m in started if m.start_date <= b]
        return [m.name for m in started]

    def describe(self) -> str:
        """A plain table of the map, one period per line, oldest first, gaps marked."""
        lines = []
        for i, m in enumerate(self._metas):
            if i and self._metas[i - 1].end_date not in (None, m.start_date):
                prev_end = self._metas[i - 1].end_date
                assert prev_end is not None
                lines.append(f"  {'(gap)':<16} {format_period(prev_end, m.start_date)}")
            lines.append(f"  {m.name:<16} {format_period(m.start_date, m.end_date)}{'  (retired)' if m.retired else ''}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"TimeMap({', '.join(f'{m.name}={format_period(m.start_date, m.end_date)}' for m in self._metas)})"
