"""Fan-out on Celery with a real broker (a local Redis) and real ``feedrouter worker`` processes.

Workers run with ``--pool solo`` (one process each), each with its own clusters.yaml; the
broker's visibility timeout is short so a batch a killed worker held comes back within
seconds. Counts are checked with plain pymongo, receiver by receiver. Nothing here sleeps
for readiness: every wait polls a condition (a worker's "ready." line, the checkpoint,
the broker) under a deadline.
"""

from __future__ import annotations

import base64
import itertools
import json
import signal
import time
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import redis
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry
from pymongo import MongoClient

from router import Activity, FeedRouter, InvalidItem, RouterConfig, data_key
from router.cli import main
from router.core.fanout.checkpoint import announce_batch, open_checkpoint
from router.fanout.celery import ACTIVE_QUEUE, BATCH_TASK, INACTIVE_QUEUE, make_app, publish_fan_out, send_batch
from router.fanout.celery_plan import check_json_data, inactive_job_id, plan_parts, sendable
from router.observe.prometheus import PrometheusMetrics
from harness.bench_celery import WorkerProcess, worker_yaml
from harness.commands import CommandLog
from harness.localservers import LocalClusters
from harness.redis import LocalRedis

from .conftest import NOW, P1, register

Clients = dict[str, MongoClient[dict[str, Any]]]
#: In [P1, P2): cluster_2 owns every copy.
WHEN = P1 + timedelta(days=33, hours=5, milliseconds=7)
OWNER = "cluster_2"
#: Seconds before the broker hands out again a batch a worker took and never acknowledged.
VISIBILITY = 5.0
_DB_INDEX = itertools.count(1)


def activity(n: int = 1) -> Activity:
    return Activity(sender_id=1000765, event_time=WHEN, type=1, data={"fabula_id": n, "tags": ["a", 1.5, None]},
                    data_key=data_key("fabula", n))


def stored(clients: Clients, db: str) -> Counter[Any]:
    """How many copies each receiver has in the owning cluster, read with pymongo."""
    feed = clients[OWNER][db].feed
    return Counter(d["receiver_id"] for d in feed.find({}, {"receiver_id": 1, "_id": 0}, batch_size=10_000))


def assert_one_copy_each(clients: Clients, db: str, receivers: range) -> None:
    copies = stored(clients, db)
    assert set(copies) == set(receivers), f"{len(set(receivers) - set(copies))} receivers have no copy"
    doubled = {r: c for r, c in copies.items() if c != 1}
    assert not doubled, f"{len(doubled)} receivers have more than one copy, e.g. {list(doubled.items())[:5]}"


def wait_for(what: str, check: Callable[[], bool], *, timeout: float = 120.0) -> None:
    """Poll *check* until it is true; fail naming *what* after *timeout* seconds."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"{what}: not within {timeout:.0f} s"
        time.sleep(0.05)


def batch_lines(worker: WorkerProcess) -> list[str]:
    """The worker's log lines for batches it wrote."""
    return [line for line in worker.log_text().splitlines() if "router.fanout.celery: fan-out" in line and ": batch " in line]


def held_batches(url: str) -> dict[str, int]:
    """Delivery tag -> batch number of every message the broker has handed out and not seen acknowledged."""
    client = redis.Redis.from_url(url)
    try:
        held = {}
        for tag, raw in client.hgetall("unacked").items():
            message = json.loads(raw)[0]
            args = json.loads(base64.b64decode(message["body"]))[0]
            held[tag.decode()] = int(args[1])
        return held
    finally:
        client.close()


def refusals(workers: list[WorkerProcess]) -> list[str]:
    """The workers' log lines for tasks they rejected as batches the job cannot have."""
    return [line for w in workers for line in w.log_text().splitlines() if "the task is rejected for good" in line]


def drop_queued_batch(url: str, number: int) -> None:
    """Take batch *number*'s message out of the queues, as Redis loses one between BRPOP and its unacked record."""
    client = redis.Redis.from_url(url)
    try:
        for key in client.keys("feedrouter.*"):
            if client.type(key) != b"list":
                continue
            for raw in client.lrange(key, 0, -1):
                if json.loads(base64.b64decode(json.loads(raw)["body"]))[0][1] == number:
                    assert client.lrem(key, 1, raw) == 1
                    return
        raise AssertionError(f"no queued message for batch {number}")
    finally:
        client.close()


def fanout_status_text(
    config: RouterConfig, url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], job_id: str
) -> tuple[Path, str]:
    """Run ``feedrouter fanout-status JOB`` as an operator would (exit 0); return its config path and output."""
    path = tmp_path / "publisher.yaml"
    path.write_text(worker_yaml(config, broker=url))
    assert main(["-c", str(path), "fanout-status", job_id]) == 0
    return path, capsys.readouterr().out


def broker_idle(url: str) -> bool:
    """True when the broker holds no task: every queue empty, nothing handed out and unacknowledged, on two looks
    0.25 s apart (kombu pops a task from its queue, then records it unacknowledged: in between it is in neither)."""
    client = redis.Redis.from_url(url)
    try:
        for look in range(2):
            if look:
                time.sleep(0.25)
            queued = sum(client.llen(key) for key in client.keys("feedrouter.*") if client.type(key) == b"list")
            if queued or client.hlen("unacked"):
                return False
        return True
    finally:
        client.close()


# -- what a stream batch becomes (no broker, no server) ----------------------------------------


def test_plan_parts_without_inactive_receivers_is_the_in_process_batch() -> None:
    """Without include_inactive: one part, the whole batch, inactive valid receivers' positions skipped."""
    chunk: list[Any] = [1, 2, True, 3, "x"]
    assert plan_parts(chunk, active=None, done=False, inactive_done=None)[0].skip == []
    (part,) = plan_parts(chunk, active=lambda r: r != 2 and r != "x", done=False, inactive_done=None)
    assert (part.inactive, part.receivers, part.skip, part.queue) == (False, chunk, [1, 4], ACTIVE_QUEUE)
    assert plan_parts(chunk, active=None, done=True, inactive_done=None) == []


def test_plan_parts_split_and_resume() -> None:
    """With include_inactive: the inactive part goes to the low queue; a part whose sibling is done takes everyone."""
    chunk: list[Any] = [10, 11, None, 12, 13]
    odd = lambda r: r % 2 == 1  # noqa: E731 - the active ones
    job, side = plan_parts(chunk, active=odd, done=False, inactive_done=False)
    assert (job.receivers, job.skip, side.receivers, side.skip, side.queue) == (chunk, [0, 3], [10, 12], [], INACTIVE_QUEUE)
    (only,) = plan_parts(chunk, active=odd, done=True, inactive_done=False)
    assert only.inactive and only.receivers == [10, 11, 12, 13]  # every valid receiver: `active` may have changed
    (only,) = plan_parts(chunk, active=odd, done=False, inactive_done=True)
    assert not only.inactive and only.skip == []
    assert plan_parts(chunk, active=odd, done=True, inactive_done=True) == []
    assert inactive_job_id("k:1") == "k:1/inactive"


def test_only_json_travels() -> None:
    """data must be JSON (refused with a path otherwise); a receiver JSON cannot carry is sent as null."""
    check_json_data({"a": [1, "x", 2.5, None, True, {"b": []}]})
    with pytest.raises(InvalidItem, match=r"^data\.a\[1\]\.when: must be JSON .* \(got datetime\)"):
        check_json_data({"a": [1, {"when": NOW}]})
    with pytest.raises(InvalidItem, match=r"data\.x: must be a finite number"):
        check_json_data({"x": float("nan")})
    chunk: list[Any] = [1, "a"]
    assert sendable(chunk, 0) is chunk
    assert sendable([1, b"raw", 2.5, object()], 0) == [1, None, 2.5, None]


def test_worker_command_usage_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """No broker, a broker that is no URL (its password hidden), an unknown queue: exit 2 before anything starts."""
    path = tmp_path / "clusters.yaml"
    path.write_text("clusters:\n  - {name: a, uri: 'mongodb://127.0.0.1:1'}\n")
    assert main(["-c", str(path), "worker"]) == 2
    assert "worker: no broker: pass --broker URL or add a celery: {broker: URL} section" in capsys.readouterr().err
    assert main(["-c", str(path), "worker", "--broker", "user:s3cret@redis"]) == 2
    err = capsys.readouterr().err
    assert "--broker: must be a broker URL" in err and "s3cret" not in err
    assert main(["-c", str(path), "worker", "--broker", "redis://h:6379/0", "--queues", "feedrouter.active,other"]) == 2
    assert "--queues: must name feedrouter.active and/or feedrouter.inactive (got 'feedrouter.active,other')" in capsys.readouterr().err


# -- real broker, real workers ----------------------------------------------------------------


@pytest.fixture(scope="module")
def broker() -> Iterator[LocalRedis]:
    """One local Redis for the module (append-only file on: it keeps its queues across a restart)."""
    with LocalRedis() as local:
        yield local


@pytest.fixture
def broker_url(broker: LocalRedis) -> str:
    """A Redis database of this test's own, empty."""
    url = f"redis://127.0.0.1:{broker.port}/{next(_DB_INDEX) % 15 + 1}"
    client = redis.Redis.from_url(url)
    client.flushdb()
    client.close()
    return url


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[Callable[..., list[WorkerProcess]]]:
    """Start ``feedrouter worker`` processes (ready when returned); at the end stop them and check none is left."""
    started: list[WorkerProcess] = []

    def start(config: RouterConfig, url: str, *, count: int = 2, retries: int = 3, retry_backoff: float = 0.5,
              pool: str = "solo") -> list[WorkerProcess]:
        path = tmp_path / f"workers-{len(started)}.yaml"
        path.write_text(worker_yaml(config, broker=url, visibility_timeout=VISIBILITY, retries=retries, retry_backoff=retry_backoff))
        new = [WorkerProcess(path, name=f"w{len(started) + i}", log_path=tmp_path / f"w{len(started) + i}.log", pool=pool,
                             concurrency=1 if pool != "solo" else None) for i in range(count)]
        started.extend(new)
        for worker in new:
            worker.start()
        for worker in new:
            worker.wait_ready(timeout=60)
        return new

    yield start
    codes = {w.name: w.stop() for w in started}
    assert not [w.name for w in started if w.group_alive()], "a worker process outlived its test"
    bad = {w.name: (codes[w.name], w.log_text()[-3000:]) for w in started if codes[w.name] not in (0, -signal.SIGKILL)}
    assert not bad, bad


@pytest.fixture
def publisher(registered_database: None,
              make_config: Callable[..., RouterConfig]) -> Iterator[tuple[RouterConfig, FeedRouter]]:
    """The test's config (three periods registered) and a FeedRouter to publish with."""
    config = make_config(timeout=timedelta(seconds=5), serverSelectionTimeoutMS=1000)
    register(config)
    with FeedRouter(config, clock=lambda: NOW) as router:
        yield config, router


def test_two_workers_give_every_receiver_one_copy(
    publisher: tuple[RouterConfig, FeedRouter], workers: Callable[..., list[WorkerProcess]], broker_url: str,
    raw_clients: Clients, db_name: str,
) -> None:
    """20k receivers, a quarter inactive but included: both jobs (20 batches of 1,000 each, shared by the two workers)
    complete, one copy each. (It was 50k: the batches and their handing out are the same; the Celery benchmark's row
    and the race tests run two workers too.)"""
    config, router = publisher
    n = 20_000
    batches = n // 1000
    pool = workers(config, broker_url)
    app = make_app(broker_url)
    published = publish_fan_out(router, app, activity(), range(n), active=lambda r: r % 4 != 0, include_inactive=True)
    assert (published.batches_total, published.tasks_sent, published.receivers) == (batches, 2 * batches, n)
    assert published.inactive_job_id == inactive_job_id(published.job_id)
    wait_for("both jobs done", lambda: all(router.fan_out_status(j).state == "done" for j in published.job_ids))
    assert_one_copy_each(raw_clients, db_name, range(n))
    job, side = (router.fan_out_status(j) for j in published.job_ids)
    assert (job.written, job.skipped, job.batches_done, job.batches_missing, job.recorded) == (
        n * 3 // 4, n // 4, batches, 0, "published")
    assert (side.written, side.skipped, side.batches_done) == (n // 4, 0, batches)
    assert all(batch_lines(w) for w in pool), "each worker wrote some batches"


def test_worker_killed_mid_job_its_batch_is_delivered_again(
    publisher: tuple[RouterConfig, FeedRouter], workers: Callable[..., list[WorkerProcess]], broker_url: str,
    raw_clients: Clients, db_name: str,
) -> None:
    """SIGKILL a worker holding a batch: the broker hands that batch to the other worker; one copy each."""
    config, router = publisher
    n = 30_000
    victim, survivor = workers(config, broker_url)
    published = publish_fan_out(router, make_app(broker_url), activity(), range(n))
    wait_for("5 batches done", lambda: router.fan_out_status(published.job_id).batches_done >= 5)
    for _attempt in range(20):  # freeze the victim, then learn which batch it holds (the survivor moves on)
        victim.signal(signal.SIGSTOP)
        before = held_batches(broker_url)
        seen = len(batch_lines(survivor))
        wait_for("the survivor to write 2 batches", lambda: len(batch_lines(survivor)) >= seen + 2, timeout=60)
        after = held_batches(broker_url)
        taken = {tag: number for tag, number in before.items() if tag in after}
        if taken:
            break
        # It was between two batches: let it run until it has written one more (resumed and frozen again at once, it
        # would never take one), then try again.
        done = len(batch_lines(victim))
        victim.signal(signal.SIGCONT)
        wait_for("the victim to write a batch", lambda: len(batch_lines(victim)) > done, timeout=60)
    assert taken, "the victim never held a batch when frozen"
    assert router.fan_out_status(published.job_id).state == "running"
    victim.kill()
    wait_for("the job done", lambda: router.fan_out_status(published.job_id).state == "done")
    lines = "\n".join(batch_lines(survivor))
    for number in taken.values():
        assert f"batch {number} (delivered again):" in lines, f"batch {number} was not delivered again"
    assert_one_copy_each(raw_clients, db_name, range(n))
    status = router.fan_out_status(published.job_id)
    assert status.written + status.already_present == n and status.batches_done == n // 1000


def test_broker_restart_mid_job(
    publisher: tuple[RouterConfig, FeedRouter], workers: Callable[..., list[WorkerProcess]], broker: LocalRedis,
    broker_url: str, raw_clients: Clients, db_name: str,
) -> None:
    """Redis is killed and restarted mid-job: workers reconnect, queued and unacknowledged batches survive, and
    once the broker is idle the job is done, or (a batch caught in delivery by the crash) shows the batch missing
    and publishing again completes it. One copy each either way."""
    config, router = publisher
    n = 20_000
    workers(config, broker_url)
    app = make_app(broker_url)
    published = publish_fan_out(router, app, activity(), range(n))
    wait_for("5 batches done", lambda: router.fan_out_status(published.job_id).batches_done >= 5)
    broker.kill()
    status = router.fan_out_status(published.job_id)
    assert status.batches_done < n // 1000, "the job finished before the broker went down"
    broker.restart()
    wait_for("the broker idle", lambda: broker_idle(broker_url))
    status = router.fan_out_status(published.job_id)
    if status.state != "done":
        # kombu's Redis transport takes a message (BRPOP) and records it unacknowledged in a second command:
        # a message between the two when Redis died is gone. The checkpoint shows which batches that cost.
        assert (status.recorded, status.batches_missing, status.failed_batches) == ("published", n // 1000 - status.batches_done, ())
        again = publish_fan_out(router, app, activity(), range(n))
        assert again.tasks_sent == status.batches_missing
    wait_for("the job done", lambda: router.fan_out_status(published.job_id).state == "done")
    assert_one_copy_each(raw_clients, db_name, range(n))
    status = router.fan_out_status(published.job_id)
    assert status.written + status.already_present == n


def test_cluster_down_the_status_shows_it_and_publishing_again_completes(
    publisher: tuple[RouterConfig, FeedRouter], workers: Callable[..., list[WorkerProcess]], broker_url: str,
    servers: LocalClusters, raw_clients: Clients, db_name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    """The owning cluster is down while workers run: batches fail and are given up; the status names them
    missing once the cluster is back; publishing the same job again completes it."""
    config, router = publisher
    n = 5000
    app = make_app(broker_url)
    published = publish_fan_out(router, app, activity(), range(n))  # queued: no worker yet
    owner = servers.servers[1]
    owner.kill()
    try:
        down = workers(config, broker_url, retries=1, retry_backoff=0.1)
        wait_for("every batch given up", lambda: sum(w.log_text().count("gave up after 2 tries") for w in down) == 5)
    finally:
        owner.restart()
    status = router.fan_out_status(published.job_id)
    assert (status.state, status.recorded, status.batches_total, status.batches_done) == ("running", "published", 5, 0)
    assert (status.batches_missing, status.missing_batches, status.failed_batches) == (5, (0, 1, 2, 3, 4), ())
    path, out = fanout_status_text(config, broker_url, tmp_path, capsys, published.job_id)
    assert f"{published.job_id}: running in cluster 'cluster_2': 0 of 5 batches done" in out
    assert "missing batches (5): still queued or running, or given up by a worker; publish the job again" in out

    again = publish_fan_out(router, app, activity(), range(n))
    assert (again.job_id, again.tasks_sent, again.batches_resumed) == (published.job_id, 5, 0)
    wait_for("the job done", lambda: router.fan_out_status(published.job_id).state == "done")
    assert_one_copy_each(raw_clients, db_name, range(n))
    assert main(["-c", str(path), "--json", "fanout-status", published.job_id]) == 0
    (shown,) = json.loads(capsys.readouterr().out)
    assert (shown["state"], shown["batches_done"], shown["written"], shown["runs"]) == ("done", 5, n, 2)


def test_a_batch_delivered_twice_writes_nothing_the_second_time(
    publisher: tuple[RouterConfig, FeedRouter], workers: Callable[..., list[WorkerProcess]], broker_url: str,
    raw_clients: Clients, db_name: str,
) -> None:
    """The same batch sent twice, taken by two workers at once: every copy stored and acknowledged once."""
    config, router = publisher
    pool = workers(config, broker_url)
    app = make_app(broker_url)
    job = router.plan_fan_out(activity(7))
    router.clusters.run(open_checkpoint(job, timeout=5))
    router.clusters.run(announce_batch([job], 0, timeout=5))  # what publish_fan_out does before sending a batch
    receivers = list(range(3000, 4000))
    send_batch(app, job, 0, 0, receivers)
    send_batch(app, job, 0, 0, receivers)
    wait_for("both deliveries written", lambda: sum(len(batch_lines(w)) for w in pool) == 2, timeout=60)
    assert_one_copy_each(raw_clients, db_name, range(3000, 4000))
    counts = [tuple(int(x.split()[0]) for x in line.split(": ")[-1].split(", ")[:2]) for w in pool for line in batch_lines(w)]
    assert sum(c[0] for c in counts) == 1000 and sum(c[1] for c in counts) == 1000  # written once, present once
    records = list(raw_clients[OWNER][db_name].fanout_batches.find({"job": job.job_id}))
    assert len(records) == 1 and records[0]["state"] == "done"
    assert records[0]["written"] + records[0]["already_present"] == 1000


def test_active_batches_are_taken_before_inactive_ones(
    publisher: tuple[RouterConfig, FeedRouter], workers: Callable[..., list[WorkerProcess]], broker_url: str,
    raw_clients: Clients, db_name: str,
) -> None:
    """Inactive receivers published first still wait: a worker empties the active queue before it takes any."""
    config, router = publisher
    n = 8000
    app = make_app(broker_url)
    inactive = publish_fan_out(router, app, activity(2), range(n), active=lambda r: False, include_inactive=True)
    active = publish_fan_out(router, app, activity(3), range(n, 2 * n))
    (worker,) = workers(config, broker_url, count=1)
    jobs = [*inactive.job_ids, active.job_id]
    wait_for("every job done", lambda: all(router.fan_out_status(j).state == "done" for j in jobs), timeout=60)
    order = ["inactive" if "/inactive" in line else "active" for line in batch_lines(worker)]
    assert order == ["active"] * 16 + ["inactive"] * 8, order
    assert router.fan_out_status(inactive.job_id).skipped == n and router.fan_out_status(inactive.job_ids[1]).written == n
    copies = stored(raw_clients, db_name)
    assert len(copies) == 2 * n and set(copies.values()) == {1}


def test_publisher_memory_measure_runs_small(servers: LocalClusters, capsys: pytest.CaptureFixture[str]) -> None:
    """scripts/fanout_memory --celery publishes every receiver in fresh processes and reports its peak memory."""
    from harness.fanout_memory import main as fanout_memory

    assert fanout_memory(["--celery", "--uri", servers.uris[0], "--sizes", "2000", "5000", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert [(r["receivers"], r["written"]) for r in rows] == [(2000, 2000), (5000, 5000)]
    assert all(r["peak_growth_mb"] >= 0 for r in rows)


def test_a_worker_reports_through_metrics_traces_and_listeners(
    publisher: tuple[RouterConfig, FeedRouter], broker_url: str, raw_clients: Clients, db_name: str,
) -> None:
    """The batch task run by a worker's app (here in this process, so its registry can be read): copies counted by
    cluster and outcome, one fan_out_batch call and span per batch, the app's listeners on its clients."""
    config, router = publisher
    registry, spans, listener = CollectorRegistry(), InMemorySpanExporter(), CommandLog(on=True)
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    app = make_app(broker_url, config=config, metrics=PrometheusMetrics(registry=registry), tracer_provider=provider,
                   event_listeners=[listener])
    job = router.plan_fan_out(activity(9))
    router.clusters.run(open_checkpoint(job, timeout=5))
    router.clusters.run(announce_batch([job], 0, timeout=5))
    args = [job.to_json(), 0, 0, list(range(500)), []]
    try:
        for _ in range(2):  # the second delivery finds every copy present
            app.tasks[BATCH_TASK].apply(args=args, throw=True)
    finally:
        app.feedrouter_clusters.close()
    assert_one_copy_each(raw_clients, db_name, range(500))

    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, labels)

    assert value("feedrouter_fanout_copies_total", cluster=OWNER, outcome="written") == 500
    assert value("feedrouter_fanout_copies_total", cluster=OWNER, outcome="already_present") == 500
    assert value("feedrouter_calls_total", op="fan_out_batch", outcome="ok") == 2
    assert value("feedrouter_requests_total", cluster=OWNER, op="insert.feed", outcome="ok") == 2  # duplicates too
    assert value("feedrouter_requests_total", cluster=OWNER, op="insert.feed", outcome="write_errors") is None
    batch_spans = [s for s in spans.get_finished_spans() if s.name == "feedrouter.fan_out_batch"]
    assert len(batch_spans) == 2
    children = [s for s in spans.get_finished_spans() if s.parent is not None and s.parent.span_id in
                {b.context.span_id for b in batch_spans}]
    assert children and all(s.attributes["feedrouter.cluster"] == OWNER for s in children)
    assert listener.total("insert") >= 2


def test_batches_the_job_cannot_have_are_refused_and_write_nothing(
    publisher: tuple[RouterConfig, FeedRouter], workers: Callable[..., list[WorkerProcess]], broker_url: str,
    raw_clients: Clients, db_name: str,
) -> None:
    """Tasks sent by hand for batch 1,000,000, -1 and 2**64 of a 5-batch job, one too big and one not numbered by an
    int: each is rejected naming the job and the batch, writes nothing, and the status still counts 5 of 5."""
    config, router = publisher
    pool = workers(config, broker_url)
    app = make_app(broker_url)
    published = publish_fan_out(router, app, activity(11), range(5000))
    wait_for("the job done", lambda: router.fan_out_status(published.job_id).state == "done")
    job = router.plan_fan_out(activity(11))
    bad: list[tuple[Any, Any, range, str]] = [
        (1_000_000, 1_000_000_000, range(900_000, 901_000), "number: must be below the job's 5 batches (got 1000000)"),
        (-1, -1000, range(901_000, 902_000), "number: must be an int of at least 0 (got -1)"),
        (2**64, 2**64 * 1000, range(902_000, 903_000), "number: must be below 1099511628 "),
        (2, 2000, range(903_000, 904_001), "receivers: must be at most the job's batch_size of 1000 (got 1001)"),
        ("3", 3000, range(904_001, 905_000), "number: must be an int of at least 0 (got '3')"),
    ]
    for number, first, receivers, _ in bad:
        send_batch(app, job, number, first, receivers)
    unpublished = router.plan_fan_out(activity(12))  # opened, its total not known yet: only absurd numbers are refused
    router.clusters.run(open_checkpoint(unpublished, timeout=5))
    send_batch(app, unpublished, 2**64, 0, range(905_000, 905_010))
    send_batch(app, router.plan_fan_out(activity(13)), 0, 0, range(906_000, 906_010))  # a job never published
    wait_for("the broker idle", lambda: broker_idle(broker_url), timeout=60)
    assert_one_copy_each(raw_clients, db_name, range(5000))
    wait_for("every bad task refused", lambda: len(refusals(pool)) == len(bad) + 2, timeout=60)
    lines = "\n".join(refusals(pool))
    for number, _, _, says in bad:
        assert f"fan-out {job.job_id!r}: batch {number!r} refused, nothing written: {says}" in lines
    assert f"fan-out {unpublished.job_id!r}: batch {2**64} refused, nothing written: number: must be below" in lines
    assert "batch 0 refused, nothing written: job: has no checkpoint in cluster 'cluster_2'" in lines
    assert_one_copy_each(raw_clients, db_name, range(5000))
    assert raw_clients[OWNER][db_name].fanout_batches.count_documents({}) == 5
    status = router.fan_out_status(published.job_id)
    assert (status.state, status.batches_done, status.batches_total, status.written) == ("done", 5, 5, 5000)
    assert router.fan_out_status(unpublished.job_id).batches_done == 0


def test_a_lost_batch_and_a_stray_one_never_read_as_done(
    publisher: tuple[RouterConfig, FeedRouter], workers: Callable[..., list[WorkerProcess]], broker_url: str,
    raw_clients: Clients, db_name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    """A 2-batch job whose batch 0 message is lost and a stray batch 7 sent by hand: batch 7 writes nothing, the
    status (and fanout-status) says running, 1 of 2 done, batch 0 missing; publishing again completes it."""
    config, router = publisher
    app = make_app(broker_url)
    published = publish_fan_out(router, app, activity(14), range(2000))  # queued: no worker yet
    drop_queued_batch(broker_url, 0)
    job = router.plan_fan_out(activity(14))
    send_batch(app, job, 7, 7000, [999_999])
    pool = workers(config, broker_url)
    wait_for("the broker idle", lambda: broker_idle(broker_url), timeout=60)
    wait_for("batch 1 written", lambda: router.fan_out_status(published.job_id).batches_done >= 1, timeout=60)
    assert not stored(raw_clients, db_name)[999_999], "the stray batch 7 wrote its copy"
    wait_for("batch 7 refused", lambda: len(refusals(pool)) == 1, timeout=60)
    assert f"fan-out {job.job_id!r}: batch 7 refused, nothing written: number: must be below the job's 2 batches" in refusals(pool)[0]
    assert_one_copy_each(raw_clients, db_name, range(1000, 2000))
    status = router.fan_out_status(published.job_id)
    assert (status.state, status.batches_done, status.batches_total, status.written) == ("running", 1, 2, 1000)
    assert (status.batches_missing, status.missing_batches, status.batches_ignored) == (1, (0,), 0)
    _, out = fanout_status_text(config, broker_url, tmp_path, capsys, published.job_id)
    assert f"{published.job_id}: running in cluster 'cluster_2': 1 of 2 batches done (published" in out
    assert "missing batches (1): still queued or running, or given up by a worker; publish the job again" in out
    assert "publish the job again to resend them: 0\n" in out

    again = publish_fan_out(router, app, activity(14), range(2000))
    assert (again.tasks_sent, again.batches_resumed) == (1, 1)
    wait_for("the job done", lambda: router.fan_out_status(published.job_id).state == "done")
    assert_one_copy_each(raw_clients, db_name, range(2000))


def test_a_batch_the_publisher_never_sent_is_refused_before_and_after_the_job_exists(
    publisher: tuple[RouterConfig, FeedRouter], workers: Callable[..., list[WorkerProcess]], broker_url: str,
    raw_clients: Clients, db_name: str,
) -> None:
    """A task made by hand for batch 1,000,000 of a job that ends with 5 batches is refused whenever a worker takes
    it: before the job record exists, and while the publisher is between batches 3 and 4 (the record there, its
    total not known yet). It writes nothing and leaves no record; the job ends 5 of 5 done with records 0 to 4."""
    config, router = publisher
    pool = workers(config, broker_url)
    app = make_app(broker_url)
    job = router.plan_fan_out(activity(15))
    stray = range(900_000, 900_010)
    send_batch(app, job, 1_000_000, 1_000_000_000, stray)  # before the job exists
    wait_for("the early stray refused", lambda: len(refusals(pool)) == 1, timeout=60)
    handled: list[int] = []

    def followers() -> Iterator[int]:
        for r in range(5000):
            if r == 4500 and not handled:  # batches 0..3 sent, the job's record open, its total not known yet
                send_batch(app, job, 1_000_000, 1_000_000_000, stray)
                wait_for("the stray and batches 0..3 handled", lambda: broker_idle(broker_url) and (
                    len(refusals(pool)) == 2 or raw_clients[OWNER][db_name].fanout_batches.count_documents(
                        {"job": job.job_id, "n": 1_000_000}) == 1), timeout=60)
                handled.append(r)
            yield r

    published = publish_fan_out(router, app, activity(15), followers())
    assert handled and published.batches_total == 5
    wait_for("the job done", lambda: router.fan_out_status(published.job_id).state == "done")
    records = sorted(d["n"] for d in raw_clients[OWNER][db_name].fanout_batches.find({"job": job.job_id}))
    assert records == [0, 1, 2, 3, 4], records
    assert not set(stored(raw_clients, db_name)) & set(stray)
    assert_one_copy_each(raw_clients, db_name, range(5000))
    lines = "\n".join(refusals(pool))  # (one worker's lines, then the other's)
    assert len(refusals(pool)) == 2
    assert f"fan-out {job.job_id!r}: batch 1000000 refused, nothing written: job: has no checkpoint" in lines
    assert (f"fan-out {job.job_id!r}: batch 1000000 refused, nothing written: number: was never sent by the job's "
            "publisher") in lines, lines


@pytest.mark.parametrize("pool", ["solo", "prefork", "threads"])
def test_a_worker_stopped_while_its_batch_waits_on_a_paused_cluster_records_the_batch(
    pool: str, publisher: tuple[RouterConfig, FeedRouter], make_config: Callable[..., RouterConfig],
    workers: Callable[..., list[WorkerProcess]], broker_url: str, servers: LocalClusters, raw_clients: Clients,
    db_name: str,
) -> None:
    """SIGTERM to the worker's whole process group (as systemd's default KillMode and ``kill -TERM -PGID`` send it)
    while its batch waits on a paused cluster: once the cluster answers again, the batch in flight finishes, is
    recorded done and acknowledged, and the worker exits 0, on every pool. (A prefork pool process used to die of the
    signal mid-batch: its copies written, the batch not recorded, the task delivered again later.)"""
    _, router = publisher
    patient = make_config(timeout=timedelta(seconds=60), serverSelectionTimeoutMS=60_000)  # the pause outlasts nothing
    app = make_app(broker_url)
    published = publish_fan_out(router, app, activity(16), range(1000))  # one batch, queued: no worker yet
    owner = servers.servers[1]
    owner.pause()
    try:
        (worker,) = workers(patient, broker_url, count=1, pool=pool)
        wait_for("the worker to take the batch", lambda: list(held_batches(broker_url).values()) == [0], timeout=60)
        wait_for("the batch to begin", lambda: ": clients for clusters " in worker.log_text(), timeout=60)
        worker.signal(signal.SIGTERM)  # the process group: with prefork, the pool process too
        wait_for("the worker to begin its warm shutdown", lambda: "Warm shutdown" in worker.log_text(), timeout=60)
    finally:
        owner.resume()
    assert worker.process is not None
    code = worker.process.wait(timeout=120)
    status = router.fan_out_status(published.job_id)
    assert (code, status.state, status.batches_done, status.written) == (0, "done", 1, 1000), worker.log_text()[-3000:]
    assert broker_idle(broker_url), "the batch was not acknowledged"
    assert_one_copy_each(raw_clients, db_name, range(1000))


def test_publishing_again_sends_exactly_the_batches_missing_when_it_reaches_them(
    publisher: tuple[RouterConfig, FeedRouter], workers: Callable[..., list[WorkerProcess]], broker_url: str,
    raw_clients: Clients, db_name: str,
) -> None:
    """A 5-batch job whose batches 0 and 1 are still queued and whose batches 2-4 were lost, published again while a
    worker takes the queued two: the publisher read the checkpoint before they were done, yet sends only what is
    still missing when it reaches each batch (2, 3 and 4), and no batch is written twice. (It used to send all 5, the
    checkpoint as it stood when publishing began.)"""
    config, router = publisher
    app = make_app(broker_url)
    published = publish_fan_out(router, app, activity(17), range(5000))  # queued: no worker yet
    for number in (2, 3, 4):
        drop_queued_batch(broker_url, number)
    status = router.fan_out_status(published.job_id)
    assert (status.batches_missing, status.missing_batches) == (5, (0, 1, 2, 3, 4))
    started: list[WorkerProcess] = []

    def receivers() -> Iterator[int]:
        """The job's receivers, once a worker wrote the two batches still queued (the publisher has begun by then)."""
        started.extend(workers(config, broker_url, count=1))
        wait_for("batches 0 and 1 done", lambda: router.fan_out_status(published.job_id).batches_done == 2, timeout=60)
        yield from range(5000)

    again = publish_fan_out(router, app, activity(17), receivers())
    assert (again.tasks_sent, again.batches_resumed) == (3, 2)
    wait_for("the job done", lambda: router.fan_out_status(published.job_id).state == "done", timeout=60)
    wait_for("the broker idle", lambda: broker_idle(broker_url), timeout=60)
    assert_one_copy_each(raw_clients, db_name, range(5000))
    (worker,) = started
    assert sorted(int(line.split(": batch ")[1].split(":")[0].split()[0]) for line in batch_lines(worker)) == [0, 1, 2, 3, 4]
    status = router.fan_out_status(published.job_id)
    assert (status.batches_done, status.written, status.already_present) == (5, 5000, 0)
