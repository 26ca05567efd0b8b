"""Erasures racing writers, in every interleaving of their requests: nothing written for an erased user stays.

The programs are the core's own (a fan-out job's start and batches, publish's outbox
entry, backfill, ``erase_program``); :func:`router.testing.scripted.interleavings` runs them
against one scripted store in every order their requests can take, each request atomic
as a single-document write is on FerretDB. Real servers are in
``tests/integration/test_erasure_races.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

import pytest

from router import Activity, ClusterMeta, SenderErased, data_key
from router.core.fanout.checkpoint import start_job
from router.core.privacy.erasure import ErasurePlan, erase_program
from router.core.fanout.plan import FanOutJob, batch_program
from router.core.layouts import EditSettings
from router.core.policy import RetryPolicy
from router.core.pseudonyms import Pseudonyms
from router.core.social.publish import backfill_program, store_outbox
from router.core.layouts import posts
from router.core.steps import Program
from router.testing.scripted import Run, ScriptedStore, interleavings, run_alone, sampled
from router.timemap import TimeMap

UTC = timezone.utc
CLUSTER = "c3"
WHEN = datetime(2024, 8, 2, 10, 0, 0, 125000, tzinfo=UTC)
USER = 1000765
OTHER = 42
NAMES = Pseudonyms(b"a key of the tests, 32 bytes long")
POLICY = RetryPolicy(attempts=1)
TIMEMAP = TimeMap([ClusterMeta(name=CLUSTER, start_date=datetime(2024, 7, 1, tzinfo=UTC), end_date=None,
                               creator_name="t", created_at=WHEN)])


def job(sender: int, n: int = 1) -> FanOutJob:
    post = Activity(sender_id=sender, event_time=WHEN, type=1, data={"n": n}, data_key=data_key("post", f"{sender}/{n}"))
    return FanOutJob(job_id=f"job-{sender}-{n}", cluster=CLUSTER, activity=post, batch_size=3)


def batch(of: FanOutJob, number: int, receivers: Sequence[Any], **kwargs: Any) -> Program[Any]:
    return batch_program(of, number, number * 3, receivers, policy=POLICY, timeout=60.0, pseudonyms=NAMES, **kwargs)


def erase(user: int = USER) -> Program[Any]:
    plan = ErasurePlan(user_id=user, names=(CLUSTER,), timemap=TIMEMAP, settings=EditSettings(timeout=60.0),
                       pseudonyms=NAMES, requested_by="tests", request_id=f"erasure-{user}", now=WHEN)
    return erase_program(plan)


def naming(store: ScriptedStore, user: int) -> list[tuple[str, Any]]:
    """Every document of the store that names *user* as sender or receiver (any collection)."""
    return [(collection, doc["_id"]) for (_cluster, collection), docs in store.collections.items()
            for doc in docs.values() if user in (doc.get("sender_id"), doc.get("receiver_id"))]


def started(of: FanOutJob, *receivers: int) -> Any:
    """A setup: the job's post registered (as its start does) and its batch 0 written. (No checkpoint, so the
    erasure sends fewer requests; a job's start and records are raced below.)"""
    def setup(store: ScriptedStore) -> None:
        a = of.activity
        post = posts.Registered(a.sender_id, a.data_key, a.event_time)
        store.answer(posts.REGISTRY.store(CLUSTER, posts.REGISTRY.documents([post.entry()]), 0.0))
        run_alone(batch(of, 0, list(receivers), record=False), store)
    return setup


def every(make: Any, *, setup: Any) -> list[Run]:
    runs = list(interleavings(make, setup=setup))
    assert len(runs) > 10  # the race really has many orders
    return runs


#: Orders drawn where trying every one would take minutes (tens of thousands of orders): a few seconds' worth.
SAMPLED = 3000


def test_a_batch_of_their_post_racing_the_erasure_leaves_nothing() -> None:
    """Whatever the order, once both end nothing names the erased sender: the batch that read the record removed its
    copies and was not recorded; the erasure found the others by the registered post."""
    mine = job(USER)
    erased = 0
    for run in sampled(lambda _s: [batch(mine, 1, [4, 5, 6]), erase()], setup=started(mine, 1, 2), runs=SAMPLED):
        assert run.errors == (None, None), run.order
        assert naming(run.store, USER) == [], run.order
        assert run.store.find(CLUSTER, "feed", {}) == [], run.order
        outcome = run.results[0]
        if outcome.fence is not None and outcome.fence.erased:
            erased += 1
            assert outcome.written == 0 and run.store.find(CLUSTER, "fanout_batches", {"n": 1}) == []
    assert 0 < erased < SAMPLED  # both sides of the race were drawn


def test_a_started_job_racing_the_erasure_leaves_no_record_of_it() -> None:
    """A job with its checkpoint open and a batch recorded, racing the erasure with its next batch: the erasure
    removes the job's records, or the batch that read the record does (and its record is never written)."""
    mine = job(USER, 5)

    def setup(store: ScriptedStore) -> None:
        run_alone(start_job(mine, timeout=60.0, pseudonyms=NAMES), store)
        run_alone(batch(mine, 0, [1]), store)

    for run in sampled(lambda _s: [batch(mine, 1, [4]), erase()], setup=setup, runs=SAMPLED):
        assert run.errors == (None, None), run.order
        assert naming(run.store, USER) == [] and run.store.find(CLUSTER, "feed", {}) == [], run.order
        assert run.store.find(CLUSTER, "fanout_batches", {"n": 0}) == [], run.order


def test_a_batch_after_the_erasure_writes_nothing_that_stays() -> None:
    """A queued batch of an erased sender's post (run after the erasure returned) removes its copies at once."""
    store = ScriptedStore()
    mine = job(USER)
    started(mine, 1, 2)(store)
    run_alone(erase(), store)
    outcome, _ = run_alone(batch(mine, 1, [4, 5, 6]), store)
    assert outcome.fence.erased and naming(store, USER) == []


def test_a_batch_to_them_racing_the_erasure_leaves_no_copy_of_theirs() -> None:
    """Another sender's batch whose receivers include the erased user: their copy goes (counted skipped when the
    batch removed it), every other receiver keeps theirs."""
    others = job(OTHER)
    for run in every(lambda _s: [batch(others, 1, [4, USER, 6]), erase()], setup=started(others, USER, 2)):
        assert run.errors == (None, None), run.order
        assert naming(run.store, USER) == [], run.order
        assert sorted(d["receiver_id"] for d in run.store.find(CLUSTER, "feed", {})) == [2, 4, 6], run.order
        outcome = run.results[0]
        assert outcome.written + outcome.already_present + outcome.skipped == 3


def test_a_job_starting_during_the_erasure_is_refused_or_found() -> None:
    """A fan-out job of their post starting (registering its post) as the erasure runs: refused with SenderErased
    and its entry removed, or started early enough that the erasure finds it; nothing names them either way."""
    mine = job(USER, 2)

    def start_then_batch() -> Program[Any]:
        yield from start_job(mine, timeout=60.0, pseudonyms=NAMES)
        return (yield from batch(mine, 0, [7, 8]))

    refused = 0
    for run in sampled(lambda _s: [start_then_batch(), erase()], runs=SAMPLED):
        assert run.errors[1] is None and naming(run.store, USER) == [], run.order
        assert run.store.find(CLUSTER, "feed", {}) == [], run.order
        refused += isinstance(run.errors[0], SenderErased)
    assert refused


def test_publish_racing_the_erasure_leaves_no_outbox_entry() -> None:
    """Publish's outbox entry and registry entry are gone at the end; a publish that read the record raises."""
    mine = job(USER, 3)
    raised = 0
    for run in sampled(lambda _s: [store_outbox(mine, policy=POLICY, timeout=60.0, pseudonyms=NAMES), erase()],
                       runs=SAMPLED):
        assert naming(run.store, USER) == [], run.order
        raised += isinstance(run.errors[0], SenderErased)
    assert raised
    store = ScriptedStore()
    run_alone(erase(), store)
    with pytest.raises(SenderErased, match=mine.activity.data_key):
        run_alone(store_outbox(mine, policy=POLICY, timeout=60.0, pseudonyms=NAMES), store)


@pytest.mark.parametrize("receiver, senders", [(USER, [OTHER]), (9, [USER])], ids=["into-their-feed", "of-their-posts"])
def test_backfill_racing_the_erasure_leaves_nothing(receiver: int, senders: list[int]) -> None:
    """A backfill into the erased user's feed, or of the erased user's posts into another feed: nothing stays."""
    published = [job(s, 4) for s in senders]

    def setup(store: ScriptedStore) -> None:
        for of in published:
            run_alone(store_outbox(of, policy=POLICY, timeout=60.0, pseudonyms=NAMES), store)

    def make(_s: ScriptedStore) -> list[Program[Any]]:
        return [backfill_program(receiver, senders, timemap=TIMEMAP, now=datetime(2024, 9, 1, tzinfo=UTC), window=None,
                                 since=None, limit=10, policy=POLICY, timeout=60.0, pseudonyms=NAMES), erase()]

    for run in sampled(make, setup=setup, runs=SAMPLED):
        assert run.errors == (None, None), run.order
        assert naming(run.store, USER) == [], run.order
