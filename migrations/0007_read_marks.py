"""Read marks of notification groups: their own index in ``seen``.

``mark_read`` inserts ``{receiver_id, group, read_time, read_key}`` into ``seen`` (see
``router/core/seen.py``, ``read_mark_documents``), beside the seen markers but without their
``event_time``: in the markers' index ``{receiver_id, event_time, key}`` (0004) a read mark sits
below every marker, outside the range of dates a marker's query asks for, so finding a marker
never steps over read marks however many a receiver has. The read marks' own queries are
served here:

* ``{receiver_id: 1, group: 1, read_time: -1, read_key: -1}``: a page of groups asks for the
  marks of its groups (and of every group, ``"*"``) at or above its oldest group's newest item,
  and a new mark deletes the same receiver's marks of its group below it. Without this index
  both read every ``seen`` document of the receiver in the cluster.

A seen marker has no ``group``; it is indexed here too, under a null group (not a partial
index, which mongo-java-server ignores): one more index entry for each ``mark_seen``.

Numbered 0007: 0006 is the erasure migration's number (``0006_erasure``).
MongoDB-only steps: none (``seen`` was sharded on hashed ``receiver_id`` by 0004).
"""

from __future__ import annotations

from typing import Any

READ_MARK_INDEX = ("receiver_group_read", [("receiver_id", 1), ("group", 1), ("read_time", -1), ("read_key", -1)])


def apply(ctx: Any) -> None:
    """Create the read marks' index on ``seen``."""
    name, keys = READ_MARK_INDEX
    ctx.create_index("seen", keys, name=name)
