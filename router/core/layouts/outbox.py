"""The outbox: one document per published post, ``{_id, data_key, sender_id, event_time, type, data}``.

Every layout shares it (a period's layout decides how its receivers' copies are stored;
a post is stored once either way). Pulled reads, backfill, publish and the edits of a
post ask this module for their queries, and turn its answers into items here.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from bson import ObjectId

from ...ids import copy_ids
from ...model import Activity, FeedItem
from ..steps import Delete, Find, Request
from .copies import PAGE_SORT, fix_requests, key_edit

__all__ = ["activity_of", "document", "edit", "entry_key", "find", "fix", "keyed", "published", "pulled_item", "remove",
           "sent_keys"]

log = logging.getLogger(__name__)


def document(oid: ObjectId, activity: Activity) -> dict[str, Any]:
    """The outbox document of *activity* under ``_id`` *oid*."""
    return {"_id": oid, "data_key": activity.data_key, "sender_id": activity.sender_id,
            "event_time": activity.event_time, "type": activity.type, "data": activity.data}


def activity_of(doc: Mapping[str, Any]) -> Activity:
    """The activity of a stored outbox document."""
    return Activity(sender_id=doc["sender_id"], event_time=doc["event_time"], type=doc["type"], data=doc["data"],
                    data_key=doc["data_key"])


def find(cluster: str, senders: Sequence[int | str], deadline: float, *, types: Sequence[int | str] = (),
         at_or_before: datetime | None = None, at: datetime | None = None, before: datetime | None = None,
         after: datetime | None = None, limit: int = 0, keys_only: bool = False) -> Find:
    """The entries of *senders* (of *types*, when given) in a time range, newest first, up to *limit*."""
    match: dict[str, Any] = {"sender_id": {"$in": list(senders)}}
    if types:
        match["type"] = {"$in": list(types)}
    times = {op: t for op, t in (("$lte", at_or_before), ("$lt", before), ("$gt", after)) if t is not None}
    if at is not None:
        match["event_time"] = at
    elif times:
        match["event_time"] = times
    projection = {"_id": 1, "event_time": 1, "data_key": 1} if keys_only else None
    return Find(cluster, "outbox", match, deadline, sort=PAGE_SORT, limit=limit, projection=projection)


def sent_keys(cluster: str, sender_id: int | str, deadline: float, *, limit: int) -> Find:
    """Up to *limit* of *sender_id*'s entries' ``data_key``\\ s, in no order (an erasure removes what it read)."""
    return Find(cluster, "outbox", {"sender_id": sender_id}, deadline, limit=limit, projection={"_id": 0, "data_key": 1})


def published(cluster: str, sender_id: int | str, keys: Sequence[str], deadline: float) -> Find:
    """*sender_id*'s entries of the posts *keys* (at most one each)."""
    return Find(cluster, "outbox", {"sender_id": sender_id, "data_key": {"$in": list(keys)}}, deadline)


def remove(cluster: str, sender_id: int | str, keys: Sequence[str], deadline: float) -> Delete:
    """The request that removes *sender_id*'s entries of the posts *keys*."""
    return Delete(cluster, "outbox", {"sender_id": sender_id, "data_key": {"$in": list(keys)}}, deadline)


def keyed(doc: Mapping[str, Any], receiver_id: int | str) -> tuple[datetime, ObjectId] | None:
    """Where an outbox entry sorts in *receiver_id*'s feed: its time and the ``_id`` the receiver's copy has (or
    would have); None for an entry no copy can be made of."""
    t: datetime = doc["event_time"]
    try:
        (key,) = copy_ids(int(t.timestamp()), doc["data_key"], [receiver_id])
    except (KeyError, TypeError, ValueError, UnicodeEncodeError) as exc:
        log.warning("outbox entry %r skipped: %s", doc.get("_id"), exc)
        return None
    return t, key


def pulled_item(doc: Mapping[str, Any], receiver_id: int | str) -> tuple[datetime, ObjectId, FeedItem] | None:
    """An outbox entry as *receiver_id*'s page shows it (under the key of :func:`keyed`)."""
    where = keyed(doc, receiver_id)
    if where is None:
        return None
    t, key = where
    item = FeedItem(receiver_id=receiver_id, sender_id=doc["sender_id"], event_time=t, type=doc["type"],
                    data=doc["data"], data_key=doc["data_key"], id=key)
    return t, key, item


def entry_key(doc: Mapping[str, Any]) -> tuple[datetime, ObjectId]:
    """An outbox document's own sort key (its time and ``_id``)."""
    return doc["event_time"], doc["_id"]


def fix(cluster: str, data_key: str, ids: Sequence[Any], data: Mapping[str, Any] | None, deadline: float) -> list[Request]:
    """Requests that remove (*data* None) or re-data the outbox entries of *data_key* among *ids*."""
    return fix_requests(cluster, "outbox", data_key, ids, data, deadline)


def edit(data_key: str, data: Mapping[str, Any] | None) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The match and update (None: delete) of every outbox entry of *data_key*."""
    return key_edit(data_key, data)
