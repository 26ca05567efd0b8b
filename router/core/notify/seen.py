"""Notification feeds: a receiver's seen marker, and how many items are newer than it.

**The marker is insert-only.** ``mark_seen`` inserts a document ``{receiver_id, event_time,
key}`` into ``seen`` in the cluster that owns ``event_time``, then deletes that receiver's
markers there that sort strictly below it. The marker is the highest document. Two devices
marking at once each insert their own document, and a cleanup removes only markers below
the one its caller inserted, so the highest always survives: the marker never moves
backwards, with no read-modify-write of one shared document (which FerretDB v1 loses under
concurrency, and which MongoDB would need ``$max`` over two fields for).

**Why the owning cluster.** Periods do not overlap, so the newest cluster that holds any
marker of a receiver holds the highest one. Reading the marker asks the read window's
clusters newest first and stops at the first that has one; clusters older than the marker
are never asked. A marker whose period left the read window is as good as none: every item
in the window is newer than it.

**Unseen counts** ask each cluster newest first, from the newest down to the marker's,
once each: a ``count`` with ``limit`` (``cap + 1`` minus what is counted already), so a
badge of "99+" costs at most 100 index entries. With pulled senders, the inbox and the
pulled outboxes are asked together for the keys of their newest entries, so a post present
both as a copy and in a pulled outbox counts once (as a page serves it once).

Example::

    program = unseen_program(UnseenPlan(receiver_id=7, names=("c3", "c2", "c1"), cap=99, ...))
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import attrs
from bson import ObjectId

from ...cursor import Position
from ...errors import InvalidItem, RequestRefused
from ...model import FeedItem, identity, is_id
from ...timemap import TimeMap
from ..layouts import Layout, layout_for, older_than, outbox, outside_clause
from ..steps import Concurrently, Delete, Failure, Find, Insert, InsertOutcome, Program, ask

__all__ = ["ALL_GROUPS", "MAX_CAP", "SEEN_SORT", "Marker", "Unseen", "UnseenPlan", "forget", "highest_read_marks",
           "mark_program", "marker_of", "marker_program", "markers", "outside", "ReadMark", "read_mark_documents",
           "read_marks", "read_marks_below", "read_marks_find", "unseen_program"]

log = logging.getLogger(__name__)
#: The order of a receiver's markers, highest first (the index 0004 creates).
SEEN_SORT = (("event_time", -1), ("key", -1))
#: Seen markers, not the read marks of groups that share their collection (:func:`read_mark_documents`): only a
#: marker has an ``event_time``. As a range of dates, this keeps a marker's ``find`` on the markers' own entries of the
#: index (a read mark's ``event_time`` is missing, which the index holds as null, below every date).
_MARKERS = {"event_time": {"$type": "date"}}
#: The largest ``cap`` an unseen count takes.
MAX_CAP = 10_000


@attrs.frozen
class Unseen:
    """How many items are newer than the receiver's seen marker.

    ``count`` stops at ``cap``: ``capped`` is true when there are more (show "99+").
    ``marker`` is the seen position (``None``: nothing marked, every item in the read
    window counts); ``queried`` lists the clusters asked, newest first.
    """

    count: int
    capped: bool
    marker: Position | None
    queried: tuple[str, ...] = ()

    @property
    def marked_at(self) -> datetime | None:
        """The ``event_time`` of the newest item marked seen, or ``None``."""
        return self.marker.event_time if self.marker is not None else None


@attrs.frozen
class UnseenPlan:
    """An unseen count's inputs: the receiver, the read window's clusters newest first, the cap and pulled senders."""

    receiver_id: int | str
    names: tuple[str, ...]
    cap: int
    deadline: float
    pull: tuple[int | str, ...] = ()
    timemap: TimeMap | None = None

    def layout(self, name: str) -> Layout:
        """The layout of cluster *name*'s period."""
        return layout_for(self.timemap, name)


def marker_of(receiver_id: int | str, position: object) -> Position:
    """The marker *receiver_id* asks to record: *position* checked, without its page's skip count.

    A :class:`FeedItem` must come from *receiver_id*'s own page (``InvalidItem`` for an item of
    another receiver's page: its key sorts in that receiver's order, not this one's). A bare
    :class:`Position` carries no receiver; it is taken as a point in *receiver_id*'s order.
    """
    if isinstance(position, FeedItem):
        if position.id is None:
            raise InvalidItem("position", "must be a FeedItem read from a page (this one has no id)")
        owner = position.receiver_id
        if not is_id(owner) or identity(owner) != identity(receiver_id):  # (5 and "5" differ; 5 and Int64(5) do not)
            raise InvalidItem("position", f"is an item of receiver {owner!r:.80}'s page, not of {receiver_id!r:.80}'s: "
                                          "mark an item of the receiver's own page")
        position = Position(position.event_time, position.id)
    if not isinstance(position, Position):
        raise InvalidItem("position", f"must be a Position or a FeedItem from a page (got {type(position).__name__})")
    when = position.event_time
    if not isinstance(when, datetime) or when.utcoffset() is None or not isinstance(position.id, ObjectId):
        raise InvalidItem("position", f"must hold a timezone-aware event_time and an ObjectId (got {position!r:.120})")
    return Position(when, position.id)  # a page's skip count means nothing to a marker


def mark_program(receiver_id: int | str, position: Position, cluster: str, *, deadline: float) -> Program[Position]:
    """Record *position* as seen in *cluster* (the owner of its time); return it. Never lowers the marker."""
    doc = {"_id": ObjectId(), "receiver_id": receiver_id, "event_time": position.event_time, "key": position.id}
    outcome: InsertOutcome = yield Insert(cluster, "seen", [doc], deadline)
    if outcome.failure is not None:
        raise outcome.failure.error
    if outcome.write_errors:  # a fresh ObjectId cannot collide; any refusal is the server's
        error = outcome.write_errors[0]
        raise RequestRefused(cluster, f"the seen marker was refused (code {error.code}): {error.message}", code=error.code)
    mine = {"receiver_id": receiver_id, **_MARKERS, **older_than(position, "key")}
    cleaned = yield Delete(cluster, "seen", mine, deadline)
    if isinstance(cleaned, Failure):  # the marker is stored; the lower ones left are harmless, and go next time
        log.warning("seen markers below the new one stay for now: %s", cleaned.error, extra={"cluster": cluster})
    return position


def marker_program(receiver_id: int | str, names: Sequence[str], *, deadline: float) -> Program[tuple[Position | None, int]]:
    """The receiver's seen marker and the index in *names* (newest first) of its cluster (``len(names)`` if none).

    Asks one cluster at a time, newest first, and stops at the first that has a marker.
    """
    for i, name in enumerate(names):
        docs = yield Find(name, "seen", {"receiver_id": receiver_id, **_MARKERS}, deadline, sort=SEEN_SORT, limit=1,
                          projection={"_id": 0, "event_time": 1, "key": 1})
        if isinstance(docs, Failure):
            raise docs.error
        if docs:
            return Position(docs[0]["event_time"], docs[0]["key"]), i
    return None, len(names)


@attrs.frozen
class Marker:
    """A seen marker as an export shows it: its time and the id of the item marked."""

    event_time: datetime
    item: ObjectId


def markers(cluster: str, receiver_id: int | str, deadline: float) -> Program[list[Marker] | Failure]:
    """Every seen marker of *receiver_id* in *cluster*, lowest first (an export: usually one; not the read marks of
    groups, which share the collection)."""
    docs = yield Find(cluster, "seen", {"receiver_id": receiver_id, **_MARKERS}, deadline,
                      sort=[(f, 1) for f, _ in SEEN_SORT],
                      projection={"_id": 0, "event_time": 1, "key": 1})
    return docs if isinstance(docs, Failure) else [Marker(d["event_time"], d["key"]) for d in docs]


@attrs.frozen
class ReadMark:
    """A read mark of notification groups as an export shows it: the group (``"*"``: every group), and the time and
    id of the item it was read through."""

    group: str
    read_time: datetime
    item: ObjectId


def read_marks(cluster: str, receiver_id: int | str, deadline: float) -> Program[list[ReadMark] | Failure]:
    """Every read mark of *receiver_id* in *cluster*, oldest first (an export)."""
    docs = yield Find(cluster, "seen", {"receiver_id": receiver_id, "read_time": {"$type": "date"}}, deadline,
                      sort=[("read_time", 1), ("read_key", 1)], projection={"_id": 0, "group": 1, "read_time": 1,
                                                                             "read_key": 1})
    return docs if isinstance(docs, Failure) else [ReadMark(str(d["group"]), d["read_time"], d["read_key"]) for d in docs]


def forget(cluster: str, receiver_id: int | str, deadline: float) -> Delete:
    """The request that removes every seen marker of *receiver_id* in *cluster*, and their read marks of groups (an
    erasure)."""
    return Delete(cluster, "seen", {"receiver_id": receiver_id}, deadline)


def _keys(answer: Any) -> Any:
    if isinstance(answer, Failure):
        raise answer.error
    return answer


def _count_with_pull(plan: UnseenPlan, cluster: str, marker: Position | None, need: int) -> Program[int]:
    """Distinct entries newer than *marker* in the inbox and the pulled outboxes of *cluster*, up to *need*.

    A list that comes back full means at least *need*; otherwise the union of keys is exact.
    Outbox entries in the marker's own millisecond are fetched whole (the store cannot order
    them by the key the page gives them), so none is lost or counted wrongly there.
    """
    programs = [
        plan.layout(cluster).newer(cluster, plan.receiver_id, marker, need, plan.deadline),
        outbox.keys(cluster, plan.pull, plan.receiver_id, plan.deadline, after=marker.event_time if marker else None,
                    limit=need),
    ]
    if marker is not None:
        programs.append(outbox.keys(cluster, plan.pull, plan.receiver_id, plan.deadline, at=marker.event_time))
    answers = yield Concurrently(programs, [cluster] * len(programs))
    inbox, found = _keys(answers[0]), _keys(answers[1])
    if len(inbox) >= need or len(found) >= need:
        return need
    seen = set(inbox)
    for where in found + (_keys(answers[2]) if marker is not None else []):  # (None: a page skips such a post too)
        if where is not None and (marker is None or (where[0], where[1].binary) > (marker.event_time, marker.id.binary)):
            seen.add(where)
    return min(len(seen), need)


def unseen_program(plan: UnseenPlan) -> Program[Unseen]:
    """Count items newer than the marker, newest cluster first, down to the marker's cluster, stopping past ``cap``."""
    marker, at = yield from marker_program(plan.receiver_id, plan.names, deadline=plan.deadline)
    total, queried = 0, []
    for i, name in enumerate(plan.names[: at + 1]):
        need = plan.cap + 1 - total
        bound = marker if i == at else None  # a cluster newer than the marker's holds only newer items
        if plan.pull:
            n = yield from _count_with_pull(plan, name, bound, need)
        else:
            n = _keys((yield from plan.layout(name).count_newer(name, plan.receiver_id, bound, need, plan.deadline)))
        queried.append(name)
        total += n
        if total > plan.cap:
            break
    return Unseen(min(total, plan.cap), total > plan.cap, marker, tuple(queried))


def outside(start: datetime | None, end: datetime | None) -> list[tuple[dict[str, Any], str]]:
    """The filters of the ``seen`` documents placed outside ``[start, end)`` (all of them when both are ``None``),
    each with the field that gives a document's time: the markers by ``event_time``, the read marks of groups by
    ``read_time`` (each lives in the cluster that owns that time, so a period change must strand neither)."""
    return [(outside_clause(start, end, earliest="event_time", latest="event_time") or dict(_MARKERS), "event_time"),
            (outside_clause(start, end, earliest="read_time", latest="read_time") or {"read_time": {"$type": "date"}},
             "read_time")]


# -- read marks of notification groups (router.core.notify.group_marks) ------------------------------

#: The ``group`` of a read mark that marks every group read.
ALL_GROUPS = "*"


def read_mark_documents(receiver_id: int | str, marks: Sequence[tuple[str, Position]]) -> list[dict[str, Any]]:
    """The ``seen`` documents of read marks: each ``(group key or "*", read through this position)``, as
    ``{receiver_id, group, read_time, read_key}``. They share the seen markers' collection but not their fields: with
    no ``event_time`` they sit below every marker in the markers' index ``{receiver_id, event_time, key}``, outside the
    range of dates a marker's query asks for, so finding the marker never steps over them; the read marks' own
    queries use ``{receiver_id, group, read_time, read_key}`` (migration 0007)."""
    return [{"_id": ObjectId(), "receiver_id": receiver_id, "group": group, "read_time": through.event_time,
             "read_key": through.id} for group, through in marks]


def read_marks_below(cluster: str, receiver_id: int | str, marks: Sequence[tuple[str, Position]],
                     deadline: float) -> Delete:
    """The delete of the read marks *marks* make redundant: of each group, those below it (of ``"*"``: of every
    group)."""
    branches: list[dict[str, Any]] = []
    for group, through in marks:
        which: Any = {"$exists": True} if group == ALL_GROUPS else group
        branches += [{"group": which, "read_time": {"$lt": through.event_time}},
                     {"group": which, "read_time": through.event_time, "read_key": {"$lt": through.id}}]
    return Delete(cluster, "seen", {"receiver_id": receiver_id, "$or": branches}, deadline)


def read_marks_find(cluster: str, receiver_id: int | str, groups: Sequence[str], oldest: datetime,
                    deadline: float) -> Find:
    """The read marks of *groups* (and of every group) at or above *oldest*."""
    return Find(cluster, "seen", {"receiver_id": receiver_id, "group": {"$in": [*groups, ALL_GROUPS]},
                                  "read_time": {"$gte": oldest}}, deadline,
                projection={"_id": 0, "group": 1, "read_time": 1, "read_key": 1})


def highest_read_marks(docs: Sequence[Mapping[str, Any]]) -> dict[str, tuple[datetime, bytes]]:
    """The answer to :func:`read_marks_find`: each group's highest mark, as a sortable ``(time, key bytes)``."""
    marks: dict[str, tuple[datetime, bytes]] = {}
    for doc in docs:
        mine = (doc["read_time"], doc["read_key"].binary)
        marks[doc["group"]] = max(marks.get(doc["group"], mine), mine)
    return marks
