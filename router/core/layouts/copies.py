"""``copies``: one document per copy, the router's first layout (and the default).

A copy is stored as exactly ``{_id, data_key, receiver_id, sender_id, event_time, type,
data}`` in ``feed``, built here from a :class:`~.values.Copy` (or a batch of them) and read
back here; an update adds ``data_digest`` (:func:`~.queries.key_edit`). A page is one
index-ordered ``find`` on ``{receiver_id: 1, event_time: -1, _id: -1}``; a delete or update
by key walks the ``{data_key: 1, _id: 1}`` index in bounded steps (:func:`~.queries.in_steps`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, ClassVar

from bson import ObjectId

from ...cursor import Position
from ...model import FeedItem, stored_item
from ..steps import Count, Failure, Find, Insert, Program, Request
from .base import EditSettings, Edited, IndexSpec, Inbox, Landed, Layout
from .queries import PAGE_SORT, fix_requests, in_steps, key_edit, newer_than, older_than, outside_clause
from .values import Copy, FanBatch

__all__ = ["Copies"]

#: The order of an export (the page index, walked backwards).
_OLDEST_FIRST = (("event_time", 1), ("_id", 1))


def _entries(docs: Iterable[Mapping[str, Any]]) -> list[tuple[datetime, ObjectId, FeedItem]]:
    """Stored copies as a page's entries, ``(event_time, _id, item)``: one comprehension, each item built through its
    slots (:func:`~router.model.stored_item`: building FeedItems was a tenth of a page's work in the core)."""
    return [(d["event_time"], d["_id"], stored_item(
        d["receiver_id"], d["sender_id"], d["event_time"], d["type"], d["data"], d["data_key"], d["_id"])) for d in docs]


# The bulk builders below are the hot paths' (write_many, fan-out): one comprehension a batch, the dict literal
# inline (a call per item cost about 0.12 us of the write path's 4.7 us an item in two paired runs).


class Copies(Layout):
    """One document per copy in ``feed``: the default layout."""

    name: ClassVar[str] = "copies"

    def copy_documents(self, copies: Sequence[Copy]) -> list[Any]:
        return [{"_id": c.id, "data_key": c.data_key, "receiver_id": c.receiver_id, "sender_id": c.sender_id,
                 "event_time": c.event_time, "type": c.type, "data": c.data} for c in copies]

    def item_documents(self, items: Sequence[FeedItem], ids: Sequence[ObjectId]) -> list[Any]:
        return [{"_id": oid, "data_key": item.data_key, "receiver_id": item.receiver_id, "sender_id": item.sender_id,
                 "event_time": item.event_time, "type": item.type, "data": item.data} for item, oid in zip(items, ids)]

    def fan_documents(self, batch: FanBatch) -> list[Any]:
        sender, t, kind, data, key = batch.sender_id, batch.event_time, batch.type, batch.data, batch.data_key
        return [{"_id": oid, "data_key": key, "receiver_id": receiver, "sender_id": sender, "event_time": t,
                 "type": kind, "data": data} for oid, receiver in zip(batch.ids, batch.receivers)]

    def store(self, cluster: str, documents: Sequence[Any], deadline: float, *, again: bool = False) -> Request:
        return Insert(cluster, "feed", documents, deadline)

    def find_copies(self, cluster: str, copies: Sequence[Copy], deadline: float) -> Program[list[Copy] | Failure]:
        docs = yield Find(cluster, "feed", {"_id": {"$in": [c.id for c in copies]}}, deadline)
        return docs if isinstance(docs, Failure) else self.copies_of(docs)

    def copies_by_id(self, cluster: str, receiver_id: int | str, ids: Sequence[ObjectId],
                     deadline: float) -> Program[list[Copy] | Failure]:
        docs = yield Find(cluster, "feed", {"_id": {"$in": list(ids)}, "receiver_id": receiver_id}, deadline)
        return docs if isinstance(docs, Failure) else self.copies_of(docs)

    def copies_of(self, documents: Iterable[Mapping[str, Any]]) -> list[Copy]:
        return [Copy(d["_id"], d["receiver_id"], d["sender_id"], d["event_time"], d["type"], d.get("data"),
                     d["data_key"]) for d in documents]

    def fix(self, cluster: str, data_key: str, ids: Sequence[ObjectId], data: Mapping[str, Any] | None,
            deadline: float) -> list[Request]:
        return fix_requests(cluster, "feed", data_key, ids, data, deadline)

    def inbox(self, cluster: str, receiver_id: int | str, position: Position | None, need: int,
              types: tuple[int | str, ...], deadline: float) -> Program[Inbox | Failure]:
        only = {"type": {"$in": list(types)}} if types else {}
        docs = yield Find(cluster, "feed", {"receiver_id": receiver_id, **only, **older_than(position)}, deadline,
                          sort=PAGE_SORT, limit=need)
        if isinstance(docs, Failure):
            return docs
        return Inbox(_entries(docs), len(docs) == need)

    def newer(self, cluster: str, receiver_id: int | str, bound: Position | None, need: int,
              deadline: float) -> Program[list[tuple[datetime, ObjectId]] | Failure]:
        docs = yield Find(cluster, "feed", {"receiver_id": receiver_id, **newer_than(bound)}, deadline, sort=PAGE_SORT,
                          limit=need, projection={"_id": 1, "event_time": 1})
        if isinstance(docs, Failure):
            return docs
        return [(d["event_time"], d["_id"]) for d in docs]

    def count_newer(self, cluster: str, receiver_id: int | str, bound: Position | None, limit: int,
                    deadline: float) -> Program[int | Failure]:
        answer = yield Count(cluster, "feed", {"receiver_id": receiver_id, **newer_than(bound)}, deadline, limit=limit)
        return answer if isinstance(answer, Failure) else int(answer)

    def copy_stream(self, receiver_id: int | str, start: datetime, end: datetime | None,
                    match: Mapping[str, Any]) -> list[dict[str, Any]]:
        # The page index's (receiver_id, event_time) prefix bounds the scan to the receiver's range of time.
        times = {"$gte": start, **({"$lt": end} if end is not None else {})}
        return [{"$match": {"receiver_id": receiver_id, "event_time": times, **match}}]

    def edit_key(self, cluster: str, data_key: str, data: Mapping[str, Any] | None, steps: EditSettings, *,
                 what: str, landed: Landed | None = None) -> Program[Edited]:
        match, update = key_edit(data_key, data)  # (in place: a copy is a document of its own, never written anew)
        return (yield from in_steps(cluster, "feed", match, steps, update=update, what=what, at_once=data is None))

    def remove_sender(self, cluster: str, receiver_id: int | str, sender_id: int | str, steps: EditSettings) -> Program[Edited]:
        # The page index's receiver_id prefix serves this query (see migrations/0002).
        match = {"receiver_id": receiver_id, "sender_id": sender_id}
        return (yield from in_steps(cluster, "feed", match, steps, what="unfollow"))

    # -- a user's data --------------------------------------------------------------------------
    def remove_sent(self, cluster: str, sender_id: int | str, keys: Sequence[str], steps: EditSettings) -> Program[Edited]:
        # The data_key index finds the keys' copies; the sender is checked on those (a key is one sender's, mostly).
        match = {"data_key": {"$in": list(keys)}, "sender_id": sender_id}
        return (yield from in_steps(cluster, "feed", match, steps, what="erase (sent)"))

    def remove_received(self, cluster: str, receiver_id: int | str, steps: EditSettings) -> Program[Edited]:
        return (yield from in_steps(cluster, "feed", {"receiver_id": receiver_id}, steps, what="erase (received)"))

    def oldest_first(self, cluster: str, receiver_id: int | str, after: Position | None, need: int,
                     deadline: float) -> Program[Inbox | Failure]:
        docs = yield Find(cluster, "feed", {"receiver_id": receiver_id, **newer_than(after)}, deadline,
                          sort=_OLDEST_FIRST, limit=need)
        if isinstance(docs, Failure):
            return docs
        return Inbox(_entries(docs), len(docs) == need)

    def sent_copy(self, cluster: str, sender_id: int | str, data_key: str, deadline: float, *,
                  at: datetime | None = None) -> Program[FeedItem | None | Failure]:
        match = {"data_key": data_key, "sender_id": sender_id, **({"event_time": at} if at is not None else {})}
        docs = yield Find(cluster, "feed", match, deadline, limit=1)
        if isinstance(docs, Failure):
            return docs
        return _entries(docs[:1])[0][2] if docs else None

    def indexes(self, *, sharded: bool = False) -> list[IndexSpec]:
        return [
            IndexSpec("receiver_time_id", (("receiver_id", 1), ("event_time", -1), ("_id", -1))),
            IndexSpec("data_key_id", (("data_key", 1), ("_id", 1))),
        ]

    def outside(self, start: datetime | None, end: datetime | None) -> tuple[dict[str, Any], str]:
        return outside_clause(start, end, earliest="event_time", latest="event_time"), "event_time"
