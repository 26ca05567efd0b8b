"""Feed ids: ObjectIds stamped with ``event_time``, and ``data_key`` hashes.

``_id`` follows the BSON ObjectId layout, with the event's time instead of the
wall clock in the first four bytes::

    | 4 bytes: event_time, UTC seconds, big-endian | 5 bytes: per-process random | 3 bytes: counter |

The 5 random bytes are drawn once per process and again in every child after
``fork()``; the counter starts at a random value and is shared by all threads.
Together they make ids unique across threads, processes and forks for up to 2**24
ids per process per event second. Sorting by ``_id`` therefore sorts by event
second first, which the read path relies on to break ties.

``data_key`` is the MurmurHash3 x64 128-bit digest (seed 0) of ``f"{kind}_{id}"``
in UTF-8, as lowercase hex of the 16 bytes h1 then h2, each little-endian: the
same string ``mmh3.hash_bytes`` gives in Python and Guava's
``Hashing.murmur3_128().hashString(s, UTF_8).toString()`` prints in Java.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from datetime import datetime

import mmh3
from bson import ObjectId

from .errors import InvalidItem
from .model import event_timestamp

__all__ = ["object_id_for", "make_ids", "data_key", "murmur3_hex", "event_seconds"]

_COUNTER_MASK = 0xFFFFFF
_lock = threading.Lock()
_random_part = 0  # the 5 random bytes, shifted into place (bits 24..63)
_counter = 0
_new_oid = ObjectId.__new__


def _reseed() -> None:
    global _random_part, _counter
    _random_part = int.from_bytes(os.urandom(5), "big") << 24
    _counter = int.from_bytes(os.urandom(3), "big")


_reseed()
os.register_at_fork(after_in_child=_reseed)


def _wrap(raw: bytes) -> ObjectId:
    # ObjectId(raw) re-validates 12 bytes we just built; skipping it halves the cost.
    oid = _new_oid(ObjectId)
    oid._ObjectId__id = raw  # type: ignore[attr-defined]
    return oid


def make_ids(seconds: Sequence[int]) -> list[ObjectId]:
    """Return one fresh ObjectId per entry of *seconds* (UTC epoch seconds, already range-checked).

    The counter values are reserved in one step, so a batch costs one lock round-trip.
    """
    global _counter
    n = len(seconds)
    with _lock:
        start = _counter
        _counter = (start + n) & _COUNTER_MASK
        rand = _random_part
    wrap = _wrap
    return [
        wrap(((sec << 64) | rand | ((start + i) & _COUNTER_MASK)).to_bytes(12, "big"))
        for i, sec in enumerate(seconds)
    ]


def event_seconds(event_time: datetime) -> int:
    """Whole UTC seconds of *event_time*; raises :class:`InvalidItem` per :func:`router.model.event_timestamp`."""
    return int(event_timestamp(event_time))


def object_id_for(event_time: datetime) -> ObjectId:
    """A new, unique ObjectId whose timestamp is *event_time*'s UTC second.

    Example::

        >>> oid = object_id_for(datetime(2016, 5, 1, 10, tzinfo=timezone.utc))
        >>> oid.generation_time.isoformat()
        '2016-05-01T10:00:00+00:00'
    """
    return make_ids((event_seconds(event_time),))[0]


def murmur3_hex(text: str) -> str:
    """Lowercase hex of the MurmurHash3_x64_128 digest (seed 0) of *text* in UTF-8.

    Example::

        >>> murmur3_hex("The quick brown fox jumps over the lazy dog")
        '6c1b07bc7bbc4be347939ac4a93c437a'
    """
    return mmh3.hash_bytes(text.encode("utf-8")).hex()


def data_key(kind: str, object_id: object) -> str:
    """The ``data_key`` of a business object: MurmurHash3_x64_128 of ``f"{kind}_{object_id}"``.

    Example::

        >>> data_key("fabula", 1000983)   # hashes "fabula_1000983"
        '243594d857def216113909cc6956dd08'
    """
    if not isinstance(kind, str) or not kind:
        raise InvalidItem("kind", f"must be a non-empty str (got {kind!r})")
    return murmur3_hex(f"{kind}_{object_id}")
