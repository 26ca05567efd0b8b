"""The values the router stores and returns: feed items, cluster metadata and pages.

Pure module: no pymongo import beyond the ``bson`` value types.

A stored feed item is exactly this document (one copy per receiver)::

    {_id, data_key, receiver_id, sender_id, event_time, type, data}

Times are timezone-aware UTC everywhere. BSON keeps milliseconds, so an
``event_time`` read back is the written one truncated to the millisecond.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

import attrs
import bson
from bson import ObjectId
from bson.errors import InvalidDocument

from .errors import InvalidItem

__all__ = [
    "FeedItem", "ClusterMeta", "Page", "FEED_FIELDS", "to_utc", "event_timestamp", "check_item", "key_problem",
    "MAX_ID_CHARS", "MAX_DATA_BYTES", "MAX_DATA_DEPTH",
]

UTC = timezone.utc
#: The fields of a stored feed document, in storage order.
FEED_FIELDS = ("_id", "data_key", "receiver_id", "sender_id", "event_time", "type", "data")
#: An ObjectId's timestamp is 4 unsigned bytes of UTC seconds.
MAX_OBJECTID_SECONDS = 2**32
#: The longest str accepted for ``receiver_id``, ``sender_id``, ``type`` and ``data_key`` (characters).
MAX_ID_CHARS = 1024
#: The most ``data`` may take as BSON: MongoDB's 16 MiB document limit less room for the other
#: fields, which :data:`MAX_ID_CHARS` bounds to well under 64 KiB together.
MAX_DATA_BYTES = 16 * 1024 * 1024 - 64 * 1024
#: How deep ``data`` may nest (mappings and lists); MongoDB refuses documents nested past 100 levels.
MAX_DATA_DEPTH = 64
_INT64 = (-(2**63), 2**63)
_LONG_STR = 64 * 1024
_FLAT_KEYS = 64
#: ``data`` keys already found valid: the usual payload repeats a handful of keys, and a set
#: lookup is cheaper than the three checks. Bounded; cleared when full.
_GOOD_KEYS: set[str] = set()
_GOOD_KEYS_MAX = 4096


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
    an item not yet stored and the stored ``_id`` for one read back.
    """

    receiver_id: int | str
    sender_id: int | str
    event_time: datetime
    type: int | str
    data: Mapping[str, Any]
    data_key: str
    id: ObjectId | None = None

    def to_document(self, oid: ObjectId) -> dict[str, Any]:
        """The stored document for this item under ``_id`` *oid*."""
        return {
            "_id": oid,
            "data_key": self.data_key,
            "receiver_id": self.receiver_id,
            "sender_id": self.sender_id,
            "event_time": self.event_time,
            "type": self.type,
            "data": self.data,
        }

    @classmethod
    def from_document(cls, doc: Mapping[str, Any]) -> FeedItem:
        """Build an item from a stored document (as returned by a tz-aware client)."""
        return cls(
            receiver_id=doc["receiver_id"],
            sender_id=doc["sender_id"],
            event_time=doc["event_time"],
            type=doc["type"],
            data=doc["data"],
            data_key=doc["data_key"],
            id=doc["_id"],
        )


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


def is_text(value: object) -> bool:
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


def is_id(value: object) -> bool:
    """A receiver, sender or type value BSON can store: a 64-bit int or a :func:`is_text` str (not a bool)."""
    if isinstance(value, str):
        return is_text(value)
    return isinstance(value, int) and not isinstance(value, bool) and _INT64[0] <= value < _INT64[1]


ID_RULE = f"must be a 64-bit int or a non-empty UTF-8 str of at most {MAX_ID_CHARS} characters"
TEXT_RULE = f"must be a non-empty UTF-8 str of at most {MAX_ID_CHARS} characters"


def key_problem(key: object) -> str | None:
    """Why *key* cannot be a key in ``data`` (at any depth), or ``None`` when it can.

    The rule, the same for every server: a str that does not start with ``$`` and holds
    no ``.`` and no NUL character. MongoDB and FerretDB treat such keys as operators or
    paths, or refuse them.
    """
    if type(key) is not str:
        return f"keys must be str (got key {key!r:.80})"
    if key.startswith("$"):
        return f"a key must not start with '$' (got {key!r:.80})"
    if "." in key:
        return f"a key must not contain '.' (got {key!r:.80})"
    if "\x00" in key:
        return f"a key must not contain NUL (got {key!r:.80})"
    return None


def _walk_data(data: Mapping[str, Any], index: int | None) -> None:
    """Check every key of *data* at every depth against :func:`key_problem`, and the depth.

    Iterative, so a deep or self-referencing value is refused by its depth instead of
    exhausting the interpreter's recursion limit.
    """
    stack: list[tuple[Any, str, int]] = [(data, "data", 1)]
    while stack:
        value, path, depth = stack.pop()
        if depth > MAX_DATA_DEPTH:
            shown = path if len(path) <= 120 else path[:117] + "..."
            raise InvalidItem(shown, f"nests deeper than {MAX_DATA_DEPTH} levels (or contains itself)", index=index)
        if isinstance(value, Mapping):
            for key, sub in value.items():
                problem = key_problem(key)
                if problem is not None:
                    where = f"{path}.{key:.80}" if type(key) is str else path
                    raise InvalidItem(where, problem, index=index)
                if isinstance(sub, (Mapping, list, tuple)):
                    stack.append((sub, f"{path}.{key}", depth + 1))
        else:
            for i, sub in enumerate(value):
                if isinstance(sub, (Mapping, list, tuple)):
                    stack.append((sub, f"{path}[{i}]", depth + 1))


def _check_data(data: Mapping[str, Any], index: int | None) -> None:
    """Check ``data`` follows the key rule, nests at most :data:`MAX_DATA_DEPTH` deep and
    encodes as BSON within :data:`MAX_DATA_BYTES`.

    Flat mappings of small scalars (the usual case) are checked in place; anything
    else is walked and then encoded once, so a bad value fails here instead of in the
    middle of a multi-cluster write.
    """
    _walk_data(data, index)
    simple = len(data) <= _FLAT_KEYS  # many keys: let the encoder measure the size
    if simple:
        for key, value in data.items():
            kind = type(value)
            if not key.isascii():
                simple = False
            elif kind is int:
                simple = _INT64[0] <= value < _INT64[1]
            elif kind is str:
                simple = len(value) < _LONG_STR and value.isascii()
            elif value is not None and kind is not float and kind is not bool:
                simple = False
            if not simple:
                break
    if simple:
        return
    try:
        size = len(bson.encode(data))
    except (InvalidDocument, OverflowError, TypeError, ValueError, RecursionError) as exc:
        raise InvalidItem("data", f"cannot be stored as BSON: {exc}", index=index) from None
    if size > MAX_DATA_BYTES:
        raise InvalidItem("data", f"must encode to at most {MAX_DATA_BYTES} bytes of BSON (got {size})", index=index)


_MIN64, _MAX64 = _INT64


def check_item(item: object, index: int | None = None) -> float:
    """Check *item* can be stored; return its ``event_time`` as UTC epoch seconds.

    ``event_time`` follows :func:`event_timestamp`'s rule, ids and ``data_key``
    :data:`ID_RULE` / :data:`TEXT_RULE`, and ``data`` :func:`_check_data`'s. Raises
    :class:`InvalidItem` naming the field and the value.

    This runs once per written item, so the usual shape (a FeedItem with a UTC
    ``event_time``, int or short ASCII str ids, a flat dict of small scalars under keys
    seen before) is checked inline in one call; anything else takes the detailed path,
    which gives the error.
    """
    if type(item) is FeedItem:
        et = item.event_time
        if type(et) is datetime and et.tzinfo is UTC:
            ts = et.timestamp()
            r, s, t, k, d = item.receiver_id, item.sender_id, item.type, item.data_key, item.data
            if (
                0.0 <= ts < MAX_OBJECTID_SECONDS
                and ((type(r) is int and _MIN64 <= r < _MAX64) or (type(r) is str and 0 < len(r) <= MAX_ID_CHARS and r.isascii()))
                and ((type(s) is int and _MIN64 <= s < _MAX64) or (type(s) is str and 0 < len(s) <= MAX_ID_CHARS and s.isascii()))
                and ((type(t) is int and _MIN64 <= t < _MAX64) or (type(t) is str and 0 < len(t) <= MAX_ID_CHARS and t.isascii()))
                and type(k) is str
                and 0 < len(k) <= MAX_ID_CHARS
                and k.isascii()
                and type(d) is dict
                and len(d) <= _FLAT_KEYS  # with values under _LONG_STR, far below the size limit
            ):
                good = _GOOD_KEYS
                for key, value in d.items():
                    kind = type(value)
                    if key not in good:
                        if type(key) is not str or not key.isascii() or key_problem(key) is not None:
                            break
                        if len(good) >= _GOOD_KEYS_MAX:
                            good.clear()
                        good.add(key)
                    if kind is int:
                        if not _MIN64 <= value < _MAX64:
                            break
                    elif kind is str:
                        if len(value) >= _LONG_STR or not value.isascii():
                            break
                    elif value is not None and kind is not float and kind is not bool:
                        break
                else:
                    return ts
    return _check_item_slowly(item, index)


def _check_item_slowly(item: object, index: int | None) -> float:
    """The detailed checks behind :func:`check_item`: precise errors, unusual but valid items."""
    if type(item) is not FeedItem:
        raise InvalidItem("item", f"must be a FeedItem (got {type(item).__name__})", index=index)
    ts = event_timestamp(item.event_time, index=index)
    for field in ("receiver_id", "sender_id", "type"):
        value = getattr(item, field)
        if not is_id(value):
            raise InvalidItem(field, f"{ID_RULE} (got {value!r:.80})", index=index)
    dk = item.data_key
    if not is_text(dk):
        raise InvalidItem("data_key", f"{TEXT_RULE} (got {dk!r:.80})", index=index)
    data = item.data
    if not isinstance(data, Mapping):
        raise InvalidItem("data", f"must be a mapping (got {type(data).__name__})", index=index)
    _check_data(data, index)
    return ts


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
    The stored document has a ``retired: true`` field only once retired.
    """

    name: str = attrs.field(validator=attrs.validators.instance_of(str))
    start_date: datetime = attrs.field(validator=_check_aware)
    end_date: datetime | None = attrs.field(default=None, validator=_check_aware)
    creator_name: str = attrs.field(default="", validator=attrs.validators.instance_of(str))
    created_at: datetime | None = None
    retired: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))

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
        )


@attrs.frozen(kw_only=True)
class Page:
    """One page of a receiver's feed, newest first.

    ``items[i]`` was served by cluster ``sources[i]``; ``queried`` lists the clusters
    asked, in order; ``next_cursor`` is ``None`` once the read window is exhausted.
    A ``partial`` page left out the clusters in ``unavailable`` (they could not be
    read); its cursor comes back for them.
    """

    items: tuple[FeedItem, ...]
    next_cursor: str | None
    sources: tuple[str, ...] = ()
    queried: tuple[str, ...] = ()
    partial: bool = False
    unavailable: tuple[str, ...] = ()

    def __iter__(self) -> Any:
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)
