"""Live feeds, the subscriber's side, without I/O: how a stream stays gap-free.

Owns the events a subscriber receives, the protocol (subscribe first, catch up from storage from the given cursor,
then drop by id what came both ways) and the bounded backlog (:mod:`.stream`). What writers push is in the kernel
(:mod:`router.core.push`); the Redis I/O is in :mod:`router.storage.push` and :mod:`router.live`.

May import the kernel, ``layouts``, ``writes`` (the input rules), ``settings`` and ``calls`` (a catch-up is a read).
"""

from __future__ import annotations

from .stream import (
    Backlog, DeletedItem, LiveEvent, LivePlan, NewItem, Resync, Stream, UpdatedItem, catch_up_events, live_cursor,
    subscribe_plan,
)

__all__ = ["Backlog", "catch_up_events", "DeletedItem", "live_cursor", "LiveEvent", "LivePlan", "NewItem", "Resync",
           "Stream", "subscribe_plan", "UpdatedItem"]
