"""The retry policy and the deadlines: what is tried again, how often, how long anything may wait.

One home for these rules; every writer (``write_many``, fan-out batches, backfill,
edits) and both front doors follow the deadlines, and every insert follows the retries
(edits are not retried within a call: a failed step ends it, and calling again resumes).

* **Deadlines.** A public call gets ``timeout`` seconds (clusters.yaml ``timeout``,
  default 10 s) from when it starts: every request it sends is bounded by what is
  left, retries and pauses included. Work that grows with the data (deletes and edits
  of many copies, fan-out batches) goes in steps, and each step gets its own
  ``timeout``. A cluster that fails a step is asked nothing more in that call. A
  request also waits at most its cluster's ``socketTimeoutMS`` for the answer (the
  storage applies it, as pymongo ignores it under a deadline).
* **Turns.** A page served partially (``on_unavailable="partial"``) asks its clusters one
  after another, and one hung cluster must not spend the others' time: while another
  cluster may still be asked after it, a cluster's turn ends at :func:`turn_deadline`,
  half of what is left; the last one gets all that is left. So whichever cluster hangs,
  the clusters after it have at least as much time as it took. A page that raises when
  a cluster fails gives each cluster the whole deadline: there is nothing to save time for.
* **What is retried.** Only a request that failed as :attr:`~Failure.retryable`
  (the connection broke mid-request, a step-down) and documents refused with a
  transient code (not primary, shutting down, interrupted), up to ``attempts`` tries
  in all, with exponential backoff from ``backoff`` (doubled each time, capped at
  :data:`BACKOFF_CAP`, jittered by ±50%), and never past the deadline. A timeout is
  not retried: the time it had is spent. That holds however it shows (the deadline or
  the socket timeout ran out, pymongo cancelled the request as its monitor timed out,
  or documents refused with :data:`TIMEOUT_WRITE_CODES`).
* **Duplicates** (code 11000) are not errors here: each writer decides what one means
  (an earlier attempt of the same write, or a collision to resolve).

Example::

    policy = RetryPolicy(attempts=3, backoff=0.1)
    policy.pause(1, deadline=time.monotonic() + 10)     # about 0.1 s; None when no time is left
    turn_deadline(deadline, others=2)                    # half of what is left before deadline
"""

from __future__ import annotations

import random
import time
from typing import Literal, TypeAlias

import attrs

__all__ = [
    "BACKOFF_CAP",
    "CodeKind",
    "DUPLICATE_KEY",
    "RetryPolicy",
    "TIMEOUT_WRITE_CODES",
    "TRANSIENT_WRITE_CODES",
    "TURN_SHARE",
    "code_kind",
    "deadline_in",
    "remaining",
    "turn_deadline",
]

#: The server's duplicate key error code.
DUPLICATE_KEY = 11000
#: Write error codes that mean "try again": not primary, step-down, shutdown, interrupted.
TRANSIENT_WRITE_CODES = frozenset({91, 189, 10107, 11600, 11602, 13435, 13436})
#: Write error codes that mean "the time ran out" (MaxTimeMSExpired): not retried.
TIMEOUT_WRITE_CODES = frozenset({50})
#: The part of what is left of a deadline that one cluster's turn may take while others wait.
TURN_SHARE = 0.5
#: The longest pause between two tries, in seconds.
BACKOFF_CAP = 5.0
#: What a write error code means to a writer.
CodeKind: TypeAlias = Literal["duplicate", "transient", "timeout", "refused"]


def code_kind(code: int | None) -> CodeKind:
    """``duplicate`` for 11000, ``transient`` for the codes worth retrying, ``timeout`` for the time
    running out, else ``refused``."""
    if code == DUPLICATE_KEY:
        return "duplicate"
    if code in TRANSIENT_WRITE_CODES:
        return "transient"
    if code in TIMEOUT_WRITE_CODES:
        return "timeout"
    return "refused"


def deadline_in(seconds: float) -> float:
    """The absolute deadline (``time.monotonic()`` seconds) *seconds* from now."""
    return time.monotonic() + seconds


def remaining(deadline: float) -> float:
    """Seconds left before *deadline* (negative once passed)."""
    return deadline - time.monotonic()


def turn_deadline(deadline: float, *, others: int, now: float | None = None) -> float:
    """When one cluster's turn ends, in a call that asks clusters one after another before *deadline*.

    While *others* clusters may still be asked after this one, the turn gets
    :data:`TURN_SHARE` of the time left (from *now*, ``time.monotonic()`` by default);
    the last one gets all of it. Never later than *deadline*.
    """
    if others <= 0:
        return deadline
    start = time.monotonic() if now is None else now
    return min(deadline, start + (deadline - start) * TURN_SHARE)


@attrs.frozen
class RetryPolicy:
    """How often and how patiently a request is tried: ``attempts`` in all, backoff from ``backoff`` seconds."""

    attempts: int = 3
    backoff: float = 0.1

    def pause(self, retry: int, *, deadline: float) -> float | None:
        """The pause before retry number *retry* (1 for the first), or ``None`` when no retry is allowed.

        None when *retry* would exceed ``attempts`` or the pause would end past *deadline*.
        """
        if retry >= self.attempts:
            return None
        delay: float = min(BACKOFF_CAP, self.backoff * 2.0 ** (retry - 1)) * random.uniform(0.5, 1.5)
        if remaining(deadline) <= delay:
            return None
        return delay
