"""Fan-out on asyncio tasks, for :class:`~router.AsyncFeedRouter`: a job's batches under a semaphore.

The asyncio twin of :mod:`router.fanout.threads`: the same batches
(:func:`router.core.fanout.plan.batch_program`), the same checkpoint and counts; batches run
as tasks, at most ``concurrency`` at a time (an ``asyncio.Semaphore``), and receivers may
be an iterable or an async iterable. Background jobs run as tasks too, at most
``workers`` at once.

Example::

    handle = await feeds.fan_out(activity, followers(author), background=True)
    handle.progress.written          # grows while it runs
    await handle.result()            # FanOutResult, or raises FanOutFailed
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Generator, Iterable
from typing import Any

from ..core.fanout import (
    FREE_SLOT, FanOutJob, FanOutResult, NEXT_BATCH, RELEASE, RunState, Send, Step, positive_int, receiver_stream,
    run_loop,
)
from ..core.policy import RetryPolicy
from ..core.pseudonyms import Pseudonyms
from ..errors import RouterError
from ..observe import Event
from ..storage.aclusters import AsyncClusters
from .handle import HandleView

__all__ = ["AsyncFanOutExecutor", "AsyncFanOutHandle", "AsyncFanOutRun", "abatches"]

log = logging.getLogger(__name__)
Receivers = Iterable[Any] | AsyncIterable[Any]


async def abatches(receivers: Receivers, size: int) -> AsyncIterator[tuple[int, int, list[Any]]]:
    """:func:`router.core.fanout.plan.batches` for an iterable or an async iterable, read lazily.

    A plain iterable is read a batch at a time in a worker thread (``asyncio.to_thread``),
    so a source that blocks (a database cursor, a generator that waits) never stalls the
    event loop.
    """
    if isinstance(receivers, AsyncIterable):
        stream = receivers.__aiter__()

        async def take() -> list[Any]:
            chunk: list[Any] = []
            async for receiver in stream:
                chunk.append(receiver)
                if len(chunk) == size:
                    break
            return chunk

    else:
        plain = receiver_stream(receivers)

        async def take() -> list[Any]:
            return await asyncio.to_thread(lambda: list(itertools.islice(plain, size)))

    number = position = 0
    while True:
        chunk = await take()
        if not chunk:
            return
        yield number, position, chunk
        number += 1
        position += len(chunk)


async def adrive(loop: Generator[Step, Any, None], do: Callable[[Step], Awaitable[Any]]) -> None:
    """:func:`router.core.fanout.runs.drive` on asyncio: each step done by awaiting *do*."""
    reply: Any = None
    error: BaseException | None = None
    while True:
        try:
            step = loop.throw(error) if error is not None else loop.send(reply)
        except StopIteration:
            return
        error = reply = None
        try:
            reply = await do(step)
        except BaseException as exc:  # (the caller cancelled: thrown in, the loop stops the run with it)
            error = exc


class AsyncFanOutRun(RunState):
    """One run of a fan-out job on asyncio (its state is a :class:`~router.core.fanout.tally.RunState`)."""

    def __init__(
        self, clusters: AsyncClusters, job: FanOutJob, *, active: Callable[[Any], bool] | None, concurrency: int,
        policy: RetryPolicy, timeout: float, pseudonyms: Pseudonyms | None = None,
    ) -> None:
        super().__init__(job, active=active, concurrency=concurrency, policy=policy, timeout=timeout,
                         pseudonyms=pseudonyms)
        self.clusters = clusters

    async def run(self, receivers: Receivers) -> FanOutResult:
        """Write every batch not done yet; return the result, or raise (see ``AsyncFeedRouter.fan_out``)."""
        if self.cancelled:
            return await self.clusters.run(self.finish(opened=False))
        planned = abatches(receivers, self.job.batch_size)
        await self.clusters.run(self.open())
        self.clusters.record(Event("fanout_jobs", 1))
        try:
            return await self._run_batches(planned)
        finally:
            self.clusters.record(Event("fanout_jobs", -1))

    async def _run_batches(self, planned: AsyncIterator[tuple[int, int, list[Any]]]) -> FanOutResult:
        """The core's run loop (:func:`~router.core.fanout.runs.run_loop`), waiting on an asyncio semaphore, sending as tasks."""
        data = self.job.encoded_data()
        slots = asyncio.Semaphore(self.concurrency)
        tasks: set[asyncio.Task[None]] = set()

        async def do(step: Step) -> Any:
            if step == FREE_SLOT:
                await slots.acquire()
            elif step == RELEASE:
                slots.release()
            elif step == NEXT_BATCH:
                return await anext(planned, None)
            elif isinstance(step, Send):
                number, first, chunk = step.batch
                task = asyncio.create_task(self._send(slots, number, first, chunk, data))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            return None

        try:
            await adrive(run_loop(self), do)
        finally:
            if tasks:
                await asyncio.gather(*tasks, return_exceptions=True)
        return await self.clusters.run(self.finish(opened=True))

    async def _send(self, slots: asyncio.Semaphore, number: int, first: int, chunk: list[Any], data: Any) -> None:
        try:
            outcome = await self.clusters.run(self.batch(number, first, chunk, data))
        except BaseException as exc:  # a bug, or the `active` predicate raised
            self.lost(len(chunk), exc)
            return
        finally:
            slots.release()
        self.add(outcome)


class AsyncFanOutHandle(HandleView):
    """A fan-out running in the background on asyncio: watch it, wait for it, cancel it.

    Example::

        handle = await feeds.fan_out(activity, followers(), background=True)
        while not await handle.wait(timeout=1.0):
            print(handle.progress.written, "so far")
        result = await handle.result()     # FanOutResult, or raises FanOutFailed
    """

    def __init__(self, run: AsyncFanOutRun, task: asyncio.Task[FanOutResult]) -> None:
        self._run = run
        self._task = task

    def done(self) -> bool:
        """True once the job has finished, failed or been cancelled."""
        return self._task.done()

    async def wait(self, timeout: float | None = None) -> bool:
        """Wait up to *timeout* seconds (forever if None) for the job to end; return :meth:`done`."""
        await asyncio.wait([self._task], timeout=timeout)
        return self._task.done()

    async def result(self, timeout: float | None = None) -> FanOutResult:
        """Wait for the job and return its result; raises as ``FanOutHandle.result`` does
        (:class:`TimeoutError` after *timeout* seconds, the job going on)."""
        if timeout is None:
            return await asyncio.shield(self._task)
        return await asyncio.wait_for(asyncio.shield(self._task), timeout)

    def cancel(self) -> bool:
        """Ask the job to stop between batches (batches in flight finish); True if it had not ended."""
        self._run.cancel()
        return not self._task.done()


class AsyncFanOutExecutor:
    """Background fan-outs on asyncio (``AsyncFeedRouter.fanouts``): at most ``workers`` jobs run at once."""

    def __init__(self, *, workers: int = 2) -> None:
        self.workers = positive_int("workers", workers)
        self._slots = asyncio.Semaphore(workers)
        self._handles: set[AsyncFanOutHandle] = set()
        self._closed = False

    def submit(self, run: AsyncFanOutRun, receivers: Receivers) -> AsyncFanOutHandle:
        """Start *run* as a task (it waits for a worker slot) and return its handle at once."""
        if self._closed:
            raise RouterError("this AsyncFanOutExecutor is closed; it accepts no new fan-outs")

        async def queued() -> FanOutResult:
            async with self._slots:
                return await run.run(receivers)

        handle = AsyncFanOutHandle(run, asyncio.create_task(queued(), name=f"fan-out {run.job.job_id}"))
        self._handles.add(handle)
        handle._task.add_done_callback(lambda _t: self._handles.discard(handle))
        return handle

    @property
    def pending(self) -> tuple[AsyncFanOutHandle, ...]:
        """The jobs queued or running."""
        return tuple(self._handles)

    async def close(self, *, drain: bool = True) -> None:
        """Stop accepting jobs; wait for every job (*drain*) or cancel them between batches first."""
        self._closed = True
        handles = list(self._handles)
        if not drain:
            for handle in handles:
                if handle.cancel():
                    log.warning("fan-out %r cancelled by close(); run it again to resume", handle.job_id,
                                extra=handle._run.job.log_extra)
        if handles:
            await asyncio.gather(*(h._task for h in handles), return_exceptions=True)
