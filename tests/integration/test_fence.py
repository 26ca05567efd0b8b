"""A deleted post stays deleted and an update wins, against fan-outs still running: real servers, both doors,
the thread and asyncio engines, backfill and two Celery worker processes.

Copies are counted with plain pymongo once every engine is idle. Every interleaving of a
batch and an edit is proven without a server in ``tests/unit/test_edit_races.py``; these
tests show the same on real servers, at the scale of the issue (batches of 500).

Calls get ``timeout: 60s``: on FerretDB-PostgreSQL on this shared machine, a delete racing
a fan-out of the same post takes longer than the default 10 s (15.7 s measured before
the fence existed), because the server fetches every copy of the key for each statement.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from pymongo import MongoClient

from router import Activity, DeleteFailed, FeedRouter, ItemDeleted, RouterConfig, UpdateFailed, data_key
from router.fanout.celery import make_app, publish_fan_out, send_batch
from router.model import to_millis as millis
from harness.bench_celery import WorkerProcess

from . import stored
from .conftest import DOOR_PER_LAYOUT, MANY_COPIES, NAMES, NOW, P1, register
from .test_celery import broker, broker_idle, broker_url, wait_for, workers  # noqa: F401 - fixtures

#: A storage contract file: every test here runs once per layout the servers hold (see conftest.py).
pytestmark = pytest.mark.contract

Clients = dict[str, MongoClient[dict[str, Any]]]
#: In [P1, P2): cluster_2 owns every copy.
WHEN = P1 + timedelta(days=20, hours=2, milliseconds=9)
OWNER = "cluster_2"
PATIENT = timedelta(seconds=60)
OLD, NEW = {"fabula_id": 22, "text": "first"}, {"fabula_id": 22, "text": "edited"}


def post(n: int = 22, data: dict[str, Any] = OLD) -> Activity:
    return Activity(sender_id="author", event_time=WHEN, type=1, data=data, data_key=data_key("fabula", n))


def copies(clients: Clients, db: str, key: str) -> int:
    """Copies of *key* in every cluster, read with pymongo through each period's layout."""
    return copies_and_stale(clients, db, key, None)[0]


def copies_and_stale(clients: Clients, db: str, key: str, data: Any) -> tuple[int, int]:
    """Copies of *key* in every cluster, and those of them whose data is not *data*, in one read of every feed."""
    found = [c for name in NAMES for c in stored.copies(clients[name][db], data_key=key)]
    return len(found), sum(1 for c in found if c.data != data)


def outbox(clients: Clients, db: str, key: str) -> int:
    return sum(clients[name][db].outbox.count_documents({"data_key": key}) for name in NAMES)


@pytest.fixture
def router(make_router: Callable[..., FeedRouter]) -> FeedRouter:
    """A router through this test's door, with a call timeout that FerretDB's edits under load fit in."""
    return make_router(timeout=PATIENT)


def written_at_least(handle: Any, count: int) -> None:
    deadline = time.monotonic() + 120
    while handle.progress.written < count:
        assert time.monotonic() < deadline and not handle.done(), f"no progress: {handle.progress}"
        handle.wait(0.01)


def delete_until_done(router: FeedRouter, key: str, tries: int = 3) -> None:
    """``delete``, called again after a DeleteFailed, as the README says to: on FerretDB a delete racing a running
    fan-out can take longer than the 10 s timeout (each step fetches every copy of the key)."""
    for attempt in range(tries):
        try:
            router.delete(key)
            return
        except DeleteFailed:
            if attempt == tries - 1:
                raise


@DOOR_PER_LAYOUT
def test_delete_during_a_background_publish_leaves_no_copy(router: FeedRouter, raw_clients: Clients, db_name: str) -> None:
    """The issue: publish to 60k followers in the background, delete once ~3,000 copies exist. Batches in flight
    remove what they wrote, the job stops early as cancelled for 'deleted', and no copy or outbox entry is left."""
    act = post()
    published = router.publish(act, range(60_000), background=True, batch_size=500)
    handle = published.handle
    written_at_least(handle, 3000)
    delete_until_done(router, act.data_key)
    with pytest.raises(ItemDeleted, match=act.data_key) as raised:
        handle.result(timeout=120)
    result = raised.value.result
    assert result.cancelled and result.reason == "deleted" and not result.complete
    assert result.batches < 60  # it stopped early, not after 120 batches
    assert copies(raw_clients, db_name, act.data_key) == 0 and outbox(raw_clients, db_name, act.data_key) == 0
    status = router.fan_out_status(handle.job_id)
    assert (status.state, status.reason) == ("cancelled", "deleted")


def test_batches_read_after_the_delete_write_nothing_that_stays(router: FeedRouter, raw_clients: Clients, db_name: str) -> None:
    """Receivers read after delete() returned: the first batch meets the tombstone, removes its copies, the run stops."""
    act = post(23)
    gate = threading.Event()

    def followers() -> Iterator[int]:
        yield from range(1500)
        assert gate.wait(60), "the test never opened the gate"
        yield from range(1500, 50_000)

    handle = router.fan_out(act, followers(), background=True, batch_size=500)
    written_at_least(handle, 1500)
    assert router.delete(act.data_key) == 1500
    gate.set()
    with pytest.raises(ItemDeleted) as raised:
        handle.result(timeout=120)
    assert raised.value.result.batches < 17  # the three before, then the few in flight: not 100
    assert copies(raw_clients, db_name, act.data_key) == 0


def test_delete_then_resume_or_publish_again_is_refused(router: FeedRouter, raw_clients: Clients, db_name: str) -> None:
    """A fan-out stopped part-way, then deleted: resuming it, fanning it out or publishing it again raises
    ItemDeleted naming the key and writes nothing."""
    act = post(24)

    def broken() -> Iterator[int]:
        yield from range(2000)
        raise RuntimeError("follower service went away")

    with pytest.raises(RuntimeError):
        router.fan_out(act, broken(), batch_size=500)
    assert copies(raw_clients, db_name, act.data_key) == 2000
    assert router.delete(act.data_key) == 2000
    for again in (lambda: router.fan_out(act, range(5000), batch_size=500),
                  lambda: router.fan_out(act, range(5000), batch_size=500, background=True).result(timeout=60),
                  lambda: router.publish(act, range(5000), batch_size=500)):
        with pytest.raises(ItemDeleted, match=act.data_key):
            again()
    assert copies(raw_clients, db_name, act.data_key) == 0 and outbox(raw_clients, db_name, act.data_key) == 0
    status = router.fan_out_status(f"{act.data_key}:{millis(WHEN)}")
    assert (status.state, status.reason) == ("cancelled", "deleted")


@MANY_COPIES
@DOOR_PER_LAYOUT
def test_update_during_a_background_fan_out_reaches_every_copy(router: FeedRouter, raw_clients: Clients, db_name: str) -> None:
    """update() returns while a fan-out has receivers left: once it ends, every copy and the outbox entry carry the
    new data (the batch that meets the update re-applies it; the next ones write it)."""
    act = post(25)
    n = 7_000  # after the gate, 8 batches of 500: twice the batches in flight (4)
    gate = threading.Event()

    def followers() -> Iterator[int]:
        yield from range(3000)
        assert gate.wait(60), "the test never opened the gate"
        yield from range(3000, n)

    handle = router.publish(act, followers(), background=True, batch_size=500).handle
    written_at_least(handle, 3000)
    assert router.update(act.data_key, NEW) == 3000
    gate.set()
    result = handle.result(timeout=120)
    assert result.ok and result.written == n
    assert copies_and_stale(raw_clients, db_name, act.data_key, NEW) == (n, 0)
    assert raw_clients[OWNER][db_name].outbox.find_one({"data_key": act.data_key})["data"] == NEW  # type: ignore[index]


@pytest.mark.slow
@MANY_COPIES
@DOOR_PER_LAYOUT
def test_update_during_a_big_fan_out_with_the_default_timeout(
    make_router: Callable[..., FeedRouter], raw_clients: Clients, db_name: str, door: str, layout: str,
) -> None:
    """update() with the default timeout (10 s) while a 40,000-follower publish runs in the background (through the
    sync door, in copies; the other case, the async door, which runs the same program, in buckets, whose edit steps
    are the same calls, races 10,000: 40,000 in buckets took 105 s of the suite): it returns (called again after an
    UpdateFailed, as the README says, a few times at most), and once the fan-out ends every copy and the outbox
    entry carry the new data."""
    router = make_router()
    act = post(26)
    n = 40_000 if (door, layout) == ("sync", "copies") else 10_000
    handle = router.publish(act, range(n), background=True, batch_size=500).handle
    written_at_least(handle, 5_000)
    calls: list[tuple[str, float]] = []
    for _ in range(5):
        began = time.monotonic()
        try:
            router.update(act.data_key, NEW)
        except UpdateFailed as failed:
            calls.append((f"failed after {failed.updated}", time.monotonic() - began))
            continue
        calls.append(("done", time.monotonic() - began))
        break
    assert calls[-1][0] == "done", calls
    result = handle.result(timeout=600)
    assert result.ok and result.written == n
    assert copies_and_stale(raw_clients, db_name, act.data_key, NEW) == (n, 0)
    assert raw_clients[OWNER][db_name].outbox.find_one({"data_key": act.data_key})["data"] == NEW  # type: ignore[index]
    print(f"\nupdate during a fan-out of {n:,}: {calls}")


def test_delete_during_backfills_leaves_no_copy(router: FeedRouter, raw_clients: Clients, db_name: str) -> None:
    """Dormant users rebuilt by backfill (two threads) while the post is deleted: no copy of it is left in any of
    their feeds. (Whether a backfill reads the entry before the delete and writes after it is up to timing here;
    every order is in test_edit_races.py.)"""
    act = post(26)
    router.publish(act, range(10), pull=True)  # outbox only
    done = []
    errors: list[BaseException] = []

    def rebuild() -> None:
        try:
            for receiver in range(100_000, 100_100):
                router.backfill(receiver, ["author"])
                done.append(receiver)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    threads = [threading.Thread(target=rebuild) for _ in range(2)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 60
    while len(done) < 30:
        assert time.monotonic() < deadline and all(t.is_alive() for t in threads), errors
        time.sleep(0.01)
    router.delete(act.data_key)
    for thread in threads:
        thread.join(120)
    assert not any(t.is_alive() for t in threads) and errors == [] and len(done) == 200
    assert copies(raw_clients, db_name, act.data_key) == 0 and outbox(raw_clients, db_name, act.data_key) == 0


def test_delete_during_a_celery_job_with_two_workers(
    make_config: Callable[..., RouterConfig], workers: Callable[..., list[WorkerProcess]], broker_url: str,
    raw_clients: Clients, db_name: str, layout: str,
) -> None:
    """Two workers, 60 batches queued; delete once 3 are done. Batches running remove what they wrote, queued ones
    write nothing, a batch delivered again after the delete stores nothing; the status says cancelled, deleted."""
    config = make_config(timeout=PATIENT)
    register(config, layout=layout)
    act = post(27)
    n = 30_000
    pool = workers(config, broker_url)
    app = make_app(broker_url)
    with FeedRouter(config, clock=lambda: NOW) as router:
        published = publish_fan_out(router, app, act, range(n), batch_size=500)
        assert published.batches_total == 60
        wait_for("3 batches done", lambda: router.fan_out_status(published.job_id).batches_done >= 3)
        router.delete(act.data_key)
        wait_for("the broker idle", lambda: broker_idle(broker_url))
        assert copies(raw_clients, db_name, act.data_key) == 0
        status = router.fan_out_status(published.job_id)
        assert (status.state, status.reason) == ("cancelled", "deleted") and status.batches_done < 60
        assert any("its post was deleted" in w.log_text() for w in pool)
        with pytest.raises(ItemDeleted):  # publishing it again is refused
            publish_fan_out(router, app, act, range(n), batch_size=500)
    payload = {"job_id": published.job_id, "cluster": OWNER, "batch_size": 500,
               "activity": {"sender_id": act.sender_id, "event_time_ms": millis(WHEN), "type": 1,
                            "data": dict(act.data), "data_key": act.data_key}}
    send_batch(app, payload, 0, 0, list(range(500)))  # delivered again, long after the delete
    wait_for("the broker idle", lambda: broker_idle(broker_url))
    assert copies(raw_clients, db_name, act.data_key) == 0
