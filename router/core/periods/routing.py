"""The one chooser every write path asks: which cluster owns this time, and may the map be trusted that far.

``write``/``write_many`` and the planning of every fan-out (``fan_out``, ``publish``, the
Celery publisher) route through :meth:`Routing.locate`; none repeats the rule. Workers run
jobs already routed (the job names its cluster and that period's layout), and ``backfill``
copies each outbox entry into the cluster that holds it (the entry's own period).

**The horizon rule.** A time map loaded at time R is trusted for ``event_time`` before
``R + lead_time`` (``rollover.lead_time``): every period boundary is announced at least
that far ahead. A time at or past that horizon that lands in the open-ended period, or
in no period, might belong to a period this router has not heard of yet. The chooser
then raises :class:`PastHorizon`; the caller refreshes once and asks again, and if the
time is still past the horizon the write is refused with
:class:`~router.errors.StaleMetadata`. Without a rollover section the map is trusted
without limit.

Example::

    routing = Routing(timemap, loaded_at=now, lead_time=timedelta(days=7))
    name, start, end = routing.locate(event_time.timestamp())
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import TypeVar

import attrs

from ...errors import RouterError, StaleMetadata
from ...observe import Event
from ...timemap import TimeMap
from ..steps import Program, Refresh, Report

__all__ = ["PastHorizon", "Routing", "routed"]

log = logging.getLogger(__name__)
UTC = timezone.utc
T = TypeVar("T")


class PastHorizon(Exception):
    """Internal signal: the time lies past what the map can vouch for; refresh, then ask again.

    ``index`` is the item's position in the call (``None`` for a single item or activity).
    """

    def __init__(self, index: int | None = None) -> None:
        self.index = index


@attrs.frozen
class Routing:
    """A time map, when its load began, and how far it can be trusted: replaced as a whole on refresh."""

    timemap: TimeMap
    loaded_at: datetime
    lead_time: timedelta | None = None

    @property
    def horizon(self) -> float:
        """UTC epoch seconds up to which the open-ended period may be trusted (infinite without rollover)."""
        if self.lead_time is None:
            return float("inf")
        return self.loaded_at.timestamp() + self.lead_time.total_seconds()

    def locate(self, ts: float, *, index: int | None = None) -> tuple[str, float, float]:
        """``(cluster, start, end)`` of the period that owns UTC epoch seconds *ts*, as far as it is trusted.

        ``end`` is cut at the horizon for the open-ended period, so a caller that checks
        ``start <= ts < end`` for the next item of the same period needs no second lookup.
        Raises :class:`PastHorizon`, or :class:`~router.errors.NoClusterForTime` (and its
        :class:`~router.errors.ClusterRetired`) naming the nearest periods.
        """
        timemap = self.timemap
        found = timemap.locate(ts)
        horizon = self.horizon
        if found is None or found[0] in timemap.retired:
            if found is None and ts >= horizon:
                raise PastHorizon(index)
            raise timemap.no_cluster(datetime.fromtimestamp(ts, UTC), index=index)
        name, start, end = found
        if end == float("inf"):
            if ts >= horizon:
                raise PastHorizon(index)
            end = horizon
        return name, start, end

    def replaced_by(self, timemap: TimeMap, started: datetime) -> Routing | None:
        """The routing of a map whose load began at *started*, or ``None`` when that load began before this
        one's (a slow refresh never replaces a newer map)."""
        return Routing(timemap, started, self.lead_time) if started >= self.loaded_at else None

    def stale(self, event_time: datetime, *, field: str = "event_time", cause: BaseException | None = None) -> StaleMetadata:
        """The error for a time still past the horizon after a refresh (or whose refresh failed)."""
        when = event_time.isoformat()
        if cause is not None:
            return StaleMetadata(
                f"{field}: {when} is past what the time map loaded at {self.loaded_at.isoformat()} can vouch for, "
                f"and the refresh failed: {cause}"
            )
        horizon = datetime.fromtimestamp(self.horizon, UTC).isoformat()
        return StaleMetadata(
            f"{field}: {when} is at or past {horizon}, the time map's horizon (loaded {self.loaded_at.isoformat()}, "
            f"plus lead time {self.lead_time}); a period starting before it may not be announced yet, so the router "
            "does not guess"
        )


def routed(
    choose: Callable[[Routing], T], routing: Routing, *, where: Callable[[PastHorizon], tuple[datetime, str]]
) -> Program[T]:
    """``choose(routing)``; past the horizon, refresh once and choose again, else :class:`StaleMetadata`.

    *where* names the time and the field that went past the horizon, for the messages.
    """
    try:
        return choose(routing)
    except PastHorizon as past:
        event_time, field = where(past)
    log.info("%s %s is past the time map's horizon; refreshing before writing", field, event_time.isoformat())
    answer = yield Refresh()
    if isinstance(answer, RouterError):
        yield Report(Event("stale_refusal"))
        raise routing.stale(event_time, field=field, cause=answer) from answer
    try:
        return choose(answer)
    except PastHorizon:
        pass
    yield Report(Event("stale_refusal"))
    raise answer.stale(event_time, field=field)
