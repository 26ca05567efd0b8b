"""``buckets``: a receiver's copies grouped into documents of up to 50, the seed's most scalable inbox.

A bucket is one document in ``feed``::

    {_id, receiver_id, count, bytes, newest, oldest, items: [{_id, data_key, sender_id, event_time, type, data, n, d},
     ...], [moved: [{_id, event_time, at}, ...]]}

(a copy as a bucket holds it, its charges ``n`` and ``d``, a copy on the move and the
``moved`` stubs: :mod:`.bucket_items`; the edits: :mod:`.bucket_edits`).

**Appending** a copy is one ``update_one(..., upsert=True)``: into a bucket of the receiver
with room (``count`` under :data:`MAX_ITEMS`, ``bytes`` under :data:`MAX_BYTES` less the
copy's size) that holds neither the copy nor another copy of its ``data_key``, and is not
emptied; ``$push`` the copy, ``$inc`` the two counters, ``$max``/``$min`` the time range.
With no such bucket, the upsert starts one. A unique index on ``items._id`` (``copy_id``)
makes a second copy of the same ``_id`` in another bucket a duplicate-key error (code
11000): reruns, redelivered Celery batches and a backfill racing a fan-out store each copy
once.

**Counters follow the copies.** ``count`` is the copies a bucket holds and ``bytes`` the sum
of their charges (each copy's BSON size): both go down when a copy leaves (a delete, an
unfollow, an erasure) or its data shrinks, so later appends fill the room. An update whose
data no longer fits the bucket moves the copy to one with room (or a new one), once however
often it is run; so no bucket passes :data:`MAX_BYTES`, far below the 16 MiB document limit,
except one holding a single copy larger than that alone. (Buckets written before charges:
their copies are charged nothing when they leave, so their counters stay upper bounds.)

**One copy of a key per bucket.** An append or a move never puts a second copy of a
``data_key`` in a bucket (only ``write_many`` can give one receiver two items of one key),
so an edit by key changes one copy per bucket it changes, and counts copies by counting
buckets.

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
next find or counted by the proof (``newest`` only grows, ``oldest`` only shrinks). That
holds inside one find too: two buckets past 16 MiB (a copy of 15 MiB) come back in two
finds, and the second asks for the buckets not yet received (the find's ``moving``), not
for those after the first in the ``newest`` order, which an append between the two can
leave behind. Each find is taken to answer from one snapshot (MongoDB, FerretDB 2 and
mongo-java-server do for a find this small). In the usual case a page of 50 reads two buckets. A copy moving
between buckets while a page reads them is served once (:class:`.bucket_items.Gathered`):
a read that finds only the stub it left in a bucket asks for it by id, one ``find`` more.

**Indexes** (:meth:`Buckets.indexes`): the page's ``{receiver_id, newest, _id}``; the unique
``copy_id``, partial on ``items._id`` existing (an emptied bucket has none, and a unique
index admits only one document without the field), ``{receiver_id, items._id}`` where the
collection is sharded on hashed ``receiver_id`` (migration 0001 on a mongos: a unique index
there must start with the shard key) and ``{items._id}`` elsewhere (mongo-java-server, which
ignores partial filters, would index an emptied bucket's missing ``items._id`` as null in
the compound form); and ``{items.data_key}`` for edits.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, ClassVar

from bson import ObjectId

from ...cursor import Position
from ...model import FeedItem
from ..policy import deadline_in
from ..steps import Count, Delete, Failure, Find, Program, Request, Update, Upserts
from .bucket_edits import delete_key, fix_copies, remove_picked, update_key
from .base import EditSettings, Edited, IndexSpec, Inbox, Landed, Layout
from .bucket_items import (CHARGE, DATA_CHARGE, MAX_BYTES, MAX_ITEMS, MOVED, MOVING, Gathered, append, charge, copy_id,
                           data_charge, feed_item, first_bucket, resolve, slots)
from .queries import outside_clause
from .values import Copy, FanBatch

__all__ = ["Buckets", "MAX_BYTES", "MAX_ITEMS", "READ_AHEAD", "first_bucket"]

#: Buckets one read of a page asks for.
READ_AHEAD = 2
_ORDER = (("newest", -1), ("_id", -1))
#: Buckets oldest first (an export, :meth:`Buckets.oldest_first`).
_OLDEST = (("oldest", 1), ("_id", 1))
#: What a read-back of copies needs of a bucket: each copy's identity, not its data (a bucket may hold 50 large ones).
_IDENTITY = {"receiver_id": 1, "items._id": 1, f"items.{MOVING}": 1, "items.data_key": 1, "items.sender_id": 1,
             "items.event_time": 1, "items.type": 1}
#: What counting copies needs of a bucket: the copies' and stubs' ids and times.
_KEYS = {"newest": 1, "items._id": 1, f"items.{MOVING}": 1, "items.event_time": 1, f"{MOVED}._id": 1,
         f"{MOVED}.event_time": 1}
#: A copy unwound from its bucket, as a document of its own (``receiver_id`` is the bucket's; one marked as moving is
#: the copy it names).
_AS_COPY = {"_id": {"$ifNull": [f"$items.{MOVING}", "$items._id"]}, "data_key": "$items.data_key",
            "sender_id": "$items.sender_id", "event_time": "$items.event_time", "type": "$items.type",
            "data": "$items.data"}


#: A copy a walk found: its time, its id, and the bucket's element.
_Entry = tuple[datetime, ObjectId, Mapping[str, Any]]


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
    gathered = Gathered()  # each copy once, even one moving between the buckets meanwhile
    read: list[ObjectId] = []

    def before(a: tuple[datetime, bytes], b: tuple[datetime, bytes]) -> bool:  # a comes before b in the walk's order
        return a > b if newest_first else a < b

    def entries() -> list[_Entry]:
        out = [(e["event_time"], oid, e) for oid, (e, _moving) in gathered.copies.items()
               if (bound is None or before(bound, _key(e["event_time"], oid))) and (not wanted or e["type"] in wanted)]
        out.sort(key=lambda x: _key(x[0], x[1]), reverse=newest_first)
        return out

    def served(found: list[_Entry]) -> Program[list[_Entry] | Failure]:
        """*found*, with the copies that moved out of a bucket read to one read before they arrived (asked by id)."""
        last = _key(found[need - 1][0], found[need - 1][1]) if len(found) >= need else None
        lost = [oid for oid, t in gathered.lost().items() if (bound is None or before(bound, _key(t, oid)))
                and (last is None or not before(last, _key(t, oid)))]
        if not lost:
            return found
        docs = yield from resolve(cluster, receiver_id, lost, deadline)
        if isinstance(docs, Failure):
            return docs
        for doc in docs:
            gathered.add(doc, only=lost)
        return entries()

    while True:
        docs = yield Find(cluster, "feed", _buckets(receiver_id, read=read, **{within: edge}), deadline,
                          sort=_ORDER if newest_first else _OLDEST, limit=READ_AHEAD, moving=True)
        if isinstance(docs, Failure):
            return docs
        for doc in docs:
            read.append(doc["_id"])
            gathered.add(doc)
        found = entries()
        every = len(docs) < READ_AHEAD  # every bucket read
        complete = every
        if not every and len(found) >= need:
            match = _buckets(receiver_id, read=read, **{within: edge, reach: found[need - 1][0]})
            others = yield Count(cluster, "feed", match, deadline, limit=1)
            if isinstance(others, Failure):
                return others
            complete = not others
        if complete:
            page = yield from served(found)
            if isinstance(page, Failure):
                return page
            return Inbox([(t, oid, feed_item(e, receiver_id)) for t, oid, e in page[:need]], len(page) > need or not every)


def _erase(cluster: str, match: Mapping[str, Any], steps: EditSettings, update: Mapping[str, Any] | None,
           counted: Callable[[Mapping[str, Any]], bool]) -> Program[Edited]:
    """Remove copies in steps of buckets: of those matching *match*, pull with *update* (None: delete the buckets),
    counting the copies *counted* picks out; *match* stops matching a bucket once it is changed.

    What is counted is what this call's statements changed, not what its find saw: the buckets found are edited in
    groups of the same number of counted copies, one statement per group, and each group counts that number per
    bucket the server says it changed. A bucket another erasure of the same user changed first no longer matches, so
    two erasures at once count each copy once between them (a step usually holds one or two such groups)."""
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
        by_count: dict[int, list[Any]] = {}
        for d in docs:
            by_count.setdefault(sum(1 for i in d.get("items", ()) if counted(i)), []).append(d["_id"])
        for copies, ids in sorted(by_count.items()):
            target = {**match, "_id": {"$in": ids}}
            answer = yield (Delete(cluster, "feed", target, deadline) if update is None
                            else Update(cluster, "feed", target, update, deadline))
            if isinstance(answer, Failure):
                return done, answer.error
            done += copies * (answer if isinstance(answer, int) else answer.modified)


class Buckets(Layout):
    """Up to :data:`MAX_ITEMS` copies of one receiver per document in ``feed``."""

    name: ClassVar[str] = "buckets"
    needs_atomic_updates: ClassVar[bool] = True
    duplicates_prove_stored: ClassVar[bool] = False

    # -- writes ---------------------------------------------------------------------------------
    def copy_documents(self, copies: Sequence[Copy]) -> list[Any]:
        return slots([(c.id, c.receiver_id, c.sender_id, c.event_time, c.type, c.data, c.data_key) for c in copies])

    def item_documents(self, items: Sequence[FeedItem], ids: Sequence[ObjectId]) -> list[Any]:
        return slots([(oid, i.receiver_id, i.sender_id, i.event_time, i.type, i.data, i.data_key)
                      for i, oid in zip(items, ids)])

    def fan_documents(self, batch: FanBatch) -> list[Any]:
        # Every copy of a post has the same size (one data object, key, sender and type): measured once.
        sender, t, kind, data, key = batch.sender_id, batch.event_time, batch.type, batch.data, batch.data_key
        part = data_charge(data)
        size = charge(key, sender, kind, part, {})
        return [(receiver, {"_id": oid, "data_key": key, "sender_id": sender, "event_time": t, "type": kind,
                            "data": data, CHARGE: size, DATA_CHARGE: part}, size)
                for oid, receiver in zip(batch.ids, batch.receivers)]

    def store(self, cluster: str, documents: Sequence[Any], deadline: float, *, again: bool = False) -> Request:
        return Upserts(cluster, "feed", [append(one, again) for one in documents], deadline)

    def find_copies(self, cluster: str, copies: Sequence[Copy], deadline: float) -> Program[list[Copy] | Failure]:
        # By id alone, whatever the receiver: a duplicate may be another receiver's copy under the same id (a drawn id
        # that collided), which the unique copy_id index refuses too; read back under our receiver only, it would look
        # absent and be sent again, forever. (A rare path: only duplicates are read back.)
        wanted = {c.id: None for c in copies}
        docs = yield Find(cluster, "feed", {"items._id": {"$in": list(wanted)}}, deadline, projection=_IDENTITY)
        return docs if isinstance(docs, Failure) else [c for c in self.copies_of(docs) if c.id in wanted]

    def copies_by_id(self, cluster: str, receiver_id: int | str, ids: Sequence[ObjectId],
                     deadline: float) -> Program[list[Copy] | Failure]:
        # Whole buckets (a bucket holds at most MAX_BYTES of copies), the copies asked for picked out of them.
        wanted = set(ids)
        docs = yield Find(cluster, "feed", {"receiver_id": receiver_id, "items._id": {"$in": list(wanted)}}, deadline)
        return docs if isinstance(docs, Failure) else [c for c in self.copies_of(docs) if c.id in wanted]

    def copies_of(self, documents: Iterable[Mapping[str, Any]]) -> list[Copy]:
        return [Copy(copy_id(i), doc["receiver_id"], i["sender_id"], i["event_time"], i["type"], i.get("data"),
                     i["data_key"]) for doc in documents for i in doc.get("items", ())]

    def fix(self, cluster: str, data_key: str, ids: Sequence[ObjectId], data: Mapping[str, Any] | None,
            deadline: float) -> list[Request]:
        return fix_copies(cluster, data_key, ids, data, deadline)

    # -- reads ----------------------------------------------------------------------------------
    def inbox(self, cluster: str, receiver_id: int | str, position: Position | None, need: int,
              types: tuple[int | str, ...], deadline: float) -> Program[Inbox | Failure]:
        return (yield from _walk(cluster, receiver_id, position, need, types, deadline, newest_first=True))

    def newer(self, cluster: str, receiver_id: int | str, bound: Position | None, need: int,
              deadline: float) -> Program[list[tuple[datetime, ObjectId]] | Failure]:
        floor = _key(bound.event_time, bound.id) if bound is not None else None
        gathered = Gathered()  # each copy once, even one moving between the buckets meanwhile
        read: list[ObjectId] = []

        def keys() -> list[tuple[datetime, ObjectId]]:
            return [(e["event_time"], oid) for oid, (e, _moving) in gathered.copies.items()
                    if floor is None or _key(e["event_time"], oid) > floor]

        while len(keys()) < need:
            match = _buckets(receiver_id, read=read, newest_from=bound.event_time if bound is not None else None)
            docs = yield Find(cluster, "feed", match, deadline, sort=_ORDER, limit=READ_AHEAD * 2, projection=_KEYS,
                              moving=True)
            if isinstance(docs, Failure):
                return docs
            for doc in docs:
                read.append(doc["_id"])
                gathered.add(doc)
            if len(docs) < READ_AHEAD * 2:
                break
        lost = [oid for oid, t in gathered.lost().items() if floor is None or _key(t, oid) > floor]
        if lost:  # moved to a bucket read before they arrived: asked by id
            docs = yield from resolve(cluster, receiver_id, lost, deadline, projection=_KEYS)
            if isinstance(docs, Failure):
                return docs
            for doc in docs:
                gathered.add(doc, only=lost)
        found = keys()
        found.sort(key=lambda k: _key(*k), reverse=True)
        return found[:need]

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
                 what: str, landed: Landed | None = None) -> Program[Edited]:
        # Counted in buckets changed, which is copies changed: a bucket holds at most one copy of a key.
        if data is None:
            return (yield from delete_key(cluster, data_key, steps, what=what))
        return (yield from update_key(cluster, data_key, data, steps, what=what, landed=landed))

    def remove_sender(self, cluster: str, receiver_id: int | str, sender_id: int | str, steps: EditSettings) -> Program[Edited]:
        return (yield from remove_picked(
            cluster, {"receiver_id": receiver_id, "items.sender_id": sender_id}, lambda i: i.get("sender_id") == sender_id,
            steps, ("sender_id",)))

    # -- a user's data --------------------------------------------------------------------------
    def remove_sent(self, cluster: str, sender_id: int | str, keys: Sequence[str], steps: EditSettings) -> Program[Edited]:
        wanted = set(keys)
        mine = {"data_key": {"$in": list(keys)}, "sender_id": sender_id}
        return (yield from remove_picked(
            cluster, {"items": {"$elemMatch": mine}}, lambda i: i.get("sender_id") == sender_id and i.get("data_key") in wanted,
            steps, ("data_key", "sender_id")))

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
        return feed_item(items[0], docs[0]["receiver_id"]) if items else None

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
