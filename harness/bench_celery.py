"""Fan-out on Celery, measured: copies per second with 1 and 2 worker processes, and in-process, in one run.

Also the plumbing the Celery tests share: a worker's clusters.yaml (:func:`worker_yaml`) and
a ``feedrouter worker`` subprocess (:class:`WorkerProcess`).

Run ``python -m harness.bench_celery --receivers 100000``. It starts three local
servers and a local Redis (or uses ``--uris``/``--broker``), then fans one job of N
receivers out three ways, each into a fresh database: ``FeedRouter.fan_out`` in this
process, then :func:`~router.fanout.celery.publish_fan_out` with one and with two
``feedrouter worker --pool solo`` processes (started and ready before the clock starts).
A Celery run is timed from the first publish call until ``fan_out_status`` says done.
Every process (servers, Redis, workers, publisher) shares this machine's cores; each run
also records how busy the machine was and the CPU seconds the servers, the broker, the
workers and the publisher used (:mod:`harness.bench.cpu`), so a missed speed-up
says what it ran out of.

Example::

    figures = run_celery_bench(receivers=100_000)
    figures["celery_2_workers"]["copies_per_second"]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from contextlib import ExitStack
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml
from pymongo import MongoClient

from router.config import ClusterConfig, RouterConfig
from router.fanout.celery import make_app, publish_fan_out
from router.ids import data_key
from router.model import Activity
from router.sync import FeedRouter
from .bench.common import NAMES, NOW, UTC, register
from .bench.cpu import Snapshot, listening_pids, server_pids
from .errors import HarnessError
from .localservers import LocalClusters
from .process import POLL_INTERVAL, checkout_env, log_tail, spawn_logged
from .redis import LocalRedis

__all__ = ["WorkerProcess", "main", "run_celery_bench", "worker_yaml"]

log = logging.getLogger(__name__)
#: The event time of the benchmark's posts: cluster_2 owns it.
WHEN = datetime(2024, 5, 4, 12, 0, tzinfo=UTC)


def _duration(seconds: float) -> str:
    ms = round(seconds * 1000)
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


def worker_yaml(
    config: RouterConfig, *, broker: str, visibility_timeout: float = 3600, retries: int = 3, retry_backoff: float = 5.0,
) -> str:
    """clusters.yaml text for *config* (database, writes, clusters and their options, the erasure key, live pushes)
    plus a ``celery`` section."""
    doc: dict[str, Any] = {
        "database": config.database,
        "collections": {"feed": config.feed_collection, "metadata": config.metadata_collection},
        "timeout": _duration(config.timeout.total_seconds()),
        "refresh_interval": _duration(config.refresh_interval.total_seconds()),
        "write": {"batch_size": config.batch_size, "retries": config.write_retries,
                  "retry_backoff": _duration(config.retry_backoff.total_seconds())},
        "celery": {"broker": broker, "visibility_timeout": _duration(visibility_timeout), "retries": retries,
                   "retry_backoff": _duration(retry_backoff)},
        "clusters": [{"name": c.name, "uri": c.uri, **({"options": dict(c.options)} if c.options else {}),
                      **({"database": c.database} if c.database else {})} for c in config.clusters],
    }
    if config.erasure_key:  # every process that writes copies must read erasure records under the same key
        doc["erasure"] = {"key": config.erasure_key}
    if config.push is not None:  # every process that writes copies pushes them to live subscribers
        p = config.push
        doc["push"] = {"redis": p.redis, "prefix": p.prefix, "presence_ttl": _duration(p.presence_ttl.total_seconds()),
                       "queue": p.queue, "catch_up": p.catch_up, "timeout": _duration(p.timeout.total_seconds())}
    return yaml.safe_dump(doc, sort_keys=False)


class WorkerProcess:
    """One ``feedrouter worker`` subprocess in a session of its own; stderr goes to ``log_path``.

    Example::

        worker = WorkerProcess(config_path, name="w1", log_path=tmp / "w1.log").start()
        worker.wait_ready(timeout=60)
        worker.kill()          # SIGKILL, no shutdown: its unacknowledged task is delivered again
        worker.stop()          # SIGTERM (warm shutdown), SIGKILL after the grace period
    """

    def __init__(
        self, config_path: Path, *, name: str, log_path: Path, pool: str = "solo", concurrency: int | None = None,
        extra: Sequence[str] = (),
    ) -> None:
        self.config_path = config_path
        self.name = name
        self.log_path = log_path
        self.pool = pool
        self.concurrency = concurrency
        self.extra = list(extra)
        self.process: subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        """The command line: the venv's ``feedrouter`` when installed next to this Python, else ``-m router.cli``."""
        script = Path(sys.executable).with_name("feedrouter")
        head = [str(script)] if script.is_file() else [sys.executable, "-m", "router.cli"]
        cmd = [*head, "-c", str(self.config_path), "worker", "--pool", self.pool, "--hostname", f"{self.name}@%h"]
        if self.concurrency is not None:
            cmd += ["--concurrency", str(self.concurrency)]
        return cmd + self.extra

    def start(self) -> WorkerProcess:
        """Start the worker (not waiting for it); returns self."""
        env = checkout_env()  # the worker imports harness too
        self.process = spawn_logged(self.command(), self.log_path, detached=True, env=env)
        return self

    @property
    def pid(self) -> int:
        if self.process is None:
            raise HarnessError(f"worker {self.name} was not started")
        return self.process.pid

    def log_text(self) -> str:
        """Everything the worker logged so far."""
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def wait_ready(self, *, timeout: float = 60.0) -> None:
        """Block until the worker logs ``ready.``; raise :class:`HarnessError` if it exits or the deadline passes."""
        deadline = time.monotonic() + timeout
        while " ready." not in self.log_text():
            if self.process is None or self.process.poll() is not None:
                raise HarnessError(f"worker {self.name} exited before it was ready:\n{log_tail([self.log_path])}")
            if time.monotonic() > deadline:
                raise HarnessError(f"worker {self.name} not ready after {timeout:.0f} s:\n{log_tail([self.log_path])}")
            time.sleep(POLL_INTERVAL)

    def signal(self, sig: signal.Signals) -> None:
        """Send *sig* to the worker's whole process group (pool children included)."""
        try:
            os.killpg(self.pid, sig)
        except ProcessLookupError:
            pass

    def kill(self) -> None:
        """SIGKILL the worker and its children, no shutdown at all, and reap it."""
        self.signal(signal.SIGKILL)
        if self.process is not None:
            self.process.wait()

    def stop(self, *, grace: float = 30.0) -> int | None:
        """SIGTERM (a warm shutdown), then SIGKILL after *grace* seconds; return the exit code."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.signal(signal.SIGCONT)
            self.signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                log.warning("worker %s ignored SIGTERM for %.0f s; killing it", self.name, grace)
                self.kill()
        self.signal(signal.SIGKILL)  # anything left in its group (there should be nothing)
        return self.process.returncode

    def group_alive(self) -> bool:
        """True while any process of the worker's group exists."""
        try:
            os.killpg(self.pid, 0)
        except ProcessLookupError:
            return False
        return True


def _wait_done(router: FeedRouter, job_id: str, *, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while router.fan_out_status(job_id).state != "done":
        if time.monotonic() > deadline:
            raise HarnessError(f"fan-out {job_id!r} not done after {timeout:.0f} s: {router.fan_out_status(job_id)}")
        time.sleep(0.05)


class _CPU:
    """CPU spent from its making to :meth:`spent`: the machine, the servers, the broker, the workers, this process."""

    def __init__(self, servers: set[int], brokers: set[int], workers: list[int]) -> None:
        self._groups = {"servers": servers, "broker": brokers, "workers": set(workers)}
        self._start = Snapshot.take(self._groups)
        self._own = time.process_time()

    def spent(self) -> dict[str, float]:
        own = time.process_time() - self._own
        used = Snapshot.take(self._groups).minus(self._start)
        return {"busy_share": used.busy_share, "cores": used.total / used.wall if used.wall else 0.0,
                **{f"{name}_s": seconds for name, seconds in used.seconds.items()}, "publisher_s": own}


def run_celery_bench(
    *, receivers: int = 100_000, batch_size: int = 1000, uris: Sequence[str] | None = None, broker: str | None = None,
    work_dir: Path | None = None, timeout: float = 900.0,
) -> dict[str, Any]:
    """Measure one fan-out of *receivers* in-process, on 1 worker and on 2 workers; return the figures.

    Each figure is ``{"seconds", "copies_per_second", "cpu"}`` (Celery runs add ``"publish_seconds"``,
    the time the publisher took to send every task); ``cpu`` holds the machine's busy share
    and the CPU seconds of the servers, the broker, the workers and the publisher over the
    timed part. Servers and Redis are started here unless *uris* / *broker* are given.
    """
    with ExitStack() as stack:
        if uris is None:
            local = stack.enter_context(LocalClusters(3))
            uris, server = local.uris, local.server_description
        else:
            server = "given servers"
        if broker is None:
            broker = stack.enter_context(LocalRedis()).url
        if work_dir is None:
            import tempfile

            work_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="feedrouter-bench-celery-")))
        figures: dict[str, Any] = {"receivers": receivers, "batch_size": batch_size, "cpus": os.cpu_count(),
                                   "server": server}
        app = make_app(broker)
        servers, brokers = server_pids(uris), listening_pids(urlsplit(broker).port or 6379)
        for label, workers in (("in_process", 0), ("celery_1_worker", 1), ("celery_2_workers", 2)):
            db = f"bench_celery_{uuid.uuid4().hex[:8]}"
            config = RouterConfig(database=db, batch_size=batch_size, timeout=timedelta(seconds=60),
                                  clusters=tuple(ClusterConfig(name=n, uri=u) for n, u in zip(NAMES, uris)))
            register(config)
            post = Activity(sender_id=1, event_time=WHEN, type=1, data={"bench": label}, data_key=data_key("bench", db))
            running: list[WorkerProcess] = []
            try:
                with FeedRouter(config, clock=lambda: NOW, refresh=False) as router:
                    if workers == 0:
                        cpu = _CPU(servers, brokers, [])
                        t0 = time.perf_counter()
                        result = router.fan_out(post, range(receivers))
                        elapsed = time.perf_counter() - t0
                        if not result.ok or result.written != receivers:
                            raise HarnessError(f"{label}: the fan-out did not write every copy: {result}")
                        figures[label] = {"seconds": elapsed, "copies_per_second": receivers / elapsed, "cpu": cpu.spent()}
                    else:
                        path = work_dir / f"{db}.yaml"
                        path.write_text(worker_yaml(config, broker=broker))
                        running = [WorkerProcess(path, name=f"{db}-{i}", log_path=work_dir / f"{db}-{i}.log").start()
                                   for i in range(workers)]
                        for worker in running:
                            worker.wait_ready()
                        cpu = _CPU(servers, brokers, [w.pid for w in running])
                        t0 = time.perf_counter()
                        published = publish_fan_out(router, app, post, range(receivers))
                        sent = time.perf_counter() - t0
                        _wait_done(router, published.job_id, timeout=timeout)
                        elapsed = time.perf_counter() - t0
                        status = router.fan_out_status(published.job_id)
                        if status.written != receivers:
                            raise HarnessError(f"{label}: the workers did not write every copy: {status}")
                        figures[label] = {"seconds": elapsed, "copies_per_second": receivers / elapsed,
                                          "publish_seconds": sent, "cpu": cpu.spent()}
                    log.info("%s: %d copies in %.2f s", label, receivers, figures[label]["seconds"])
            finally:
                for worker in running:
                    worker.stop()
                for uri in uris:
                    client: MongoClient[dict[str, Any]] = MongoClient(uri, serverSelectionTimeoutMS=5000)
                    with client:
                        client.drop_database(db)
        one, two = figures["celery_1_worker"], figures["celery_2_workers"]
        figures["speedup_2_vs_1_workers"] = two["copies_per_second"] / one["copies_per_second"]
        figures["celery_1_vs_in_process"] = one["copies_per_second"] / figures["in_process"]["copies_per_second"]
        return figures


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m harness.bench_celery``: print the figures as JSON on stdout; exit 0, or 1 on failure."""
    parser = argparse.ArgumentParser(prog="python -m harness.bench_celery", description=__doc__.split("\n\n")[0])
    parser.add_argument("--receivers", type=int, default=100_000)
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument("--uris", nargs=3, default=None, help="three running servers (default: start local ones)")
    parser.add_argument("--broker", default=None, help="a broker URL (default: start a local Redis)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    try:
        figures = run_celery_bench(receivers=args.receivers, batch_size=args.batch_size, uris=args.uris, broker=args.broker)
    except Exception as exc:  # the harness, a server, a worker
        log.error("benchmark failed: %s: %s", type(exc).__name__, exc)
        return 1
    print(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
