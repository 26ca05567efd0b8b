"""Feed indexes and the metadata collection; on a mongos, shard feed on hashed receiver_id.

Indexes, in every cluster's feed collection:

* ``{receiver_id: 1, event_time: -1, _id: -1}`` serves the only hot query, one
  receiver's page newest first; ``_id`` breaks ties inside one millisecond.
* ``{data_key: 1}`` finds every copy of one item for deletes.

Shard key: ``{receiver_id: "hashed"}``, chosen over ``{receiver_id: 1, event_time: 1}``.
Both start with ``receiver_id``, so one receiver's page is a targeted query (Turms'
rule for inbox-like collections: shard by recipient and index recipient + time, so
one recipient's records sit together). They differ in these ways:

* Every period begins on a new, empty cluster, so each rollover starts an empty
  collection under the full write load. A hashed key is pre-split across all shards
  when the empty collection is sharded, so writes spread from the period's first
  second. A ranged key starts with one chunk on one shard and leans on splitting
  and balancing under that load at every rollover.
* A ranged shard key needs an ascending index, and our page index is descending on
  ``event_time``, so ``{receiver_id: 1, event_time: 1}`` costs one more index
  anyway. The hashed key also needs its own index. The cost is the same, one extra
  index. (Turms avoids hashed indexes on ids because they cannot enforce uniqueness.
  Nothing here needs ``receiver_id`` to be unique.)
* What hashed gives up: one receiver's items for one period cannot be split across
  chunks. Each cluster holds only one period, which bounds that size, and the
  celebrity problem is on the sender side (fan-out), not the receiver side.

MongoDB-only steps are skipped, with a note, on a server that is not a mongos (one
whose ``hello`` lacks ``msg: "isdbgrid"``), such as FerretDB or a single mongod.
"""

from __future__ import annotations

from typing import Any

FEED_INDEXES: list[tuple[str, list[tuple[str, int]]]] = [
    ("receiver_time_id", [("receiver_id", 1), ("event_time", -1), ("_id", -1)]),
    ("data_key", [("data_key", 1)]),
]
SHARD_KEY: dict[str, Any] = {"receiver_id": "hashed"}


def sharding_commands(database: str, feed_collection: str) -> list[tuple[str, dict[str, Any]]]:
    """The commands sent to a mongos, as (database, command document) pairs."""
    return [
        ("admin", {"enableSharding": database}),
        ("admin", {"shardCollection": f"{database}.{feed_collection}", "key": dict(SHARD_KEY)}),
    ]


def apply(ctx: Any) -> None:
    """Create the metadata collection and the feed indexes; shard feed on a mongos."""
    config = ctx.config
    ctx.create_collection(config.metadata_collection)
    for name, keys in FEED_INDEXES:
        ctx.create_index(config.feed_collection, keys, name=name)
    if ctx.capabilities.sharded:
        for database, command in sharding_commands(config.database, config.feed_collection):
            ctx.command(database, command)
    else:
        ctx.note(
            f"sharding skipped: {ctx.capabilities.server} {ctx.capabilities.version} is not a mongos "
            "(hello has no msg: isdbgrid)"
        )
