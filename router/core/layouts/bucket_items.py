"""A copy as a ``buckets`` bucket holds it: its charges, its append, and how a reader sees a copy on the move.

One element of a bucket's ``items``::

    {_id, data_key, sender_id, event_time, type, data, [data_digest], n, d}

``n`` is the copy's *charge*: its share of the bucket's ``bytes`` (its BSON size when it was
appended, changed by each update by what its data changed); ``d`` is what of ``n`` its data
(and the data's digest) take. A bucket's ``bytes`` is the sum of its copies' ``n`` and its
``count`` the number of its copies, so both go down when a copy leaves or shrinks, exactly
(:mod:`.bucket_edits`). A copy stored before charges (no ``n``, no ``d``) is charged
nothing when it leaves and its old data nothing when it changes: its bucket's counters
stay an upper bound, as they were.

**A copy on the move** (:mod:`.bucket_edits`: an update whose data no longer fits the
bucket) is first marked in place: its ``_id`` becomes a stand-in (a fresh ObjectId, so the
unique ``copy_id`` index lets the copy's own id be stored elsewhere) and ``moving`` holds
its id. Readers take such an element for the copy ``moving`` names, with its old data,
unless the same read also found the copy itself. Once the copy is stored in its new bucket
the element leaves its old one, and a *stub* stays there in ``moved``: ``{_id, event_time,
at}`` (no sender, no key, no data). A read that meets a stub of a copy it has not found
(it read the new bucket before the copy arrived) asks for that copy by id
(:func:`resolve`): in any one snapshot a copy is in some bucket's ``items``, as itself or
marked as moving (unless it was deleted). Stubs are dropped from a bucket after
:data:`STUB_KEEP`, when another copy moves out of it: far longer than a read lasts (its
deadline).

**An append** (:func:`append`) goes to a bucket with room that holds neither the copy nor
another copy of its ``data_key``, and never to an emptied bucket (mongo-java-server cannot
push into a document emptied under a unique index).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

import bson
from bson import Int64, ObjectId

from ...model import FeedItem, identity, stored_item
from ..steps import Failure, Find, Program
from .queries import DIGEST

__all__ = ["CHARGE", "DATA_CHARGE", "MAX_BYTES", "MAX_ITEMS", "MOVED", "MOVING", "STUB_KEEP", "Gathered", "Slot",
           "append", "charge", "copy_id", "data_charge", "feed_item", "first_bucket", "resolve", "slot", "slots"]

#: Copies a bucket takes at most.
MAX_ITEMS = 50
#: Bytes of copies (BSON) a bucket takes at most: half the 16 MiB document limit, leaving room for its other fields.
MAX_BYTES = 8 * 1024 * 1024
#: A copy's charge: its share of its bucket's ``bytes``.
CHARGE = "n"
#: What of a copy's charge its data and the data's digest take.
DATA_CHARGE = "d"
#: In an element marked as moving: the id of the copy it is (its ``_id`` is a stand-in).
MOVING = "moving"
#: A bucket's stubs of the copies that moved out of it.
MOVED = "moved"
#: How long a stub stays (at least): a read that began before its copy moved ends long before.
STUB_KEEP = timedelta(days=1)

_INT_FIRST = b"\xff\xff\xff\xfe"


def first_bucket(receiver_id: int | str) -> ObjectId:
    """The ``_id`` of *receiver_id*'s first bucket in a period: every writer derives the same one (a 64-bit receiver
    id as it is, behind a tag no router-made id starts with; any other id by a 96-bit hash: were two receivers to share
    one, the second would start its first bucket as it starts later ones)."""
    if type(receiver_id) is not int and type(receiver_id) is not str:  # (an Int64: its int; one receiver, one bucket)
        receiver_id = identity(receiver_id, "receiver_id")
    if type(receiver_id) is int and -(1 << 63) <= receiver_id < 1 << 63:
        return ObjectId(_INT_FIRST + receiver_id.to_bytes(8, "big", signed=True))
    return ObjectId(hashlib.blake2b(f"{type(receiver_id).__name__}:{receiver_id}".encode(), digest_size=12).digest())


#: What a bucket layout sends for one copy: its receiver, the copy as a bucket holds it, and its charge.
Slot = tuple[Any, dict[str, Any], int]


def data_charge(data: Mapping[str, Any], mark: str | None = None) -> int:
    """What *data* (with its digest *mark*, when given) takes in a copy: the ``d`` of a copy holding it."""
    if mark is None:
        return _DATA_ELEMENT + len(bson.encode(data))
    return len(bson.encode({"data": data, DIGEST: mark})) - 5


#: The bytes of a copy's ``data`` element besides its document: the type byte and the name ``data``.
_DATA_ELEMENT = 6
_EPOCH = datetime(1970, 1, 1)
_NO_ID = ObjectId(b"\0" * 12)


def _shape(value: Any) -> tuple[str, int]:
    """What the BSON size of an id or type depends on: its kind and, for a str, its length in bytes."""
    if type(value) is str:
        return "s", len(value) if value.isascii() else len(value.encode())
    return ("l" if isinstance(value, Int64) or not -(1 << 31) <= value < 1 << 31 else "i"), 0


def charge(key: str, sender: Any, kind: Any, data_size: int, known: dict[tuple[Any, ...], int]) -> int:
    """The charge (``n``) of a copy of *key* from *sender* of type *kind* whose data takes *data_size*
    (:func:`data_charge`): its BSON size, charges included. Its other fields' size is kept in *known* by their shape
    (a copy's ``_id`` and ``event_time`` have fixed sizes), so a batch encodes each shape once."""
    shape = (_shape(key), _shape(sender), _shape(kind))
    size = known.get(shape)
    if size is None:
        size = known[shape] = len(bson.encode({"_id": _NO_ID, "data_key": key, "sender_id": sender,
                                               "event_time": _EPOCH, "type": kind, CHARGE: 0, DATA_CHARGE: 0}))
    return size + data_size


def slot(receiver: Any, item: dict[str, Any], data_size: int, known: dict[tuple[Any, ...], int]) -> Slot:
    """*item* (a copy's fields, ``data`` among them) charged, for *receiver*: ``n`` and ``d`` set (:func:`charge`)."""
    size = charge(item["data_key"], item["sender_id"], item["type"], data_size, known)
    item[CHARGE], item[DATA_CHARGE] = size, data_size
    return receiver, item, size


def slots(rows: Sequence[tuple[ObjectId, Any, Any, datetime, Any, Any, str]]) -> list[Slot]:
    """The slots of copies given as ``(id, receiver, sender, event_time, type, data, data_key)`` rows (each data object
    encoded once)."""
    out: list[Slot] = []
    data_sizes: dict[int, int] = {}  # lives for one batch, which keeps each data object alive
    known: dict[tuple[Any, ...], int] = {}
    for oid, receiver, sender, t, kind, data, key in rows:
        size = data_sizes.get(id(data))
        if size is None:
            size = data_sizes[id(data)] = data_charge(data)
        out.append(slot(receiver, {"_id": oid, "data_key": key, "sender_id": sender, "event_time": t, "type": kind,
                                   "data": data}, size, known))
    return out


def append(one: Slot, again: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    """The filter and update (an upsert) that append *one* to a bucket with room, or start one."""
    receiver, item, size = one
    t = item["event_time"]
    # "Not already holding this copy or its key" as $nor, not $ne: with $ne on an indexed array path DocumentDB may
    # plan a BitmapAnd over the RUM indexes, which crashes its backend under concurrent appends (docs/servers.md).
    match = {"receiver_id": receiver, "count": {"$lt": MAX_ITEMS}, "bytes": {"$lte": MAX_BYTES - size},
             "items.0": {"$exists": True}, "$nor": [{"items._id": item["_id"]}, {"items.data_key": item["data_key"]}]}
    update: dict[str, Any] = {"$push": {"items": item}, "$inc": {"count": 1, "bytes": size}, "$max": {"newest": t},
                              "$min": {"oldest": t}}
    if not again:
        update["$setOnInsert"] = {"_id": first_bucket(receiver)}
    return match, update


def copy_id(element: Mapping[str, Any]) -> ObjectId:
    """The id of the copy a bucket's element is (one marked as moving holds it in ``moving``)."""
    oid: ObjectId = element.get(MOVING) or element["_id"]
    return oid


def feed_item(element: Mapping[str, Any], receiver_id: int | str) -> FeedItem:
    """A bucket's element as a page shows it."""
    return stored_item(receiver_id, element["sender_id"], element["event_time"], element["type"], element["data"],
                       element["data_key"], copy_id(element))


class Gathered:
    """The copies one read found in a receiver's buckets, each once: a copy itself wins over an element marked as it
    moving (its old data), and the stubs of copies that moved out of the buckets read, for :func:`resolve`.

    Example::

        seen = Gathered()
        for bucket in docs:
            seen.add(bucket)
        lost = seen.lost()          # stubs of copies found nowhere in what was read
    """

    def __init__(self) -> None:
        #: Each copy found, by id: ``(element, moving)``.
        self.copies: dict[ObjectId, tuple[Mapping[str, Any], bool]] = {}
        self._stubs: dict[ObjectId, datetime] = {}

    def add(self, bucket: Mapping[str, Any], only: Iterable[ObjectId] | None = None) -> None:
        """Take in what *bucket* holds (with *only*: of those copies alone, and not its stubs)."""
        wanted = None if only is None else set(only)
        for element in bucket.get("items", ()):
            oid, moving = copy_id(element), MOVING in element
            if wanted is not None and oid not in wanted:
                continue
            known = self.copies.get(oid)
            if known is None or (known[1] and not moving):
                self.copies[oid] = (element, moving)
        if wanted is None:
            for stub in bucket.get(MOVED, ()):
                self._stubs.setdefault(stub["_id"], stub["event_time"])

    def lost(self) -> dict[ObjectId, datetime]:
        """The stubs of copies not found in what was read, with their times."""
        return {oid: t for oid, t in self._stubs.items() if oid not in self.copies}


def resolve(cluster: str, receiver_id: int | str, ids: Sequence[ObjectId], deadline: float,
            projection: Mapping[str, Any] | None = None) -> Program[list[dict[str, Any]] | Failure]:
    """The buckets of *receiver_id* holding the copies *ids*, as themselves or marked as moving (one ``find``, by the
    unique copy index and the receiver's)."""
    match = {"receiver_id": receiver_id, "$or": [{"items._id": {"$in": list(ids)}}, {f"items.{MOVING}": {"$in": list(ids)}}]}
    docs: list[dict[str, Any]] | Failure = yield Find(cluster, "feed", match, deadline, projection=projection)
    return docs
