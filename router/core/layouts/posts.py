"""The posts registry: which posts each sender stored in a period, one small document per sender and write.

An erasure must find every copy a user sent, in every receiver's feed, in every period
(:mod:`router.core.privacy.erasure`). The page index starts with the receiver and the edit index
with the ``data_key``; an index on the sender would find them too, at a cost on every copy
written (measured: fan-out at 0.76-0.91 of its rate without it, ``write_many`` at
0.40-0.90, on FerretDB 2). The registry costs one small insert per sender and write
instead, in the cluster that holds the copies, beside them::

    posts: {_id, sender_id, event_time: <the earliest of times>, n: <len(keys)>,
            keys: [data_key, ...], times: [event_time, ...]}

``keys`` are the sender's posts among the write's items (each once, at most :data:`KEYS`
to a document; a write of more takes several), ``times[i]`` the time ``keys[i]`` was
written at (its first item's). A sender's documents are found by the registry's
``{sender_id, event_time, _id}`` index, a page of about :data:`KEYS` posts at a time
(:func:`page`), then their copies by the copies' own ``data_key`` index. Its writers:

* ``write``/``write_many``: one document per sender in each cluster share, sent at the
  same time as its copies (:func:`of_items`, :func:`router.core.writes.insert.write_program`),
  under an id drawn fresh for it: an insert that never meets a duplicate (a send the
  insert loop makes again of the same documents is the only one that can, and such a
  duplicate is that document). An item whose post could not be registered is reported
  not written (:class:`~router.errors.WriteFailed`: write it again). Measured on FerretDB 2
  (1,000 documents a command, load average 5): an insert took the server 118 µs a
  document, an upsert of a document by an id derived from its posts 184 µs (and 46 µs when
  it was there already), and a duplicate answered to an insert cost the client 7.1 µs a
  document to build the error; a fresh id costs neither;
* a fan-out job, once per run, before its first batch (:func:`router.core.fanout.checkpoint.start_job`);
* ``publish``, with the outbox entry (:func:`router.core.social.publish.store_outbox`).
  These two register one post alone, under an id derived from the post
  (:attr:`Registered.id`): a job run again, or two runs at once, register it once.

The same post may be listed by several documents (a write made again, a post stored by a
write and by a fan-out, registrations older than migration 0008): the readers take each
``(time, data_key)`` once. A document is never changed once stored: an erasure removes a
document only after everything of the posts it lists (:func:`remove`, :func:`remove_alone`),
so a writer's document stored meanwhile is never lost with it. Every sender is taken by its
:func:`~router.model.identity` (a ``bson.Int64`` is the int's user; an int and a str are two). Documents of one post each (``data_key``
and ``event_time`` instead of ``keys`` and ``times``), written by migration 0006 and by
routers before 0008, are read as documents listing one post; migration 0008 turns the
ones it finds into documents of a sender's posts each.

The core hands it :class:`Entry` and :class:`Registered` values and gets :class:`Page`
values back; only this module builds or reads a registry document.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, ClassVar

import attrs
from bson import ObjectId

from ...model import FeedItem, identity
from ..steps import Collection, Delete, Failure, Find, Insert, Program, Request
from .base import Writer

__all__ = ["KEYS", "POSTS", "REGISTRY", "Entry", "Page", "Registered", "Registry", "forget", "of_items", "page",
           "post_id", "remove", "remove_alone"]

#: The collection, in every cluster, that registers each sender's posts.
POSTS: Collection = "posts"
#: The most posts one registry document lists, and about how many one :func:`page` gives.
KEYS = 500
#: A sender's documents oldest first (the index ``sender_time_id``, migration 0006).
_OLDEST_FIRST = (("event_time", 1), ("_id", 1))


def post_id(sender_id: int | str, data_key: str) -> str:
    """The ``_id`` of the document that registers *sender_id*'s post *data_key* alone: the pair, length-prefixed and
    tagged (so injective), after a ``p`` no other registry id starts with. The sender is its
    :func:`~router.model.identity` (a ``bson.Int64`` is the int's user)."""
    sender = identity(sender_id, "sender_id")
    return f"p{len(data_key)}:{data_key}{'s' if type(sender) is str else 'i'}{sender}"


@attrs.frozen(slots=True)
class Entry:
    """One registry document: *sender_id*'s posts *keys* (distinct), ``times[i]`` the time of ``keys[i]``."""

    id: str
    sender_id: int | str
    keys: Sequence[str]
    times: Sequence[datetime]


@attrs.frozen(slots=True)
class Registered:
    """One post registered alone (a fan-out job's, ``publish``'s): who sent it, its ``data_key`` and its time."""

    sender_id: int | str
    data_key: str
    event_time: datetime

    @property
    def id(self) -> str:
        """The id of the document that registers this post alone (:func:`post_id`)."""
        return post_id(self.sender_id, self.data_key)

    def entry(self) -> Entry:
        """This post as the registry document that lists it alone."""
        return Entry(self.id, identity(self.sender_id, "sender_id"), (self.data_key,), (self.event_time,))


class Registry(Writer[Sequence[Entry]]):
    """The writer of registry documents (a duplicate id is the same document, stored by an earlier send)."""

    collection: ClassVar[Collection] = POSTS

    def documents(self, batch: Sequence[Entry]) -> list[Any]:
        return [{"_id": e.id, "sender_id": e.sender_id, "event_time": min(e.times), "n": len(e.keys),
                 "keys": list(e.keys), "times": list(e.times)} for e in batch]

    def store(self, cluster: str, documents: Sequence[Any], deadline: float, *, again: bool = False) -> Request:
        return Insert(cluster, POSTS, documents, deadline)

    def id_at(self, batch: Sequence[Entry], position: int) -> str:
        return batch[position].id


#: The registry's writer (stateless).
REGISTRY = Registry()


def of_items(items: Sequence[FeedItem]) -> list[Entry]:
    """The registry documents of *items* (a cluster's share of ``write_many``): per sender, its posts at the time of
    their first item, :data:`KEYS` to a document, each under a fresh id. A post is listed once by a document; one met
    again after :data:`KEYS` other posts of its sender may be listed by the next document too (the readers take it
    once): deduplicating in a small table per document, not in one for the whole write, halved this function's cost
    (measured: 110 against 280 ns a post in writes of 100,000 posts)."""
    senders: dict[Any, list[dict[str, datetime]]] = {}
    last: Any = None
    chunks: list[dict[str, datetime]] = []
    posts: dict[str, datetime] = {}
    for item in items:  # (write_many's hot path: per item a comparison and a lookup; per post a store)
        sender = item.sender_id
        if sender != last:  # (ids equal as Python values are one identity: 5 and bson.Int64(5); 5 and "5" are two)
            chunks = senders.setdefault(identity(sender, "sender_id"), [{}])
            posts = chunks[-1]
            last = sender
        key = item.data_key
        if key not in posts:
            if len(posts) >= KEYS:
                posts = {}
                chunks.append(posts)
            posts[key] = item.event_time
    return [Entry(f"w{ObjectId().binary.hex()}", sender, list(chunk), list(chunk.values()))
            for sender, chunks in senders.items() for chunk in chunks]


@attrs.frozen
class Page:
    """One step through a sender's registry: the documents read (``ids``), the posts they list as ``(time,
    data_key)`` (each once, oldest first), and where the next step starts (``after``: None when none follows)."""

    ids: list[str]
    posts: list[tuple[datetime, str]]
    after: tuple[datetime, str] | None


def page(cluster: str, sender_id: int | str, deadline: float, *, after: tuple[datetime, str] | None = None,
         ordered: bool = False) -> Program[Page | Failure]:
    """The next of *sender_id*'s registry documents that list about :data:`KEYS` posts together (at least one
    document), after *after* (a :attr:`Page.after`) oldest first when *ordered*, else in no order (an erasure removes
    what it read: the next page is what is left).

    Two finds: the documents' sizes first (what their ``n`` says: one for a document of one post), then the posts of
    the documents that fit; so a step holds about :data:`KEYS` posts, however the documents were cut.
    """
    sender_id = identity(sender_id, "sender_id")
    match: dict[str, Any] = {"sender_id": sender_id}
    if after is not None:
        when, last = after
        match["$or"] = [{"event_time": {"$gt": when}}, {"event_time": when, "_id": {"$gt": last}}]
    sizes = yield Find(cluster, POSTS, match, deadline, sort=_OLDEST_FIRST if ordered else None, limit=KEYS,
                       projection={"_id": 1, "event_time": 1, "n": 1})
    if isinstance(sizes, Failure):
        return sizes
    chosen: list[Mapping[str, Any]] = []
    total = 0
    for doc in sizes:
        n = doc.get("n", 1)
        n = n if isinstance(n, int) and n > 0 else 1
        if chosen and total + n > KEYS:
            break
        chosen.append(doc)
        total += n
    if not chosen:
        return Page([], [], None)
    ids = [d["_id"] for d in chosen]
    docs = yield Find(cluster, POSTS, {"_id": {"$in": ids}, "sender_id": sender_id}, deadline)
    if isinstance(docs, Failure):
        return docs
    posts: set[tuple[datetime, str]] = set()
    for doc in docs:
        posts.update(_listed(doc))
    more = len(chosen) < len(sizes) or len(sizes) == KEYS
    tail = chosen[-1]
    return Page(ids, sorted(posts), (tail["event_time"], tail["_id"]) if more else None)


def _listed(doc: Mapping[str, Any]) -> list[tuple[datetime, str]]:
    """The ``(time, data_key)`` of each post a registry document lists (of either shape; what is not a key and a
    time is skipped)."""
    keys, times = doc.get("keys"), doc.get("times")
    if not isinstance(keys, list):  # a document of one post (migration 0006, routers before 0008)
        keys, times = [doc.get("data_key")], [doc.get("event_time")]
    elif not isinstance(times, list) or len(times) != len(keys):
        times = [doc.get("event_time")] * len(keys)
    return [(t, k) for k, t in zip(keys, times) if isinstance(k, str) and isinstance(t, datetime)]


def remove(cluster: str, sender_id: int | str, ids: Sequence[str], deadline: float) -> Delete:
    """The request that removes *sender_id*'s registry documents *ids* (a page's, once its posts are gone)."""
    return Delete(cluster, POSTS, {"sender_id": identity(sender_id, "sender_id"), "_id": {"$in": list(ids)}}, deadline)


def remove_alone(cluster: str, sender_id: int | str, keys: Sequence[str], deadline: float) -> Delete:
    """The request that removes *sender_id*'s registry documents that list one of the posts *keys* alone (of either
    shape), once those posts are gone; a document that lists other posts too is left to the page that finds it."""
    listed = list(keys)
    return Delete(cluster, POSTS, {"sender_id": identity(sender_id, "sender_id"),
                                   "$or": [{"n": 1, "keys": {"$in": listed}}, {"data_key": {"$in": listed}}]}, deadline)


def forget(cluster: str, post: Registered, deadline: float) -> Delete:
    """The request that removes the document registering *post* alone (a post refused after it was registered)."""
    return Delete(cluster, POSTS, {"_id": post.id}, deadline)
