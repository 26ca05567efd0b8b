"""Benchmarks: what the router costs on top of the driver, as ratios measured in one run.

Run ``scripts/bench`` (``python -m router.testing.bench``). It starts three local servers
(or reuses ``--uris``). Each measurement has a warm-up and several repetitions with
the router run and the raw pymongo run alternating, so machine drift cancels out.
It prints a markdown table of medians with min and max, writes every raw figure to
JSON, and draws a PNG chart when matplotlib is installed (the ``bench`` extra).
The last line is the summary, PASS or FAIL per target. The test suite only checks
that a small run works; the targets are judged here.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, TextIO

import attrs
import bson
import pymongo
from pymongo import MongoClient, monitoring

from .. import __version__
from ..admin.migrate import discover, migrate_cluster
from ..config import ClusterConfig, RouterConfig
from ..ids import data_key
from ..model import ClusterMeta, FeedItem
from ..storage.clusters import Cluster
from ..sync import FeedRouter
from .localservers import LocalClusters

__all__ = ["main", "run_bench", "Result"]

UTC = timezone.utc
P0 = datetime(2024, 1, 1, tzinfo=UTC)
P1 = datetime(2024, 4, 1, tzinfo=UTC)
P2 = datetime(2024, 7, 1, tzinfo=UTC)
NOW = datetime(2024, 9, 1, tzinfo=UTC)
NAMES = ("cluster_1", "cluster_2", "cluster_3")
@attrs.frozen
class Sizes:
    """How big each measurement is."""

    writes: int
    cpu: int
    reps: int
    reads: int
    deletes: int
    fanout: int
    memory: tuple[int, int]


SIZES = {
    "full": Sizes(writes=30_000, cpu=100_000, reps=5, reads=50, deletes=300, fanout=1_000_000, memory=(100_000, 1_000_000)),
    "small": Sizes(writes=2_000, cpu=5_000, reps=3, reads=20, deletes=30, fanout=20_000, memory=(5_000, 20_000)),
}


@attrs.frozen
class Result:
    """One measurement: per-repetition figures, the ratio per repetition, and the target verdict."""

    name: str
    what: str
    unit: str
    router: list[float]
    raw: list[float]
    ratios: list[float]
    target: str
    passed: bool
    note: str = ""

    def row(self) -> str:
        def span(xs: list[float]) -> str:
            if not xs:
                return "-"
            return f"{statistics.median(xs):,.3g} [{min(xs):,.3g} - {max(xs):,.3g}]"

        return (f"| {self.what} | {span(self.router)} | {span(self.raw)} | {self.unit} | {span(self.ratios)} "
                f"| {self.target} | {'PASS' if self.passed else 'FAIL'} |")


class _Finds(monitoring.CommandListener):
    """Counts find/getMore commands and the documents they returned."""

    def __init__(self) -> None:
        self.finds = 0
        self.documents = 0
        self.enabled = False

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        if self.enabled and event.command_name in ("find", "getMore"):
            self.finds += event.command_name == "find"

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        if self.enabled and event.command_name in ("find", "getMore"):
            cursor = event.reply.get("cursor", {})
            self.documents += len(cursor.get("firstBatch", cursor.get("nextBatch", [])))

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass


def _config(uris: Sequence[str], database: str, *, listener: monitoring.CommandListener | None = None) -> RouterConfig:
    options: dict[str, Any] = {"event_listeners": [listener]} if listener is not None else {}
    return RouterConfig(
        database=database,
        clusters=tuple(ClusterConfig(name=n, uri=u, options=options) for n, u in zip(NAMES, uris)),
    )


def _register(config: RouterConfig) -> None:
    migrations = discover()
    for spec, (start, end) in zip(config.clusters, ((P0, P1), (P1, P2), (P2, None))):
        cluster = Cluster(spec, config)
        migrate_cluster(cluster, config, migrations)
        cluster.write_meta(ClusterMeta(name=spec.name, start_date=start, end_date=end, creator_name="bench"))
        cluster.close()


def _items(n: int, *, receivers: int = 5000, start: datetime = P0, end: datetime = NOW, key_offset: int = 0) -> list[FeedItem]:
    step = (end - start) / n
    return [
        FeedItem(receiver_id=1_000_000 + i % receivers, sender_id=1_000_765, event_time=start + step * i, type=1,
                 data={"fabula_id": key_offset + i}, data_key=data_key("fabula", key_offset + i))
        for i in range(n)
    ]


def _timed(fn: Callable[[], Any]) -> float:
    gc.collect()
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _interleave(reps: int, router: Callable[[], float], raw: Callable[[], float]) -> tuple[list[float], list[float]]:
    """Warm up both, then alternate which goes first in each repetition."""
    router()
    raw()
    r_out, w_out = [], []
    for rep in range(reps):
        if rep % 2:
            w_out.append(raw())
            r_out.append(router())
        else:
            r_out.append(router())
            w_out.append(raw())
    return r_out, w_out


def bench_writes(uris: Sequence[str], n: int, reps: int) -> Result:
    """write_many of n items over three periods vs raw insert_many of the same built documents, clusters in parallel."""
    config = _config(uris, "bench_router")
    _register(config)
    raw_db = "bench_raw"
    clients: list[MongoClient[dict[str, Any]]] = [MongoClient(u, tz_aware=True) for u in uris]
    items = _items(n)
    with FeedRouter(config, clock=lambda: NOW, refresh=False) as router:
        prepared = router.prepare(items)
        raw_docs = {name: [dict(d) for d in docs] for name, (_, docs) in prepared.batches.items()}

        def reset(db: str) -> None:
            for c in clients:
                c[db].feed.drop()
                c[db].feed.create_index([("receiver_id", 1), ("event_time", -1), ("_id", -1)], name="receiver_time_id")
                c[db].feed.create_index([("data_key", 1)], name="data_key")

        def run_router() -> float:
            reset("bench_router")
            return n / _timed(lambda: router.write_many(items))

        def run_raw() -> float:
            reset(raw_db)
            colls = {name: clients[NAMES.index(name)][raw_db].feed for name in raw_docs}

            def insert() -> None:
                futures = [
                    router.clusters.submit(name, lambda c=colls[name], d=docs: c.insert_many(d, ordered=False))
                    for name, docs in raw_docs.items()
                ]
                for f in futures:
                    f.result()

            return n / _timed(insert)

        r, w = _interleave(reps, run_router, run_raw)
    for c in clients:
        c.close()
    ratios = [a / b for a, b in zip(r, w)]
    return Result("write_ratio", f"write throughput, {n:,} items over 3 clusters", "items/s", r, w, ratios,
                  ">= 0.95", statistics.median(ratios) >= 0.95)


def bench_cpu(n: int, reps: int) -> Result:
    """Routing + _id + data_key + document building, no I/O, vs bson.encode of the same documents."""
    from ..core.routing import Routing
    from ..core.writes import prepare
    from ..timemap import TimeMap

    metas = [ClusterMeta(name=NAMES[0], start_date=P0, end_date=P1), ClusterMeta(name=NAMES[1], start_date=P1, end_date=P2),
             ClusterMeta(name=NAMES[2], start_date=P2)]
    routing = Routing(TimeMap(metas), NOW)  # the write path only (router.core.writes.prepare): no connections needed
    step = (NOW - P0) / n
    times = [P0 + step * i for i in range(n)]

    def build_and_prepare() -> Any:
        items = [FeedItem(receiver_id=1_000_000 + i % 5000, sender_id=1_000_765, event_time=times[i], type=1,
                          data={"fabula_id": i}, data_key=data_key("fabula", i)) for i in range(n)]
        return prepare(items, routing)

    docs = [d for _, (_, ds) in build_and_prepare().batches.items() for d in ds]
    items = [FeedItem(receiver_id=d["receiver_id"], sender_id=d["sender_id"], event_time=d["event_time"], type=d["type"],
                      data=d["data"], data_key=d["data_key"]) for d in docs]
    keys = list(range(n))

    def run_router() -> float:
        def work() -> None:
            for k in keys:
                data_key("fabula", k)
            prepare(items, routing)

        return _timed(work) / n * 1e9

    def run_encode() -> float:
        encode = bson.encode
        return _timed(lambda: [encode(d) for d in docs]) / n * 1e9

    r, w = _interleave(reps, run_router, run_encode)
    ratios = [a / b for a, b in zip(r, w)]
    return Result("cpu_ratio", f"router CPU per item (route, _id, data_key, document), {n:,} items", "ns/item", r, w,
                  ratios, "<= 0.5", statistics.median(ratios) <= 0.5)


def bench_pages(uris: Sequence[str]) -> Result:
    """Commands and documents per page: one cluster fills it; then a page spanning three clusters."""
    finds = _Finds()
    config = _config(uris, "bench_pages", listener=finds)
    _register(config)
    with FeedRouter(config, clock=lambda: NOW, refresh=False) as router:
        router.write_many(_items(200, receivers=1, start=P2 + timedelta(days=1), end=NOW))
        spread = (_items(10, receivers=1, start=P2, end=NOW, key_offset=10_000)
                  + _items(10, receivers=1, start=P1, end=P2, key_offset=20_000)
                  + _items(100, receivers=1, start=P0, end=P1, key_offset=30_000))
        router.write_many([attrs.evolve(it, receiver_id=7) for it in spread])
        finds.enabled, finds.finds, finds.documents = True, 0, 0
        one = router.read(1_000_000, limit=50)
        single = (finds.finds, finds.documents, len(one))
        finds.finds, finds.documents = 0, 0
        three = router.read(7, limit=50)
        spanning = (finds.finds, finds.documents, len(three), len(set(three.sources)))
    ok = single == (1, 50, 50) and spanning[0] == spanning[3] == 3 and spanning[1] == spanning[2] == 50
    note = (f"newest cluster fills the page: {single[0]} find, {single[1]} documents for {single[2]} items; "
            f"page over {spanning[3]} clusters: {spanning[0]} finds, {spanning[1]} documents for {spanning[2]} items")
    return Result("commands_per_page", "commands per page (finds; documents = items)", "finds",
                  [float(single[0]), float(spanning[0])], [1.0, 3.0], [float(single[1] - single[2]), float(spanning[1] - spanning[2])],
                  "1 find; k finds; docs = items", ok, note)


def bench_read(uris: Sequence[str], reps: int, rounds: int) -> Result:
    """First page through the router vs the same indexed find on the newest cluster with raw pymongo."""
    config = _config(uris, "bench_read")
    _register(config)
    raw: MongoClient[dict[str, Any]] = MongoClient(uris[2], tz_aware=True)
    coll = raw["bench_read"].feed
    with FeedRouter(config, clock=lambda: NOW, refresh=False) as router:
        router.write_many(_items(5_000, receivers=50, start=P2, end=NOW))
        receiver = 1_000_007

        def run_router() -> float:
            return statistics.median(_timed(lambda: router.read(receiver, limit=50)) for _ in range(rounds)) * 1e3

        def run_raw() -> float:
            return statistics.median(
                _timed(lambda: list(coll.find({"receiver_id": receiver}, sort=[("event_time", -1), ("_id", -1)], limit=50)))
                for _ in range(rounds)
            ) * 1e3

        r, w = _interleave(reps, run_router, run_raw)
    raw.close()
    ratios = [a / b for a, b in zip(r, w)]
    return Result("read_ratio", "first page latency (50 items) vs one raw indexed find", "ms", r, w, ratios,
                  "<= 1.15", statistics.median(ratios) <= 1.15)


def bench_delete(uris: Sequence[str], reps: int, copies: int) -> Result:
    """delete(data_key) across 3 clusters (in parallel) vs the slowest single-cluster raw delete."""
    config = _config(uris, "bench_delete")
    _register(config)
    clients: list[MongoClient[dict[str, Any]]] = [MongoClient(u, tz_aware=True) for u in uris]
    key = data_key("fabula", 424242)
    with FeedRouter(config, clock=lambda: NOW, refresh=False) as router:
        router.write_many(_items(3_000, receivers=500))  # other items, so the deletes have something to skip
        copy_items = [FeedItem(receiver_id=r, sender_id=1, event_time=t, type=1, data={"fabula_id": 424242}, data_key=key)
                      for r in range(copies) for t in (P0 + timedelta(days=9), P1 + timedelta(days=9), P2 + timedelta(days=9))]

        def run_router() -> float:
            router.write_many(copy_items)
            return _timed(lambda: router.delete(key)) * 1e3

        sums: list[float] = []

        def run_raw() -> float:
            router.write_many(copy_items)
            each = []
            for client in clients:
                feed = client["bench_delete"].feed
                each.append(_timed(lambda: feed.delete_many({"data_key": key})))
            sums.append(sum(each) * 1e3)
            return max(each) * 1e3

        r, w = _interleave(reps, run_router, run_raw)
    for c in clients:
        c.close()
    ratios = [a / b for a, b in zip(r, w)]
    note = (f"the three single-cluster deletes one after another take {statistics.median(sums):.1f} ms (median); "
            f"the router's parallel delete takes {statistics.median(r):.1f} ms, "
            f"{statistics.median(r) / statistics.median(sums):.2f} of that, on {os.cpu_count()} cores for 3 server processes")
    return Result("delete_ratio", f"delete(data_key), {copies} copies in each of 3 clusters, vs slowest single cluster",
                  "ms", r, w, ratios, "<= 1.3", statistics.median(ratios) <= 1.3, note)


def bench_fanout(uris: Sequence[str], n: int, reps: int) -> Result:
    """fan_out of one activity to n receivers (a generator) vs raw insert_many of the same copies, same cluster."""
    from ..ids import copy_ids
    from ..model import Activity

    config = _config(uris, "bench_fanout")
    _register(config)
    owner = uris[2]  # the activity's time is in cluster_3's period
    raw: MongoClient[dict[str, Any]] = MongoClient(owner, tz_aware=True)
    when = P2 + timedelta(days=3, milliseconds=7)
    seconds = int(when.timestamp())

    def activity(k: int) -> Activity:
        return Activity(sender_id=1_000_765, event_time=when, type=1, data={"fabula_id": k}, data_key=data_key("fabula", k))

    def reset(db: str) -> None:
        raw[db].feed.drop()
        raw[db].fanouts.drop()
        raw[db].feed.create_index([("receiver_id", 1), ("event_time", -1), ("_id", -1)], name="receiver_time_id")
        raw[db].feed.create_index([("data_key", 1)], name="data_key")

    with FeedRouter(config, clock=lambda: NOW, refresh=False) as router:
        def run_router(size: int, k: int) -> float:
            reset("bench_fanout")
            return size / _timed(lambda: router.fan_out(activity(k), (10_000_000 + i for i in range(size))))

        def run_raw(size: int, k: int) -> float:
            reset("bench_fanout_raw")
            act = activity(k)
            receivers = [10_000_000 + i for i in range(size)]
            ids = copy_ids(seconds, act.data_key, receivers)
            docs = [{"_id": oid, "data_key": act.data_key, "receiver_id": r, "sender_id": act.sender_id,
                     "event_time": act.event_time, "type": act.type, "data": act.data} for oid, r in zip(ids, receivers)]
            coll = raw["bench_fanout_raw"].feed
            return size / _timed(lambda: coll.insert_many(docs, ordered=False))

        warm = min(n, 20_000)
        run_router(warm, 0)
        run_raw(warm, 0)
        r, w = [], []
        for rep in range(reps):
            if rep % 2:
                w.append(run_raw(n, rep + 1))
                r.append(run_router(n, rep + 1))
            else:
                r.append(run_router(n, rep + 1))
                w.append(run_raw(n, rep + 1))
    raw.drop_database("bench_fanout_raw")
    raw.close()
    ratios = [a / b for a, b in zip(r, w)]
    return Result("fanout_ratio", f"fan-out throughput, {n:,} receivers from a generator", "copies/s", r, w, ratios,
                  ">= 0.90", statistics.median(ratios) >= 0.90)


def bench_fanout_memory(uri: str, sizes: tuple[int, int]) -> Result:
    """Peak RSS growth of a fan-out from a generator, small vs large receiver count, each in a fresh process."""
    out = subprocess.run(
        [sys.executable, "-m", "router.testing.fanout_memory", "--uri", uri, "--sizes", *map(str, sizes), "--json"],
        capture_output=True, text=True, check=False,
    )
    if out.returncode != 0:
        raise RuntimeError(f"scripts/fanout_memory failed: {out.stderr[-2000:]}")
    rows = json.loads(out.stdout)
    small, large = rows[0], rows[-1]
    diff = large["peak_growth_mb"] - small["peak_growth_mb"]
    note = (f"peak growth {small['peak_growth_mb']} MB for {small['receivers']:,} receivers, "
            f"{large['peak_growth_mb']} MB for {large['receivers']:,}; {large['receivers_per_second']:,} receivers/s")
    return Result("fanout_memory", f"fan-out peak memory growth, {sizes[0]:,} vs {sizes[1]:,} receivers", "MB",
                  [float(large["peak_growth_mb"])], [float(small["peak_growth_mb"])], [diff], "< 20 MB difference",
                  abs(diff) < 20, note)


def _chart(results: list[Result], path: Path) -> str:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "chart skipped: matplotlib is not installed (pip install 'feed-router[bench]')"
    shown = [r for r in results if r.ratios and r.name not in ("commands_per_page", "fanout_memory")]
    fig, ax = plt.subplots(figsize=(8, 3.2 + 0.35 * len(shown)))
    names = [r.name for r in shown]
    med = [statistics.median(r.ratios) for r in shown]
    lo = [m - min(r.ratios) for m, r in zip(med, shown)]
    hi = [max(r.ratios) - m for m, r in zip(med, shown)]
    colors = ["#2e7d32" if r.passed else "#c62828" for r in shown]
    ax.barh(names, med, xerr=[lo, hi], color=colors, capsize=4)
    for i, r in enumerate(shown):
        target = float(r.target.split()[-1])
        ax.plot([target, target], [i - 0.4, i + 0.4], color="black", linestyle="--")
        ax.text(max(med[i], target) + 0.03, i, f"{med[i]:.2f} (target {r.target})", va="center", fontsize=8)
    ax.set_xlabel("router / raw pymongo (median, min-max whiskers; dashed = target)")
    ax.set_title("feed-router overhead vs raw pymongo, same run")
    ax.set_xlim(0, max(max(med) + max(hi), 1.3) * 1.45)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return f"chart: {path}"


def _environment(uris: Sequence[str], backend: str, server: str | None = None) -> dict[str, Any]:
    """The run's context for the report header; ``server`` as LocalClusters.server_description gives it."""
    info = MongoClient(uris[0]).admin.command("buildInfo")
    if server is None:  # servers we did not start: the wire protocol does not say which FerretDB backend
        server = f"FerretDB {info['ferretdbVersion']}" if "ferretdbVersion" in info else f"MongoDB {info.get('version')}"
    return {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "pymongo": pymongo.version,
        "feed_router": __version__,
        "server": server,
        "backend": backend,
    }


def run_bench(out: TextIO, *, size: str = "full", uris: Sequence[str] | None = None, results_dir: Path = Path("bench-results"),
              only: Sequence[str] | None = None) -> list[Result]:
    """Run the measurements and report them; return the results."""
    s = SIZES[size]
    results_dir.mkdir(parents=True, exist_ok=True)
    local: LocalClusters | None = None
    if uris is None:
        local = LocalClusters(3, names=list(NAMES))
        uris = local.start()
    try:
        servers = list(uris)
        env = _environment(servers, local.backend if local else "reused", local.server_description if local else None)
        out.write(f"# feed-router benchmark ({size})\n\n" + "\n".join(f"- {k}: {v}" for k, v in env.items()) + "\n\n")
        out.flush()
        steps: list[tuple[str, Callable[[], Result]]] = [
            ("cpu_ratio", lambda: bench_cpu(s.cpu, s.reps)),
            ("write_ratio", lambda: bench_writes(servers, s.writes, s.reps)),
            ("commands_per_page", lambda: bench_pages(servers)),
            ("read_ratio", lambda: bench_read(servers, s.reps, s.reads)),
            ("delete_ratio", lambda: bench_delete(servers, s.reps, s.deletes)),
            ("fanout_ratio", lambda: bench_fanout(servers, s.fanout, 2 if size == "full" else s.reps)),
            ("fanout_memory", lambda: bench_fanout_memory(servers[0], s.memory)),
        ]
        results = []
        for name, step in steps:
            if only and name not in only:
                continue
            out.write(f"running {name} ...\n")
            out.flush()
            results.append(step())
        out.write("\n| measure | router | raw pymongo | unit | ratio router/raw | target | result |\n"
                  "| --- | --- | --- | --- | --- | --- | --- |\n")
        out.write("\n".join(r.row() for r in results) + "\n\n")
        for r in results:
            if r.note:
                out.write(f"- {r.name}: {r.note}\n")
        (results_dir / "bench.json").write_text(json.dumps({"environment": env, "results": [attrs.asdict(r) for r in results]}, indent=2))
        out.write(f"\nraw figures: {results_dir / 'bench.json'}\n{_chart(results, results_dir / 'bench.png')}\n")
        passed = sum(r.passed for r in results)
        verdicts = ", ".join(f"{r.name} {'PASS' if r.passed else 'FAIL'}" for r in results)
        out.write(f"SUMMARY: {passed} of {len(results)} targets met: {verdicts}\n")
        return results
    finally:
        if local is not None:
            local.stop()


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m router.testing.bench [--small] [--uris U1,U2,U3] [--out DIR] [--only NAME ...] [--strict]``."""
    parser = argparse.ArgumentParser(prog="scripts/bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", action="store_true", help="tiny sizes: checks the benchmark runs (used by the tests)")
    parser.add_argument("--uris", help="reuse three running servers (comma-separated) instead of starting them")
    parser.add_argument("--out", type=Path, default=Path("bench-results"), help="folder for bench.json and bench.png")
    parser.add_argument("--only", nargs="*", help="run only these measures")
    parser.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    args = parser.parse_args(argv)
    uris = args.uris.split(",") if args.uris else None
    results = run_bench(sys.stdout, size="small" if args.small else "full", uris=uris, results_dir=args.out, only=args.only)
    return 1 if args.strict and not all(r.passed for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
