"""A fan-out run's state and what it reports: counts while it runs (:class:`FanOutProgress`), its end
(:class:`FanOutResult`).

:class:`Tally` adds up batch outcomes; :class:`RunState` is what every engine (threads,
asyncio) keeps while a run goes on, and how it ends; the loop that feeds it batches is
:func:`router.core.fanout.runs.run_loop`. Engines only decide how they wait and where batches run.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Literal

import attrs

from ...errors import FanOutFailed, ItemDeleted, RouterError, SenderErased
from .checkpoint import drop_checkpoint, finish_checkpoint, start_job
from .plan import MAX_ERRORS, MAX_FAILED_RECEIVERS, BatchOutcome, FanOutJob, batch_program
from ..writes import NEVER, Fence
from ..policy import RetryPolicy
from ..pseudonyms import Pseudonyms
from .runs import SKIP, STOP
from ..steps import Program

__all__ = ["FanOutProgress", "FanOutResult", "Tally"]

log = logging.getLogger(__name__)


@attrs.frozen(kw_only=True)
class FanOutProgress:
    """Counts so far of a running fan-out (see :class:`FanOutResult` for what each means)."""

    written: int
    already_present: int
    skipped: int
    failed: int
    resumed: int
    batches: int
    batches_resumed: int
    elapsed_seconds: float

    @property
    def receivers(self) -> int:
        """Receivers accounted for so far."""
        return self.written + self.already_present + self.skipped + self.failed + self.resumed


@attrs.frozen(kw_only=True)
class FanOutResult:
    """What one run of a fan-out did; every receiver read is counted exactly once.

    * ``written``: copies this run stored.
    * ``already_present``: copies that were there already (an earlier or concurrent run of
      the same fan-out, or an attempt of this run whose acknowledgement was lost).
    * ``skipped``: inactive receivers (``active`` said no); they get no copy.
    * ``failed``: receivers with no confirmed copy: invalid ids, or a batch that failed
      after every attempt. ``failed_receivers`` lists the first
      :data:`~router.core.fanout.plan.MAX_FAILED_RECEIVERS` valid ones; invalid ones are named in ``errors``.
    * ``resumed``: receivers in batches the checkpoint recorded done, not sent again.
    * ``batches`` / ``batches_resumed``: batches sent / not sent for that reason.
    * ``errors``: the first :data:`~router.core.fanout.plan.MAX_ERRORS` distinct errors, including
      checkpoint updates that failed (those alone do not fail the job).
    * ``complete``: every receiver was read and every batch sent; ``cancelled``: stopped
      by ``cancel()`` or ``close()``, or because the post was deleted (``reason``
      ``"deleted"``: the run raises :class:`~router.errors.ItemDeleted` with this result) or its sender erased
      (``"erased"``: :class:`~router.errors.SenderErased`, and the job's checkpoint is removed).
    """

    job_id: str
    cluster: str
    written: int
    already_present: int
    skipped: int
    failed: int
    resumed: int
    failed_receivers: tuple[int | str, ...]
    errors: tuple[RouterError, ...]
    batches: int
    batches_resumed: int
    elapsed_seconds: float
    complete: bool
    cancelled: bool = False
    reason: str | None = None

    @property
    def ok(self) -> bool:
        """True when every receiver was read and none is left without a copy."""
        return self.complete and not self.cancelled and self.failed == 0

    @property
    def receivers(self) -> int:
        """Receivers read by this run."""
        return self.written + self.already_present + self.skipped + self.failed + self.resumed


class Tally:
    """The running counts of one fan-out run."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.finished: float | None = None
        self.written = self.already_present = self.skipped = self.failed = self.resumed = 0
        self.batches = self.batches_resumed = 0
        self.failed_receivers: list[int | str] = []
        self.errors: list[RouterError] = []
        self._texts: set[str] = set()

    def resumed_batch(self, receivers: int) -> None:
        """A batch the checkpoint records done: not sent again."""
        self.resumed += receivers
        self.batches_resumed += 1

    def add(self, outcome: BatchOutcome) -> None:
        """Count a written batch."""
        self.written += outcome.written
        self.already_present += outcome.already_present
        self.skipped += outcome.skipped
        self.failed += outcome.failed
        self.batches += 1
        room = MAX_FAILED_RECEIVERS - len(self.failed_receivers)
        if room > 0:
            self.failed_receivers.extend(outcome.failed_receivers[:room])
        for error in outcome.errors:
            self.note(error)

    def lost(self, receivers: int) -> None:
        """A batch that could not be written at all (its task raised)."""
        self.failed += receivers

    def note(self, error: RouterError) -> None:
        """Keep *error* among the first :data:`MAX_ERRORS` distinct ones."""
        text = str(error)
        if text not in self._texts and len(self.errors) < MAX_ERRORS:
            self._texts.add(text)
            self.errors.append(error)

    def counts(self) -> dict[str, Any]:
        end = self.finished if self.finished is not None else time.monotonic()
        return {
            "written": self.written, "already_present": self.already_present, "skipped": self.skipped,
            "failed": self.failed, "resumed": self.resumed, "batches": self.batches,
            "batches_resumed": self.batches_resumed, "elapsed_seconds": end - self.started,
        }

    def progress(self) -> FanOutProgress:
        return FanOutProgress(**self.counts())

    def result(self, job_id: str, cluster: str, *, complete: bool, cancelled: bool,
               reason: str | None = None) -> FanOutResult:
        return FanOutResult(
            job_id=job_id, cluster=cluster, failed_receivers=tuple(self.failed_receivers), errors=tuple(self.errors),
            complete=complete, cancelled=cancelled, reason=reason, **self.counts(),
        )


class RunState:
    """What one run of a fan-out job knows while it runs, whatever engine runs it.

    Counts (:class:`Tally`), the cancel switch, and why it stopped early: the cluster
    failed (``gave_up``: the run ends in :class:`FanOutFailed`) or the receivers, the
    ``active`` predicate or a bug raised (``raised``: re-raised as it is), or the post
    was deleted (``fence``, the newest edit fence a batch saw, passed to the next
    batches: the run ends in :class:`ItemDeleted`). *lock* guards the counts where
    batches finish on several threads.
    """

    def __init__(
        self, job: FanOutJob, *, lock: AbstractContextManager[Any] | None = None,
        active: Callable[[Any], bool] | None = None, concurrency: int = 1, policy: RetryPolicy = RetryPolicy(),
        timeout: float = 10.0, pseudonyms: Pseudonyms | None = None,
    ) -> None:
        self.job = job
        #: What the batches read erasure records with (the router's; None: not read, for measuring only).
        self.pseudonyms = pseudonyms
        self.active = active
        self.concurrency = concurrency
        self.policy = policy
        self.timeout = timeout
        #: Batches read from the receivers so far, and whether every receiver was read.
        self.total = 0
        self.read_all = False
        self.tally = Tally()
        self.lock: AbstractContextManager[Any] = lock if lock is not None else nullcontext()
        self.cancelled = False
        self.stopping = False
        self.gave_up: BaseException | None = None
        self.raised: BaseException | None = None
        self.fence: Fence = NEVER
        #: The batches done earlier (read by :meth:`open`).
        self.done: set[int] = set()

    def progress(self) -> FanOutProgress:
        with self.lock:
            return self.tally.progress()

    def errors(self) -> tuple[RouterError, ...]:
        with self.lock:
            return tuple(self.tally.errors)

    def cancel(self) -> None:
        self.cancelled = self.stopping = True

    def open(self) -> Program[set[int]]:
        """Start the run: refuse a deleted post, open the checkpoint; return the batches done earlier."""
        job = self.job
        try:
            done, self.fence = yield from start_job(job, timeout=self.timeout, pseudonyms=self.pseudonyms,
                                                    policy=self.policy)
        except BaseException as exc:
            log.error("fan-out %r could not start: %s", job.job_id, exc, extra=job.log_extra)
            raise
        log.info("fan-out %r: data_key %s at %s to cluster %r, batches of %d, %d in flight, %d batches done earlier",
                 job.job_id, job.activity.data_key, job.activity.event_time.isoformat(), job.cluster, job.batch_size,
                 self.concurrency, len(done), extra=job.log_extra)
        self.done = done
        return done

    def admit(self, number: int, first: int, chunk: list[Any]) -> Any:
        """What to send for batch *number*, just read: the batch itself (``(number, first, chunk)``), or
        :data:`~router.core.fanout.runs.SKIP` (done earlier) or :data:`~router.core.fanout.runs.STOP` (the run is stopping: it is
        left for a resume)."""
        self.total = number + 1
        if self.stopping:
            return STOP
        if number in self.done:
            self.resumed(len(chunk))
            return SKIP
        return number, first, chunk

    def exhausted(self) -> None:
        """Every receiver was read (unless the run was stopping meanwhile)."""
        self.read_all = not self.stopping

    def batch(self, number: int, first: int, chunk: list[Any], data: Any) -> Program[BatchOutcome]:
        """The program that writes batch *number* under the newest fence this run has seen."""
        return batch_program(self.job, number, first, chunk, policy=self.policy, timeout=self.timeout,
                             active=self.active, data=data, known=self.fence, pseudonyms=self.pseudonyms)

    def stop(self, trouble: BaseException, *, raised: bool) -> None:
        """Stop sending batches, keeping the first trouble of each kind."""
        with self.lock:
            if raised and self.raised is None:
                self.raised = trouble
            elif not raised and self.gave_up is None:
                self.gave_up = trouble
        self.stopping = True

    def resumed(self, receivers: int) -> None:
        with self.lock:
            self.tally.resumed_batch(receivers)

    def lost(self, receivers: int, trouble: BaseException) -> None:
        """A batch task raised (a bug, or ``active`` raised): its receivers failed, and the run stops."""
        with self.lock:
            self.tally.lost(receivers)
        self.stop(trouble, raised=True)

    def add(self, outcome: BatchOutcome) -> None:
        """Count a written batch; a batch whose cluster failed, or that found the post deleted, stops the run."""
        with self.lock:
            self.tally.add(outcome)
            self.fence = self.fence.newer(outcome.fence)
        if self.fence.deleted:
            self.stopping = True
        if outcome.stopped is not None:
            log.error("fan-out %r: batch %d: %d receivers not written: %s", self.job.job_id, outcome.number,
                      len(outcome.failed_receivers), outcome.stopped.error, extra=self.job.log_extra)
            self.stop(outcome.stopped.error, raised=False)

    def finish(self, *, opened: bool) -> Program[FanOutResult]:
        """End the run (*opened*: its checkpoint was opened): record its status in the checkpoint, then return the
        result or raise.

        Returns only for a run that read every receiver and left none without a copy; raises
        what the receivers (or ``active``) raised, else :class:`FanOutFailed` with the result.
        """
        job, read_all, total, timeout = self.job, self.read_all, self.total, self.timeout
        trouble = self.raised or self.gave_up
        deleted = self.fence.deleted and self.raised is None
        complete = read_all and trouble is None and not deleted
        cancelled = (self.cancelled or deleted) and not complete
        status: Literal["done", "failed", "cancelled"]
        text: str | None
        erased = deleted and self.fence.erased
        if erased:
            status, text = "cancelled", f"erased: the sender of data_key {job.activity.data_key!r} was erased"
        elif deleted:
            status, text = "cancelled", f"deleted: data_key {job.activity.data_key!r} was deleted while it ran"
        elif complete and self.tally.failed == 0:
            status, text = "done", None
        else:
            status = "cancelled" if cancelled and trouble is None else "failed"
            text = f"{type(trouble).__name__}: {trouble}" if trouble is not None else (
                str(self.tally.errors[0]) if self.tally.errors else None)
        if opened:
            if erased:  # nothing of an erased sender's post stays, its checkpoint included
                error = yield from drop_checkpoint(job, timeout=timeout)
            else:
                error = yield from finish_checkpoint(job, status=status, total=total if read_all else None, error=text,
                                                     timeout=timeout)
            if error is not None:
                with self.lock:
                    self.tally.note(error)
        with self.lock:
            self.tally.finished = time.monotonic()
            result = self.tally.result(job.job_id, job.cluster, complete=complete, cancelled=cancelled,
                                       reason="erased" if erased else "deleted" if deleted else None)
        if self.raised is not None:
            log.error("fan-out %r stopped: %s: %s", job.job_id, type(self.raised).__name__, self.raised, exc_info=self.raised,
                      extra=job.log_extra)
            raise self.raised
        if erased:
            log.info("fan-out %r stopped after %d batches: its sender was erased", job.job_id, result.batches)
            raise SenderErased(job.activity.data_key, result=result)
        if deleted:
            log.info("fan-out %r stopped after %d batches: its post was deleted", job.job_id, result.batches)
            raise ItemDeleted(job.activity.data_key, result=result)
        if not result.ok:
            failure = FanOutFailed(result)
            log.error("%s", failure, extra=job.log_extra)
            raise failure
        log.info("fan-out %r done in %.1f s: %d written, %d already present, %d skipped, %d in batches done earlier",
                 job.job_id, result.elapsed_seconds, result.written, result.already_present, result.skipped, result.resumed,
                 extra=job.log_extra)
        return result


__all__ += ["RunState"]
