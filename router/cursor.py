"""Page cursors: an opaque string holding the sort key of the last item served.

A feed is ordered by ``(event_time desc, _id desc)``; a cursor stores the last
item's ``event_time`` (milliseconds, as BSON stores it) and ``_id``, so the next
page asks for items strictly after it in that order. Because the cursor is a
position and not an offset, items written while a reader pages never shift
later pages: nothing already paged is lost or repeated.

Format: ``"c1."`` followed by URL-safe base64 (no padding) of an 8-byte signed
big-endian millisecond count and the 12 ``_id`` bytes.
"""

from __future__ import annotations

import base64
import binascii
import struct
from datetime import datetime, timedelta, timezone
from typing import Any

import attrs
from bson import ObjectId

from .errors import InvalidCursor

__all__ = ["Position", "encode_cursor", "decode_cursor"]

_PREFIX = "c1."
_LAYOUT = struct.Struct(">q12s")
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


@attrs.frozen
class Position:
    """The sort key of one stored item: where the next page starts (exclusive)."""

    event_time: datetime
    id: ObjectId

    def older_filter(self) -> dict[str, Any]:
        """The query clause for items strictly after this position in newest-first order."""
        return {
            "$or": [
                {"event_time": {"$lt": self.event_time}},
                {"event_time": self.event_time, "_id": {"$lt": self.id}},
            ]
        }


def _to_ms(t: datetime) -> int:
    delta = t - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1000 + delta.microseconds // 1000


def encode_cursor(position: Position) -> str:
    """The opaque cursor string for *position*."""
    raw = _LAYOUT.pack(_to_ms(position.event_time), position.id.binary)
    return _PREFIX + base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def decode_cursor(cursor: str) -> Position:
    """Parse a cursor made by :func:`encode_cursor`; raise :class:`InvalidCursor` otherwise."""
    if not isinstance(cursor, str) or not cursor.startswith(_PREFIX):
        raise InvalidCursor(f"cursor: not a feed-router cursor (got {cursor!r:.60})")
    body = cursor[len(_PREFIX) :]
    try:
        raw = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
        ms, oid = _LAYOUT.unpack(raw)
        event_time = _EPOCH + timedelta(milliseconds=ms)
    except (binascii.Error, struct.error, ValueError, OverflowError) as exc:
        raise InvalidCursor(f"cursor: malformed ({exc}) (got {cursor!r:.60})") from None
    return Position(event_time, ObjectId(oid))
