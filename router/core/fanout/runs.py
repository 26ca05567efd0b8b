"""One fan-out run loop for every engine: a free slot, the next batch, admit it, send it, add it up.

:func:`run_loop` is the loop, once, as a generator of steps like every core program: it
says what to do next and the engine does it its own way:

* :data:`FREE_SLOT`: wait until fewer than ``concurrency`` batches are in flight (a
  semaphore on threads or on asyncio; nothing for the Celery publisher, which hands each
  batch to the broker before it reads the next);
* :data:`NEXT_BATCH`: read the next ``(number, first, receivers)`` batch of the stream
  (:func:`router.core.fanout.plan.batches`) and answer it, or None once the receivers are all read;
* :data:`RELEASE`: give back the slot taken for a batch that is not sent;
* :class:`Send`: send what the run admitted (the engine gives its slot back when the
  batch ends, and adds its outcome up with the run: :meth:`~router.core.fanout.tally.RunState.add`).

An exception the engine meets while doing a step (the receivers raised, the caller was
interrupted, the broker refused a task) is thrown into the loop at that step: the loop
gives back a slot it holds, stops the run with it (``stop(exc, raised=True)``) and ends.
The engine then waits for what it has in flight and ends the run
(:meth:`~router.core.fanout.tally.RunState.finish`). Engines: :mod:`router.fanout.threads`,
:mod:`router.fanout.tasks`, and the publisher of :mod:`router.fanout.celery`.

Example (how a synchronous engine drives it)::

    drive(run_loop(run), lambda step: slots.acquire() if step is FREE_SLOT else ...)
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any, Final, Literal, Protocol

import attrs

__all__ = ["FREE_SLOT", "NEXT_BATCH", "RELEASE", "SKIP", "STOP", "LoopRun", "Send", "Step", "drive", "run_loop"]

#: Wait for a free slot (answered with None).
FREE_SLOT: Final = "free slot"
#: Read the next batch (answered with ``(number, first, receivers)``, or None at the end of the receivers).
NEXT_BATCH: Final = "next batch"
#: Give back the slot taken for a batch that is not sent (answered with None).
RELEASE: Final = "release"
#: What :meth:`LoopRun.admit` answers for a batch done earlier (counted there), and for a run that is stopping.
SKIP: Final = "skip"
STOP: Final = "stop"


@attrs.frozen
class Send:
    """Send *batch*, what :meth:`LoopRun.admit` gave for it (answered with None once the engine started it)."""

    batch: Any


Step = Literal["free slot", "next batch", "release"] | Send


class LoopRun(Protocol):
    """What the loop asks of a run (:class:`~router.core.fanout.tally.RunState`, or the Celery publisher's run)."""

    @property
    def stopping(self) -> bool:
        """True once no further batch is to be sent."""

    def admit(self, number: int, first: int, chunk: list[Any]) -> Any:
        """What to send for batch *number* (read just now, its first receiver at stream position *first*), or
        :data:`SKIP` (done earlier), or :data:`STOP` (the run is stopping: it is left for a resume)."""

    def exhausted(self) -> None:
        """Every receiver was read."""

    def stop(self, trouble: BaseException, *, raised: bool) -> None:
        """Stop sending batches because of *trouble*."""


def run_loop(run: LoopRun) -> Generator[Step, Any, None]:
    """The run loop: at most one batch read ahead of a free slot, so memory holds ``concurrency`` batches at most."""
    try:
        while True:
            yield FREE_SLOT  # a free slot first, then read the next batch
            if run.stopping:
                yield RELEASE
                return
            try:
                batch = yield NEXT_BATCH
            except GeneratorExit:
                raise
            except BaseException:
                yield RELEASE
                raise
            if batch is None:
                yield RELEASE
                run.exhausted()
                return
            number, first, chunk = batch
            admitted = run.admit(number, first, chunk)
            if admitted is SKIP or admitted is STOP:
                yield RELEASE
                if admitted is STOP:
                    return
                continue
            yield Send(admitted)
    except GeneratorExit:
        raise
    except BaseException as exc:  # the receivers raised, the caller was interrupted, a send was refused
        run.stop(exc, raised=True)


def drive(loop: Generator[Step, Any, None], do: Callable[[Step], Any]) -> None:
    """Run *loop* to its end, doing each step with *do* (a synchronous engine); what *do* raises goes back into the
    loop at that step."""
    reply: Any = None
    error: BaseException | None = None
    while True:
        try:
            step = loop.throw(error) if error is not None else loop.send(reply)
        except StopIteration:
            return
        error = reply = None
        try:
            reply = do(step)
        except BaseException as exc:
            error = exc
