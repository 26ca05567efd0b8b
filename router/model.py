"""The values the router takes and returns: items, activities, pages, and a cluster's metadata.

Pure module: no pymongo import beyond the ``bson`` value types. How a copy or an
outbox entry is stored is not said here: that belongs to a period's layout
(:mod:`router.core.layouts`).

Times are timezone-aware UTC everywhere. BSON keeps milliseconds, so an
``event_time`` read back is the written one truncated to the millisecond.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timedelta, timezone
from typing import Any, TypeGuard

import attrs
from bson import ObjectId

from .layout_names import DEFAULT as DEFAULT_LAYOUT
from .errors import InvalidItem

__all__ = [
    "Activity",
    "ClusterMeta",
    "FeedItem",
    "ID_RULE",
    "MAX_ID_CHARS",
    "Page",
    "TEXT_RULE",
    "EPOCH",
    "event_timestamp",
    "from_millis",
    "identity",
    "is_id",
    "is_text",
    "to_millis",
    "to_utc",
    "utcnow",
]

UTC = timezone.utc
#: An ObjectId's timestamp is 4 unsigned bytes of UTC seconds.
MAX_OBJECTID_SECONDS = 2**32
#: The longest str accepted for ``receiver_id``, ``sender_id``, ``type`` and ``data_key`` (characters).
MAX_ID_CHARS = 1024
ID_RULE = f"must be a 64-bit int or a non-empty UTF-8 str of at most {MAX_ID_CHARS} characters"
TEXT_RULE = f"must be a non-empty UTF-8 str of at most {MAX_ID_CHARS} characters"
_INT64 = (-(2**63), 2**63)


@attrs.frozen(kw_only=True, slots=True)
class FeedItem:
    """One copy of a feed item, for one receiver.

    Example::

        item = FeedItem(
            receiver_id=1000386, sender_id=1000765,
            event_time=datetime(2016, 5, 1, 10, tzinfo=timezone.utc),
            type=1, data={"fabula_id": 1000983},
            data_key=data_key("fabula", 1000983),
        )

    Fields are checked when the item is written (``FeedRouter.write``), not when
    it is built, so bulk writes pay for one check per item. ``id`` is ``None`` for
    an item not yet stored (the router makes one) and the stored ``_id`` for one read
    back. Set it to write with a chosen ``_id``: to repeat a write whose outcome was
    unknown (``WriteFailed.ids``) without storing a second copy.
    """

    receiver_id: int | str
    sender_id: int | str
    event_time: datetime
    type: int | str
    data: Mapping[str, Any]
    data_key: str
    id: ObjectId | None = None


def _setter(name: str) -> Callable[[FeedItem, Any], None]:
    """The slot descriptor's own setter of FeedItem's field *name* (what the frozen class's ``__setattr__`` refuses)."""
    setter: Callable[[FeedItem, Any], None] = getattr(FeedItem, name).__set__
    return setter


_new_object = object.__new__
_set_receiver_id, _set_sender_id, _set_event_time = _setter("receiver_id"), _setter("sender_id"), _setter("event_time")
_set_type, _set_data, _set_data_key, _set_id = _setter("type"), _setter("data"), _setter("data_key"), _setter("id")


def stored_item(receiver_id: int | str, sender_id: int | str, event_time: datetime, type: int | str,
                data: Mapping[str, Any], data_key: str, id: ObjectId) -> FeedItem:
    """A FeedItem of values read back from a store, which were checked when written: the same item as
    ``FeedItem(...)`` gives, built through its slots in half the time of the attrs ``__init__`` (a page builds one
    per item; measured 25 against 50 us for 20)."""
    item: FeedItem = _new_object(FeedItem)
    _set_receiver_id(item, receiver_id)
    _set_sender_id(item, sender_id)
    _set_event_time(item, event_time)
    _set_type(item, type)
    _set_data(item, data)
    _set_data_key(item, data_key)
    _set_id(item, id)
    return item


@attrs.frozen(kw_only=True, slots=True)
class Activity:
    """What every receiver gets a copy of: a :class:`FeedItem` without its receiver.

    Example::

        activity = Activity(sender_id=1000765, event_time=datetime.now(timezone.utc), type=1,
                            data={"fabula_id": 1000983}, data_key=data_key("fabula", 1000983))
        activity.for_receiver(1000386)     # the FeedItem one receiver gets

    Fields are checked when it is published or fanned out, with the same rules as a FeedItem.
    """

    sender_id: int | str
    event_time: datetime
    type: int | str
    data: Mapping[str, Any]
    data_key: str

    def for_receiver(self, receiver_id: int | str, *, id: ObjectId | None = None) -> FeedItem:
        """The feed item *receiver_id* gets."""
        return FeedItem(
            receiver_id=receiver_id,
            sender_id=self.sender_id,
            event_time=self.event_time,
            type=self.type,
            data=self.data,
            data_key=self.data_key,
            id=id,
        )

    @classmethod
    def from_item(cls, item: FeedItem) -> Activity:
        """The activity of an item already written for one receiver (say, the author's own copy)."""
        return cls(
            sender_id=item.sender_id,
            event_time=item.event_time,
            type=item.type,
            data=item.data,
            data_key=item.data_key,
        )


#: The epoch, aware UTC.
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MS = timedelta(milliseconds=1)


def to_millis(t: datetime) -> int:
    """UTC epoch milliseconds of the aware datetime *t*, rounded down: what BSON stores of it."""
    return (t - EPOCH) // _MS


def from_millis(ms: int) -> datetime:
    """The aware UTC datetime of epoch milliseconds *ms* (the mirror of :func:`to_millis`)."""
    return EPOCH + timedelta(milliseconds=ms)


def utcnow() -> datetime:
    """The current time, timezone-aware UTC (the routers' default clock)."""
    return datetime.now(UTC)


def to_utc(value: object, *, field: str = "event_time", index: int | None = None) -> datetime:
    """Return *value* as an aware UTC datetime, or raise :class:`InvalidItem`.

    Naive datetimes are refused rather than guessed at: a naive value is local time
    to one service and UTC to another.
    """
    if not isinstance(value, datetime):
        raise InvalidItem(field, f"must be a timezone-aware datetime (got {value!r:.80})", index=index)
    try:
        offset = value.utcoffset()
    except Exception as exc:  # a tzinfo may raise anything, or return an offset of a day or more
        raise InvalidItem(
            field, f"its tzinfo {value.tzinfo!r:.60} gives no valid UTC offset ({type(exc).__name__}: {exc})", index=index
        ) from None
    if offset is None:
        raise InvalidItem(
            field,
            f"must be timezone-aware, e.g. datetime(..., tzinfo=timezone.utc) (got naive {value.isoformat()})",
            index=index,
        )
    try:
        return value.astimezone(UTC)
    except (OverflowError, ValueError) as exc:
        raise InvalidItem(field, f"is outside the range of a UTC datetime ({exc}) (got {value!r:.80})", index=index) from None


def event_timestamp(value: object, *, field: str = "event_time", index: int | None = None) -> float:
    """UTC epoch seconds of *value*, checked to fit an ObjectId timestamp.

    The rule: timezone-aware, and from 1970-01-01T00:00:00Z up to (not including)
    2106-02-07T06:28:16Z, the range an ObjectId's 4-byte timestamp holds.
    Raises :class:`InvalidItem` naming the field and the value.
    """
    if type(value) is not datetime or value.tzinfo is not UTC:
        value = to_utc(value, field=field, index=index)
    ts = value.timestamp()
    if not 0 <= ts < MAX_OBJECTID_SECONDS:
        raise InvalidItem(
            field,
            "must lie in [1970-01-01T00:00:00Z, 2106-02-07T06:28:16Z), the range of an ObjectId "
            f"timestamp (got {value.isoformat()})",
            index=index,
        )
    return ts


def is_text(value: object) -> TypeGuard[str]:
    """A non-empty str of at most :data:`MAX_ID_CHARS` characters that UTF-8 can encode (no lone surrogates)."""
    if not isinstance(value, str) or value == "" or len(value) > MAX_ID_CHARS:
        return False
    if value.isascii():
        return True
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def is_id(value: object) -> TypeGuard[int | str]:
    """A receiver, sender or type value BSON can store: a 64-bit int or a :func:`is_text` str (not a bool)."""
    if isinstance(value, str):
        return is_text(value)
    return isinstance(value, int) and not isinstance(value, bool) and _INT64[0] <= value < _INT64[1]


def identity(user_id: object, field: str = "user_id") -> int | str:
    """The identity of a user id (a receiver, a sender, a user to erase): one user is one identity whatever integer
    type carries the number.

    A plain int or str is returned as it is; any other int (``bson.Int64``, which pymongo returns for every id stored
    as a 64-bit int, so for every id above 2**31 read back) gives the plain int, any other str the plain str. An int
    and a str stay different users (5 and ``"5"``), as everywhere in the router. Whatever hashes, compares or records
    a user id goes through this one function (the erasure's pseudonyms, the posts registry's ids, a buckets period's
    first bucket, a seen marker's owner, the API's checks), so a user read back as ``Int64`` is the user written as
    ``int``. Raises :class:`~router.errors.InvalidItem` naming *field* for anything that is no id (:func:`is_id`:
    a bool, a float, an int beyond 64 bits, an empty or too long str).

        >>> from bson.int64 import Int64
        >>> type(identity(Int64(2**40))), identity(Int64(5)) == identity(5), identity("5") == identity(5)
        (<class 'int'>, True, False)
    """
    if type(user_id) is int:
        if -0x8000000000000000 <= user_id <= 0x7FFFFFFFFFFFFFFF:
            return user_id
    elif type(user_id) is str:
        if is_text(user_id):
            return user_id
    elif is_id(user_id):
        return int(user_id) if isinstance(user_id, int) else str.__str__(user_id)
    raise InvalidItem(field, f"{ID_RULE} (got {user_id!r:.80})")


def _check_aware(_inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is None and attribute.name == "end_date":
        return
    to_utc(value, field=attribute.name)


@attrs.frozen(kw_only=True)
class ClusterMeta:
    """A cluster's ``metadata`` document: which period of ``event_time`` it owns.

    Example::

        ClusterMeta(name="cluster_1", start_date=datetime(2016, 5, 1, tzinfo=timezone.utc),
                    end_date=datetime(2016, 8, 1, tzinfo=timezone.utc),
                    creator_name="ethan", created_at=datetime.now(timezone.utc))

    The period is half-open, ``[start_date, end_date)``; ``end_date=None`` means open-ended.
    A ``retired`` cluster is skipped by reads and refuses writes; deletes still reach it.
    The stored document has a ``retired: true`` field only once retired. ``layout`` names how
    the period stores its copies (:mod:`router.core.layouts`); the stored document has a
    ``layout`` field only for a layout other than the default ``copies``.
    """

    name: str = attrs.field(validator=attrs.validators.instance_of(str))
    start_date: datetime = attrs.field(validator=_check_aware)
    end_date: datetime | None = attrs.field(default=None, validator=_check_aware)
    creator_name: str = attrs.field(default="", validator=attrs.validators.instance_of(str))
    created_at: datetime | None = None
    retired: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))
    layout: str = attrs.field(default=DEFAULT_LAYOUT, validator=attrs.validators.instance_of(str))

    def __attrs_post_init__(self) -> None:
        if self.end_date is not None and self.end_date <= self.start_date:
            raise InvalidItem(
                "end_date",
                f"must be after start_date {self.start_date.isoformat()} (got {self.end_date.isoformat()})",
            )

    def to_document(self) -> dict[str, Any]:
        """The stored ``metadata`` document; ``_id`` equals the cluster name."""
        doc: dict[str, Any] = {
            "_id": self.name,
            "name": self.name,
            "start_date": self.start_date,
            "end_date": self.end_date,
            "creator_name": self.creator_name,
            "created_at": self.created_at,
        }
        if self.retired:
            doc["retired"] = True
        if self.layout != DEFAULT_LAYOUT:
            doc["layout"] = self.layout
        return doc

    @classmethod
    def from_document(cls, doc: Mapping[str, Any]) -> ClusterMeta:
        """Parse a ``metadata`` document; raise :class:`InvalidItem` naming the bad field."""
        for field in ("_id", "name", "start_date"):
            if field not in doc:
                raise InvalidItem(field, "is missing")
        if doc["_id"] != doc["name"]:
            raise InvalidItem("name", f"must equal _id {doc['_id']!r} (got {doc['name']!r})")
        end = doc.get("end_date")
        created = doc.get("created_at")
        return cls(
            name=doc["name"],
            start_date=to_utc(doc["start_date"], field="start_date"),
            end_date=None if end is None else to_utc(end, field="end_date"),
            creator_name=doc.get("creator_name") or "",
            created_at=created if isinstance(created, datetime) else None,
            retired=doc.get("retired", False),
            layout=doc.get("layout", DEFAULT_LAYOUT),
        )


@attrs.frozen(kw_only=True)
class Page:
    """One page of a receiver's feed, newest first.

    ``items[i]`` was served by cluster ``sources[i]``, from the receiver's own feed or, with
    ``read(..., pull=...)``, from an author's outbox (``pulled[i]`` is then true and the item's
    ``id`` is the one its feed copy would have). ``queried`` lists the clusters asked, in
    order; ``next_cursor`` is ``None`` once the read window is exhausted. A ``partial`` page
    left out the clusters in ``unavailable`` (they could not be read); its cursor comes back
    for them.
    """

    items: tuple[FeedItem, ...]
    next_cursor: str | None
    sources: tuple[str, ...] = ()
    queried: tuple[str, ...] = ()
    partial: bool = False
    unavailable: tuple[str, ...] = ()
    pulled: tuple[bool, ...] = ()

    def __iter__(self) -> Any:
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)
