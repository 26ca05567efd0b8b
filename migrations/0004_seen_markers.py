"""Seen markers for notification feeds; on a mongos, shard them on hashed receiver_id.

``seen`` holds one document per ``mark_seen`` call (``{receiver_id, event_time, key}``), in
the cluster that owns the marked ``event_time``; a receiver's marker is the highest one
(see :mod:`router.core.seen`). Documents are only inserted and, below the newest, deleted,
so two devices marking at once never lose a mark, on servers that lose concurrent updates of
one document too.

* ``{receiver_id: 1, event_time: -1, key: -1}`` serves both queries: the marker (the first
  entry of the receiver's range) and the cleanup of the receiver's markers below a new one.
* Shard key ``{receiver_id: "hashed"}``, as for ``feed`` (0001): every query names one
  receiver, so each goes to one shard.

What is deliberately *not* added: an index for ``read(..., types=[...])`` on ``feed``. The
README's notification section gives the measurement behind that choice.

MongoDB-only steps are skipped, with a note, on a server that is not a mongos.
"""

from __future__ import annotations

from typing import Any

SEEN_INDEX = ("receiver_time_key", [("receiver_id", 1), ("event_time", -1), ("key", -1)])
SEEN_SHARD_KEY: dict[str, Any] = {"receiver_id": "hashed"}


def sharding_commands(database: str) -> list[tuple[str, dict[str, Any]]]:
    """The commands sent to a mongos, as (database, command document) pairs."""
    return [("admin", {"shardCollection": f"{database}.seen", "key": dict(SEEN_SHARD_KEY)})]


def apply(ctx: Any) -> None:
    """Create the seen-marker index; shard ``seen`` on a mongos."""
    name, keys = SEEN_INDEX
    ctx.create_index("seen", keys, name=name)
    if ctx.capabilities.sharded:
        for database, command in sharding_commands(ctx.config.database):
            ctx.command(database, command)
    else:
        ctx.note(
            f"sharding skipped: {ctx.capabilities.server} {ctx.capabilities.version} is not a mongos "
            "(hello has no msg: isdbgrid)"
        )
