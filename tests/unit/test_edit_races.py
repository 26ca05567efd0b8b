"""Edits racing writers, in every interleaving of their requests: a deleted post stays deleted, an update wins.

The programs are the core's own (a fan-out batch, ``delete``, ``update``, publish's
outbox entry, backfill); :func:`router.testing.scripted.interleavings` runs them against
one scripted store in every order their requests can take, each request atomic as a
single-document write is on FerretDB. Real servers are in ``tests/integration/test_fence.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

import pytest

from router import Activity, ClusterMeta, ItemDeleted, data_key
from router.core.writes.edits import EditSettings, delete_program, update_program
from router.core.fanout.plan import FanOutJob, batch_program
from router.core.policy import RetryPolicy
from router.core.social.publish import backfill_program, store_outbox
from router.core.steps import Program
from router.testing.scripted import Run, ScriptedStore, interleavings, run_alone
from router.timemap import TimeMap

UTC = timezone.utc
CLUSTER = "c3"
WHEN = datetime(2024, 8, 2, 10, 0, 0, 125000, tzinfo=UTC)
KEY = data_key("fabula", 77)
OLD, NEW, NEWER = {"v": 1}, {"v": 2}, {"v": 3}
ACT = Activity(sender_id="author", event_time=WHEN, type=1, data=OLD, data_key=KEY)
JOB = FanOutJob(job_id=f"{KEY}:1", cluster=CLUSTER, activity=ACT, batch_size=3)
POLICY = RetryPolicy(attempts=1)
#: Edits in one step each; :data:`STEPPED` takes steps of two copies (more places to interleave).
EDITS = EditSettings(timeout=60.0)
STEPPED = EditSettings(step=2, sample=2, timeout=60.0)


def batch(number: int, receivers: Sequence[Any], **kwargs: Any) -> Program[Any]:
    return batch_program(JOB, number, number * 3, receivers, policy=POLICY, timeout=60.0, **kwargs)


def delete(settings: EditSettings = EDITS) -> Program[int]:
    return delete_program(KEY, [CLUSTER], settings)


def update(data: dict[str, Any]) -> Program[int]:
    return update_program(KEY, data, [CLUSTER], EDITS)


def one_after_another(*programs: Program[Any]) -> Program[None]:
    """Programs in order: the next starts when the one before has returned (a caller's sequential calls)."""
    for program in programs:
        yield from program


def copies(store: ScriptedStore, **match: Any) -> list[dict[str, Any]]:
    return store.find(CLUSTER, "feed", {"data_key": KEY, **match})


def earlier_batch(store: ScriptedStore) -> None:
    """Batch 0 (two receivers) written before the race begins."""
    run_alone(batch(0, [1, 2]), store)


def every(make: Any, *, setup: Any = earlier_batch) -> list[Run]:
    runs = list(interleavings(make, setup=setup))
    assert len(runs) > 10  # the race really has many orders
    return runs


def test_delete_racing_a_batch_leaves_no_copy() -> None:
    """Whatever the order, once both end no copy of the deleted post is left, and a batch that saw the tombstone
    is not recorded done."""
    for run in every(lambda _s: [batch(1, [4, 5, 6]), delete(STEPPED)]):
        assert run.errors == (None, None), run.order
        assert copies(run.store) == [], run.order
        assert run.store.find(CLUSTER, "outbox", {}) == []
        outcome = run.results[0]
        if outcome.fence is not None and outcome.fence.deleted:
            assert outcome.written == 0 and run.store.find(CLUSTER, "fanout_batches", {"n": 1}) == []


def test_a_batch_after_the_delete_writes_nothing_that_stays() -> None:
    """A batch that starts after ``delete`` returned (a queued or resumed batch) removes what it wrote at once."""
    store = ScriptedStore()
    earlier_batch(store)
    assert run_alone(delete(), store)[0] == 2
    outcome, _ = run_alone(batch(1, [4, 5, 6]), store)
    assert outcome.fence.deleted and copies(store) == []


def test_update_racing_a_batch_leaves_every_copy_new() -> None:
    """Whatever the order, once both end every copy carries the updated data."""
    for run in every(lambda _s: [batch(1, [4, 5, 6], record=False), update(NEW)]):
        assert run.errors == (None, None), run.order
        found = copies(run.store)
        assert len(found) == 5 and all(c["data"] == NEW for c in found), run.order


def test_two_updates_in_turn_racing_a_batch_leave_the_second() -> None:
    """A batch that applies an older update after a newer one swept reads the fence again and applies the newer."""
    for run in every(lambda _s: [batch(1, [4], record=False), one_after_another(update(NEW), update(NEWER))]):
        assert run.errors == (None, None), run.order
        found = copies(run.store)
        assert len(found) == 3 and all(c["data"] == NEWER for c in found), run.order


def test_update_then_delete_racing_a_batch_leave_nothing() -> None:
    """An update, then a delete, both racing one batch: nothing is left."""
    for run in every(lambda _s: [batch(1, [4, 5], record=False), one_after_another(update(NEW), delete())]):
        assert run.errors == (None, None), run.order
        assert copies(run.store) == [], run.order


def test_publish_racing_a_delete_leaves_no_outbox_entry() -> None:
    """The outbox entry of a publish racing a delete is gone at the end; a publish that read the tombstone raises
    ItemDeleted, and one that started after the delete always does."""
    def setup(store: ScriptedStore) -> None:
        return None

    raised = 0
    for run in every(lambda _s: [store_outbox(JOB, policy=POLICY, timeout=60.0), delete()], setup=setup):
        assert run.store.find(CLUSTER, "outbox", {}) == [], run.order
        raised += isinstance(run.errors[0], ItemDeleted)
        if run.order[0] == 1 and run.order.index(0) > 2:  # the delete's tombstone and sweep came first
            assert isinstance(run.errors[0], ItemDeleted)
    assert raised
    store = ScriptedStore()
    run_alone(delete(), store)
    with pytest.raises(ItemDeleted, match=KEY):
        run_alone(store_outbox(JOB, policy=POLICY, timeout=60.0), store)


def test_backfill_racing_a_delete_leaves_no_copy() -> None:
    """A backfill that read the outbox entry before the delete removed it leaves no copy behind."""
    timemap = TimeMap([ClusterMeta(name=CLUSTER, start_date=datetime(2024, 7, 1, tzinfo=UTC), end_date=None,
                                   creator_name="t", created_at=WHEN)])

    def publish_first(store: ScriptedStore) -> None:
        run_alone(store_outbox(JOB, policy=POLICY, timeout=60.0), store)

    def make(_s: ScriptedStore) -> list[Program[Any]]:
        return [backfill_program(9, ["author"], timemap=timemap, now=datetime(2024, 9, 1, tzinfo=UTC), window=None,
                                 since=None, limit=10, policy=POLICY, timeout=60.0), delete()]

    for run in every(make, setup=publish_first):
        assert run.errors == (None, None), run.order
        assert copies(run.store) == [] and run.store.find(CLUSTER, "outbox", {}) == [], run.order


def test_backfill_racing_an_update_copies_the_new_data() -> None:
    """A backfill that read the outbox entry before an update copies, in the end, the new data."""
    timemap = TimeMap([ClusterMeta(name=CLUSTER, start_date=datetime(2024, 7, 1, tzinfo=UTC), end_date=None,
                                   creator_name="t", created_at=WHEN)])

    def make(_s: ScriptedStore) -> list[Program[Any]]:
        return [backfill_program(9, ["author"], timemap=timemap, now=datetime(2024, 9, 1, tzinfo=UTC), window=None,
                                 since=None, limit=10, policy=POLICY, timeout=60.0), update(NEW)]

    for run in every(make, setup=lambda s: run_alone(store_outbox(JOB, policy=POLICY, timeout=60.0), s)):
        assert run.errors == (None, None), run.order
        assert [c["data"] for c in copies(run.store)] == [NEW], run.order
