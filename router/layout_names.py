"""The names of the layouts, importable without the layouts themselves.

:mod:`router.config` checks a ``layout`` in clusters.yaml against these without importing
the core (configuration is read before the core is used, and nothing in the core imports
it back). :data:`router.core.layouts.LAYOUTS` holds one layout per name, in this order.
"""

from __future__ import annotations

__all__ = ["DEFAULT", "LAYOUT_NAMES"]

#: Every layout's name, as a period's metadata records it.
LAYOUT_NAMES: tuple[str, ...] = ("copies", "buckets")
#: The layout of a period whose metadata names none.
DEFAULT = "copies"
