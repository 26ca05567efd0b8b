"""Aggregated notifications: what a group is, its key, its cursor, and the pipelines that count it on the server.

A **group** is a receiver's items that share an aggregation key: the values of a few item
fields (:class:`GroupBy`, by default ``type`` and ``data.target``) and the *window* of their
``event_time`` (by default the UTC day: windows are ``span``-long slices counted from the
epoch, so a group's span is bounded by construction). "Alice and 3 others liked your post"
is the group ``("like", <post>)`` of one day; "5 new followers today" is ``("follow", None)``.

**Counted on the server.** A group's item count, distinct-actor count, first time and newest
actors come from ``aggregate`` pipelines (:mod:`router.core.layouts.grouping`) run on
the stream of the receiver's copies in one window that the period's layout supplies
(:meth:`~router.core.layouts.base.Layout.copy_stream`); what comes back is one row per group
and a few items per group on the page, never the group's items. A group of 100,000 likes
costs the server a scan of that window and the client a handful of documents.

**Groups walk by window.** Windows do not overlap, and a group belongs to one window, so
every group of a newer window sorts above every group of an older one: a walk takes the
windows newest first and, inside one, the groups newest first by their newest item. The
cursor (:class:`GroupCursor`) holds the walk's *ceiling* (the newest item when the walk
began: items above it are the next walk's), the current window and the 8-byte hashes of the
groups of that window already served; a group is served once per walk whatever its newest
item does meanwhile (see ``docs/notification-groups.md`` for the rules).

This module is pure and names no stored field: values, keys, windows and cursors. What a
grouped read asks a cluster is built in :mod:`router.core.layouts.grouping` (the copies'
fields are the layouts' to name) and the read marks' documents in :mod:`router.core.notify.seen`
(their collection's module); the programs are in :mod:`router.core.notify.group_reads` (pages) and
:mod:`router.core.notify.group_marks` (read marks, the badge).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
import struct
from collections.abc import Hashable, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, Protocol, TypeVar

import attrs
import bson
import bson.errors
from bson import Binary, Decimal128, ObjectId

from ...cursor import Position
from ...errors import InvalidCursor, InvalidItem
from ...model import FeedItem, from_millis, to_millis
from ..layouts import canonical

__all__ = [
    "ACTORS_COUNTED", "Acted", "DEFAULT_GROUP_BY", "Group", "GroupBy", "GroupCursor", "GroupPage", "MAX_GROUP_PAGE", "MAX_MARKS", "MAX_NEWEST", "UnseenGroups",
    "canonical", "check_group", "decode_group_cursor", "decode_key", "encode_group_cursor", "group_key", "ident",
    "key_hash", "newest_actors", "position_key",
]

#: The most groups one page returns.
MAX_GROUP_PAGE = 100
#: The most groups one ``mark_read`` call marks (its cleanup names each in one statement).
MAX_MARKS = 1000
#: The most newest items (one per actor) a group carries.
MAX_NEWEST = 10
#: How many of a group's items (in each period it meets) a page counts distinct actors among: a group with more has
#: ``actors_capped`` set, and its ``actor_count`` counts the distinct actors of that many of its items (at least so
#: many act in it). Counting every actor of a huge group cost each page seconds on FerretDB 2 (a ``$group`` per actor).
ACTORS_COUNTED = 1000
#: The fields a key may name besides ``data.<path>``.
_PLAIN_FIELDS = ("type", "sender_id", "data_key")
_DATA_PATH = re.compile(r"^data(\.[A-Za-z0-9_]+){1,4}$")
_SPAN_UNITS = {"m": 60, "h": 3600, "d": 86400}
_KEY_PREFIX = "g1."
_MISSING = object()
_CURSOR_PREFIX = "gc1."
_CURSOR_HEAD = struct.Struct(">4sq12sqBI")


def _check_fields(_inst: object, _attr: object, fields: tuple[str, ...]) -> None:
    if not isinstance(fields, tuple) or not 1 <= len(fields) <= 4:
        raise InvalidItem("key.fields", f"must be a tuple of 1 to 4 field names (got {fields!r:.80})")
    for i, f in enumerate(fields):
        if not isinstance(f, str) or not (f in _PLAIN_FIELDS or _DATA_PATH.match(f)):
            raise InvalidItem(f"key.fields[{i}]", "must be 'type', 'sender_id', 'data_key' or 'data.<name>[.<name>...]' "
                                               f"(got {f!r:.80})")
    if len(set(fields)) != len(fields):
        raise InvalidItem("key.fields", f"names a field twice (got {fields!r:.80})")


def _check_span(_inst: object, _attr: object, span: timedelta) -> None:
    if not isinstance(span, timedelta) or span % timedelta(seconds=60) or not timedelta(minutes=1) <= span <= timedelta(days=7):
        raise InvalidItem("key.span", f"must be a whole number of minutes from 1 minute to 7 days (got {span!r:.80})")


@attrs.frozen
class GroupBy:
    """An aggregation key: the item fields whose values a group shares, and the span of its window.

    Example::

        GroupBy()                                          # type + data.target, per UTC day (the default)
        GroupBy(fields=("type",), span=timedelta(hours=1)) # "12 likes this hour"
        GroupBy.parse("type,data.post/1d")                 # the same thing as text (the CLI's --key)

    A key is a declaration, not a callable: the server must be able to select and count a
    group's items, which it cannot do with Python code. A missing field counts as ``None``.
    """

    fields: tuple[str, ...] = attrs.field(default=("type", "data.target"), validator=_check_fields)
    span: timedelta = attrs.field(default=timedelta(days=1), validator=_check_span)

    @classmethod
    def parse(cls, text: str) -> GroupBy:
        """``"type,data.target/1d"``: fields separated by commas, then ``/`` and a span in m, h or d."""
        fields_text, _, span_text = text.partition("/")
        m = re.fullmatch(r"(\d+)([mhd])", span_text.strip() or "1d")
        if m is None:
            raise InvalidItem("key", f"span must be a number and m, h or d, as in 'type,data.target/1d' (got {text!r:.80})")
        fields = tuple(f.strip() for f in fields_text.split(",") if f.strip())
        return cls(fields=fields, span=timedelta(seconds=int(m.group(1)) * _SPAN_UNITS[m.group(2)]))

    @property
    def span_ms(self) -> int:
        return int(self.span.total_seconds()) * 1000

    def window_of(self, t: datetime) -> int:
        """The number of the window *t* falls in."""
        return to_millis(t) // self.span_ms

    def window_bounds(self, window: int) -> tuple[datetime, datetime]:
        """``[start, end)`` of window number *window*."""
        return from_millis(window * self.span_ms), from_millis((window + 1) * self.span_ms)

    def values_of(self, item: FeedItem) -> tuple[Any, ...]:
        """The key's field values of *item* (``None`` for a missing one), as the server's grouping sees them: a
        ``data`` path read as an aggregation reads ``"$data.a.b"`` (through a list, the list of its elements'
        values), each value :func:`canonical`."""
        out: list[Any] = []
        for f in self.fields:
            if f in _PLAIN_FIELDS:
                out.append(canonical(getattr(item, f)))
                continue
            value: Any = item.data
            for part in f.split(".")[1:]:
                value = _step(value, part)
            out.append(None if value is _MISSING else canonical(value))
        return tuple(out)

    def fingerprint(self, types: Sequence[int | str] = ()) -> bytes:
        """Four bytes that tell this key (and type filter) apart from another, so a cursor is not reused across them."""
        text = repr((self.fields, self.span_ms, sorted(map(repr, types))))
        return hashlib.blake2b(text.encode(), digest_size=4).digest()


#: The default aggregation key: type and ``data.target``, per UTC day.
DEFAULT_GROUP_BY = GroupBy()


def _step(value: Any, part: str) -> Any:
    """One step of an aggregation field path: a document's field, or through a list the values of its elements that
    have it (the list of them)."""
    if isinstance(value, Mapping):
        return value.get(part, _MISSING)
    if isinstance(value, list):
        found = [_step(v, part) for v in value]
        return [v for v in found if v is not _MISSING]
    return _MISSING


def ident(value: Any) -> Hashable:
    """*value* as a hashable value equal to another's exactly when the servers group the two together.

    Python's own equality would merge what the servers keep apart (``True == 1``) and cannot hash
    lists or documents: here booleans, numbers (by value; NaN is one value), strings, lists and
    documents (their fields in order, as BSON compares them) are told apart by their kind.
    """
    if value is None:
        return ("null",)
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, (int, float, Decimal128)):
        number = canonical(value)
        if isinstance(number, Decimal128):
            number = number.to_decimal()
        return ("nan",) if number != number else ("number", number)
    if isinstance(value, str):
        return ("string", value)
    if isinstance(value, (list, tuple)):
        return ("array", tuple(ident(v) for v in value))
    if isinstance(value, Mapping):
        return ("document", tuple((k, ident(v)) for k, v in value.items()))
    if isinstance(value, Binary):
        return ("binary", value.subtype, bytes(value))
    if isinstance(value, bytes):
        return ("binary", 0, value)
    try:
        hash(value)
    except TypeError:
        return (type(value).__name__, repr(value))
    return (type(value).__name__, value)


def group_key(by: GroupBy, values: Sequence[Any], window: int) -> str:
    """The opaque, stable string that names one group (what ``mark_read`` takes): of its :func:`canonical` values."""
    raw = bson.encode({"f": list(by.fields), "s": by.span_ms, "w": window, "v": [canonical(v) for v in values]})
    return _KEY_PREFIX + base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def decode_key(key: object, *, field: str = "groups") -> tuple[tuple[str, ...], int, int, tuple[Any, ...]]:
    """``(fields, span_ms, window, values)`` of a key made by :func:`group_key`; :class:`InvalidItem` otherwise."""
    if not isinstance(key, str) or not key.startswith(_KEY_PREFIX) or len(key) > 8192:
        raise InvalidItem(field, f"must hold group keys (Group.key) or groups (got {key!r:.60})")
    body = key[len(_KEY_PREFIX):]
    try:
        doc = bson.decode(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
        fields, span_ms, window, values = tuple(doc["f"]), int(doc["s"]), int(doc["w"]), tuple(doc["v"])
        if span_ms <= 0 or len(fields) != len(values):
            raise ValueError("its span or values do not fit its fields")
        return fields, span_ms, window, values
    except (binascii.Error, bson.errors.BSONError, KeyError, TypeError, ValueError) as exc:
        raise InvalidItem(field, f"is not a group key ({exc}) (got {key!r:.60})") from None


def key_hash(key: str) -> bytes:
    """The 8 bytes a cursor keeps of a served group."""
    return hashlib.blake2b(key.encode(), digest_size=8).digest()


@attrs.frozen
class Group:
    """One group of a receiver's notifications, as a page of groups returns it.

    ``count`` items (exact, each item once across periods and pulled outboxes) from
    ``actor_count`` distinct senders (exact, unless ``actors_capped``: a group of more than
    :data:`ACTORS_COUNTED` items in a period counts the actors of that many of them there, so
    it has at least ``actor_count``; show ``others`` as "999+"); ``items`` holds the newest
    item of each of the newest actors (at most ``newest`` of them), newest first;
    ``first_time``/``last_time`` are its oldest and newest item's times, ``newest`` the
    position of its newest item (what ``mark_read`` records for a group passed as a value).
    ``seen``: no item newer than the seen marker; ``read``: marked read since its newest item.
    """

    key: str
    values: tuple[Any, ...]
    window_start: datetime
    count: int
    actor_count: int
    items: tuple[FeedItem, ...]
    first_time: datetime
    last_time: datetime
    newest: Position
    seen: bool
    read: bool
    actors_capped: bool = False

    @property
    def actors(self) -> tuple[int | str, ...]:
        """The senders of :attr:`items`, newest first (distinct)."""
        return tuple(item.sender_id for item in self.items)

    @property
    def others(self) -> int:
        """Actors beyond the first one shown: the "3" of "Alice and 3 others"."""
        return max(self.actor_count - 1, 0)


def check_group(group: Group, *, field: str) -> Position:
    """The position *group* (a ``Group`` value passed to ``mark_read``) is read through, once it is checked to be a
    group a page returned: its ``newest`` a timezone-aware time and an ObjectId, its ``key`` a group key whose window
    holds that time and whose values are its ``values``, its ``window_start`` and ``last_time`` those of its key and
    newest item. :class:`InvalidItem` naming *field* otherwise (a mark of an altered group would be stored under a
    key no page shows, or in a cluster that does not own its position)."""
    newest = group.newest
    if (not isinstance(newest, Position) or not isinstance(newest.id, ObjectId)
            or not isinstance(newest.event_time, datetime) or newest.event_time.utcoffset() is None):
        raise InvalidItem(field, "must be a Group a page returned: its newest must be the Position of its newest item, "
                                 f"with a timezone-aware event_time and an ObjectId (got {newest!r:.120})")
    _fields, span_ms, window, values = decode_key(group.key, field=field)
    when = to_millis(newest.event_time)
    if when // span_ms != window or from_millis(window * span_ms) != group.window_start:
        raise InvalidItem(field, "must be a Group a page returned: its newest item and window_start lie outside the "
                                 f"window its key names (got key {group.key!r:.60}, newest at {newest.event_time})")
    if ident(values) != ident(tuple(group.values)):
        raise InvalidItem(field, f"must be a Group a page returned: its key names the values {values!r:.80}, not its "
                                 f"values {group.values!r:.80}")
    if group.last_time != newest.event_time:
        raise InvalidItem(field, f"must be a Group a page returned: its last_time {group.last_time} is not its newest "
                                 f"item's time {newest.event_time}")
    return Position(newest.event_time, newest.id)


@attrs.frozen
class GroupPage:
    """A page of groups newest first, and the cursor for the next (``None`` once the walk is done)."""

    groups: tuple[Group, ...]
    next_cursor: str | None
    queried: tuple[str, ...] = ()


@attrs.frozen
class UnseenGroups:
    """How many groups have an item newer than the seen marker, stopping at ``cap`` (``capped``: show "99+")."""

    count: int
    capped: bool
    marker: Position | None
    queried: tuple[str, ...] = ()


@attrs.frozen
class GroupCursor:
    """Where a walk of groups stands: its ceiling, the window it is in, and the groups of that window served; or, with
    *below*, that every group of that window was served and the walk goes on below it."""

    fingerprint: bytes
    ceiling: Position
    window: int
    served: frozenset[bytes] = frozenset()
    below: bool = False


def encode_group_cursor(cursor: GroupCursor) -> str:
    """The opaque string of *cursor* (``"gc1."`` and URL-safe base64)."""
    head = _CURSOR_HEAD.pack(cursor.fingerprint, to_millis(cursor.ceiling.event_time), cursor.ceiling.id.binary,
                             cursor.window, 1 if cursor.below else 0, len(cursor.served))
    raw = head + b"".join(sorted(cursor.served))
    return _CURSOR_PREFIX + base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def decode_group_cursor(text: object, fingerprint: bytes) -> GroupCursor:
    """Parse a cursor of :func:`encode_group_cursor` made for the same key and types; :class:`InvalidCursor` otherwise."""
    if not isinstance(text, str) or not text.startswith(_CURSOR_PREFIX):
        raise InvalidCursor(f"cursor: not a cursor of grouped reads (got {text!r:.60})")
    body = text[len(_CURSOR_PREFIX):]
    try:
        raw = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
        mark, ms, oid, window, flags, n = _CURSOR_HEAD.unpack_from(raw)
        rest = raw[_CURSOR_HEAD.size:]
        if len(rest) != 8 * n:
            raise ValueError("served groups do not match their count")
        if flags not in (0, 1) or (flags and n):
            raise ValueError("bad flags")
        ceiling = Position(from_millis(ms), ObjectId(oid))
    except (binascii.Error, struct.error, ValueError, OverflowError) as exc:
        raise InvalidCursor(f"cursor: malformed ({exc}) (got {text!r:.60})") from None
    if mark != fingerprint:
        raise InvalidCursor("cursor: made for another key or other types; start the walk again without a cursor")
    return GroupCursor(mark, ceiling, window, frozenset(rest[i:i + 8] for i in range(0, len(rest), 8)), bool(flags))


def position_key(position: Position) -> tuple[datetime, bytes]:
    """A position as a sortable tuple (newest-first order is this tuple's descending order)."""
    return position.event_time, position.id.binary


class Acted(Protocol):
    """An item, or an item known by its position and sender: what :func:`newest_actors` orders."""

    @property
    def event_time(self) -> datetime: ...

    @property
    def id(self) -> ObjectId | None: ...

    @property
    def sender_id(self) -> int | str: ...


A = TypeVar("A", bound=Acted)


def _order(item: Acted) -> tuple[datetime, bytes]:
    assert item.id is not None
    return item.event_time, item.id.binary


def newest_actors(items: Iterable[A], newest: int) -> tuple[A, ...]:
    """The newest item of each actor among *items*, newest first, at most *newest* of them."""
    best: dict[Hashable, A] = {}
    for item in items:
        actor = ident(item.sender_id)
        mine = best.get(actor)
        if mine is None or _order(item) > _order(mine):
            best[actor] = item
    return tuple(sorted(best.values(), key=_order, reverse=True)[:newest])
