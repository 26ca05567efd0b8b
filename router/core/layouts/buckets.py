"""``buckets``: a receiver's copies grouped into documents of up to 50, the seed's most scalable inbox.

A bucket is one document in ``feed``::

    {_id, receiver_id, count, bytes, newest, oldest, items: [{_id, data_key, sender_id, event_time, type, data}, ...]}

**Appending** a copy is one ``update_one(..., upsert=True)``: into a bucket of the receiver
with room (``count`` under :data:`MAX_ITEMS`, ``bytes`` under :data:`MAX_BYTES` less the
copy's size) that holds neither the copy nor another copy of its ``data_key``; ``$push`` the
copy, ``$inc`` the two counters, ``$max``/``$min`` the time range. With no such bucket, the
upsert starts one. A unique index on ``items._id`` (``copy_id``) makes a second copy of the
same ``_id`` in another bucket a duplicate-key error (code 11000): reruns, redelivered
Celery batches and a backfill racing a fan-out store each copy once.

**Counters only grow.** ``count`` is slots used: a removed copy leaves its slot used, and an
edit that removes copies *seals* every bucket it touched (``count`` set to
:data:`MAX_ITEMS`), so no append ever goes to a bucket a copy left (an emptied bucket stays
empty; mongo-java-server cannot append to a bucket emptied under a unique index). ``bytes``
is an upper bound of the copies' size: an append adds the copy's size, an update adds the new
data's size (never subtracting the old), and a bucket without room for that refuses the
update (:class:`~router.errors.BucketsFull`) instead of growing past its cap; so no bucket
passes :data:`MAX_BYTES`, far below the 16 MiB document limit, except one holding a single
copy larger than that alone (an update there sets ``bytes`` to that copy's size).

**One copy of a key per bucket.** An append never puts a second copy of a ``data_key`` in a
bucket (only ``write_many`` can give one receiver two items of one key), so an edit by key
changes one copy per bucket it changes, and counts copies by counting buckets.

**Concurrent appends do not fragment.** A receiver's first bucket has an ``_id`` every
writer derives from the receiver (:func:`first_bucket`): two appends that both find no
bucket both start that one, one of them gets a duplicate key, reads back that its copy is
not stored, and appends again, now into the bucket the other started
(:attr:`~router.core.layouts.base.Layout.duplicates_prove_stored`). A later bucket is only
started when every bucket of the receiver is full; writers that do so at the same moment
start one each (the retry carries no shared ``_id``), but those then have room and take the
next appends, so a receiver has at most as many buckets with room as writers that appended
to it at once.

**What the server must do.** Other writers append to the same bucket, so the server must
apply one document's filter and update atomically, as MongoDB does. FerretDB v1 does not
(its update reads, changes and writes back the document in separate steps) and loses
concurrent appends: this layout is refused there when a period is created or a standby is
checked (:func:`router.admin.periods.layout_problem`) and by ``feedrouter check``.

**A page** reads the receiver's buckets newest first by ``newest`` (two at a time), and
serves items strictly after the cursor's position in ``(event_time, _id)`` order. Late
events make buckets' ranges overlap, so an item is served only once no unread bucket can
hold a newer one: after the first read, one ``count`` of the unread buckets whose ``newest``
reaches the page's last item proves it (no documents returned); if some can, more are read.
An append during the page raises its bucket's ``newest``, so the unread buckets are named
by what they are not (``_id`` not among the buckets read), never by a position in the
``newest`` order: a bucket that moves ahead between two finds is still unread, read by the
next find or counted by the proof (``newest`` only grows, ``oldest`` only shrinks). Each
find is taken to answer from one snapshot (MongoDB, FerretDB 2 and mongo-java-server do
for a find this small). In the usual case a page of 50 reads two buckets.

**Indexes** (:meth:`Buckets.indexes`): the page's ``{receiver_id, newest, _id}``; the unique
``copy_id``, partial on ``items._id`` existing (an emptied bucket has none, and a unique
index admits only one document without the field), ``{receiver_id, items._id}`` where the
collection is sharded on hashed ``receiver_id`` (migration 0001 on a mongos: a unique index
there must start with the shard key) and ``{items._id}`` elsewhere (mongo-java-server, which
ignores partial filters, would index an emptied bucket's missing ``items._id`` as null in
the compound form); and ``{items.data_key}`` for edits.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, ClassVar

import bson
from bson import ObjectId

from ...cursor import Position
from ...errors import BucketsFull
from ...model import FeedItem
from ..policy import deadline_in
from ..steps import Count, Delete, Failure, Find, Program, Request, Update, Upserts
from .base import EditSettings, Edited, IndexSpec, Inbox, Layout
from .queries import DIGEST, chunks, digest, in_steps, outside_clause
from .values import Copy, FanBatch

__all__ = ["Buckets", "MAX_BYTES", "MAX_ITEMS", "READ_AHEAD", "first_bucket"]

#: Copies a bucket takes at most.
MAX_ITEMS = 50
#: Bytes of copies (BSON) a bucket takes at most: half the 16 MiB document limit, leaving room for its other fields.
MAX_BYTES = 8 * 1024 * 1024
#: What a copy's fields other than its data take at most (data is held to 16 MiB less 64 KiB, for them).
_FIELDS_BOUND = 64 * 1024
#: Buckets one read of a page asks for.
READ_AHEAD = 2
_ORDER = (("newest", -1), ("_id", -1))
#: Buckets oldest first (an export, :meth:`Buckets.oldest_first`).
_OLDEST = (("oldest", 1), ("_id", 1))
#: What a read-back of copies needs of a bucket: each copy's identity, not its data (a bucket may hold 50 large ones).
_IDENTITY = {"receiver_id": 1, "items._id": 1, "items.data_key": 1, "items.sender_id": 1, "items.event_time": 1,
             "items.type": 1}
#: A copy unwound from its bucket, as a document of its own (``receiver_id`` is the bucket's).
_AS_COPY = {"_id": "$items._id", "data_key": "$items.data_key", "sender_id": "$items.sender_id",
            "event_time": "$items.event_time", "type": "$items.type", "data": "$items.data"}
#: What an edit that removes copies does besides: seal the bucket (no append goes where a copy left).
_SEAL = {"$max": {"count": MAX_ITEMS}}


_INT_FIRST = b"\xff\xff\xff\xfe"


def first_bucket(receiver_id: int | str) -> ObjectId:
    """The ``_id`` of *receiver_id*'s first bucket in a period: every writer derives the same one (a 64-bit receiver
    id as it is, behind a tag no router-made id starts with; any other id by a 96-bit hash: were two receivers to share
    one, the second would start its first bucket as it starts later ones)."""
    if type(receiver_id) is int and -(1 << 63) <= receiver_id < 1 << 63:
        return ObjectId(_INT_FIRST + receiver_id.to_bytes(8, "big", signed=True))
    return ObjectId(hashlib.blake2b(f"{type(receiver_id).__name__}:{receiver_id}".encode(), digest_size=12).digest())


#: What a bucket layout sends for one copy: its receiver, the copy as a bucket holds it, and that copy's BSON size.
_Slot = tuple[Any, dict[str, Any], int]


def _slots(rows: Sequence[tuple[ObjectId, Any, Any, datetime, Any, Any, str]]) -> list[_Slot]:
    """The slots of copies given as ``(id, receiver, sender, event_time, type, data, data_key)`` rows."""
    out: list[_Slot] = []
    sizes: dict[tuple[Any, ...], int] = {}  # lives for one batch, which keeps each data object alive
    for oid, receiver, sender, t, kind, data, key in rows:
        item = {"_id": oid, "data_key": key, "sender_id": sender, "event_time": t, "type": kind, "data": data}
        # A copy's BSON size depends only on these (its _id and event_time have fixed sizes).
        shape = (id(data), key, sender.__class__, sender, kind.__class__, kind)
        size = sizes.get(shape)
        if size is None:
            size = sizes[shape] = len(bson.encode(item))
        out.append((receiver, item, size))
    return out


def _append(slot: _Slot, again: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    receiver, item, size = slot
    t = item["event_time"]
    # "Not already holding this copy or its key" as $nor, not $ne: with $ne on an indexed array path DocumentDB may
    # plan a BitmapAnd over the RUM indexes, which crashes its backend under concurrent appends (docs/servers.md).
    match = {"receiver_id": receiver, "count": {"$lt": MAX_ITEMS}, "bytes": {"$lte": MAX_BYTES - size},
             "$nor": [{"items._id": item["_id"]}, {"items.data_key": item["data_key"]}]}
    update: dict[str, Any] = {"$push": {"items": item}, "$inc": {"count": 1, "bytes": size}, "$max": {"newest": t},
                              "$min": {"oldest": t}}
    if not again:
        update["$setOnInsert"] = {"_id": first_bucket(receiver)}
    return match, update


def _item(doc: Mapping[str, Any], receiver_id: int | str) -> FeedItem:
    return FeedItem(receiver_id=receiver_id, sender_id=doc["sender_id"], event_time=doc["event_time"], type=doc["type"],
                    data=doc["data"], data_key=doc["data_key"], id=doc["_id"])


def _data_size(data: Mapping[str, Any], mark: str) -> int:
    """What giving a copy *data* and its digest *mark* adds to its bucket's ``bytes`` at most (its old data is not
    subtracted)."""
    return len(bson.encode({"data": data, DIGEST: mark}))


def _redata(data: Mapping[str, Any], mark: str, size: int,
            match: Mapping[str, Any]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """The filters (*match* narrowed) and updates that give the copies picked by :func:`_the_key` new data and its
    digest (arrayFilters: the positional ``$`` with ``$elemMatch`` is refused by some servers).

    A bucket holding that copy alone (``count`` 1: one append, and no removal, which would have sealed it) gets
    ``bytes`` set to the copy's size, so a copy as large as a write takes is updated in place any number of times; a
    bucket shared with other copies is charged the new data's *size* (:func:`_data_size`), where it has room under
    :data:`MAX_BYTES`. (*mark* and *size* are computed once per call: the data may be near 16 MiB.)"""
    new = {"items.$[copy].data": data, f"items.$[copy].{DIGEST}": mark}
    return [({**match, "count": 1}, {"$set": {**new, "bytes": size + _FIELDS_BOUND}}),
            ({**match, "count": {"$gt": 1}, "bytes": {"$lte": MAX_BYTES - size}}, {"$set": new, "$inc": {"bytes": size}})]


def _the_key(data_key: str) -> list[dict[str, Any]]:
    return [{"copy.data_key": data_key}]


def _stale(data_key: str, mark: str) -> dict[str, Any]:
    return {"items": {"$elemMatch": {"data_key": data_key, DIGEST: {"$ne": mark}}}}


def _key(t: datetime, oid: ObjectId) -> tuple[datetime, bytes]:
    return t, oid.binary


def _buckets(receiver_id: int | str, *, read: Sequence[ObjectId], oldest_by: datetime | None = None,
             newest_from: datetime | None = None) -> dict[str, Any]:
    """The receiver's buckets other than those already *read* that hold something at or before *oldest_by* and
    reach *newest_from* (both only ever become true of a bucket: ``oldest`` only shrinks, ``newest`` only grows)."""
    match: dict[str, Any] = {"receiver_id": receiver_id}
    if oldest_by is not None:
        match["oldest"] = {"$lte": oldest_by}
    if newest_from is not None:
        match["newest"] = {"$gte": newest_from}
    if read:
        match["_id"] = {"$nin": list(read)}
    return match


def _walk(cluster: str, receiver_id: int | str, after: Position | None, need: int, types: tuple[int | str, ...],
          deadline: float, *, newest_first: bool) -> Program[Inbox | Failure]:
    """A page of the receiver's items past *after*, newest or oldest first (one walk for ``inbox`` and
    ``oldest_first``): buckets are read by their newest item (oldest first: by their oldest), and the page is served
    once no unread bucket can hold an item that comes before its last."""
    bound = _key(after.event_time, after.id) if after is not None else None
    edge = after.event_time if after is not None else None
    # Buckets that can hold an item past *after*; then, of those unread, one that can come before the page's last.
    within, reach = ("oldest_by", "newest_from") if newest_first else ("newest_from", "oldest_by")
    wanted = set(types)
    found: list[tuple[datetime, ObjectId, FeedItem]] = []
    read: list[ObjectId] = []
    while True:
        docs = yield Find(cluster, "feed", _buckets(receiver_id, read=read, **{within: edge}), deadline,
                          sort=_ORDER if newest_first else _OLDEST, limit=READ_AHEAD)
        if isinstance(docs, Failure):
            return docs
        for doc in docs:
            read.append(doc["_id"])
            for item in doc.get("items", ()):
                t, oid = item["event_time"], item["_id"]
                if bound is not None and ((_key(t, oid) >= bound) if newest_first else (_key(t, oid) <= bound)):
                    continue
                if not wanted or item["type"] in wanted:
                    found.append((t, oid, _item(item, receiver_id)))
        found.sort(key=lambda e: _key(e[0], e[1]), reverse=newest_first)
        if len(docs) < READ_AHEAD:  # every bucket read
            return Inbox(found[:need], len(found) > need)
        if len(found) >= need:
            match = _buckets(receiver_id, read=read, **{within: edge, reach: found[need - 1][0]})
            others = yield Count(cluster, "feed", match, deadline, limit=1)
            if isinstance(others, Failure):
                return others
            if not others:
                return Inbox(found[:need], True)


def _erase(cluster: str, match: Mapping[str, Any], steps: EditSettings, update: Mapping[str, Any] | None,
           counted: Callable[[Mapping[str, Any]], bool]) -> Program[Edited]:
    """Remove copies in steps of buckets: of those matching *match*, pull with *update* (None: delete the buckets),
    counting the copies *counted* picks out; *match* stops matching a bucket once it is changed."""
    done = 0
    size = max(1, steps.step // MAX_ITEMS)
    while True:
        deadline = deadline_in(steps.timeout)
        docs = yield Find(cluster, "feed", match, deadline, projection={"items.data_key": 1, "items.sender_id": 1},
                          limit=size)
        if isinstance(docs, Failure):
            return done, docs.error
        if not docs:
            return done, None
        target = {**match, "_id": {"$in": [d["_id"] for d in docs]}}
        answer = yield (Delete(cluster, "feed", target, deadline) if update is None
                        else Update(cluster, "feed", target, update, deadline))
        if isinstance(answer, Failure):
            return done, answer.error
        done += sum(1 for d in docs for i in d.get("items", ()) if counted(i))


class Buckets(Layout):
    """Up to :data:`MAX_ITEMS` copies of one receiver per document in ``feed``."""

    name: ClassVar[str] = "buckets"
    needs_atomic_updates: ClassVar[bool] = True
    duplicates_prove_stored: ClassVar[bool] = False

    # -- writes ---------------------------------------------------------------------------------
    def copy_documents(self, copies: Sequence[Copy]) -> list[Any]:
        return _slots([(c.id, c.receiver_id, c.sender_id, c.event_time, c.type, c.data, c.data_key) for c in copies])

    def item_documents(self, items: Sequence[FeedItem], ids: Sequence[ObjectId]) -> list[Any]:
        return _slots([(oid, i.receiver_id, i.sender_id, i.event_time, i.type, i.data, i.data_key)
                       for i, oid in zip(items, ids)])

    def fan_documents(self, batch: FanBatch) -> list[Any]:
        # Every copy of a post has the same size (one data object, key, sender and type): encoded once.
        sender, t, kind, data, key = batch.sender_id, batch.event_time, batch.type, batch.data, batch.data_key
        size = 0
        out: list[_Slot] = []
        for oid, receiver in zip(batch.ids, batch.receivers):
            item = {"_id": oid, "data_key": key, "sender_id": sender, "event_time": t, "type": kind, "data": data}
            if not size:
                size = len(bson.encode(item))
            out.append((receiver, item, size))
        return out

    def store(self, cluster: str, documents: Sequence[Any], deadline: float, *, again: bool = False) -> Request:
        return Upserts(cluster, "feed", [_append(slot, again) for slot in documents], deadline)

    def find_copies(self, cluster: str, copies: Sequence[Copy], deadline: float) -> Program[list[Copy] | Failure]:
        # By id alone, whatever the receiver: a duplicate may be another receiver's copy under the same id (a drawn id
        # that collided), which the unique copy_id index refuses too; read back under our receiver only, it would look
        # absent and be sent again, forever. (A rare path: only duplicates are read back.)
        wanted = {c.id: None for c in copies}
        docs = yield Find(cluster, "feed", {"items._id": {"$in": list(wanted)}}, deadline, projection=_IDENTITY)
        return docs if isinstance(docs, Failure) else [c for c in self.copies_of(docs) if c.id in wanted]

    def copies_of(self, documents: Iterable[Mapping[str, Any]]) -> list[Copy]:
        return [Copy(i["_id"], doc["receiver_id"], i["sender_id"], i["event_time"], i["type"], i.get("data"),
                     i["data_key"]) for doc in documents for i in doc.get("items", ())]

    def fix(self, cluster: str, data_key: str, ids: Sequence[ObjectId], data: Mapping[str, Any] | None,
            deadline: float) -> list[Request]:
        out: list[Request] = []
        mark = digest(data) if data is not None else ""
        size = _data_size(data, mark) if data is not None else 0
        for chunk in chunks(ids, beside=0 if data is None else len(bson.encode(data))):
            if data is None:  # (data_key first: its index finds the buckets)
                out.append(Update(cluster, "feed", {"items.data_key": data_key, "items._id": {"$in": chunk}},
                                  {"$pull": {"items": {"_id": {"$in": chunk}}}, **_SEAL}, deadline))
            else:
                match = {"items": {"$elemMatch": {"_id": {"$in": chunk}, "data_key": data_key, DIGEST: {"$ne": mark}}}}
                out += [Update(cluster, "feed", target, update, deadline, array_filters=_the_key(data_key))
                        for target, update in _redata(data, mark, size, match)]
        return out

    # -- reads ----------------------------------------------------------------------------------
    def inbox(self, cluster: str, receiver_id: int | str, position: Position | None, need: int,
              types: tuple[int | str, ...], deadline: float) -> Program[Inbox | Failure]:
        return (yield from _walk(cluster, receiver_id, position, need, types, deadline, newest_first=True))

    def newer(self, cluster: str, receiver_id: int | str, bound: Position | None, need: int,
              deadline: float) -> Program[list[tuple[datetime, ObjectId]] | Failure]:
        floor = _key(bound.event_time, bound.id) if bound is not None else None
        keys: list[tuple[datetime, ObjectId]] = []
        read: list[ObjectId] = []
        while len(keys) < need:
            match = _buckets(receiver_id, read=read, newest_from=bound.event_time if bound is not None else None)
            docs = yield Find(cluster, "feed", match, deadline, sort=_ORDER, limit=READ_AHEAD * 2,
                              projection={"newest": 1, "items._id": 1, "items.event_time": 1})
            if isinstance(docs, Failure):
                return docs
            for doc in docs:
                read.append(doc["_id"])
                keys.extend((i["event_time"], i["_id"]) for i in doc.get("items", ())
                            if floor is None or _key(i["event_time"], i["_id"]) > floor)
            if len(docs) < READ_AHEAD * 2:
                break
        keys.sort(key=lambda k: _key(*k), reverse=True)
        return keys[:need]

    def count_newer(self, cluster: str, receiver_id: int | str, bound: Position | None, limit: int,
                    deadline: float) -> Program[int | Failure]:
        keys = yield from self.newer(cluster, receiver_id, bound, limit, deadline)
        return keys if isinstance(keys, Failure) else len(keys)

    def copy_stream(self, receiver_id: int | str, start: datetime, end: datetime | None,
                    match: Mapping[str, Any]) -> list[dict[str, Any]]:
        # A bucket's newest and oldest bound its copies' times (newest only grows, oldest only shrinks), so the page
        # index {receiver_id, newest} picks the buckets that may hold the range; the copies are then unwound.
        buckets: dict[str, Any] = {"receiver_id": receiver_id, "newest": {"$gte": start}}
        times = {"$gte": start}
        if end is not None:
            buckets["oldest"] = {"$lt": end}
            times["$lt"] = end
        return [{"$match": buckets}, {"$unwind": "$items"}, {"$project": _AS_COPY},
                {"$match": {"event_time": times, **match}}]

    # -- edits ----------------------------------------------------------------------------------
    def edit_key(self, cluster: str, data_key: str, data: Mapping[str, Any] | None, steps: EditSettings, *,
                 what: str) -> Program[Edited]:
        # Counted in buckets changed, which is copies changed: a bucket holds at most one copy of a key.
        if data is None:
            return (yield from in_steps(cluster, "feed", {"items.data_key": data_key}, steps,
                                        update={"$pull": {"items": {"data_key": data_key}}, **_SEAL}, what=what))
        # Matched on the data's digest, not the data, which would make the statement carry it twice.
        done = 0
        mark = digest(data)
        size = _data_size(data, mark)
        for match, update in _redata(data, mark, size, _stale(data_key, mark)):
            changed, error = yield from in_steps(cluster, "feed", match, steps, update=update,
                                                 array_filters=_the_key(data_key), what=what)
            done += changed
            if error is not None:
                return done, error
        # Copies left with old data in shared buckets without room for the new. (A copy a running fan-out writes
        # meanwhile, in a bucket with room, is the fence's to fix, as in every layout.)
        full = {**_stale(data_key, mark), "count": {"$gt": 1}, "bytes": {"$gt": MAX_BYTES - size}}
        left = yield Count(cluster, "feed", full, deadline_in(steps.timeout))
        if isinstance(left, Failure):
            return done, left.error
        if left:
            return done, BucketsFull(cluster, data_key, int(left), size)
        return done, None

    def remove_sender(self, cluster: str, receiver_id: int | str, sender_id: int | str, steps: EditSettings) -> Program[Edited]:
        match = {"receiver_id": receiver_id, "items.sender_id": sender_id}
        docs = yield Find(cluster, "feed", match, deadline_in(steps.timeout), projection={"items.sender_id": 1})
        if isinstance(docs, Failure):
            return 0, docs.error
        copies = sum(1 for d in docs for i in d.get("items", ()) if i.get("sender_id") == sender_id)
        _, error = yield from in_steps(cluster, "feed", match, steps,
                                       update={"$pull": {"items": {"sender_id": sender_id}}, **_SEAL}, what="unfollow")
        return copies, error

    # -- a user's data --------------------------------------------------------------------------
    def remove_sent(self, cluster: str, sender_id: int | str, keys: Sequence[str], steps: EditSettings) -> Program[Edited]:
        wanted = set(keys)
        mine = {"data_key": {"$in": list(keys)}, "sender_id": sender_id}
        return (yield from _erase(cluster, {"items": {"$elemMatch": mine}}, steps, {"$pull": {"items": mine}, **_SEAL},
                                  lambda i: i.get("sender_id") == sender_id and i.get("data_key") in wanted))

    def remove_received(self, cluster: str, receiver_id: int | str, steps: EditSettings) -> Program[Edited]:
        return (yield from _erase(cluster, {"receiver_id": receiver_id}, steps, None, lambda _i: True))

    def oldest_first(self, cluster: str, receiver_id: int | str, after: Position | None, need: int,
                     deadline: float) -> Program[Inbox | Failure]:
        return (yield from _walk(cluster, receiver_id, after, need, (), deadline, newest_first=False))

    def sent_copy(self, cluster: str, sender_id: int | str, data_key: str, deadline: float, *,
                  at: datetime | None = None) -> Program[FeedItem | None | Failure]:
        mine = {"data_key": data_key, "sender_id": sender_id, **({"event_time": at} if at is not None else {})}
        docs = yield Find(cluster, "feed", {"items": {"$elemMatch": mine}}, deadline, limit=1)
        if isinstance(docs, Failure):
            return docs
        items = [i for d in docs for i in d.get("items", ()) if all(i.get(k) == v for k, v in mine.items())]
        return _item(items[0], docs[0]["receiver_id"]) if items else None

    # -- operators ------------------------------------------------------------------------------
    def indexes(self, *, sharded: bool = False) -> list[IndexSpec]:
        copy_keys = (("receiver_id", 1), ("items._id", 1)) if sharded else (("items._id", 1),)
        return [
            IndexSpec("receiver_newest_id", (("receiver_id", 1), ("newest", -1), ("_id", -1))),
            IndexSpec("copy_id", copy_keys, unique=True, partial=(("items._id", {"$exists": True}),)),
            IndexSpec("items_data_key", (("items.data_key", 1),)),
        ]

    def outside(self, start: datetime | None, end: datetime | None) -> tuple[dict[str, Any], str]:
        # By the copies themselves: a bucket's oldest and newest never shrink, so they still hold a deleted copy's time
        # (the latest time reported is the bucket's newest).
        return outside_clause(start, end, earliest="items.event_time", latest="items.event_time"), "newest"
