"""The posts registry: which posts each sender stored in a period, one small document per sender and ``data_key``.

An erasure must find every copy a user sent, in every receiver's feed, in every period
(:mod:`router.core.erasure`). The page index starts with the receiver and the edit index
with the ``data_key``; an index on the sender would find them too, at a cost on every copy
written (measured: fan-out at 0.76-0.91 of its rate without it, ``write_many`` at
0.40-0.90, on FerretDB 2). The registry costs one small insert per *post* instead, in the
cluster that holds the post's copies::

    posts: {_id: "<len(data_key)>:<data_key><i|s><sender_id>", sender_id, data_key, event_time}

so a sender's copies are found by the registry's ``{sender_id, event_time}`` index and then
by the copies' own ``data_key`` index. Its writers:

* ``write``/``write_many``: one insert per cluster batch, of the batch's distinct
  ``(sender, data_key)`` pairs, sent at the same time as the batch's copies
  (:func:`router.core.writes.write_program`); an item whose pair could not be registered is
  reported not written (:class:`~router.errors.WriteFailed`: write it again);
* a fan-out job, once per run, before its first batch (:func:`router.core.checkpoint.start_job`);
* ``publish``, with the outbox entry (:func:`router.core.social.store_outbox`).

A pair stored twice is one document (its ``_id`` is the pair, length-prefixed and tagged
like a copy's key in :mod:`router.ids`, so it is injective): reruns and concurrent writers
register nothing twice. Data stored before the registry existed is registered by
migration 0006, by one scan of each period's feed and outbox.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from .steps import Collection, Delete, Find, Request

__all__ = ["POSTS", "entries", "entry", "entry_id", "fix", "registered", "registered_keys"]

#: The collection, in every cluster, that registers each sender's posts.
POSTS: Collection = "posts"
#: The registry's order for a sender (its index ``sender_time_id``, migration 0006).
SENDER_ORDER = (("event_time", 1), ("_id", 1))


def entry_id(sender_id: int | str, data_key: str) -> str:
    """The ``_id`` of the registry entry of *sender_id*'s post *data_key*: the pair, length-prefixed and tagged."""
    tag = "i" if type(sender_id) is int else "s"
    return f"{len(data_key)}:{data_key}{tag}{sender_id}"


def entry(sender_id: int | str, data_key: str, event_time: datetime) -> dict[str, Any]:
    """The registry document of one post."""
    return {"_id": entry_id(sender_id, data_key), "sender_id": sender_id, "data_key": data_key, "event_time": event_time}


def entries(posts: Iterable[tuple[int | str, str, datetime]]) -> list[dict[str, Any]]:
    """The registry documents of *posts* (``(sender, data_key, event_time)``), one per distinct pair, first time kept."""
    seen: dict[str, dict[str, Any]] = {}
    for sender, key, when in posts:
        oid = entry_id(sender, key)
        if oid not in seen:
            seen[oid] = {"_id": oid, "sender_id": sender, "data_key": key, "event_time": when}
    return list(seen.values())


def registered(cluster: str, sender_id: int | str, deadline: float, *, limit: int,
               after: tuple[datetime, str] | None = None) -> Find:
    """Up to *limit* of *sender_id*'s registry entries, oldest first (after *after*, an entry's time and ``_id``)."""
    match: dict[str, Any] = {"sender_id": sender_id}
    if after is not None:
        match["$or"] = [{"event_time": {"$gt": after[0]}}, {"event_time": after[0], "_id": {"$gt": after[1]}}]
    return Find(cluster, POSTS, match, deadline, sort=SENDER_ORDER, limit=limit)


def registered_keys(cluster: str, sender_id: int | str, deadline: float, *, limit: int) -> Find:
    """Up to *limit* of *sender_id*'s registered ``data_key``\\ s, in no order (an erasure removes what it read)."""
    return Find(cluster, POSTS, {"sender_id": sender_id}, deadline, limit=limit, projection={"_id": 0, "data_key": 1})


def fix(cluster: str, data_key: str, ids: Sequence[Any], data: Mapping[str, Any] | None, deadline: float) -> list[Request]:
    """The requests that remove the registry entries *ids* of *data_key* (an update changes nothing here: the
    registry holds no data)."""
    if data is not None:
        return []
    return [Delete(cluster, POSTS, {"data_key": data_key, "_id": {"$in": list(ids)}}, deadline)]
