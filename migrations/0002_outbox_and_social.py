"""Outbox indexes, fan-out batch records, feed deletes by ranges; on a mongos, shard outbox on hashed sender_id.

Collections and indexes this adds, in every cluster:

* ``outbox`` (one entry per published activity, in the cluster owning its ``event_time``):

  - ``{sender_id: 1, event_time: -1, _id: -1}`` serves the two outbox queries: a page's
    pulled senders (``sender_id: {$in: [...]}`` newest first, one index range per sender,
    merged by the sort) and a backfill (the same, newer than ``since``).
  - ``{data_key: 1}`` finds the one entry of an item for ``update`` and ``delete``.
  - Shard key ``{sender_id: "hashed"}``: a pulled read names its senders, so each sender's
    entries sit on one shard and the query goes only to the shards of those senders.
    Hashed rather than ranged for the reason 0001 gives for ``feed``: every period starts
    on an empty cluster, and a hashed key is pre-split across the shards, so a celebrity's
    posts do not pile onto one chunk at each rollover. One author's outbox is small (one
    entry per post, not per follower), so keeping it on one shard costs nothing.

* ``fanout_batches`` (one record per fan-out batch written): ``{job: 1}`` lists a job's
  batches for a resume and for ``fan_out_status``. Unsharded: a few documents per
  thousand copies written.

* ``feed``: ``{data_key: 1, _id: 1}`` replaces ``{data_key: 1}``. Deletes and updates of an
  item work in ``_id`` ranges of about 10,000 copies (``{data_key: k, _id: {$lte: p}}``);
  with ``_id`` in the index each step is an index range scan instead of a scan of every
  copy of the item. It still serves ``data_key`` equality. The write path keeps the same
  number of indexes, each entry 12 bytes longer.

What is deliberately *not* added: an index for ``unfollow`` (``{receiver_id, sender_id}``).
Unfollowing removes one followee's copies from one receiver's feed; the page index
``{receiver_id: 1, event_time: -1, _id: -1}`` already narrows that to the receiver's own
feed in each cluster (thousands of documents, one shard), and the sender is checked on
those. A second index on ``feed`` would be paid by every copy fan-out writes, millions a
post, for an operation users do rarely.

MongoDB-only steps are skipped, with a note, on a server that is not a mongos.
"""

from __future__ import annotations

from typing import Any

OUTBOX_INDEXES: list[tuple[str, list[tuple[str, int]]]] = [
    ("sender_time_id", [("sender_id", 1), ("event_time", -1), ("_id", -1)]),
    ("data_key", [("data_key", 1)]),
]
BATCH_INDEXES: list[tuple[str, list[tuple[str, int]]]] = [("job", [("job", 1)])]
FEED_DELETE_INDEX = ("data_key_id", [("data_key", 1), ("_id", 1)])
OUTBOX_SHARD_KEY: dict[str, Any] = {"sender_id": "hashed"}


def sharding_commands(database: str) -> list[tuple[str, dict[str, Any]]]:
    """The commands sent to a mongos, as (database, command document) pairs."""
    return [("admin", {"shardCollection": f"{database}.outbox", "key": dict(OUTBOX_SHARD_KEY)})]


def apply(ctx: Any) -> None:
    """Create the outbox and batch-record indexes, swap the feed's data_key index; shard outbox on a mongos."""
    config = ctx.config
    for name, keys in OUTBOX_INDEXES:
        ctx.create_index("outbox", keys, name=name)
    for name, keys in BATCH_INDEXES:
        ctx.create_index("fanout_batches", keys, name=name)
    name, keys = FEED_DELETE_INDEX
    ctx.create_index(config.feed_collection, keys, name=name)
    ctx.command(config.database, {"dropIndexes": config.feed_collection, "index": "data_key"})
    if ctx.capabilities.sharded:
        for database, command in sharding_commands(config.database):
            ctx.command(database, command)
    else:
        ctx.note(
            f"sharding skipped: {ctx.capabilities.server} {ctx.capabilities.version} is not a mongos "
            "(hello has no msg: isdbgrid)"
        )
