"""Fan-out on threads, for :class:`~router.FeedRouter`: a job's batches on a bounded pool, jobs in the background.

The receivers are read lazily in batches (:func:`router.core.fanout.plan.batches`); a semaphore
admits at most ``concurrency`` batches at a time, so memory is bounded by
``batch_size * concurrency`` copies, never by the number of receivers. Each batch runs
:func:`router.core.fanout.plan.batch_program` on the router's clusters. A batch that fails
because its cluster did stops the job: batches in flight finish, the checkpoint keeps
what was done, and the result says ``complete=False``.

Example::

    handle = router.fanouts.submit(job, followers(author), active=active_ids)
    handle.progress.written          # grows while it runs
    handle.result()                  # FanOutResult, or raises FanOutFailed
"""

from __future__ import annotations

import concurrent.futures
import contextvars
import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from ..core.fanout import (
    FREE_SLOT, FanOutJob, FanOutResult, NEXT_BATCH, RELEASE, RunState, Send, Step, batches, drive, positive_int,
    receiver_stream, run_loop,
)
from ..core.policy import RetryPolicy
from ..core.pseudonyms import Pseudonyms
from ..errors import RouterError
from ..observe import Event
from ..storage.clusters import Clusters
from .handle import HandleView

__all__ = ["FanOutExecutor", "FanOutHandle", "FanOutRun"]

log = logging.getLogger(__name__)


class FanOutRun(RunState):
    """One run of a fan-out job on threads (its state is a :class:`~router.core.fanout.tally.RunState`)."""

    def __init__(
        self, clusters: Clusters, job: FanOutJob, *, active: Callable[[Any], bool] | None, concurrency: int,
        policy: RetryPolicy, timeout: float, pseudonyms: Pseudonyms | None = None,
    ) -> None:
        super().__init__(job, lock=threading.Lock(), active=active, concurrency=concurrency, policy=policy,
                         timeout=timeout, pseudonyms=pseudonyms)
        self.clusters = clusters

    def run(self, receivers: Iterable[Any]) -> FanOutResult:
        """Write every batch not done yet; return the result, or raise (see :meth:`router.FeedRouter.fan_out`)."""
        if self.cancelled:  # cancelled while queued: nothing read, nothing touched
            return self.clusters.run(self.finish(opened=False))
        stream = receiver_stream(receivers)
        self.clusters.run(self.open())
        self.clusters.record(Event("fanout_jobs", 1))
        try:
            return self._run_batches(stream)
        finally:
            self.clusters.record(Event("fanout_jobs", -1))

    def _run_batches(self, stream: Iterator[Any]) -> FanOutResult:
        """The core's run loop (:func:`~router.core.fanout.runs.run_loop`), waiting on a semaphore, sending on a pool."""
        data = self.job.encoded_data()
        slots = threading.BoundedSemaphore(self.concurrency)
        pool = concurrent.futures.ThreadPoolExecutor(self.concurrency, thread_name_prefix="feed-router-fanout-batch")
        planned = batches(stream, self.job.batch_size)

        def do(step: Step) -> Any:
            if step == FREE_SLOT:
                slots.acquire()
            elif step == RELEASE:
                slots.release()
            elif step == NEXT_BATCH:
                return next(planned, None)
            elif isinstance(step, Send):
                number, first, chunk = step.batch
                pool.submit(contextvars.copy_context().run, self._send, slots, number, first, chunk, data)  # spans nest
            return None

        try:
            drive(run_loop(self), do)
        finally:
            pool.shutdown(wait=True)
        return self.clusters.run(self.finish(opened=True))

    def _send(self, slots: threading.BoundedSemaphore, number: int, first: int, chunk: list[Any], data: Any) -> None:
        try:
            outcome = self.clusters.run(self.batch(number, first, chunk, data))
        except BaseException as exc:  # a bug, or the `active` predicate raised: stop the job, re-raise from run()
            self.lost(len(chunk), exc)
            return
        finally:
            slots.release()
        self.add(outcome)


class FanOutHandle(HandleView):
    """A fan-out running in a :class:`FanOutExecutor`: watch it, wait for it, cancel it.

    Example::

        handle = router.fan_out(activity, followers(), background=True)
        while not handle.wait(timeout=1.0):
            print(handle.progress.written, "so far")
        result = handle.result()           # FanOutResult, or raises FanOutFailed
    """

    def __init__(self, run: FanOutRun, future: concurrent.futures.Future[FanOutResult]) -> None:
        self._run = run
        self._future = future

    def done(self) -> bool:
        """True once the job has finished, failed or been cancelled."""
        return self._future.done()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait up to *timeout* seconds (forever if None) for the job to end; return :meth:`done`."""
        concurrent.futures.wait([self._future], timeout=timeout)
        return self._future.done()

    def result(self, timeout: float | None = None) -> FanOutResult:
        """Wait for the job and return its result.

        Returns only for a job that read every receiver and left none without a copy; raises
        :class:`FanOutFailed` (with ``.result``) otherwise, including after :meth:`cancel`;
        raises what the job raised when it could not start (:class:`ClusterUnavailable`,
        :class:`FanOutConflict`) or what the receivers or *active* raised;
        :class:`TimeoutError` if it is still running after *timeout* seconds.
        """
        return self._future.result(timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """What :meth:`result` would raise, or None."""
        return self._future.exception(timeout)

    def cancel(self) -> bool:
        """Ask the job to stop between batches (batches in flight finish); True if it had not ended.

        The checkpoint stays, so the same fan-out run again resumes it.
        """
        self._run.cancel()
        return not self._future.done()


class FanOutExecutor:
    """A bounded pool that runs fan-outs in the background (``FeedRouter.fanouts``).

    ``workers`` jobs run at once, each with up to its ``concurrency`` batches in flight;
    later jobs wait in a queue, their receivers not yet read.
    """

    def __init__(self, *, workers: int = 2) -> None:
        self.workers = positive_int("workers", workers)
        self._pool = concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="feed-router-fanout")
        self._lock = threading.Lock()
        self._handles: set[FanOutHandle] = set()
        self._closed = False

    def submit(self, run: FanOutRun, receivers: Iterable[Any]) -> FanOutHandle:
        """Queue *run* (its job already checked and routed) and return its handle at once.

        *receivers* is read later, from a worker thread, in a copy of the caller's context (so the
        job's spans are children of the caller's ``feedrouter.fan_out`` span). Raises
        :class:`RouterError` after :meth:`close`.
        """
        with self._lock:
            if self._closed:
                raise RouterError("this FanOutExecutor is closed; it accepts no new fan-outs")
            future = self._pool.submit(contextvars.copy_context().run, run.run, receivers)
            handle = FanOutHandle(run, future)
            self._handles.add(handle)
        handle._future.add_done_callback(lambda _f: self._forget(handle))
        return handle

    def _forget(self, handle: FanOutHandle) -> None:
        with self._lock:
            self._handles.discard(handle)

    @property
    def pending(self) -> tuple[FanOutHandle, ...]:
        """The jobs queued or running."""
        with self._lock:
            return tuple(self._handles)

    def close(self, *, drain: bool = True) -> None:
        """Stop accepting jobs; wait for every job (*drain*) or cancel them first, then return.

        Cancelled jobs stop between batches and keep their checkpoints; each is logged with
        its job id so it can be resumed. Safe to call more than once.
        """
        with self._lock:
            self._closed = True
            handles = list(self._handles)
        if not drain:
            for handle in handles:
                if handle.cancel():
                    log.warning("fan-out %r cancelled by close(); run it again to resume", handle.job_id,
                                extra=handle._run.job.log_extra)
        self._pool.shutdown(wait=True)

    def __enter__(self) -> FanOutExecutor:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        self.close(drain=exc_type is None)
