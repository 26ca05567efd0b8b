"""Storage layouts: how a period stores its receivers' copies (see :mod:`.base` for the contract).

:data:`LAYOUTS` is the table the core picks from, by the name a period's metadata records.

May import the kernel only (``steps``, ``policy``, ``nogc``): every other concern builds on the stored shape.
"""

from __future__ import annotations

from collections.abc import Mapping

from ...errors import InvalidItem, UnknownLayout
from ...timemap import TimeMap
from .base import DEFAULT, EditSettings, Inbox, IndexSpec, Landed, Layout, Writer
from .buckets import Buckets
from .copies import Copies
from ...layout_names import LAYOUT_NAMES
from .values import Copy, CopyBatch, CopyList, FanBatch, ItemBatch, Post
from . import grouping, outbox, posts
from .grouping import canonical
from .queries import older_than, outside_clause

__all__ = ["canonical", "Copy", "CopyBatch", "CopyList", "DEFAULT", "EditSettings", "FanBatch", "grouping", "Inbox",
           "IndexSpec", "ItemBatch", "Landed", "Layout", "layout_for", "layout_named", "LAYOUTS", "older_than",
           "outbox", "outside_clause", "Post", "posts", "Writer"]

#: Every layout, by the name recorded in a period's metadata. A new layout is one more row here (and its name in
#: :data:`router.layout_names.LAYOUT_NAMES`); the contract suite runs over this table.
LAYOUTS: Mapping[str, Layout] = {Copies.name: Copies(), Buckets.name: Buckets()}
assert tuple(LAYOUTS) == LAYOUT_NAMES, "router.core.layouts.names.LAYOUT_NAMES lists the table's names, in order"


def layout_for(timemap: TimeMap | None, cluster: str) -> Layout:
    """The layout of *cluster*'s period in *timemap* (the default layout without a map, or for a cluster not in it).

    Raises :class:`~router.errors.UnknownLayout` naming the cluster and the layout when its metadata names a layout
    this router does not know: every operation that touches that cluster fails so, and nothing else does.
    """
    name = timemap.layout_of(cluster) if timemap is not None else DEFAULT
    layout = LAYOUTS.get(name)
    if layout is None:
        raise UnknownLayout(cluster, name, sorted(LAYOUTS))
    return layout


def layout_named(name: object, *, field: str = "layout") -> Layout:
    """The layout called *name*; :class:`~router.errors.InvalidItem` naming *field* and the known layouts otherwise."""
    layout = LAYOUTS.get(name) if isinstance(name, str) else None
    if layout is None:
        raise InvalidItem(field, f"must be one of {', '.join(sorted(LAYOUTS))} (got {name!r:.80})")
    return layout
