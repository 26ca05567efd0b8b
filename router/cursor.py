"""Page cursors: an opaque string holding the sort key of the last item served.

A feed is ordered by ``(event_time desc, _id desc)``; a cursor stores the last
item's ``event_time`` (milliseconds, as BSON stores it) and ``_id``, so the next
page asks for items strictly after it in that order. Because the cursor is a
position and not an offset, items written while a reader pages never shift
later pages: nothing already paged is lost or repeated.

Format: ``"c1."`` followed by URL-safe base64 (no padding) of an 8-byte signed
big-endian millisecond count and the 12 ``_id`` bytes.

After a *partial* page (a cluster could not be read), the cursor also remembers
each skipped cluster and where its unread items begin: ``"c2."`` + base64 of a
flags byte, the main position (if any), and per skipped cluster its name and
position (if any). Once a skipped cluster answers again, its items are served
before the main walk continues, so none of them is lost.
"""

from __future__ import annotations

import base64
import binascii
import struct
from collections.abc import Mapping
from datetime import datetime

import attrs
from bson import ObjectId

from .errors import InvalidCursor
from .model import from_millis, to_millis

__all__ = [
    "Position", "CursorState", "encode_cursor", "decode_cursor", "encode_state", "decode_state", "check_state",
]

_PREFIX = "c1."
_LAYOUT = struct.Struct(">q12s")


@attrs.frozen
class Position:
    """The sort key of one item served: where the next page starts (exclusive).

    ``skip`` (pulled reads only) counts the pulled outbox entries at exactly
    ``event_time`` that sort at or before this position: the next page asks for that
    many more, since the store cannot sort them the way the page does.
    """

    event_time: datetime
    id: ObjectId
    skip: int = 0


def encode_cursor(position: Position) -> str:
    """The opaque cursor string for *position*."""
    raw = _LAYOUT.pack(to_millis(position.event_time), position.id.binary)
    return _PREFIX + base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def decode_cursor(cursor: str) -> Position:
    """Parse a cursor made by :func:`encode_cursor`; raise :class:`InvalidCursor` otherwise."""
    if not isinstance(cursor, str) or not cursor.startswith(_PREFIX):
        raise InvalidCursor(f"cursor: not a feed-router cursor (got {cursor!r:.60})")
    body = cursor[len(_PREFIX) :]
    try:
        raw = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
        ms, oid = _LAYOUT.unpack(raw)
        event_time = from_millis(ms)
    except (binascii.Error, struct.error, ValueError, OverflowError) as exc:
        raise InvalidCursor(f"cursor: malformed ({exc}) (got {cursor!r:.60})") from None
    return Position(event_time, ObjectId(oid))


@attrs.frozen
class CursorState:
    """Where paging stands: the main walk's position, the clusters still owed, and whether the walk ended."""

    position: Position | None = None
    pending: tuple[tuple[str, Position | None], ...] = ()
    done: bool = False


_V2 = "c2."
_POS = _LAYOUT


_SKIP = struct.Struct(">I")


def _pack_position(position: Position | None) -> bytes:
    if position is None:
        return b"\x00"
    packed = _POS.pack(to_millis(position.event_time), position.id.binary)
    if position.skip:
        return b"\x02" + packed + _SKIP.pack(min(position.skip, 2**32 - 1))
    return b"\x01" + packed


def encode_state(state: CursorState) -> str:
    """The cursor string for *state* (a plain ``c1.`` cursor when nothing is pending)."""
    if not state.pending and not state.done and state.position is not None and not state.position.skip:
        return encode_cursor(state.position)
    parts = [bytes([1 if state.done else 0]), _pack_position(state.position), bytes([len(state.pending)])]
    for name, position in state.pending:
        raw_name = name.encode("utf-8")
        parts += [bytes([len(raw_name)]), raw_name, _pack_position(position)]
    return _V2 + base64.urlsafe_b64encode(b"".join(parts)).rstrip(b"=").decode("ascii")


def decode_state(cursor: str) -> CursorState:
    """Parse any cursor this module makes; raise :class:`InvalidCursor` otherwise."""
    if isinstance(cursor, str) and cursor.startswith(_PREFIX):
        return CursorState(position=decode_cursor(cursor))
    if not isinstance(cursor, str) or not cursor.startswith(_V2):
        raise InvalidCursor(f"cursor: not a feed-router cursor (got {cursor!r:.60})")
    body = cursor[len(_V2) :]
    try:
        raw = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
        at = 0

        def take(n: int) -> bytes:
            nonlocal at
            if at + n > len(raw):
                raise ValueError("truncated")
            chunk = raw[at : at + n]
            at += n
            return chunk

        def position() -> Position | None:
            flag = take(1)
            if flag == b"\x00":
                return None
            if flag not in (b"\x01", b"\x02"):
                raise ValueError("bad position flag")
            ms, oid = _POS.unpack(take(_POS.size))
            skip = _SKIP.unpack(take(_SKIP.size))[0] if flag == b"\x02" else 0
            return Position(from_millis(ms), ObjectId(oid), skip)

        done = take(1) == b"\x01"
        main = position()
        pending = []
        for _ in range(take(1)[0]):
            name = take(take(1)[0]).decode("utf-8")
            pending.append((name, position()))
        if at != len(raw):
            raise ValueError("trailing bytes")
    except (binascii.Error, struct.error, ValueError, OverflowError, UnicodeDecodeError) as exc:
        raise InvalidCursor(f"cursor: malformed ({exc}) (got {cursor!r:.60})") from None
    return CursorState(position=main, pending=tuple(pending), done=done)


def check_state(state: CursorState, starts: Mapping[str, datetime]) -> CursorState:
    """Return *state* if the router could have produced it for clusters whose periods start at *starts*.

    The router only ever owes a configured cluster, each at most once, from a position
    at or after that cluster's period start (an older position could not be owed by it),
    and a finished walk with nothing owed yields no cursor at all. Anything else is a
    forged or foreign cursor: :class:`InvalidCursor`, naming what is wrong.
    """
    seen: set[str] = set()
    for name, position in state.pending:
        if name in seen:
            raise InvalidCursor(f"cursor: owes cluster {name!r} twice; not a cursor this router made")
        seen.add(name)
        start = starts.get(name)
        if start is None:
            raise InvalidCursor(f"cursor: owes cluster {name!r}, which has no period here; not a cursor this router made")
        if position is not None and position.event_time < start:
            raise InvalidCursor(
                f"cursor: owes cluster {name!r} items before {position.event_time.isoformat()}, which precedes its "
                f"period (from {start.isoformat()}); not a cursor this router made"
            )
    if state.done and not state.pending:
        raise InvalidCursor("cursor: marks a finished walk that owes nothing; not a cursor this router made")
    return state
