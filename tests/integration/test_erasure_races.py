"""An erasure against writers still running, on real servers: fan-outs on threads and asyncio (both doors), two
Celery worker processes with queued batches, backfills, and an erasure killed half-way and called again.

After each, once every writer is idle, no document of any collection of any period names the user (scanned with
plain pymongo), in both layouts. Every interleaving of a writer and an erasure is proven without a server in
``tests/unit/test_erasure_races.py``; these show the same at the scale of a fan-out (batches of 500).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import attrs
import pytest
from bson.int64 import Int64

from router import Activity, FeedItem, InvalidItem, RouterConfig, SenderErased, data_key
from router.admin.status import check_report
from router.fanout.celery import make_app, publish_fan_out
from router.sync import FeedRouter
from harness.bench.common import with_client_options
from harness.bench_celery import WorkerProcess
from harness.process import checkout_env

from .conftest import DOORS, NOW, P1, door_layout_pairs
from .erasure import DOORS_AND_USERS, PATIENT, USER, USERS, Clients, copies_sent, layout_config, naming
from .test_celery import broker, broker_idle, broker_url, wait_for, workers  # noqa: F401 - fixtures

#: In [P1, P2): cluster_2 owns every copy.
WHEN = P1 + timedelta(days=20, hours=2, milliseconds=9)
OTHER = 42
CHILD = Path(__file__).with_name("erase_child.py")
REPO = Path(__file__).resolve().parents[2]


def post(sender: int, n: int) -> Activity:
    return Activity(sender_id=sender, event_time=WHEN + timedelta(seconds=n), type=1, data={"n": n, "text": "hello"},
                    data_key=data_key("race", f"{sender}/{n}"))


#: The layouts every race here runs in (the file runs on the main server, which holds both).
LAYOUT_NAMES = ("copies", "buckets")
#: The heaviest races here run through each door once and in each layout once, as ``DOOR_PER_LAYOUT`` runs them in the
#: contract files (conftest.py); the others, in every layout.
DOOR_PER_LAYOUT = pytest.mark.parametrize(("door", "layout"), door_layout_pairs(DOORS, LAYOUT_NAMES),
                                          indirect=True)


@pytest.fixture(params=LAYOUT_NAMES)
def layout(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def config(make_config: Callable[..., RouterConfig], layout: str) -> RouterConfig:
    """The test's periods in its layout, with an erasure key of its own (every process must use it)."""
    return attrs.evolve(layout_config(make_config, layout), erasure_key="a key for the race tests, 32+ bytes")


@pytest.fixture
def router(config: RouterConfig, open_router: Callable[..., Any]) -> Any:
    return open_router(config, clock=lambda: NOW)


def written_at_least(handle: Any, count: int) -> None:
    deadline = time.monotonic() + 180
    while handle.progress.written < count:
        assert time.monotonic() < deadline and not handle.done(), f"no progress: {handle.progress}"
        handle.wait(0.01)


@DOOR_PER_LAYOUT
def test_erase_during_a_background_publish_of_their_post(router: Any, raw_clients: Clients, config: RouterConfig) -> None:
    """Publish to 60k followers in the background, erase the author once 1,000 copies exist: batches in flight
    remove what they wrote, the run stops (SenderErased, reason erased) and removes its checkpoint; nothing names
    the author."""
    act = post(USER, 1)
    handle = router.publish(act, range(60_000), background=True, batch_size=500).handle
    written_at_least(handle, 1000)
    router.erase_user(USER, requested_by="tests")
    with pytest.raises(SenderErased, match=act.data_key) as raised:
        handle.result(timeout=300)
    result = raised.value.result
    assert result.cancelled and result.reason == "erased" and result.batches < 120
    assert naming(raw_clients, config) == []
    with pytest.raises(InvalidItem, match="no cluster has a fan-out job"):
        router.fan_out_status(handle.job_id)
    with pytest.raises(SenderErased):  # their posts are never written again
        router.publish(post(USER, 2), range(10))


@DOORS_AND_USERS
def test_erase_during_fan_outs_to_them(router: Any, raw_clients: Clients, config: RouterConfig, user: int) -> None:
    """Another sender's fan-outs: one gave the user a copy before the erasure (the erasure removes it), one reaches
    them after it (the batch removes it again and counts them skipped); every other receiver keeps its copy."""
    gate = threading.Event()

    def late() -> Iterator[int]:
        yield from range(1, 1001)
        assert gate.wait(120), "the test never opened the gate"
        yield Int64(user)  # as a read of a follower list returns a 64-bit id
        yield from range(1001, 2000)

    early = router.fan_out(post(OTHER, 3), [*range(1, 100), user, *range(100, 1000)], batch_size=500)
    assert early.written == 1000
    handle = router.fan_out(post(OTHER, 4), late(), background=True, batch_size=500)
    written_at_least(handle, 500)
    router.erase_user(user, requested_by="tests")
    gate.set()
    result = handle.result(timeout=300)
    assert result.ok and result.written == 1999 and result.skipped == 1
    assert naming(raw_clients, config, user) == []
    assert copies_sent(raw_clients, config, OTHER) == 999 + 1999


@DOORS_AND_USERS
def test_erase_during_backfills(router: Any, raw_clients: Clients, config: RouterConfig, user: int) -> None:
    """Backfills into the user's feed and of the user's posts into others' feeds, on two threads, while the user is
    erased: once they stop, nothing names the user."""
    for n in range(5):
        router.publish(post(OTHER, 10 + n), [], pull=True)
        router.publish(post(user, 20 + n), [], pull=True)
    done: list[int] = []
    errors: list[BaseException] = []

    def rebuild(receiver: Callable[[int], int], senders: list[int]) -> None:
        try:
            for i in range(80):
                router.backfill(receiver(i), senders)
                done.append(i)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    threads = [threading.Thread(target=rebuild, args=(lambda _i: user, [OTHER])),
               threading.Thread(target=rebuild, args=(lambda i: 100_000 + i, [user]))]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 120
    while len(done) < 40:
        assert time.monotonic() < deadline and all(t.is_alive() for t in threads), errors
        time.sleep(0.01)
    router.erase_user(user, requested_by="tests")
    for thread in threads:
        thread.join(300)
    assert not any(t.is_alive() for t in threads) and errors == [] and len(done) == 160
    assert naming(raw_clients, config, user) == []


@DOORS_AND_USERS
def test_two_erasures_of_one_user_at_once_count_each_document_once(open_router: Callable[..., Any], raw_clients: Clients,
                                                                    config: RouterConfig, user: int) -> None:
    """Two erase_user calls for the same user started together: what they removed adds up to what was stored, per
    collection (in buckets, a bucket both found is counted by the one whose statement changed it), and nothing names
    the user. Each request may take the call's whole time (socketTimeoutMS, 10 s by default): the two erasures'
    statements on the same buckets wait for each other, and one that times out on the client may still finish on the
    server, uncounted (load, not the race)."""
    patient = with_client_options(config, socketTimeoutMS=int(PATIENT.total_seconds() * 1000))
    router = open_router(patient, clock=lambda: NOW)
    for n in range(4):  # 4 posts to the same 500 followers: 2,000 copies, in buckets 4 in each follower's bucket
        router.publish(post(user, 40 + n), range(1000, 1500), batch_size=500)
    router.write_many([FeedItem(receiver_id=user, sender_id=OTHER, event_time=WHEN + timedelta(seconds=n), type=1,
                                data={"n": n}, data_key=data_key("race-in", n)) for n in range(120)])
    assert copies_sent(raw_clients, config, user) == 2000
    start = threading.Barrier(2)
    results: list[Any] = []

    def erase() -> None:
        start.wait(30)
        results.append(router.erase_user(user, requested_by="tests"))

    threads = [threading.Thread(target=erase) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    assert len(results) == 2
    totals = {what: sum(r.totals[what] for r in results) for what in ("feed_sent", "feed_received", "outbox", "posts")}
    assert totals == {"feed_sent": 2000, "feed_received": 120, "outbox": 4, "posts": 4}
    assert naming(raw_clients, config, user) == []


@USERS
def test_erase_during_celery_jobs_with_two_workers(
    config: RouterConfig, workers: Callable[..., list[WorkerProcess]], broker_url: str, raw_clients: Clients, user: int,
) -> None:
    """Two worker processes, 30 batches of the user's post and 4 of another's (the user its last receiver)
    queued; the user is erased once 3 batches are done. Batches running remove what they wrote, queued ones write
    nothing that stays, the user's job leaves no checkpoint, the other job is done with the user skipped."""
    pool = workers(config, broker_url)
    app = make_app(broker_url)
    with FeedRouter(config, clock=lambda: NOW) as router:
        mine = publish_fan_out(router, app, post(user, 5), range(15_000), batch_size=500)
        theirs = publish_fan_out(router, app, post(OTHER, 6), [*range(1, 2000), Int64(user)], batch_size=500)
        wait_for("3 batches done", lambda: router.fan_out_status(mine.job_id).batches_done >= 3)
        router.erase_user(user, requested_by="tests")
        # Their job last: once it has ended, every batch of both was taken from the queue before it.
        wait_for("their job ended, the broker idle", lambda: router.fan_out_status(theirs.job_id).state != "running"
                 and broker_idle(broker_url), timeout=300)
        assert naming(raw_clients, config, user) == []
        with pytest.raises(InvalidItem, match="no cluster has a fan-out job"):
            router.fan_out_status(mine.job_id)
        status = router.fan_out_status(theirs.job_id)
        assert status.state == "done" and status.written + status.skipped == 2000 and status.skipped >= 1
        assert any("its sender was erased" in w.log_text() for w in pool)
        with pytest.raises(SenderErased):  # publishing it again is refused
            publish_fan_out(router, app, post(user, 5), range(15_000), batch_size=500)


@DOOR_PER_LAYOUT
def test_an_interrupted_erasure_completes_when_called_again(
    router: Any, raw_clients: Clients, config: RouterConfig, layout: str,
) -> None:
    """An erasure killed half-way (SIGKILL, in a process of its own) leaves its records running, which check and
    erasure_status report; called again, it finishes, and nothing names the user. In buckets, the call again meets
    every follower's bucket still holding some of the posts: a step of the default size over full buckets."""
    followers = 1000 if layout == "copies" else 500  # buckets: an erasure's step takes longer, half of them suffice
    step = 200 if layout == "copies" else 1000  # ...and larger steps (20 buckets each)
    posts = [post(USER, 30 + n) for n in range(10)]
    for act in posts:  # 10 posts to the same followers: in buckets, one bucket each
        router.publish(act, range(1000, 1000 + followers), batch_size=250)
    total = copies_sent(raw_clients, config)
    assert total == len(posts) * followers
    feed = raw_clients[config.clusters[1].name][config.database_for(config.clusters[1])].feed

    def posts_left() -> int:
        """How many of the posts still have a copy (by their data_key index). The erasure removes them post by post,
        so this falls steadily; a count of the documents naming the user would not: in buckets, a follower's bucket
        names the user until its last post is gone."""
        return sum(feed.find_one({"$or": [{"data_key": a.data_key}, {"items.data_key": a.data_key}]}, {"_id": 1})
                   is not None for a in posts)
    spec = {"database": config.database, "user": USER, "step": step, "erasure_key": config.erasure_key,
            "clusters": [{"name": c.name, "uri": c.uri, "database": config.database_for(c)} for c in config.clusters]}
    env = checkout_env()
    child = subprocess.Popen([sys.executable, str(CHILD), json.dumps(spec)], stdout=subprocess.PIPE, text=True, cwd=REPO,
                             env=env, start_new_session=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "erasing"
        deadline = time.monotonic() + 300
        while not 0 < posts_left() < len(posts):  # some posts' copies gone, some left
            assert time.monotonic() < deadline and child.poll() is None, "the erasure ended before it could be stopped"
            time.sleep(0.05)
    finally:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait(60)
    left = copies_sent(raw_clients, config)
    assert 0 < left < total
    status = router.erasure_status(USER)
    assert not status.finished and status.unfinished
    report, _ = check_report(config)
    assert sum("did not finish" in p for p in report["problems"]) == len(status.unfinished)
    again = router.erase_user(USER, requested_by="tests, again")
    assert 0 < again.totals["feed_sent"] <= left  # (a step the killed process sent may still have landed after it)
    assert naming(raw_clients, config) == []
    assert router.erasure_status(USER).finished
    report, _ = check_report(config)
    assert not [p for p in report["problems"] if "erasure" in p]
