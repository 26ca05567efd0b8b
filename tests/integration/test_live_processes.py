"""Live feeds with real processes: ``feedrouter tail`` ended by SIGINT, and Celery workers pushing what they write."""

from __future__ import annotations

import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import attrs

from router import Activity, FeedRouter, NewItem, RouterConfig, data_key, live_cursor
from router.fanout.celery import make_app, publish_fan_out
from router.pushconfig import PushConfig
from harness.bench_celery import WorkerProcess, worker_yaml
from harness.redis import LocalRedis

from .conftest import NOW, register
from .live import R, S, WHEN, item, live_config, opened, push, redis_server, until  # noqa: F401 - fixtures too

def _lines(stream: Any, into: "queue.Queue[str]") -> None:
    for text in stream:
        into.put(text.rstrip("\n"))


def _wait_line(lines: "queue.Queue[str]", want: Callable[[str], bool], what: str, *, timeout: float = 60.0) -> str:
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        assert left > 0, f"{what}: not within {timeout:.0f} s"
        try:
            text = lines.get(timeout=left)
        except queue.Empty:
            continue
        if want(text):
            return text


def test_tail_prints_the_feed_and_ends_cleanly_on_ctrl_c(live_config: RouterConfig, redis_server: LocalRedis,
                                                         tmp_path: Path) -> None:
    """``feedrouter tail RECEIVER`` in a real process: it catches up from --cursor, prints a write as it happens, and
    SIGINT ends it with exit 0 and no traceback."""
    path = tmp_path / "clusters.yaml"
    path.write_text(worker_yaml(live_config, broker=redis_server.url))
    with FeedRouter(live_config, clock=lambda: NOW) as feeds:
        (before,) = feeds.write_many([item(1)])
        cursor = live_cursor(feeds.read(R))
        (caught,) = feeds.write_many([item(2)])
        script = Path(sys.executable).with_name("feedrouter")
        process = subprocess.Popen([str(script), "-c", str(path), "tail", str(R), "--cursor", cursor], text=True,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        out: queue.Queue[str] = queue.Queue()
        err: queue.Queue[str] = queue.Queue()
        readers = [threading.Thread(target=_lines, args=(process.stdout, out), daemon=True),
                   threading.Thread(target=_lines, args=(process.stderr, err), daemon=True)]
        for reader in readers:
            reader.start()
        try:
            _wait_line(err, lambda t: t.startswith(f"tail: following {R!r}"), "the tail to subscribe")
            assert f"item {caught}" in _wait_line(out, lambda t: True, "the caught-up item")
            (live,) = feeds.write_many([item(3)])
            assert f"item {live} from {S!r} type 1 key {data_key('live', 3)}: " in _wait_line(out, lambda t: True, "the live item")
            process.send_signal(signal.SIGINT)
            assert process.wait(60) == 0
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
        for reader in readers:
            reader.join(10)
        rest = list(err.queue)
        assert rest[-1:] == ["tail: stopped"] and not any("Traceback" in t for t in rest), rest
        assert out.empty() and str(before) not in "".join(out.queue)


def test_celery_workers_push_the_copies_they_write(make_config: Callable[..., RouterConfig], push: PushConfig,
                                                   redis_server: LocalRedis, tmp_path: Path) -> None:
    """A fan-out published to two real ``feedrouter worker`` processes: each connected receiver gets its copy, pushed
    by whichever worker wrote it, as a page shows it."""
    config = attrs.evolve(make_config(timeout=timedelta(seconds=5)), push=push)
    register(config)
    broker = f"redis://127.0.0.1:{redis_server.port}/5"
    path = tmp_path / "workers.yaml"
    path.write_text(worker_yaml(config, broker=broker, visibility_timeout=5))
    workers = [WorkerProcess(path, name=f"w{i}", log_path=tmp_path / f"w{i}.log") for i in range(2)]
    with FeedRouter(config, clock=lambda: NOW) as feeds:
        watched = [0, 1500, 3999]
        subs = [opened(feeds.subscribe(r)) for r in watched]
        try:
            for worker in workers:
                worker.start()
            for worker in workers:
                worker.wait_ready(timeout=60)
            post = Activity(sender_id=S, event_time=WHEN, type=1, data={"celery": 1}, data_key=data_key("celery", 1))
            publish_fan_out(feeds, make_app(broker), post, range(4000))
            for receiver, live in zip(watched, subs):
                (event,) = until(live, lambda e: isinstance(e, NewItem), timeout=120)
                assert isinstance(event, NewItem) and event.item == feeds.read(receiver).items[0]
                live.close()
        finally:
            codes = [w.stop() for w in workers]
        assert codes == [0, 0], [w.log_text()[-2000:] for w in workers]
