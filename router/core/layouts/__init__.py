"""Storage layouts: how a period stores its receivers' copies (see :mod:`.base` for the contract).

:data:`LAYOUTS` is the table the core picks from, by the name a period's metadata records.
"""

from __future__ import annotations

from collections.abc import Mapping

from ...errors import InvalidItem, UnknownLayout
from ...timemap import TimeMap
from .base import (
    DEFAULT,
    EditSettings,
    Entry,
    IndexSpec,
    Inbox,
    Layout,
    copy_entries,
    entry_of,
    item_entries,
    same_entry,
)
from .buckets import Buckets
from .copies import Copies

__all__ = ["DEFAULT", "EditSettings", "Entry", "IndexSpec", "Inbox", "LAYOUTS", "Layout", "copy_entries", "entry_of", "item_entries", "layout_for", "layout_named", "same_entry"]

#: Every layout, by the name recorded in a period's metadata.
LAYOUTS: Mapping[str, Layout] = {Copies.name: Copies(), Buckets.name: Buckets()}


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
