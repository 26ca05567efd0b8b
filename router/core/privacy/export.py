"""Exporting a user: what the router holds about them, streamed in time order, for the files of ``export_user``.

:func:`export_program` reads every period the time map knows (retired ones too), oldest
first, and hands each record to a :class:`Sink` (the door's :class:`~router.exports.ExportFolder`
writes it to a file), three streams:

* ``sent``: the user's posts as they sent them, one :class:`~router.model.Activity` per
  post, found through the posts registry (:mod:`router.core.layouts.posts`) oldest first,
  each once however many registry documents list it; the data comes from the post's outbox
  entry, or else from one of its copies of the post's time.
* ``received``: the items of the user's own feed, oldest first (:meth:`Layout.oldest_first`),
  as the :class:`~router.model.FeedItem` values a page serves.
* ``seen``: the user's seen markers (:class:`~router.core.notify.seen.Marker`).
* ``read``: the user's read marks of notification groups (:class:`~router.core.notify.seen.ReadMark`).

Only values cross here: the layouts and :mod:`.seen` read the stored documents, and the
sink turns each value into a record. Memory stays bounded: each stream is read a page of
:data:`PAGE` at a time, and a value goes to the sink as soon as it is read (``sent``: as
soon as no page still to read can list it), with its period (the cluster). Periods do not overlap, so taking them oldest first keeps each stream in time order.

Example::

    summary = driver.run(export_program(ExportPlan(user_id=7, timemap=timemap, timeout=10.0), folder))
    summary.counts["received"]
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, Protocol

import attrs

from ...cursor import Position
from ...model import Activity, to_millis
from ...timemap import TimeMap
from ..notify import seen
from ..layouts import Layout, layout_for, outbox, posts
from ..policy import deadline_in
from ..steps import Concurrently, Failure, Program

__all__ = ["PAGE", "STREAMS", "ExportPlan", "ExportProgress", "ExportSummary", "Sink", "export_program"]

#: The streams of an export, each a file of its own.
STREAMS = ("sent", "received", "seen", "read")
#: Records one read asks for.
PAGE = 500


class Sink(Protocol):
    """Where an export's records go, one at a time, in order (the door writes them to files): each a value of the
    router's API (an :class:`~router.model.Activity` sent, a :class:`~router.model.FeedItem` received, a
    :class:`~router.core.notify.seen.Marker`, a :class:`~router.core.notify.seen.ReadMark`) and the period it was read from."""

    def write(self, stream: str, value: Any, period: str) -> None: ...


@attrs.frozen
class ExportProgress:
    """How far an export is, as ``export_user``'s *progress* callback hears it after every record written: the stream
    (``sent``, ``received``, ``seen``, ``read``), the period it is reading, and the records of that stream written so
    far (every period). Nothing here names the user."""

    stream: str
    period: str
    records: int


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
    for stream, read in (("sent", _sent), ("received", _received), ("seen", _seen), ("read", _read)):
        for meta in periods:
            def emit(value: Any, stream: str = stream, period: str = meta.name) -> None:
                sink.write(stream, value, period)
                counts[stream] += 1

            yield from read(plan, meta.name, emit)
    shown = tuple((m.name, m.start_date.isoformat(), m.end_date.isoformat() if m.end_date else None) for m in periods)
    return ExportSummary(shown, counts)


#: What a stream's reader hands each record to, as soon as it is read.
Emit = Callable[[Any], None]


def _answer(answer: Any) -> Any:
    if isinstance(answer, Failure):
        raise answer.error
    return answer


def _sent(plan: ExportPlan, cluster: str, emit: Emit) -> Program[None]:
    """The user's posts in *cluster*, oldest first, each once: their registry's pages oldest first (by each
    document's earliest time), a post handed on once no page still to read can list it (those list none older than
    the page's last document), with its data (:func:`_posts`).

    Held meanwhile: the posts read but not handed on, those of documents whose times reach past the page's last."""
    user = plan.user_id
    layout = layout_for(plan.timemap, cluster)
    waiting: set[tuple[datetime, str]] = set()
    after: tuple[datetime, str] | None = None
    while True:
        deadline = deadline_in(plan.timeout)
        page = _answer((yield from posts.page(cluster, user, deadline, after=after, ordered=True)))
        waiting.update(page.posts)
        due = sorted(waiting if page.after is None else (p for p in waiting if p[0] < page.after[0]))
        waiting.difference_update(due)
        for start in range(0, len(due), PAGE):
            yield from _posts(layout, cluster, user, due[start : start + PAGE], deadline_in(plan.timeout), emit)
        if page.after is None:
            return
        after = page.after


def _posts(layout: Layout, cluster: str, user: int | str, due: list[tuple[datetime, str]], deadline: float,
           emit: Emit) -> Program[None]:
    """The posts *due* ``(time, data_key)``, in that order, each with its data: its outbox entry, or else its copy of
    that time (a post with nothing stored any more is not one)."""
    published = _answer((yield from outbox.published(cluster, user, sorted({k for _t, k in due}), deadline)))
    found = {(p.activity.data_key, to_millis(p.activity.event_time)): p.activity for p in published}
    missing = [(t, k) for t, k in due if (k, to_millis(t)) not in found]
    copies = yield Concurrently([layout.sent_copy(cluster, user, k, deadline, at=t) for t, k in missing],
                                [cluster] * len(missing))
    for (t, k), copy in zip(missing, copies):
        item = _answer(copy)
        if item is not None:
            found[k, to_millis(t)] = Activity.from_item(item)
    for t, k in due:
        activity = found.get((k, to_millis(t)))
        if activity is not None:
            emit(activity)


def _received(plan: ExportPlan, cluster: str, emit: Emit) -> Program[None]:
    """The items of the user's feed in *cluster*, oldest first, a page at a time."""
    layout = layout_for(plan.timemap, cluster)
    position: Position | None = None
    while True:
        inbox = _answer((yield from layout.oldest_first(cluster, plan.user_id, position, PAGE, deadline_in(plan.timeout))))
        for _t, _oid, item in inbox.entries:
            emit(item)
        if not inbox.full or not inbox.entries:
            return
        t, oid, _item = inbox.entries[-1]
        position = Position(t, oid)


def _seen(plan: ExportPlan, cluster: str, emit: Emit) -> Program[None]:
    """The user's seen markers in *cluster*, oldest first (usually one)."""
    for marker in _answer((yield from seen.markers(cluster, plan.user_id, deadline_in(plan.timeout)))):
        emit(marker)


def _read(plan: ExportPlan, cluster: str, emit: Emit) -> Program[None]:
    """The user's read marks of notification groups in *cluster*, oldest first (a few: each supersedes the ones
    below it)."""
    for mark in _answer((yield from seen.read_marks(cluster, plan.user_id, deadline_in(plan.timeout)))):
        emit(mark)
