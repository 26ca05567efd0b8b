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
import struct
import threading
from collections.abc import Sequence
from datetime import datetime

import mmh3
from bson import ObjectId

from .errors import InvalidItem
from .model import ID_RULE, MAX_ID_CHARS, TEXT_RULE, event_timestamp

__all__ = ["object_id_for", "make_ids", "data_key", "murmur3_hex", "event_seconds"]

_COUNTER_MASK = 0xFFFFFF
_lock = threading.Lock()
_random_part = 0  # the 5 random bytes, shifted into place (bits 24..63)
_counter = 0
_new_oid = ObjectId.__new__
#: An id's 12 bytes from its second and its last 8 bytes (cheaper than one 96-bit int's ``to_bytes``: ~30 ns an id).
_pack_id = struct.Struct(">IQ").pack
#: MurmurHash3_x64_128 (seed 0) of bytes: the 16 bytes ``mmh3.hash_bytes`` gives, ~70 ns a call cheaper.
_murmur = mmh3.mmh3_x64_128_digest


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
    pack = _pack_id
    return [wrap(pack(sec, rand | ((start + i) & _COUNTER_MASK))) for i, sec in enumerate(seconds)]


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


def _utf8(text: str, field: str) -> bytes:
    # Always hash bytes: mmh3 5.3 crashes the interpreter on a str holding a lone surrogate.
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidItem(field, f"must be valid Unicode text (got {text!r:.80})") from None


def murmur3_hex(text: str) -> str:
    """Lowercase hex of the MurmurHash3_x64_128 digest (seed 0) of *text* in UTF-8.

    Example::

        >>> murmur3_hex("The quick brown fox jumps over the lazy dog")
        '6c1b07bc7bbc4be347939ac4a93c437a'
    """
    return _murmur(_utf8(text, "text")).hex()


def data_key(kind: str, object_id: object) -> str:
    """The ``data_key`` of a business object: MurmurHash3_x64_128 of ``f"{kind}_{object_id}"``.

    Example::

        >>> data_key("fabula", 1000983)   # hashes "fabula_1000983"
        '243594d857def216113909cc6956dd08'
    """
    if type(kind) is not str or not kind:
        if not (isinstance(kind, str) and kind):
            raise InvalidItem("kind", f"must be a non-empty str (got {kind!r})")
    text = f"{kind}_{object_id}"
    try:  # (inline, not _utf8: a call less per key, on the write path's callers)
        raw = text.encode("utf-8")
    except UnicodeEncodeError:
        raw = _utf8(text, "object_id")  # raises, naming the field
    return _murmur(raw).hex()


# -- fan-out copy ids ---------------------------------------------------------------------
#
# A fan-out writes one copy of an item per receiver, and must be able to write it again
# (after a crash, a timeout, a second run) without doubling it. So a copy's ``_id`` is not
# drawn fresh but derived from what the copy *is*::
#
#     | 4 bytes: event_time, UTC seconds, big-endian | 8 bytes: MurmurHash3 of (data_key, receiver) |
#
# The 8 bytes are the first 8 of the MurmurHash3_x64_128 digest (seed 0, ``mmh3.hash_bytes``)
# of the UTF-8 bytes of ``f"{len(data_key)}:{data_key}"`` + ``"i"`` or ``"s"`` + ``str(receiver_id)``.
# The length prefix makes the encoding injective for any data_key (even one holding the
# separator), and the ``i``/``s`` tag keeps receiver ``5`` and receiver ``"5"`` apart. Hashing
# always goes through ``bytes``: mmh3 5.3 crashes the interpreter on a ``str`` holding a lone
# surrogate, while ``str.encode`` raises ``UnicodeEncodeError`` for it.


def copy_key(data_key: str, receiver_id: int | str) -> bytes:
    """The bytes hashed into a fan-out copy's id (see :func:`copy_id`).

    Example::

        >>> copy_key("ab", 5), copy_key("ab", "5")
        (b'2:abi5', b'2:abs5')
    """
    prefix = f"{len(data_key)}:{data_key}".encode("utf-8")
    if isinstance(receiver_id, str):
        return prefix + b"s" + receiver_id.encode("utf-8")
    return b"%bi%d" % (prefix, receiver_id)


def copy_id(seconds: int, data_key: str, receiver_id: int | str) -> ObjectId:
    """The deterministic ``_id`` of *receiver_id*'s copy of the item *data_key* at event second *seconds*.

    The same arguments always give the same id, so writing a copy twice is a duplicate-key
    no-op; the timestamp is the event's second, as for every feed ``_id``.

    Example::

        >>> oid = copy_id(1462096800, "243594d857def216113909cc6956dd08", 1000386)
        >>> oid.generation_time.isoformat()
        '2016-05-01T10:00:00+00:00'
        >>> oid == copy_id(1462096800, "243594d857def216113909cc6956dd08", 1000386)
        True

    Raises :class:`InvalidItem` for a second outside an ObjectId's range, an empty or
    non-str *data_key*, or a receiver that is not a 64-bit int or a non-empty str.
    """
    _check_stamp(seconds, data_key)
    if isinstance(receiver_id, str):
        ok = 0 < len(receiver_id) <= MAX_ID_CHARS
    else:
        ok = isinstance(receiver_id, int) and not isinstance(receiver_id, bool) and -(2**63) <= receiver_id < 2**63
    if not ok:
        raise InvalidItem("receiver_id", f"{ID_RULE} (got {receiver_id!r:.80})")
    try:
        key = copy_key(data_key, receiver_id)
    except UnicodeEncodeError as exc:
        raise InvalidItem("receiver_id", f"must be valid Unicode text ({exc.reason})") from None
    return _wrap(seconds.to_bytes(4, "big") + _murmur(key)[:8])


def _check_stamp(seconds: object, data_key: object) -> None:
    """The checks :func:`copy_id` and :func:`outbox_id` share: an ObjectId second and a data_key."""
    if isinstance(seconds, bool) or not isinstance(seconds, int) or not 0 <= seconds < 2**32:
        raise InvalidItem("seconds", f"must be an int in [0, 2**32), an ObjectId timestamp (got {seconds!r})")
    if not isinstance(data_key, str) or not 0 < len(data_key) <= MAX_ID_CHARS:
        raise InvalidItem("data_key", f"{TEXT_RULE} (got {data_key!r:.80})")


def copy_ids(seconds: int, data_key: str, receivers: Sequence[int | str]) -> list[ObjectId]:
    """:func:`copy_id` for many receivers of one item: the fan-out's inner loop.

    Arguments are not checked (the caller has: *seconds* in range, *data_key* a non-empty
    str, each receiver an int or a non-empty str). A str that is not valid Unicode raises
    ``UnicodeEncodeError``; callers retry such a batch one receiver at a time.

    Example::

        >>> copy_ids(1462096800, "k", [1, "1"]) == [copy_id(1462096800, "k", 1), copy_id(1462096800, "k", "1")]
        True
    """
    stamp = seconds.to_bytes(4, "big")
    prefix = f"{len(data_key)}:{data_key}".encode("utf-8")
    as_int = prefix + b"i"
    as_str = prefix + b"s"
    murmur = _murmur
    wrap = _wrap
    return [
        wrap(stamp + murmur(as_str + r.encode("utf-8") if isinstance(r, str) else b"%b%d" % (as_int, r))[:8])
        for r in receivers
    ]


__all__ += ["copy_key", "copy_id", "copy_ids"]


def outbox_id(seconds: int, data_key: str) -> ObjectId:
    """The deterministic ``_id`` of the outbox entry of item *data_key* at event second *seconds*.

    Publishing the same activity again is a duplicate-key no-op: one outbox entry per
    (data_key, event second). Layout as :func:`copy_id`, hashing ``f"{len(key)}:{key}o"``.

    Example::

        >>> outbox_id(1462096800, "k") == outbox_id(1462096800, "k")
        True
    """
    _check_stamp(seconds, data_key)
    key = f"{len(data_key)}:{data_key}o".encode("utf-8", "surrogatepass")
    return _wrap(seconds.to_bytes(4, "big") + _murmur(key)[:8])


__all__ += ["outbox_id"]
