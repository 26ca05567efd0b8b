"""Erasure: the posts registry, the erasure records, job records by post; posts stored before are registered.

An erasure (``erase_user``, ``router/core/erasure.py``) finds what a user sent through the
``posts`` registry (one document per sender and ``data_key``, ``router/core/registry.py``),
and every writer of copies reads the ``erasures`` records after writing. This adds, in
every cluster:

* ``posts``: ``{sender_id: 1, event_time: 1, _id: 1}`` finds a sender's posts, oldest first
  (an erasure takes them in any order, an export in time order).
* ``erasures``: ``{user: 1}`` serves the writers' check, a lookup of the pseudonyms of a
  batch's sender and receivers (for the many batches of users never erased, it finds
  nothing), and ``erase-status``.
* ``fanouts``: ``{data_key: 1}`` finds the fan-out jobs of an erased user's posts, and
  ``fanout_sent``: ``{job: 1}`` their sent-batch records (``fanout_batches`` has one since 0002).

Then it registers the posts already stored, by one scan of the period's ``feed`` (each
copy's, or in a ``buckets`` period each bucket item's, sender and ``data_key``) and of its
``outbox``, grouped on the server: as an index build would, once. A pair registered twice
is one document, so running the scan again (or beside live writers) is harmless. The groups
are read through the aggregation's cursor (``getMore``), unlike the router's finds and
streamed pipelines (``router/storage/finds.py``, which FerretDB 2 repeats and skips once
documents were updated): a ``$group`` stage builds every group before the first batch, and on
FerretDB 2, with documents updated, 3,000 groups read in batches of 50, 150 and 101 came back
exactly once each, where a plain ``find`` of the same collection in batches of 50 did not end.
A server that does not implement the pipeline (FerretDB 1 has no ``$min`` in ``$group``)
gets the same groups from one ``find`` of the fields they need, reduced here.

What is deliberately *not* added: an index on ``feed.sender_id``. It would find a sender's
copies directly, but every copy written pays for it (measured on FerretDB 2: fan-out at
0.76-0.91 of its rate without it, ``write_many`` at 0.40-0.90); the registry costs one small
insert per post instead. ``docs/erasure.md`` gives the measurement.

MongoDB-only steps: none. In a dry run the scan is described, not made.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

POSTS_INDEX = ("sender_time_id", [("sender_id", 1), ("event_time", 1), ("_id", 1)])
ERASURES_INDEX = ("user", [("user", 1)])
FANOUTS_INDEX = ("data_key", [("data_key", 1)])
SENT_INDEX = ("job", [("job", 1)])
#: Registry documents per insert while registering what is stored.
CHUNK = 1000
#: The server's code for a stage or operator it does not implement (FerretDB 1: ``$min`` in ``$group``).
NOT_IMPLEMENTED = 238


def registry_id(sender_id: Any, data_key: str) -> str:
    """A registry entry's ``_id`` (``router.core.layouts.posts.entry_id`` when this was written; a test keeps them
    equal). A sender stored as a 64-bit int comes back as ``bson.Int64``: it is the same user as the int, so the
    same entry (``router.model.identity``)."""
    is_int = isinstance(sender_id, int) and not isinstance(sender_id, bool)
    return f"{len(data_key)}:{data_key}{'i' if is_int else 's'}{int(sender_id) if is_int else sender_id}"


def pipelines(layout: str) -> list[tuple[str, list[dict[str, Any]]]]:
    """The scans, as (collection role, aggregation pipeline), that list a period's posts by sender."""
    def group(prefix: str) -> dict[str, Any]:
        return {"$group": {"_id": {"s": f"${prefix}sender_id", "k": f"${prefix}data_key"},
                           "t": {"$min": f"${prefix}event_time"}}}

    feed = [{"$unwind": "$items"}, group("items.")] if layout == "buckets" else [group("")]
    return [("feed", feed), ("outbox", [group("")])]


def apply(ctx: Any) -> None:
    """Create the indexes, then register the posts already stored."""
    for collection, (name, keys) in (("posts", POSTS_INDEX), ("erasures", ERASURES_INDEX), ("fanouts", FANOUTS_INDEX),
                                     ("fanout_sent", SENT_INDEX)):
        ctx.create_index(collection, keys, name=name)
    layouts = {str(doc.get("layout", "copies")) for doc in ctx.cluster.metadata_documents()}
    layout = "buckets" if "buckets" in layouts else "copies"
    if ctx.dry_run:
        ctx.note(f"would register the posts stored in feed ({layout}) and outbox by sender, in posts (one scan each)")
        return
    db = ctx.cluster.db
    total = 0
    for role, pipeline in pipelines(layout):
        source = db[ctx.config.feed_collection if role == "feed" else role]
        total += ctx.cluster.call(f"registering the posts of {role}", lambda: _register(source, pipeline, db["posts"]))
    ctx.note(f"registered {total} posts stored before the registry (feed: {layout}, and outbox)")


def _register(source: Any, pipeline: list[dict[str, Any]], posts: Any) -> int:
    """Scan *source* with *pipeline* and insert a registry entry per group; how many were new."""
    total = 0
    chunk: list[dict[str, Any]] = []
    for group in _groups(source, pipeline):
        sender, key = group["_id"].get("s"), group["_id"].get("k")
        if isinstance(key, str) and sender is not None:
            chunk.append({"_id": registry_id(sender, key), "sender_id": sender, "data_key": key, "event_time": group["t"]})
        if len(chunk) >= CHUNK:
            total, chunk = total + _insert(posts, chunk), []
    return total + _insert(posts, chunk)


def _groups(source: Any, pipeline: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """The groups of *pipeline*; where the server does not implement it (FerretDB 1 has no ``$min`` accumulator), the
    same groups computed here from one scan of the fields they need (a group met twice is registered once)."""
    from pymongo.errors import OperationFailure

    try:
        yield from source.aggregate(pipeline, allowDiskUse=True)
        return
    except OperationFailure as exc:
        if exc.code != NOT_IMPLEMENTED:
            raise
    unwind = pipeline[0].get("$unwind") == "$items"
    first: dict[tuple[Any, Any], Any] = {}
    fields = {"items.sender_id": 1, "items.data_key": 1, "items.event_time": 1} if unwind else {
        "sender_id": 1, "data_key": 1, "event_time": 1}
    for doc in source.find({}, fields):
        for item in (doc.get("items", []) if unwind else [doc]):
            pair = (item.get("sender_id"), item.get("data_key"))
            when = item.get("event_time")
            if pair not in first or (when is not None and when < first[pair]):
                first[pair] = when
    for (sender, key), when in first.items():
        yield {"_id": {"s": sender, "k": key}, "t": when}


def _insert(posts: Any, docs: list[dict[str, Any]]) -> int:
    """Insert registry *docs*, a pair registered already being no error; how many were new."""
    from pymongo.errors import BulkWriteError

    if not docs:
        return 0
    try:
        return len(posts.insert_many(docs, ordered=False).inserted_ids)
    except BulkWriteError as exc:
        errors = exc.details.get("writeErrors", [])
        if any(e.get("code") != 11000 for e in errors):
            raise
        return len(docs) - len(errors)
