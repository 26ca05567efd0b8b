"""The posts registry: which posts each sender stored in a period, one small document per sender and ``data_key``.

An erasure must find every copy a user sent, in every receiver's feed, in every period
(:mod:`router.core.erasure`). The page index starts with the receiver and the edit index
with the ``data_key``; an index on the sender would find them too, at a cost on every copy
written (measured: fan-out at 0.76-0.91 of its rate without it, ``write_many`` at
0.40-0.90, on FerretDB 2). The registry costs one small insert per *post* instead, in the
cluster that holds the post's copies::

    posts: {_id: "<len(data_key)>:<data_key><i|s><sender_id>", sender_id, data_key, event_time}

so a sender's copies are found by the registry's ``{sender_id, event_time, _id}`` index and
then by the copies' own ``data_key`` index. Its writers:

* ``write``/``write_many``: one insert per cluster share, of its distinct ``(sender,
  data_key)`` pairs, sent at the same time as its copies
  (:func:`router.core.writes.write_program`); an item whose pair could not be registered is
  reported not written (:class:`~router.errors.WriteFailed`: write it again);
* a fan-out job, once per run, before its first batch (:func:`router.core.checkpoint.start_job`);
* ``publish``, with the outbox entry (:func:`router.core.social.store_outbox`).

A pair stored twice is one document (its ``_id`` is the pair, length-prefixed and tagged
like a copy's key in :mod:`router.ids`, so injective): reruns and concurrent writers
register nothing twice. Posts stored before the registry existed are registered by
migration 0006, by one scan of each period's feed and outbox.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from ..steps import Collection, Delete, Find, Request

__all__ = ["POSTS", "entry", "entry_id", "fix", "keys_of", "of_copies", "position_of", "registered", "registered_keys",
           "remove"]

#: The collection, in every cluster, that registers each sender's posts.
POSTS: Collection = "posts"
#: A sender's posts oldest first (the index ``sender_time_id``, migration 0006).
_OLDEST_FIRST = (("event_time", 1), ("_id", 1))


def entry_id(sender_id: int | str, data_key: str) -> str:
    """The ``_id`` of the registry entry of *sender_id*'s post *data_key*: the pair, length-prefixed and tagged."""
    tag = "i" if type(sender_id) is int else "s"
    return f"{len(data_key)}:{data_key}{tag}{sender_id}"


def entry(sender_id: int | str, data_key: str, event_time: datetime) -> dict[str, Any]:
    """The registry document of one post."""
    return {"_id": entry_id(sender_id, data_key), "sender_id": sender_id, "data_key": data_key, "event_time": event_time}


def of_copies(positions: Iterable[int], copies: Iterable[Mapping[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, list[int]]]:
    """The registry documents of the posts of *copies* (entries, as the core builds them), one per distinct pair,
    and the *positions* of the copies each one registers."""
    owners: dict[str, list[int]] = {}
    docs: list[dict[str, Any]] = []
    for position, copy in zip(positions, copies):
        key = entry_id(copy["sender_id"], copy["data_key"])
        mine = owners.get(key)
        if mine is None:
            owners[key] = mine = []
            docs.append({"_id": key, "sender_id": copy["sender_id"], "data_key": copy["data_key"],
                         "event_time": copy["event_time"]})
        mine.append(position)
    return docs, owners


def registered(cluster: str, sender_id: int | str, deadline: float, *, limit: int,
               after: tuple[datetime, str] | None = None) -> Find:
    """Up to *limit* of *sender_id*'s registry entries, oldest first, after *after* (:func:`position_of` one)."""
    match: dict[str, Any] = {"sender_id": sender_id}
    if after is not None:
        match["$or"] = [{"event_time": {"$gt": after[0]}}, {"event_time": after[0], "_id": {"$gt": after[1]}}]
    return Find(cluster, POSTS, match, deadline, sort=_OLDEST_FIRST, limit=limit)


def position_of(doc: Mapping[str, Any]) -> tuple[datetime, str]:
    """Where a registry entry sorts among its sender's (what :func:`registered` goes on after)."""
    return doc["event_time"], doc["_id"]


def registered_keys(cluster: str, sender_id: int | str, deadline: float, *, limit: int) -> Find:
    """Up to *limit* of *sender_id*'s registry entries, in no order (an erasure removes what it read)."""
    return Find(cluster, POSTS, {"sender_id": sender_id}, deadline, limit=limit, projection={"_id": 0, "data_key": 1})


def keys_of(docs: Iterable[Mapping[str, Any]]) -> list[str]:
    """The ``data_key``\\ s of registry (or outbox) documents, as read."""
    return [doc["data_key"] for doc in docs if isinstance(doc.get("data_key"), str)]


def remove(cluster: str, sender_id: int | str, keys: Sequence[str], deadline: float) -> Delete:
    """The request that removes *sender_id*'s entries of the posts *keys*."""
    return Delete(cluster, POSTS, {"sender_id": sender_id, "data_key": {"$in": list(keys)}}, deadline)


def fix(cluster: str, data_key: str, ids: Sequence[Any], data: Mapping[str, Any] | None, deadline: float) -> list[Request]:
    """The requests that remove the registry entries *ids* of *data_key* (an update changes nothing here: the
    registry holds no data)."""
    if data is not None:
        return []
    return [Delete(cluster, POSTS, {"data_key": data_key, "_id": {"$in": list(ids)}}, deadline)]
