"""Buckets periods: a partial, shard-key-prefixed unique copy index; emptied buckets sealed.

Only a cluster whose metadata gives its period the ``buckets`` layout is changed; others get a
note. Such a period was created with a unique ``items_id`` index on ``{items._id: 1}``. Two
things were wrong with it:

* A bucket emptied by a delete has no ``items._id``, and a unique index admits only one
  document without the field: once two buckets lost their only copy, every further delete
  failed (FerretDB 2, as MongoDB). The new index ``copy_id`` is partial
  (``partialFilterExpression: {"items._id": {"$exists": true}}``).
* On a mongos, ``feed`` is sharded on hashed ``receiver_id`` (0001), and MongoDB allows a
  unique index on a sharded collection only when it starts with the shard key: there
  ``copy_id`` is ``{receiver_id: 1, items._id: 1}`` (a copy belongs to one receiver, so it is
  as unique). Elsewhere it stays ``{items._id: 1}``: mongo-java-server ignores partial
  filters, and would index an emptied bucket's missing ``items._id`` as null in the compound
  form.

``copy_id`` is created before ``items_id`` is dropped, so uniqueness is never unguarded. Last,
buckets already emptied are sealed (``count`` raised to 50), as every delete now seals the
buckets it touches: no append goes to a bucket a copy left (mongo-java-server cannot push to an
array emptied under a unique index). These are the specs of
``router.core.layouts.buckets.Buckets.indexes`` when this was written; a test keeps them equal.
"""

from __future__ import annotations

from typing import Any

#: The copy index, on a mongos (sharded on hashed receiver_id) and elsewhere.
COPY_KEYS_SHARDED: dict[str, Any] = {"receiver_id": 1, "items._id": 1}
COPY_KEYS: dict[str, Any] = {"items._id": 1}
PARTIAL: dict[str, Any] = {"items._id": {"$exists": True}}
#: A bucket's most copies when this was written (router.core.layouts.buckets.MAX_ITEMS).
SEALED = 50


def commands(feed: str, *, sharded: bool) -> list[dict[str, Any]]:
    """The command documents, in order, for the feed collection *feed* of a buckets period."""
    keys = COPY_KEYS_SHARDED if sharded else COPY_KEYS
    return [
        {"createIndexes": feed, "indexes": [{"key": dict(keys), "name": "copy_id", "unique": True,
                                             "partialFilterExpression": dict(PARTIAL)}]},
        {"dropIndexes": feed, "index": "items_id"},
        {"update": feed, "updates": [{"q": {"items": {"$size": 0}, "count": {"$lt": SEALED}},
                                      "u": {"$max": {"count": SEALED}}, "multi": True}]},
    ]


def apply(ctx: Any) -> None:
    """Give a buckets period its partial copy index and seal its emptied buckets; note and skip any other cluster."""
    layouts = {str(doc.get("layout", "copies")) for doc in ctx.cluster.metadata_documents()}
    if "buckets" not in layouts:
        ctx.note("no buckets period here: nothing to change")
        return
    feed = ctx.config.feed_collection
    names = {i["name"] for i in ctx.cluster.call("listing indexes", lambda: list(ctx.cluster.db[feed].list_indexes()))}
    for command in commands(feed, sharded=ctx.capabilities.sharded):
        if "dropIndexes" in command and command["index"] not in names:
            ctx.note(f"index {command['index']} absent: nothing to drop")
            continue
        ctx.command(ctx.config.database, command)
