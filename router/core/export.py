"""Exporting a user: what the router holds about them, streamed in time order, for the files of ``export_user``.

:func:`export_program` reads every period the time map knows (retired ones too), oldest
first, and hands each record to a :class:`Sink` (the door's :class:`~router.exports.ExportFolder`
writes it to a file), three streams:

* ``sent``: the user's posts as they sent them, one record per post (its ``data_key``,
  time, type and data), found through the posts registry (:mod:`router.core.layouts.posts`)
  oldest first; the data comes from the post's outbox entry, or else from one of its copies.
* ``received``: the items of the user's own feed, oldest first (:meth:`Layout.oldest_first`).
* ``seen``: the user's seen markers.

Memory stays bounded: each stream is read a page of :data:`PAGE` at a time, and a record
goes to the sink as soon as it is read. Each record names its period (``period``: the
cluster). Periods do not overlap, so taking them oldest first keeps each stream in time order.

Example::

    summary = driver.run(export_program(ExportPlan(user_id=7, timemap=timemap, timeout=10.0), folder))
    summary.counts["received"]
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

import attrs

from ..cursor import Position
from ..timemap import TimeMap
from ..model import Activity
from . import seen
from .layouts import layout_for, outbox, posts
from .policy import deadline_in
from .steps import Concurrently, Failure, Program

__all__ = ["PAGE", "STREAMS", "ExportPlan", "ExportSummary", "Sink", "export_program"]

#: The streams of an export, each a file of its own.
STREAMS = ("sent", "received", "seen")
#: Records one read asks for.
PAGE = 500


class Sink(Protocol):
    """Where an export's records go, one at a time, in order (the door writes them to files)."""

    def write(self, stream: str, record: Mapping[str, Any]) -> None: ...


@attrs.frozen
class ExportPlan:
    """An export's inputs: the user, the time map (which periods, and each one's layout), and each read's timeout."""

    user_id: int | str
    timemap: TimeMap
    timeout: float


@attrs.frozen
class ExportSummary:
    """What an export read: the periods, oldest first (name, start, end), and the records of each stream."""

    periods: tuple[tuple[str, str, str | None], ...]
    counts: Mapping[str, int]


def export_program(plan: ExportPlan, sink: Sink) -> Program[ExportSummary]:
    """Hand every record of ``plan.user_id`` to *sink*, stream by stream, each in time order; raises a cluster's
    :class:`~router.errors.ClusterUnavailable` if one cannot be read (the files are then incomplete)."""
    counts = dict.fromkeys(STREAMS, 0)
    periods = plan.timemap.periods
    for stream, read in (("sent", _sent), ("received", _received), ("seen", _seen)):
        for meta in periods:
            def emit(record: dict[str, Any], stream: str = stream, period: str = meta.name) -> None:
                sink.write(stream, {**record, "period": period})
                counts[stream] += 1

            yield from read(plan, meta.name, emit)
    shown = tuple((m.name, m.start_date.isoformat(), m.end_date.isoformat() if m.end_date else None) for m in periods)
    return ExportSummary(shown, counts)


#: What a stream's reader hands each record to, as soon as it is read.
Emit = Callable[[dict[str, Any]], None]


def _answer(answer: Any) -> Any:
    if isinstance(answer, Failure):
        raise answer.error
    return answer


def _sent(plan: ExportPlan, cluster: str, emit: Emit) -> Program[None]:
    """The user's posts in *cluster*, oldest first: from the registry, with each post's data (its outbox entry, or
    one of its copies), a page at a time."""
    user = plan.user_id
    layout = layout_for(plan.timemap, cluster)
    after: tuple[Any, str] | None = None
    while True:
        deadline = deadline_in(plan.timeout)
        page = _answer((yield posts.registered(cluster, user, deadline, limit=PAGE, after=after)))
        if not page:
            return
        keys = posts.keys_of(page)
        found = {a.data_key: a for a in map(outbox.activity_of, _answer((yield outbox.published(cluster, user, keys,
                                                                                                  deadline))))}
        missing = [k for k in keys if k not in found]
        copies = yield Concurrently([layout.sent_copy(cluster, user, k, deadline) for k in missing],
                                    [cluster] * len(missing))
        for key, copy in zip(missing, copies):
            item = _answer(copy)
            if item is not None:
                found[key] = Activity(sender_id=user, event_time=item.event_time, type=item.type, data=item.data,
                                      data_key=key)
        for a in (found[key] for key in keys if key in found):  # (a post with nothing stored any more is not one)
            emit({"data_key": a.data_key, "event_time": a.event_time, "type": a.type, "data": a.data})
        if len(page) < PAGE:
            return
        after = posts.position_of(page[-1])


def _received(plan: ExportPlan, cluster: str, emit: Emit) -> Program[None]:
    """The items of the user's feed in *cluster*, oldest first, a page at a time."""
    layout = layout_for(plan.timemap, cluster)
    position: Position | None = None
    while True:
        inbox = _answer((yield from layout.oldest_first(cluster, plan.user_id, position, PAGE, deadline_in(plan.timeout))))
        for _t, _oid, item in inbox.entries:
            emit({"id": item.id, "sender_id": item.sender_id, "event_time": item.event_time, "type": item.type,
                  "data": item.data, "data_key": item.data_key})
        if not inbox.full or not inbox.entries:
            return
        t, oid, _item = inbox.entries[-1]
        position = Position(t, oid)


def _seen(plan: ExportPlan, cluster: str, emit: Emit) -> Program[None]:
    """The user's seen markers in *cluster*, oldest first (usually one)."""
    for marker in seen.positions(_answer((yield seen.markers(cluster, plan.user_id, deadline_in(plan.timeout))))):
        emit({"event_time": marker.event_time, "item": marker.id})
