"""Periods: which cluster owns a time.

Owns the chooser and the horizon rule (:mod:`.routing`: a write goes to the cluster whose period holds its
``event_time``, a read asks the recent periods) and the clusters' ``metadata`` documents, read and checked into a
:class:`~router.timemap.TimeMap` (:mod:`.metadata`).

May import the kernel (``steps``, ``policy``) and ``layouts`` (a period's layout is named in its metadata).
"""

from __future__ import annotations

from .metadata import inspect_metadata, load_timemap, read_metadata
from .routing import PastHorizon, Routing, routed

__all__ = ["inspect_metadata", "load_timemap", "PastHorizon", "read_metadata", "routed", "Routing"]
