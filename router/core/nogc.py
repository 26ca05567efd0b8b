"""The cyclic garbage collector paused around the hot loops that allocate an object per item and no cycles.

Building a batch of 100,000 items' documents with the collector on lets it rescan the growing
batch again and again: measured at 750 of 2,300 ns per item on the write path (1,550 with it
paused). A pause covers one step's loops (``write_many``'s checks, routes, ids, documents and
registry entries are one step: :func:`router.core.writes.insert.prepare_documents`), and restores what
it found, so it nests. What a pause does not save: once it ends, the collector looks once over
what was allocated meanwhile (the young generation, at the next allocation), as it would have
over each object once anyway. That one look costs about 350 ns per item of a 100,000-item batch
(a dict and an ObjectId each), so a pause over thousands of such objects *promotes* them
instead: the young generations are collected first (what the application made before the
call is looked at as usual), and at the end everything tracked moves to the oldest
generation unscanned (``gc.freeze()`` then ``gc.unfreeze()``: two list splices). The batch's
objects are acyclic and die by reference count; nothing else is left unscanned but what other
threads allocated during the pause. An application that keeps objects frozen itself (a
pre-fork server's ``gc.freeze()``) is left alone: unfreezing would undo it. (A ``gc.freeze()``
made in another thread at the very moment a pause ends can still be undone: freeze before
starting writes, as pre-fork servers do.)
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["PROMOTE_AT", "cyclic_gc_paused"]

#: From how many items a hot loop's pause promotes what it built (below it, the young collection after the
#: pause is small anyway).
PROMOTE_AT = 1_000


@contextmanager
def cyclic_gc_paused(*, promote: bool = False) -> Iterator[None]:
    """Disable the cyclic collector for the block, then enable it again if it was enabled; with *promote*, what
    the block allocated goes to the oldest generation unscanned (see the module's docstring)."""
    enabled = gc.isenabled()
    promote = promote and enabled and not gc.get_freeze_count()
    if promote:
        gc.collect(1)
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            if promote and not gc.get_freeze_count():
                gc.freeze()
                gc.unfreeze()
            gc.enable()
