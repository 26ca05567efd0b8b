"""What a test's periods store, read through their layouts: copies as values, whatever the layout.

A contract test checks storage with these instead of reading ``feed`` documents itself, so
it holds for every layout (:data:`router.core.layouts.LAYOUTS`): each layout reads its own
documents back (:meth:`~router.core.layouts.Layout.copies_of`).

Example::

    assert stored.count(raw_clients["cluster_3"][db_name], data_key=key) == 0
"""

from __future__ import annotations

from typing import Any

from pymongo.database import Database

from router.core.layouts import DEFAULT, LAYOUTS, Copy, Layout


def layout_of(db: Database[dict[str, Any]]) -> Layout:
    """The layout of the period whose database is *db* (its metadata document says; the default without one)."""
    meta = db.metadata.find_one({})
    return LAYOUTS[str((meta or {}).get("layout", DEFAULT))]


def copies(db: Database[dict[str, Any]], **match: Any) -> list[Copy]:
    """Every copy stored in *db*'s feed whose fields equal *match* (``id=``, ``receiver_id=``, ``data_key=``...)."""
    found = layout_of(db).copies_of(db.feed.find({}))
    return [c for c in found if all(getattr(c, k) == v for k, v in match.items())]


def count(db: Database[dict[str, Any]], **match: Any) -> int:
    """How many copies :func:`copies` finds."""
    return len(copies(db, **match))


def one(db: Database[dict[str, Any]], **match: Any) -> Copy | None:
    """The copy :func:`copies` finds, None without one; more than one fails the test."""
    found = copies(db, **match)
    assert len(found) <= 1, found
    return found[0] if found else None
