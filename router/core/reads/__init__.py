"""Reads: a receiver's feed, newest first, across recent periods.

Owns the page walk (:mod:`.pages`): the short path for a page the newest cluster fills, the merge across periods,
cursors and the clusters a partial page owes.

May import the kernel and ``layouts``.
"""

from __future__ import annotations

from .pages import ReadPlan, read_program

__all__ = ["read_program", "ReadPlan"]
