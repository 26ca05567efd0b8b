"""The input rules: what an item, an activity or a receiver must be before anything is written.

Every writer checks through here (``write``/``write_many``, fan-out, ``publish``,
backfill, the workers), so a value is either refused with
:class:`~router.errors.InvalidItem` naming the field, or storable on any server:

* ``event_time``: timezone-aware, within an ObjectId's range (:func:`router.model.event_timestamp`);
* ``receiver_id``, ``sender_id``, ``type``: a 64-bit int or a non-empty UTF-8 str of at most
  :data:`~router.model.MAX_ID_CHARS` characters; ``data_key``: such a str;
* ``data``: a mapping whose keys, at every depth, are str that do not start with ``$`` and
  hold no ``.`` or NUL (:func:`key_problem`), nesting at most :data:`MAX_DATA_DEPTH`
  levels, encoding to at most :data:`MAX_DATA_BYTES` of BSON.

Together these keep every stored document under MongoDB's 16 MiB limit.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

import bson
from bson.errors import InvalidDocument

from ...errors import InvalidItem
from ...model import ID_RULE, MAX_ID_CHARS, MAX_OBJECTID_SECONDS, TEXT_RULE, Activity, FeedItem, event_timestamp, identity, is_id, is_text

__all__ = ["MAX_DATA_BYTES", "MAX_DATA_DEPTH", "check_item", "check_data", "key_problem"]

UTC = timezone.utc
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


def check_data(data: Mapping[str, Any], index: int | None) -> None:
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
    check_data(data, index)
    return ts


def check_activity(activity: object, *, field: str = "activity") -> float:
    """Check an :class:`~router.model.Activity` can be stored; return its ``event_time`` as UTC epoch seconds.

    The same rules as :func:`check_item`, for every field but the receiver.
    """
    if type(activity) is not Activity:
        raise InvalidItem(field, f"must be an Activity (got {type(activity).__name__})")
    ts = event_timestamp(activity.event_time)
    for name in ("sender_id", "type"):
        value = getattr(activity, name)
        if not is_id(value):
            raise InvalidItem(name, f"{ID_RULE} (got {value!r:.80})")
    if not is_text(activity.data_key):
        raise InvalidItem("data_key", f"{TEXT_RULE} (got {activity.data_key!r:.80})")
    if not isinstance(activity.data, Mapping):
        raise InvalidItem("data", f"must be a mapping (got {type(activity.data).__name__})")
    check_data(activity.data, None)
    return ts


def receiver_problem(value: object) -> str | None:
    """Why *value* cannot be a receiver id (:data:`~router.model.ID_RULE`), or ``None`` when it can."""
    if type(value) is int:
        return None if _MIN64 <= value < _MAX64 else f"{ID_RULE} (got {value!r:.80})"
    if type(value) is str and 0 < len(value) <= MAX_ID_CHARS:
        if value.isascii():  # the usual case: no encoding needed (as in is_text)
            return None
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            return f"must be valid Unicode text ({exc.reason})"
        return None
    return None if is_id(value) else f"{ID_RULE} (got {value!r:.80})"


def check_ids(values: object, *, field: str, noun: str, limit: int, too_many: str, empty: bool = True) -> tuple[int | str, ...]:
    """The ids of argument *field* (senders, types) as a sorted tuple without repeats (``None``: none).

    :class:`InvalidItem` names the argument as the caller gave it (``pull[1]: ...``,
    ``types: ...``): not a list of *noun*, an empty one unless *empty*, a bad id, or more than
    *limit* distinct ids (*too_many* says why there is a limit).
    """
    if values is None:
        return ()
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or (not empty and not values):
        shown = type(values).__name__ if empty else f"{values!r:.80}"
        raise InvalidItem(field, f"must be a {'' if empty else 'non-empty '}list of {noun} (got {shown})")
    chosen: set[int | str] = set()
    for i, value in enumerate(values):
        chosen.add(identity(value, f"{field}[{i}]"))
    if len(chosen) > limit:
        raise InvalidItem(field, f"at most {limit} {too_many} (got {len(chosen)})")
    return tuple(sorted(chosen, key=lambda v: (isinstance(v, str), v)))


def check_senders(senders: object, *, field: str, limit: int, per: str) -> tuple[int | str, ...]:
    """:func:`check_ids` for sender lists: ``pull[1]: ...`` for a read, ``senders[0]: ...`` for a backfill; more
    than *limit* distinct senders (the configured ``read.max_pull``) is ``<field>: at most <limit> senders per <per>``."""
    return check_ids(senders, field=field, noun="sender ids", limit=limit,
                     too_many=f"senders per {per} (read.max_pull in clusters.yaml)")


__all__ += ["check_activity", "check_ids", "check_senders", "receiver_problem"]
