"""Fan-out on Celery into a ``buckets`` period: real Redis, real ``feedrouter worker`` processes, mongo-java-server.

The job carries its period's layout to the workers (``FanOutJob.layout``); a batch sent again
(as a redelivery would) finds its copies stored and adds none.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from pymongo import MongoClient

from router import Activity, FeedRouter, data_key
from router.fanout.celery import make_app, publish_fan_out, send_batch
from harness.bench_celery import WorkerProcess, worker_yaml
from harness.javaserver import LocalJavaServer
from harness.redis import LocalRedis

from .conftest import NOW, P2
from .layouts import buckets_config, copies_per_receiver
from .test_celery import wait_for

RECEIVERS = 5_000


@pytest.fixture(scope="module")
def javaserver() -> Iterator[LocalJavaServer]:
    with LocalJavaServer() as server:
        yield server


def test_two_workers_fill_buckets_once(javaserver: LocalJavaServer, tmp_path: Path) -> None:
    """5,000 receivers on two workers: one copy each in buckets of at most 50; a batch sent again adds none."""
    config = buckets_config(javaserver.uri)
    post = Activity(sender_id=42, event_time=P2 + timedelta(days=2), type=1, data={"p": 1}, data_key=data_key("cel", 1))
    raw: MongoClient[dict[str, Any]] = MongoClient(javaserver.uri, tz_aware=True)
    workers: list[WorkerProcess] = []
    with LocalRedis() as redis_server, FeedRouter(config, clock=lambda: NOW) as router:
        url = f"redis://127.0.0.1:{redis_server.port}/1"
        path = tmp_path / "worker.yaml"
        path.write_text(worker_yaml(config, broker=url, visibility_timeout=5.0, retries=3, retry_backoff=0.5))
        try:
            workers = [WorkerProcess(path, name=f"w{i}", log_path=tmp_path / f"w{i}.log") for i in range(2)]
            for worker in workers:
                worker.start()
            for worker in workers:
                worker.wait_ready(timeout=60)
            app = make_app(url)
            published = publish_fan_out(router, app, post, range(RECEIVERS), batch_size=250)
            job = router.plan_fan_out(post, batch_size=250)
            assert job.layout == "buckets" and job.job_id == published.job_id
            wait_for("the job done", lambda: router.fan_out_status(published.job_id).state == "done")
            send_batch(app, job, 3, 750, list(range(750, 1000)))  # a redelivered batch
            wait_for("the repeated batch done", lambda: any(
                ": batch 3: 0 written, 250 already present" in w.log_text() for w in workers))
            status = router.fan_out_status(published.job_id)
            assert (status.written, status.batches_done, status.batches_missing) == (RECEIVERS, 20, 0)
        finally:
            for worker in workers:
                worker.stop()
        counts = copies_per_receiver(raw, config, 2)
        assert counts == {r: 1 for r in range(RECEIVERS)}
        docs = list(raw[config.database_for(config.clusters[2])].feed.find({}, {"count": 1, "items._id": 1}))
        assert all(len(d["items"]) == d["count"] <= 50 for d in docs)
    raw.close()
