"""The outbox: one document per published post, ``{_id, data_key, sender_id, event_time, type, data}``.

Every layout shares it (a period's layout decides how its receivers' copies are stored;
a post is stored once either way). This module is the outbox's layout: the only code that
builds or reads an outbox document. The core hands it :class:`~.values.Post` values and
gets posts back (:func:`find`), or the keys a receiver's copies would have (:func:`keys`).
Pulled reads, backfill, publish and the edits of a post ask it for their requests.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, ClassVar

from bson import ObjectId

from ...ids import copy_ids
from ...model import Activity, FeedItem
from ..policy import deadline_in
from ..steps import Collection, Delete, Failure, Find, Insert, Program, Request, Update
from .base import EditSettings, Writer
from .queries import PAGE_SORT, fix_requests, key_edit, outside_clause
from .values import Post

__all__ = ["OUTBOX", "Outbox", "edit", "find", "fix", "keyed", "keys", "outside", "published", "pulled_item", "remove",
           "sent_keys", "sort_key", "stream"]

log = logging.getLogger(__name__)


def _document(post: Post) -> dict[str, Any]:
    a = post.activity
    return {"_id": post.id, "data_key": a.data_key, "sender_id": a.sender_id, "event_time": a.event_time, "type": a.type,
            "data": a.data}


def _post(doc: Mapping[str, Any]) -> Post:
    return Post(doc["_id"], Activity(sender_id=doc["sender_id"], event_time=doc["event_time"], type=doc["type"],
                                     data=doc["data"], data_key=doc["data_key"]))


class Outbox(Writer[Sequence[Post]]):
    """The writer of outbox entries (ids derived from the post, :func:`~router.ids.outbox_id`: a duplicate is the
    same post, stored before)."""

    collection: ClassVar[Collection] = "outbox"

    def documents(self, batch: Sequence[Post]) -> list[Any]:
        return [_document(p) for p in batch]

    def store(self, cluster: str, documents: Sequence[Any], deadline: float, *, again: bool = False) -> Request:
        return Insert(cluster, "outbox", documents, deadline)

    def stored(self, cluster: str, batch: Sequence[Post], positions: Sequence[int],
               deadline: float) -> Program[dict[int, bool] | Failure]:
        ours = {batch[p].id: p for p in positions}
        docs = yield Find(cluster, "outbox", {"_id": {"$in": list(ours)}}, deadline)
        if isinstance(docs, Failure):
            return docs
        return {ours[d["_id"]]: _post(d).same_as(batch[ours[d["_id"]]]) for d in docs if d["_id"] in ours}

    def id_at(self, batch: Sequence[Post], position: int) -> ObjectId:
        return batch[position].id


#: The outbox's writer (stateless).
OUTBOX = Outbox()


def _match(senders: Sequence[int | str], types: Sequence[int | str], at_or_before: datetime | None, at: datetime | None,
           before: datetime | None, after: datetime | None, at_or_after: datetime | None = None) -> dict[str, Any]:
    match: dict[str, Any] = {"sender_id": {"$in": list(senders)}}
    if types:
        match["type"] = {"$in": list(types)}
    times = {op: t for op, t in (("$lte", at_or_before), ("$lt", before), ("$gt", after), ("$gte", at_or_after))
             if t is not None}
    if at is not None:
        match["event_time"] = at
    elif times:
        match["event_time"] = times
    return match


def find(cluster: str, senders: Sequence[int | str], deadline: float, *, types: Sequence[int | str] = (),
         at_or_before: datetime | None = None, at: datetime | None = None, before: datetime | None = None,
         after: datetime | None = None, at_or_after: datetime | None = None,
         limit: int = 0) -> Program[list[Post] | Failure]:
    """The posts of *senders* (of *types*, when given) in a time range, newest first by ``(event_time, id)``, up to
    *limit*."""
    docs = yield Find(cluster, "outbox", _match(senders, types, at_or_before, at, before, after, at_or_after), deadline,
                      sort=PAGE_SORT, limit=limit)
    return docs if isinstance(docs, Failure) else [_post(d) for d in docs]


def stream(senders: Sequence[int | str], *, types: Sequence[int | str] = (),
           after: datetime | None = None) -> list[dict[str, Any]]:
    """The first stages of an ``aggregate`` on ``outbox`` that yield *senders*' posts (of *types*, when given) after
    *after*, each as a document with a copy's fields but ``receiver_id`` (what
    :meth:`~router.core.layouts.base.Layout.copy_stream` yields of copies): what grouped reads group on the server."""
    return [{"$match": _match(senders, types, None, None, None, after)}]


def keys(cluster: str, senders: Sequence[int | str], receiver_id: int | str, deadline: float, *,
         at: datetime | None = None, after: datetime | None = None,
         limit: int = 0) -> Program[list[tuple[datetime, ObjectId] | None] | Failure]:
    """Where each of *senders*' posts in a time range sorts in *receiver_id*'s feed (:func:`keyed`: None for a post
    no copy can be made of), newest first, reading only what that needs of each."""
    docs = yield Find(cluster, "outbox", _match(senders, (), None, at, None, after), deadline, sort=PAGE_SORT,
                      limit=limit, projection={"_id": 1, "event_time": 1, "data_key": 1})
    if isinstance(docs, Failure):
        return docs
    return [_keyed(doc.get("_id"), doc.get("event_time"), doc.get("data_key"), receiver_id) for doc in docs]


def _keyed(oid: Any, t: Any, data_key: Any, receiver_id: int | str) -> tuple[datetime, ObjectId] | None:
    try:
        (key,) = copy_ids(int(t.timestamp()), data_key, [receiver_id])
    except (AttributeError, TypeError, ValueError, UnicodeEncodeError) as exc:
        log.warning("outbox entry %r skipped: %s", oid, exc)
        return None
    return t, key


def keyed(post: Post, receiver_id: int | str) -> tuple[datetime, ObjectId] | None:
    """Where *post* sorts in *receiver_id*'s feed: its time and the id the receiver's copy has (or would have);
    None for a post no copy can be made of."""
    return _keyed(post.id, post.activity.event_time, post.activity.data_key, receiver_id)


def pulled_item(post: Post, receiver_id: int | str) -> tuple[datetime, ObjectId, FeedItem] | None:
    """*post* as *receiver_id*'s page shows it (under the key of :func:`keyed`)."""
    where = keyed(post, receiver_id)
    if where is None:
        return None
    t, key = where
    return t, key, post.activity.for_receiver(receiver_id, id=key)


def sort_key(post: Post) -> tuple[datetime, ObjectId]:
    """A post's own sort key in the outbox (its time and id)."""
    return post.activity.event_time, post.id


def fix(cluster: str, data_key: str, ids: Sequence[Any], data: Mapping[str, Any] | None, deadline: float) -> list[Request]:
    """Requests that remove (*data* None) or re-data the outbox entries of *data_key* among *ids*."""
    return fix_requests(cluster, "outbox", data_key, ids, data, deadline)


def edit(cluster: str, data_key: str, data: Mapping[str, Any] | None, settings: EditSettings) -> Program[Failure | None]:
    """Remove (*data* None) or re-data every outbox entry of *data_key* in one request: one per second it was
    published at, not one per copy."""
    match, update = key_edit(data_key, data)
    deadline = deadline_in(settings.timeout)
    answer = yield (Delete(cluster, "outbox", match, deadline) if update is None
                    else Update(cluster, "outbox", match, update, deadline))
    return answer if isinstance(answer, Failure) else None


# -- a user's posts: erasure and export (router.core.privacy.erasure, router.core.privacy.export) -----------------


def sent_keys(cluster: str, sender_id: int | str, deadline: float, *, limit: int) -> Program[list[str] | Failure]:
    """Up to *limit* of *sender_id*'s posts' ``data_key``\\ s, in no order (an erasure removes what it read)."""
    docs = yield Find(cluster, "outbox", {"sender_id": sender_id}, deadline, limit=limit, projection={"_id": 0, "data_key": 1})
    return docs if isinstance(docs, Failure) else [d["data_key"] for d in docs if isinstance(d.get("data_key"), str)]


def published(cluster: str, sender_id: int | str, keys: Sequence[str], deadline: float) -> Program[list[Post] | Failure]:
    """*sender_id*'s posts among *keys* (at most one each), as they are now (updated data included)."""
    docs = yield Find(cluster, "outbox", {"sender_id": sender_id, "data_key": {"$in": list(keys)}}, deadline)
    return docs if isinstance(docs, Failure) else [_post(d) for d in docs]


def remove(cluster: str, sender_id: int | str, keys: Sequence[str], deadline: float) -> Delete:
    """The request that removes *sender_id*'s posts *keys*."""
    return Delete(cluster, "outbox", {"sender_id": sender_id, "data_key": {"$in": list(keys)}}, deadline)


def outside(start: datetime | None, end: datetime | None) -> tuple[dict[str, Any], str]:
    """The filter of outbox entries outside ``[start, end)``, and the field that gives an entry's time."""
    return outside_clause(start, end, earliest="event_time", latest="event_time"), "event_time"
