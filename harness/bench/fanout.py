"""Measures of fan-out: throughput against raw insert_many, and memory as receivers grow."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from pymongo import MongoClient, monitoring

from router.ids import data_key
from router.sync import FeedRouter
from .common import NOW, P2, Result, bench_config, register, timed


class FenceTimer(monitoring.CommandListener):
    """Times the edit fence's reads (``find`` on ``edits``, one per batch) while ``on``."""

    def __init__(self) -> None:
        self.on = False
        self.pending: set[int] = set()
        self.seconds: list[float] = []

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        if self.on and event.command_name == "find" and event.command.get("find") == "edits":
            self.pending.add(event.request_id)

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        if event.request_id in self.pending:
            self.pending.discard(event.request_id)
            self.seconds.append(event.duration_micros / 1e6)

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        self.pending.discard(event.request_id)


#: Copies per raw insert_many command (the router's fan-out batches hold 1,000).
RAW_BATCH = 10_000


def bench_fanout(uris: Sequence[str], n: int, reps: int) -> Result:
    """fan_out of one activity to n receivers (a generator) vs raw insert_many of the same copies, same cluster;
    the note gives what the edit fence cost (its one find per batch)."""
    from router.ids import copy_ids
    from router.model import Activity

    fence = FenceTimer()
    config = bench_config(uris, "bench_fanout", listener=fence)
    register(config)
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
            return size / timed(lambda: router.fan_out(activity(k), (10_000_000 + i for i in range(size))))

        def run_raw(size: int, k: int) -> float:
            reset("bench_fanout_raw")
            act = activity(k)
            receivers = [10_000_000 + i for i in range(size)]
            ids = copy_ids(seconds, act.data_key, receivers)
            docs = [{"_id": oid, "data_key": act.data_key, "receiver_id": r, "sender_id": act.sender_id,
                     "event_time": act.event_time, "type": act.type, "data": act.data} for oid, r in zip(ids, receivers)]
            coll = raw["bench_fanout_raw"].feed

            def insert() -> None:
                # In commands of RAW_BATCH: FerretDB 2 advertises maxWriteBatchSize 100,000 but refuses more than
                # 25,000 writes in one command, so one insert_many of every copy fails there.
                for i in range(0, len(docs), RAW_BATCH):
                    coll.insert_many(docs[i:i + RAW_BATCH], ordered=False)

            return size / timed(insert)

        if reps > 1:  # a warm-up; one repetition (the small run, whose figures judge nothing) has none
            warm = min(n, 20_000)
            run_router(warm, 0)
            run_raw(warm, 0)
        r, w = [], []
        fence.on = True
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
    batches = reps * -(-n // config.batch_size)
    spent = sum(fence.seconds)
    wall = sum(n / x for x in r)
    note = (f"edit fence: {len(fence.seconds)} finds on edits for {batches} batches (plus 1 per job, at its start), "
            f"median {statistics.median(fence.seconds or [0.0]) * 1000:.2f} ms each, "
            f"summed {spent:.2f} s = {100 * spent / wall:.1f}% of the runs' {wall:.1f} s (batches overlap, so at most that)")
    return Result("fanout_ratio", f"fan-out throughput, {n:,} receivers from a generator", "copies/s", r, w, ratios,
                  ">= 0.90", statistics.median(ratios) >= 0.90, note)


def bench_fanout_memory(uri: str, sizes: tuple[int, int]) -> Result:
    """Peak RSS growth of a fan-out from a generator, small vs large receiver count, each in a fresh process."""
    out = subprocess.run(
        [sys.executable, "-m", "harness.fanout_memory", "--uri", uri, "--sizes", *map(str, sizes), "--json"],
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
