"""The edit fence's values and what it costs a batch, without a server (see also test_edit_races.py)."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import pytest
from bson.int64 import Int64

from router import Activity, ItemDeleted, data_key
from router.core.fanout.checkpoint import job_status
from router.core.writes.edits import EditSettings, delete_program, update_program
from router.core.fanout.plan import FanOutJob, batch_program
from router.core.fanout.checkpoint import fenced_status, start_job
from router.core.writes.fence import DELETED, NEVER, Fence, FenceMemo, fence_of
from router.core.policy import RetryPolicy
from router.core.push import Push
from router.core.steps import Concurrently, Find, Insert
from router.core.fanout.runs import STOP
from router.core.fanout.tally import RunState
from router.testing.scripted import ScriptedStore, run_alone

UTC = timezone.utc
KEY = data_key("fabula", 5)
ACT = Activity(sender_id=1, event_time=datetime(2024, 8, 2, tzinfo=UTC), type=1, data={"v": 1}, data_key=KEY)
JOB = FanOutJob(job_id="j", cluster="c3", activity=ACT, batch_size=4)
POLICY = RetryPolicy(attempts=1)


def batch(number: int, receivers: list[int], **kwargs: object) -> object:
    return batch_program(JOB, number, number * 4, receivers, policy=POLICY, timeout=30.0, **kwargs)  # type: ignore[arg-type]


def test_newest_record_wins_and_a_tombstone_beats_every_update() -> None:
    """Per key the highest seq counts; a tombstone (read back as Int64) is newer than any update; malformed records
    are ignored."""
    fences = fence_of([
        {"data_key": "a", "seq": 1, "data": {"v": 1}}, {"data_key": "a", "seq": 3, "data": {"v": 3}},
        {"data_key": "b", "seq": 2, "data": {"v": 2}}, {"data_key": "b", "seq": Int64(DELETED), "data": None},
        {"data_key": "c", "seq": "x"}, {"data_key": "d", "seq": True}, {"seq": 4},
    ])
    assert fences == {"a": Fence(3, {"v": 3}), "b": Fence(DELETED)}
    assert fences["b"].deleted and not fences["a"].deleted and fences["a"].updated and not NEVER.updated
    assert Fence(DELETED).newer(Fence(9, {})) == Fence(DELETED) and NEVER.newer(None) is NEVER


def test_memo_keeps_the_newest_fence_of_the_most_recent_keys() -> None:
    """A worker's memo never goes back to an older fence, and forgets the least recently seen key first."""
    memo = FenceMemo(size=2)
    memo.learn("a", Fence(2, {"v": 2}))
    memo.learn("a", Fence(1, {"v": 1}))
    memo.learn("a", NEVER)
    assert memo.known("a") == Fence(2, {"v": 2})
    memo.learn("b", Fence(DELETED))
    memo.learn("c", Fence(1, {}))
    assert memo.known("a") is NEVER and memo.known("b").deleted


def test_status_of_a_deleted_post_is_cancelled_for_deleted() -> None:
    """A job whose post was deleted reads cancelled with reason deleted, unless it had finished before."""
    running = job_status("c3", {"_id": "j", "status": "published", "batches_total": 3}, [{"n": 0, "state": "done"}])
    assert fenced_status(running, NEVER) == running
    gone = fenced_status(running, Fence(DELETED))
    assert (gone.state, gone.reason, gone.to_json()["reason"]) == ("cancelled", "deleted", "deleted")
    done = job_status("c3", {"_id": "j", "status": "done", "batches_total": 1}, [{"n": 0, "state": "done"}])
    assert (fenced_status(done, Fence(DELETED)).state, fenced_status(done, Fence(DELETED)).reason) == ("done", "deleted")


def test_a_batch_of_a_post_never_edited_pays_one_find() -> None:
    """The fence costs a batch one request: a find on edits after its insert (and the checkpoint record)."""
    outcome, sent = run_alone(batch(0, [1, 2, 3]))
    assert [(type(r), r.collection) for r in sent] == [(Insert, "feed"), (Find, "edits"), (Insert, "fanout_batches")]
    assert outcome.written == 3 and outcome.fence == NEVER


def test_a_batch_that_knows_the_post_deleted_sends_nothing() -> None:
    """A batch given a tombstone by its engine (a run, or a worker's memo) writes and records nothing."""
    outcome, sent = run_alone(batch(0, [1, 2, 3], known=Fence(DELETED)))
    assert sent == [] and outcome.written == 0 and outcome.fence.deleted


def test_a_batch_that_knows_an_update_writes_the_new_data_at_once() -> None:
    """A batch given an update writes its data and, the fence unchanged, applies nothing again."""
    store = ScriptedStore()
    run_alone(update_program(KEY, {"v": 2}, ["c3"], EditSettings()), store)
    fence = run_alone(start_job(JOB, timeout=30.0), store)[0][1]
    assert fence == Fence(1, {"v": 2})
    _, sent = run_alone(batch(0, [1, 2], known=fence, record=False), store)
    assert [type(r) for r in sent] == [Insert, Find]
    assert [c["data"] for c in store.find("c3", "feed", {})] == [{"v": 2}, {"v": 2}]


def test_edits_leave_their_record_before_touching_any_copy() -> None:
    """delete and update write the fence first in each cluster; a later update keeps one record, seq + 1."""
    store = ScriptedStore()
    run_alone(batch(0, [1]), store)
    _, sent = run_alone(update_program(KEY, {"v": 2}, ["c3"], EditSettings()), store)
    assert [r.collection for r in sent][:3] == ["edits", "edits", "edits"]
    run_alone(update_program(KEY, {"v": 3}, ["c3"], EditSettings()), store)
    assert [(r["seq"], r["data"]) for r in store.find("c3", "edits", {})] == [(2, {"v": 3})]
    _, sent = run_alone(delete_program(KEY, ["c3"], EditSettings()), store)
    assert isinstance(sent[0], Insert) and sent[0].collection == "edits"
    assert [r["seq"] for r in store.find("c3", "edits", {})] == [DELETED]
    run_alone(update_program(KEY, {"v": 4}, ["c3"], EditSettings()), store)  # no record after a tombstone
    assert [r["seq"] for r in store.find("c3", "edits", {})] == [DELETED]


def test_a_deleted_post_is_not_fanned_out_again() -> None:
    """Starting (or resuming) a fan-out of a deleted post raises ItemDeleted naming the key; nothing is opened."""
    store = ScriptedStore()
    run_alone(delete_program(KEY, ["c3"], EditSettings()), store)
    with pytest.raises(ItemDeleted, match=KEY):
        run_alone(start_job(JOB, timeout=30.0), store)
    assert store.find("c3", "fanouts", {}) == []


def test_a_run_that_meets_the_tombstone_stops_and_says_so() -> None:
    """A batch outcome with a tombstone stops the run; it ends cancelled for 'deleted' and raises ItemDeleted."""
    store = ScriptedStore()
    run_alone(delete_program(KEY, ["c3"], EditSettings()), store)
    state = RunState(JOB, timeout=30.0)
    assert state.admit(0, 0, [1, 2]) == (0, 0, [1, 2])
    outcome, _ = run_alone(batch(0, [1, 2]), store)
    state.add(outcome)
    assert state.stopping and state.fence.deleted and state.admit(1, 2, [3]) == STOP
    with pytest.raises(ItemDeleted) as raised:
        run_alone(state.finish(opened=True), store)
    result = raised.value.result
    assert result.cancelled and result.reason == "deleted" and not result.complete and result.written == 0


def waves(program: Any, store: ScriptedStore) -> tuple[Any, list[list[tuple[str, str, str]]]]:
    """Run *program* with every concurrent sub-program in lock step: wave *i* holds each ``(cluster, request type,
    collection)`` sent at the *i*-th round trip, so the number of waves is the longest chain of requests."""
    def advance(gen: Any, reply: Any) -> list[tuple[Any, Any]]:
        """The pending leaves under *gen* after sending it *reply*: ``(generator, request)`` pairs."""
        try:
            request = gen.send(reply)
            while isinstance(request, Push):  # a live push is answered at once, as a driver does: no round trip
                request = gen.send(None)
        except StopIteration as stop:
            finished[id(gen)] = stop.value
            return []
        if isinstance(request, Concurrently):
            children = [iter(p) for p in request.programs]
            parents[id(gen)] = (gen, children)
            for child in children:
                owner[id(child)] = gen
            return [leaf for child in children for leaf in advance(child, None)]
        return [(gen, request)]

    def settle(gen: Any) -> list[tuple[Any, Any]]:
        """Resume the parents whose children have all ended."""
        parent = owner.get(id(gen))
        if parent is None or not all(id(c) in finished for c in parents[id(parent)][1]):
            return []
        results = [finished[id(c)] for c in parents.pop(id(parent))[1]]
        return advance(parent, results) or settle(parent)

    finished: dict[int, Any] = {}
    parents: dict[int, tuple[Any, list[Any]]] = {}
    owner: dict[int, Any] = {}
    top = iter(program)
    pending = advance(top, None)
    out: list[list[tuple[str, str, str]]] = []
    while pending:
        out.append(sorted((r.cluster, type(r).__name__, r.collection) for _, r in pending))
        nxt: list[tuple[Any, Any]] = []
        for gen, request in pending:
            leaves = advance(gen, store.answer(request))
            nxt += leaves if leaves or id(gen) not in finished else settle(gen)
        pending = nxt
    return finished[id(top)], out


def test_a_delete_is_two_round_trips_per_cluster() -> None:
    """``delete`` over three clusters: the tombstones first, all at once; then in each cluster the copies (one request,
    no sample), the outbox entry and the superseded update records, all at once. Exact count, nothing left."""
    store = ScriptedStore()
    for cluster in ("c1", "c2", "c3"):
        job = FanOutJob(job_id=f"j-{cluster}", cluster=cluster, activity=ACT, batch_size=500)
        run_alone(batch_program(job, 0, 0, list(range(500)), policy=POLICY, timeout=30.0), store)
        store.docs(cluster, "outbox")["o"] = {"_id": "o", "data_key": KEY}
    run_alone(update_program(KEY, {"v": 2}, ["c1", "c2", "c3"], EditSettings()), store)
    deleted, rounds = waves(delete_program(KEY, ["c1", "c2", "c3"], EditSettings()), store)
    assert deleted == 1500
    assert rounds == [
        [(c, "Insert", "edits") for c in ("c1", "c2", "c3")],
        [(c, "Delete", collection) for c in ("c1", "c2", "c3") for collection in ("edits", "feed", "outbox")],
    ]
    for cluster in ("c1", "c2", "c3"):
        assert store.find(cluster, "feed", {}) == [] and store.find(cluster, "outbox", {}) == []
        assert [r["seq"] for r in store.find(cluster, "edits", {})] == [DELETED]
