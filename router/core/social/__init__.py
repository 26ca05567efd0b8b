"""The social half: posts in their author's outbox, pushed to followers or pulled at read time.

Owns ``publish`` (push or pull by audience), backfill on follow and the outbox's part in reads (:mod:`.publish`).

May import the kernel, ``layouts``, ``periods``, ``writes`` and ``fanout``.
"""

from __future__ import annotations

from .publish import BackfillResult, MAX_BACKFILL, PublishResult, Publishing, backfill_program, publish_program

__all__ = ["backfill_program", "BackfillResult", "MAX_BACKFILL", "publish_program", "Publishing", "PublishResult"]
