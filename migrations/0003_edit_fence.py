"""The edit fence: a collection ``edits`` in every cluster, indexed for the one query every fan-out batch sends.

``delete`` and ``update`` leave one record per ``data_key`` here before they edit any
copy (see ``router/core/fence.py``): ``{_id: "<data_key>#<seq>", data_key, seq, kind,
data, at}``. Every fan-out batch, backfill and publish reads it after writing,
``find({data_key: k}).sort({seq: -1}).limit(1)``, so a post deleted or updated while
copies were being written ends with no copy, or the new data, everywhere.

* ``{data_key: 1, seq: -1}`` serves that query as one index lookup (for the posts never
  edited, which are nearly all of them, it finds nothing), and the ``$in`` of a backfill.

The collection holds one record per deleted post (a tombstone is final) and at most a
few per updated one (an update removes the records it supersedes): small, so unsharded.
"""

from __future__ import annotations

from typing import Any

EDIT_INDEXES: list[tuple[str, list[tuple[str, int]]]] = [("data_key_seq", [("data_key", 1), ("seq", -1)])]


def apply(ctx: Any) -> None:
    """Create the edit fence's index (which creates the collection)."""
    for name, keys in EDIT_INDEXES:
        ctx.create_index("edits", keys, name=name)
