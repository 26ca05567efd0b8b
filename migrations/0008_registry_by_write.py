"""The posts registry by sender and write: documents of one post each become documents of many.

Until this version every post was registered in a document of its own, ``{_id, sender_id,
data_key, event_time}`` (migration 0006 and every writer); a write now registers its posts in
one document per sender, ``{_id, sender_id, event_time, n, keys, times}``
(``router/core/layouts/posts.py``: ``event_time`` is the earliest of ``times``, ``n`` the
number of ``keys``). This turns the documents of one post each into documents of up to
:data:`KEYS` posts of one sender, in each sender's time order, and leaves the indexes as
they are: the new documents are found by 0006's ``{sender_id, event_time, _id}``.

Each new document is stored before the ones it replaces are removed, so an erasure or an
export running meanwhile finds every post (some twice, which the readers allow), and a
migration stopped part-way is finished by running it again: a new document's ``_id`` is
derived from the ids it replaces (``m`` and a SHA-256 of them), so the same documents
regrouped again are the same document, stored once. Routers older than this version that
are still running keep writing documents of one post each: the router reads both shapes.

The old documents are read through one aggregation that sorts them (by sender, then time):
a ``$sort`` stage builds its whole result before the first batch, so on FerretDB 2 it stays
exact across ``getMore`` while this removes what it read, where a plain ``find`` would be
continued wrongly once rows are removed (``docs/ferretdb2-cursor-bug.md``). The same
pipeline runs on FerretDB 1.

MongoDB-only steps: none. In a dry run the documents to regroup are counted, not changed.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from datetime import datetime
from typing import Any

#: The most posts one new document lists (``router.core.layouts.posts.KEYS`` when this was written; a test keeps
#: them equal).
KEYS = 500
#: The documents of one post each (the new ones have ``keys``).
OLD = {"keys": {"$exists": False}}


def apply(ctx: Any) -> None:
    """Regroup the registry documents of one post each into documents of a sender's posts."""
    posts = ctx.cluster.db["posts"]
    if ctx.dry_run:
        count = ctx.cluster.call("counting the posts registry", lambda: posts.count_documents(OLD))
        ctx.note(f"would regroup {count} registry documents of one post each into documents of up to {KEYS} "
                 "posts of one sender")
        return
    old, new = ctx.cluster.call("regrouping the posts registry", lambda: regroup(posts))
    ctx.note(f"regrouped {old} registry documents of one post each into {new} documents of up to {KEYS} posts "
             "of one sender")


def regroup(posts: Any) -> tuple[int, int]:
    """Regroup *posts*'s documents of one post each; how many were read, and how many documents replace them."""
    read = stored = 0
    for group in _groups(posts.aggregate([{"$match": OLD}, {"$sort": {"sender_id": 1, "event_time": 1, "_id": 1}}],
                                         allowDiskUse=True)):
        read += len(group)
        stored += _replace(posts, group)
    return read, stored


def _groups(rows: Iterator[dict[str, Any]]) -> Iterator[list[dict[str, Any]]]:
    """Runs of up to :data:`KEYS` documents of one sender (int ids of any type are one sender, a str id another)."""
    group: list[dict[str, Any]] = []
    for row in rows:
        if group and (row.get("sender_id") != group[0].get("sender_id") or len(group) >= KEYS):
            yield group
            group = []
        group.append(row)
    if group:
        yield group


def _replace(posts: Any, group: list[dict[str, Any]]) -> int:
    """Store the document listing *group*'s posts (each once, at its earliest time), then remove the documents it
    replaces; how many documents were stored (0: an earlier run stored it, or *group* names no post: a document
    without a sender, a str ``data_key`` and a time is left as it is)."""
    from pymongo.errors import DuplicateKeyError

    first: dict[str, datetime] = {}
    ids = []
    sender = group[0].get("sender_id")
    for doc in group:  # (oldest first)
        key, when = doc.get("data_key"), doc.get("event_time")
        if sender is not None and isinstance(key, str) and isinstance(when, datetime):
            first.setdefault(key, when)
            ids.append(doc["_id"])
    if not ids:
        return 0
    digest = hashlib.sha256("\x00".join(str(i) for i in ids).encode()).hexdigest()[:32]
    stored = 1
    try:
        posts.insert_one({"_id": f"m{digest}", "sender_id": sender, "event_time": min(first.values()), "n": len(first),
                          "keys": list(first), "times": list(first.values())})
    except DuplicateKeyError:
        stored = 0  # by a run that stopped before removing what it replaces
    posts.delete_many({"_id": {"$in": ids}})
    return stored
