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

The core hands it :class:`Registered` values and gets them back; only this module builds or
reads a registry document. A pair stored twice is one document (its ``_id`` is the pair,
length-prefixed and tagged like a copy's key in :mod:`router.ids`, so injective): reruns
and concurrent writers register nothing twice. Posts stored before the registry existed are registered by
migration 0006, by one scan of each period's feed and outbox.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, ClassVar

import attrs

from ...model import FeedItem, identity
from ..steps import Collection, Delete, Failure, Find, Insert, Program, Request
from .base import Writer

__all__ = ["POSTS", "REGISTRY", "Registered", "Registry", "entry_id", "fix", "of_items", "registered", "registered_keys",
           "remove"]

#: The collection, in every cluster, that registers each sender's posts.
POSTS: Collection = "posts"
#: A sender's posts oldest first (the index ``sender_time_id``, migration 0006).
_OLDEST_FIRST = (("event_time", 1), ("_id", 1))


def entry_id(sender_id: int | str, data_key: str) -> str:
    """The ``_id`` of the registry entry of *sender_id*'s post *data_key*: the pair, length-prefixed and tagged."""
    if type(sender_id) is not int and type(sender_id) is not str:  # (an Int64: its int; the usual ids skip the call)
        sender_id = identity(sender_id, "sender_id")
    tag = "i" if type(sender_id) is int else "s"
    return f"{len(data_key)}:{data_key}{tag}{sender_id}"


@attrs.frozen(slots=True)
class Registered:
    """One post in the registry: who sent it, its ``data_key`` and its time (where it sorts among its sender's)."""

    sender_id: int | str
    data_key: str
    event_time: datetime

    @property
    def id(self) -> str:
        """The registry entry's id (:func:`entry_id`)."""
        return entry_id(self.sender_id, self.data_key)


def _document(post: Registered) -> dict[str, Any]:
    return {"_id": post.id, "sender_id": post.sender_id, "data_key": post.data_key, "event_time": post.event_time}


def _registered(doc: Mapping[str, Any]) -> Registered:
    return Registered(doc["sender_id"], doc["data_key"], doc["event_time"])


class Registry(Writer[Sequence[Registered]]):
    """The writer of registry entries (ids derived from the pair: a duplicate is the same post, registered before)."""

    collection: ClassVar[Collection] = POSTS

    def documents(self, batch: Sequence[Registered]) -> list[Any]:
        return [_document(p) for p in batch]

    def store(self, cluster: str, documents: Sequence[Any], deadline: float, *, again: bool = False) -> Request:
        return Insert(cluster, POSTS, documents, deadline)

    def id_at(self, batch: Sequence[Registered], position: int) -> str:
        return batch[position].id


#: The registry's writer (stateless).
REGISTRY = Registry()


def of_items(positions: Iterable[int], items: Iterable[FeedItem]) -> tuple[list[Registered], dict[str, list[int]]]:
    """The posts of *items* (``write_many``'s), one per distinct pair, and the *positions* of the items each one
    registers."""
    owners: dict[str, list[int]] = {}
    found: list[Registered] = []
    for position, item in zip(positions, items):
        key = entry_id(item.sender_id, item.data_key)
        mine = owners.get(key)
        if mine is None:  # (a value per post, not per item: write_many's hot path)
            owners[key] = mine = []
            found.append(Registered(item.sender_id, item.data_key, item.event_time))
        mine.append(position)
    return found, owners


def registered(cluster: str, sender_id: int | str, deadline: float, *, limit: int,
               after: Registered | None = None) -> Program[list[Registered] | Failure]:
    """Up to *limit* of *sender_id*'s posts, oldest first, after *after* (one of them)."""
    match: dict[str, Any] = {"sender_id": sender_id}
    if after is not None:
        match["$or"] = [{"event_time": {"$gt": after.event_time}}, {"event_time": after.event_time, "_id": {"$gt": after.id}}]
    docs = yield Find(cluster, POSTS, match, deadline, sort=_OLDEST_FIRST, limit=limit)
    return docs if isinstance(docs, Failure) else [_registered(d) for d in docs]


def registered_keys(cluster: str, sender_id: int | str, deadline: float, *, limit: int) -> Program[list[str] | Failure]:
    """Up to *limit* of *sender_id*'s posts' ``data_key``\\ s, in no order (an erasure removes what it read)."""
    docs = yield Find(cluster, POSTS, {"sender_id": sender_id}, deadline, limit=limit, projection={"_id": 0, "data_key": 1})
    return docs if isinstance(docs, Failure) else [d["data_key"] for d in docs if isinstance(d.get("data_key"), str)]


def remove(cluster: str, sender_id: int | str, keys: Sequence[str], deadline: float) -> Delete:
    """The request that removes *sender_id*'s entries of the posts *keys*."""
    return Delete(cluster, POSTS, {"sender_id": sender_id, "data_key": {"$in": list(keys)}}, deadline)


def fix(cluster: str, data_key: str, ids: Sequence[Any], data: Mapping[str, Any] | None, deadline: float) -> list[Request]:
    """The requests that remove the registry entries *ids* of *data_key* (an update changes nothing here: the
    registry holds no data)."""
    if data is None:
        return [Delete(cluster, POSTS, {"data_key": data_key, "_id": {"$in": list(ids)}}, deadline)]
    return []
