"""``buckets``: a receiver's copies grouped into documents of up to 50, the seed's most scalable inbox.

A bucket is one document in ``feed``::

    {_id, receiver_id, count, bytes, newest, oldest, items: [{_id, data_key, sender_id, event_time, type, data}, ...]}

**Appending** a copy is one ``update_one(..., upsert=True)``: into a bucket of the receiver
with room (``count`` under :data:`MAX_ITEMS`, ``bytes`` under :data:`MAX_BYTES` less the
copy's size) that does not hold the copy already; ``$push`` the copy, ``$inc`` the two
counters, ``$max``/``$min`` the time range. With no such bucket, the upsert starts one. A
unique index on ``items._id`` makes a second copy of the same ``_id`` in another bucket a
duplicate-key error (code 11000), which the core reads as "stored already": reruns,
redelivered Celery batches and a backfill racing a fan-out store each copy once. The
counters only grow (a removed copy leaves its slot used), so no bucket passes either cap,
and :data:`MAX_BYTES` keeps every bucket far below the 16 MiB document limit (one copy
larger than that sits alone in its own bucket).

**What the server must do.** Other writers append to the same bucket, so the server must
apply one document's filter and update atomically, as MongoDB does. FerretDB v1 does not
(its update reads, changes and writes back the document in separate steps) and loses
concurrent appends: this layout is refused there when a period is created
(:func:`router.admin.periods.layout_problem`) and by ``feedrouter check``.

**A page** reads the receiver's buckets newest first by ``newest`` (two at a time), and
serves items strictly after the cursor's position in ``(event_time, _id)`` order. Late
events make buckets' ranges overlap, so an item is served only once no unread bucket can
hold a newer one: after the first read, one ``count`` of the unread buckets whose ``newest``
reaches the page's last item proves it (no documents returned); if some can, more are read.
In the usual case a page of 50 reads two buckets.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, ClassVar

import bson
from bson import ObjectId

from ...cursor import Position
from ...model import FeedItem
from ..policy import deadline_in
from ..steps import Count, Failure, Find, Program, Request, Update, Upserts
from .base import EditSettings, Edited, Entry, IndexSpec, Inbox, Layout, outside_clause
from .copies import DIGEST, chunks, digest, in_steps, item_of

__all__ = ["Buckets", "MAX_BYTES", "MAX_ITEMS", "READ_AHEAD"]

#: Copies a bucket takes at most.
MAX_ITEMS = 50
#: Bytes of copies (BSON) a bucket takes at most: half the 16 MiB document limit, leaving room for its other fields.
MAX_BYTES = 8 * 1024 * 1024
#: Buckets one read of a page asks for.
READ_AHEAD = 2
_ORDER = (("newest", -1), ("_id", -1))


def _item(entry: Entry) -> dict[str, Any]:
    return {"_id": entry["_id"], "data_key": entry["data_key"], "sender_id": entry["sender_id"],
            "event_time": entry["event_time"], "type": entry["type"], "data": entry["data"]}


def _append(entry: Entry) -> tuple[dict[str, Any], dict[str, Any]]:
    item = _item(entry)
    size = len(bson.encode(item))
    t = entry["event_time"]
    match = {"receiver_id": entry["receiver_id"], "count": {"$lt": MAX_ITEMS}, "bytes": {"$lte": MAX_BYTES - size},
             "items._id": {"$ne": entry["_id"]}}
    update = {"$push": {"items": item}, "$inc": {"count": 1, "bytes": size}, "$max": {"newest": t}, "$min": {"oldest": t}}
    return match, update


def _redata(data: Mapping[str, Any], mark: str) -> dict[str, Any]:
    """The update that gives the copies picked by :func:`_the_key` new data and its digest *mark* (arrayFilters: the
    positional ``$`` with ``$elemMatch`` is refused by some servers)."""
    return {"$set": {"items.$[copy].data": data, f"items.$[copy].{DIGEST}": mark}}


def _the_key(data_key: str) -> list[dict[str, Any]]:
    return [{"copy.data_key": data_key}]


def _key(t: datetime, oid: ObjectId) -> tuple[datetime, bytes]:
    return t, oid.binary


def _buckets(receiver_id: int | str, *, after: Mapping[str, Any] | None, oldest_by: datetime | None = None,
             newest_from: datetime | None = None) -> dict[str, Any]:
    """The receiver's buckets after the bucket *after* in read order (newest desc, _id desc; all when None) that hold
    something at or before *oldest_by* and reach *newest_from*."""
    match: dict[str, Any] = {"receiver_id": receiver_id}
    if oldest_by is not None:
        match["oldest"] = {"$lte": oldest_by}
    if newest_from is not None:
        match["newest"] = {"$gte": newest_from}
    if after is not None:
        match["$or"] = [{"newest": {"$lt": after["newest"]}}, {"newest": after["newest"], "_id": {"$lt": after["_id"]}}]
    return match


class Buckets(Layout):
    """Up to :data:`MAX_ITEMS` copies of one receiver per document in ``feed``."""

    name: ClassVar[str] = "buckets"
    needs_atomic_updates: ClassVar[bool] = True

    # -- writes ---------------------------------------------------------------------------------
    def store(self, cluster: str, entries: Sequence[Entry], deadline: float) -> Request:
        return Upserts(cluster, "feed", [_append(e) for e in entries], deadline)

    def lookup(self, cluster: str, ids: Sequence[ObjectId], deadline: float) -> Find:
        return Find(cluster, "feed", {"items._id": {"$in": list(ids)}}, deadline, projection={"receiver_id": 1, "items": 1})

    def looked_up(self, docs: Sequence[Mapping[str, Any]], ids: Sequence[ObjectId]) -> list[Entry]:
        wanted = set(ids)
        return [{**item, "receiver_id": doc["receiver_id"]} for doc in docs for item in doc.get("items", ())
                if item.get("_id") in wanted]

    def fix(self, cluster: str, data_key: str, ids: Sequence[ObjectId], data: Mapping[str, Any] | None,
            deadline: float) -> list[Request]:
        out: list[Request] = []
        mark = digest(data) if data is not None else ""
        for chunk in chunks(ids, beside=0 if data is None else len(bson.encode(data))):
            if data is None:
                out.append(Update(cluster, "feed", {"items._id": {"$in": chunk}},
                                  {"$pull": {"items": {"_id": {"$in": chunk}}}}, deadline))
            else:
                match = {"items": {"$elemMatch": {"_id": {"$in": chunk}, "data_key": data_key, DIGEST: {"$ne": mark}}}}
                out.append(Update(cluster, "feed", match, _redata(data, mark), deadline, array_filters=_the_key(data_key)))
        return out

    # -- reads ----------------------------------------------------------------------------------
    def inbox(self, cluster: str, receiver_id: int | str, position: Position | None, need: int,
              types: tuple[int | str, ...], deadline: float) -> Program[Inbox | Failure]:
        bound = _key(position.event_time, position.id) if position is not None else None
        oldest_by = position.event_time if position is not None else None
        wanted = set(types)
        found: list[tuple[datetime, ObjectId, FeedItem]] = []
        last: Mapping[str, Any] | None = None
        while True:
            docs = yield Find(cluster, "feed", _buckets(receiver_id, after=last, oldest_by=oldest_by), deadline,
                              sort=_ORDER, limit=READ_AHEAD)
            if isinstance(docs, Failure):
                return docs
            for doc in docs:
                for item in doc.get("items", ()):
                    t, oid = item["event_time"], item["_id"]
                    if (bound is None or _key(t, oid) < bound) and (not wanted or item["type"] in wanted):
                        found.append((t, oid, item_of(item, receiver_id)))
            found.sort(key=lambda e: _key(e[0], e[1]), reverse=True)
            if len(docs) < READ_AHEAD:  # every bucket read
                return Inbox(found[:need], len(found) > need)
            last = docs[-1]
            if len(found) >= need:
                # Could an unread bucket hold an item above the page's last? Only one whose newest reaches it.
                match = _buckets(receiver_id, after=last, oldest_by=oldest_by, newest_from=found[need - 1][0])
                others = yield Count(cluster, "feed", match, deadline, limit=1)
                if isinstance(others, Failure):
                    return others
                if not others:
                    return Inbox(found[:need], True)

    def newer(self, cluster: str, receiver_id: int | str, bound: Position | None, need: int,
              deadline: float) -> Program[list[tuple[datetime, ObjectId]] | Failure]:
        floor = _key(bound.event_time, bound.id) if bound is not None else None
        keys: list[tuple[datetime, ObjectId]] = []
        last: Mapping[str, Any] | None = None
        while len(keys) < need:
            match = _buckets(receiver_id, after=last, newest_from=bound.event_time if bound is not None else None)
            docs = yield Find(cluster, "feed", match, deadline, sort=_ORDER, limit=READ_AHEAD * 2,
                              projection={"newest": 1, "items._id": 1, "items.event_time": 1})
            if isinstance(docs, Failure):
                return docs
            for doc in docs:
                keys.extend((i["event_time"], i["_id"]) for i in doc.get("items", ())
                            if floor is None or _key(i["event_time"], i["_id"]) > floor)
            if len(docs) < READ_AHEAD * 2:
                break
            last = docs[-1]
        keys.sort(key=lambda k: _key(*k), reverse=True)
        return keys[:need]

    def count_newer(self, cluster: str, receiver_id: int | str, bound: Position | None, limit: int,
                    deadline: float) -> Program[int | Failure]:
        keys = yield from self.newer(cluster, receiver_id, bound, limit, deadline)
        return keys if isinstance(keys, Failure) else len(keys)

    # -- edits ----------------------------------------------------------------------------------
    def edit_key(self, cluster: str, data_key: str, data: Mapping[str, Any] | None, steps: EditSettings, *,
                 what: str) -> Program[Edited]:
        # Counted in buckets changed: that is copies changed, since fan-out gives a receiver one copy of a key (only
        # write_many can give one receiver two items of one key, which would count once).
        if data is None:
            return (yield from in_steps(cluster, "feed", {"items.data_key": data_key}, steps,
                                        update={"$pull": {"items": {"data_key": data_key}}}, what=what))
        mark = digest(data)  # matched instead of the data, which would make the statement carry it twice
        match = {"items": {"$elemMatch": {"data_key": data_key, DIGEST: {"$ne": mark}}}}
        return (yield from in_steps(cluster, "feed", match, steps, update=_redata(data, mark),
                                    array_filters=_the_key(data_key), what=what))

    def remove_sender(self, cluster: str, receiver_id: int | str, sender_id: int | str, steps: EditSettings) -> Program[Edited]:
        match = {"receiver_id": receiver_id, "items.sender_id": sender_id}
        docs = yield Find(cluster, "feed", match, deadline_in(steps.timeout), projection={"items.sender_id": 1})
        if isinstance(docs, Failure):
            return 0, docs.error
        copies = sum(1 for d in docs for i in d.get("items", ()) if i.get("sender_id") == sender_id)
        _, error = yield from in_steps(cluster, "feed", match, steps, update={"$pull": {"items": {"sender_id": sender_id}}},
                                       what="unfollow")
        return copies, error

    # -- operators ------------------------------------------------------------------------------
    def indexes(self) -> list[IndexSpec]:
        return [
            IndexSpec("receiver_newest_id", (("receiver_id", 1), ("newest", -1), ("_id", -1))),
            IndexSpec("items_id", (("items._id", 1),), unique=True),
            IndexSpec("items_data_key", (("items.data_key", 1),)),
        ]

    def outside(self, start: datetime | None, end: datetime | None) -> tuple[dict[str, Any], str]:
        return outside_clause(start, end, earliest="oldest", latest="newest"), "newest"
