"""The one fan-out run loop (router.core.fanout.runs), driven by a scripted engine; and that every engine uses it."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from router import Activity, SenderErased, data_key
from router.core.fanout.plan import BatchOutcome, FanOutJob, batches
from router.core.writes.fence import SENDER_ERASED
from router.core.fanout.runs import FREE_SLOT, NEXT_BATCH, RELEASE, Send, Step, drive, run_loop
from router.core.fanout.tally import RunState
from router.fanout.celery_plan import PublishRun
from router.testing.scripted import ScriptedStore, run_alone

ACT = Activity(sender_id=1, event_time=datetime(2024, 7, 2, tzinfo=timezone.utc), type=1, data={}, data_key=data_key("p", 1))
JOB = FanOutJob(job_id="j", cluster="c3", activity=ACT, batch_size=2)
ROUTER = Path(__file__).resolve().parents[2] / "router"


class Engine:
    """A scripted engine: *concurrency* slots, receivers read in batches of 2; it logs each step it is asked."""

    def __init__(self, receivers: Iterator[Any], concurrency: int = 1) -> None:
        self.planned = batches(receivers, 2)
        self.free = concurrency
        self.log: list[Any] = []

    def do(self, step: Step) -> Any:
        self.log.append(step if not isinstance(step, Send) else ("send", step.batch[0]))
        if step == FREE_SLOT:
            assert self.free > 0, "asked for a slot with none free"
            self.free -= 1
        elif step == RELEASE:
            self.free += 1
        elif step == NEXT_BATCH:
            return next(self.planned, None)
        else:
            self.free += 1  # the batch ran at once and gave its slot back
        return None


def test_a_slot_first_then_a_batch_and_every_slot_given_back() -> None:
    """Five receivers, batch 0 done earlier: its slot comes back unsent; 1 and 2 are sent; the end of the receivers
    gives its slot back and marks the run as having read everything."""
    state = RunState(JOB)
    state.done = {0}
    engine = Engine(iter(range(5)))
    drive(run_loop(state), engine.do)
    assert engine.log == [FREE_SLOT, NEXT_BATCH, RELEASE, FREE_SLOT, NEXT_BATCH, ("send", 1), FREE_SLOT, NEXT_BATCH,
                          ("send", 2), FREE_SLOT, NEXT_BATCH, RELEASE]
    assert engine.free == 1 and state.read_all and state.total == 3 and state.tally.resumed == 2


def test_receivers_that_raise_give_the_slot_back_and_stop_the_run() -> None:
    """The receivers raise after one batch: the loop gives back the slot it took, and the run stops with the error
    as raised (the run ends re-raising it), having read less than everything."""
    def receivers() -> Iterator[int]:
        yield from (1, 2)
        raise ValueError("the follower list broke")

    state = RunState(JOB)
    engine = Engine(receivers(), concurrency=2)
    drive(run_loop(state), engine.do)
    assert engine.log == [FREE_SLOT, NEXT_BATCH, ("send", 0), FREE_SLOT, NEXT_BATCH, RELEASE]
    assert engine.free == 2 and state.stopping and not state.read_all
    assert isinstance(state.raised, ValueError)


def test_a_stopping_run_reads_no_further_batch() -> None:
    """A run cancelled between batches takes a slot, sees it is stopping, gives it back and reads nothing more."""
    state = RunState(JOB)
    engine = Engine(iter(range(10)))
    loop = run_loop(state)
    assert next(loop) == FREE_SLOT and loop.send(None) == NEXT_BATCH and loop.send((0, 0, [0, 1])) == Send((0, 0, [0, 1]))
    state.cancel()
    assert loop.send(None) == FREE_SLOT and loop.send(None) == RELEASE
    with pytest.raises(StopIteration):
        loop.send(None)
    assert engine.log == []


def test_a_batch_that_finds_the_sender_erased_stops_the_loop() -> None:
    """The erasure check is the loop's, whatever the engine: once a batch's outcome says the post's sender was erased,
    the run admits no further batch (its slot comes back unsent) and ends removing its checkpoint, raising
    SenderErased."""
    state = RunState(JOB)
    engine = Engine(iter(range(10)))
    sent: list[int] = []

    def do(step: Step) -> Any:
        reply = engine.do(step)
        if isinstance(step, Send):
            number = step.batch[0]
            sent.append(number)
            state.add(BatchOutcome(number=number, receivers=2, written=0, already_present=0, skipped=0,
                                   failed_receivers=(), invalid=0, errors=(),
                                   fence=SENDER_ERASED if number == 1 else None))
        return reply

    drive(run_loop(state), do)
    assert sent == [0, 1] and engine.log[-3:] == [("send", 1), FREE_SLOT, RELEASE] and not state.read_all
    store = ScriptedStore()
    store.docs("c3", "fanouts")[JOB.job_id] = {"_id": JOB.job_id, "data_key": ACT.data_key}
    store.docs("c3", "fanout_batches")["j:0"] = {"_id": "j:0", "job": JOB.job_id, "n": 0}
    with pytest.raises(SenderErased) as stopped:
        run_alone(state.finish(opened=True), store)
    assert stopped.value.result is not None and stopped.value.result.reason == "erased"
    assert store.docs("c3", "fanouts") == {} == store.docs("c3", "fanout_batches")


def test_the_publisher_runs_the_same_loop() -> None:
    """The Celery publisher's run: a batch whose every part is done is skipped (counted resumed), the others are sent
    with their parts; a send the broker refuses stops it, to be recorded failed and raised."""
    publishing = PublishRun([JOB], active=None, timeout=10.0)
    publishing.done = {1}
    sent: list[Any] = []

    def do(step: Step) -> Any:
        if step == NEXT_BATCH:
            return next(planned, None)
        if isinstance(step, Send):
            if step.batch[0] == 3:
                raise ConnectionError("the broker went away")
            sent.append((step.batch[0], [p.receivers for p in step.batch[2]]))
        return None

    planned = batches(iter(range(10)), 2)
    drive(run_loop(publishing), do)
    assert sent == [(0, [[0, 1]]), (2, [[4, 5]])]
    assert (publishing.total, publishing.resumed, publishing.read) == (4, 1, 8)
    assert isinstance(publishing.raised, ConnectionError) and publishing.stopping


ENGINES = ("fanout/threads.py", "fanout/tasks.py", "fanout/celery.py")
#: What only the core's run loop and the runs it drives may call: admitting, planning, announcing, ending a run.
LOOP_ONLY = {"admit", "exhausted", "plan_parts", "announce_batch", "finish_checkpoint", "open_checkpoint", "start_job",
             "drop_checkpoint"}


@pytest.mark.parametrize("engine", ENGINES)
def test_engines_supply_only_how_they_wait_and_send(engine: str) -> None:
    """Each engine drives the core's run_loop and calls nothing of the loop's own (no admit, no checkpoint program
    run by hand)."""
    tree = ast.parse((ROUTER / engine).read_text())
    called = {n.func.attr if isinstance(n.func, ast.Attribute) else getattr(n.func, "id", "")
              for n in ast.walk(tree) if isinstance(n, ast.Call)}
    assert "run_loop" in called, f"{engine} does not drive router.core.fanout.runs.run_loop"
    assert not called & LOOP_ONLY, f"{engine} runs part of the loop itself: {sorted(called & LOOP_ONLY)}"
