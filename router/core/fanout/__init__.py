"""Fan-out on write: one copy per receiver, however the batches run (threads, asyncio, Celery).

Owns a job's plan and its batch program (:mod:`.plan`), job records (:mod:`.jobs`), checkpoints and claims
(:mod:`.checkpoint`), runs (:mod:`.runs`) and the results' tally (:mod:`.tally`).

May import the kernel, ``layouts``, ``periods`` and ``writes`` (inserts, the edit fence).
"""

from __future__ import annotations

from . import checkpoint
from .checkpoint import (
    JobStatus, announce_batch, fenced_status, find_job, finish_checkpoint, open_checkpoint, start_job,
)
from .jobs import FanOutJob
from .plan import BatchOutcome, DEFAULT_CONCURRENCY, batch_program, batches, plan_job, positive_int, receiver_stream
from .runs import FREE_SLOT, NEXT_BATCH, RELEASE, SKIP, Send, Step, drive, run_loop
from .tally import FanOutProgress, FanOutResult, RunState

__all__ = ["announce_batch", "batch_program", "batches", "BatchOutcome", "checkpoint", "DEFAULT_CONCURRENCY",
           "drive", "FanOutJob", "FanOutProgress", "FanOutResult", "fenced_status", "find_job", "finish_checkpoint",
           "FREE_SLOT", "JobStatus", "NEXT_BATCH", "open_checkpoint", "plan_job", "positive_int", "receiver_stream",
           "RELEASE", "run_loop", "RunState", "Send", "SKIP", "start_job", "Step"]
