"""A router over 10, 100 and 1,000 periods on three servers: start-up time, threads, RSS, commands per call.

The periods are weekly, a database each, spread over the three servers
(:mod:`harness.fleet`). Each figure comes from a fresh child process
(``python -m harness.bench.scale --child ...``) so one router's clients, threads
and memory never count in another's: it measures RSS and threads before the router, the
start-up (wall and the process's CPU time), then threads and RSS after one write and one
page read, then the commands one more write and one more page read send (a command
listener on every client). At the largest size the child also times the start-up's
metadata finds written by hand on the same door's pymongo client (same options, the same
4 at a time per server, on threads or on the event loop): the floor the driver sets.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from concurrent.futures import ThreadPoolExecutor
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

import pymongo
from pymongo import AsyncMongoClient, MongoClient

from router.config import RouterConfig
from router.ids import data_key
from router.model import FeedItem
from router.storage.clients import COLD_OPTIONS, client_options
from router.storage.clusters import Clusters
from ..commands import CommandLog
from ..fleet import FIRST, drop_fleet, fleet_config, register_fleet
from .common import Result

__all__ = ["bench_scale", "measure"]

SIZES = (10, 100, 1000)
SMALL_SIZES = (10, 30)


def now_in(total: int) -> datetime:
    """The routers' "now": in the newest of *total* weekly periods from fleet.FIRST."""
    return FIRST + timedelta(weeks=total - 1, days=3)


def _rss_mb() -> float:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _items(now: datetime, batch: int) -> list[FeedItem]:
    """20 items in the newest period: one insert, and enough for a page of 10 from that period alone."""
    return [FeedItem(receiver_id=77, sender_id=1, event_time=now - timedelta(minutes=n), type=1, data={"n": n},
                     data_key=data_key("scale", batch * 100 + n)) for n in range(20)]


def _subset(config: RouterConfig, count: int) -> RouterConfig:
    """The newest *count* periods of *config* (contiguous, the last open-ended)."""
    return RouterConfig(clusters=config.clusters[-count:], database=config.database)


def measure(config: RouterConfig, door: str, now: datetime) -> dict[str, Any]:
    """Start a router of *door* on *config* in this process and measure it (see the module docstring)."""
    from router import AsyncFeedRouter, FeedRouter

    log = CommandLog()
    before = {"threads": threading.active_count(), "rss_mb": _rss_mb()}
    out: dict[str, Any] = {"door": door, "periods": len(config.clusters), "before": before}
    if door == "sync":
        t0, c0 = time.perf_counter(), time.process_time()
        router = FeedRouter(config, clock=lambda: now, refresh=False, event_listeners=[log])
        out["startup_s"], out["startup_cpu_s"] = time.perf_counter() - t0, time.process_time() - c0
        try:
            router.write_many(_items(now, 0))
            router.read(77, limit=10)
            out["after"] = {"threads": threading.active_count(), "rss_mb": _rss_mb(), "clients": len(router.clusters.clients.open())}
            log.on = True
            router.write_many(_items(now, 1))
            router.read(77, limit=10)
            log.on = False
        finally:
            router.close()
    else:
        async def run() -> None:
            t0, c0 = time.perf_counter(), time.process_time()
            router = await AsyncFeedRouter(config, clock=lambda: now, refresh=False, event_listeners=[log]).start()
            out["startup_s"], out["startup_cpu_s"] = time.perf_counter() - t0, time.process_time() - c0
            try:
                await router.write_many(_items(now, 0))
                await router.read(77, limit=10)
                out["after"] = {"threads": threading.active_count(), "rss_mb": _rss_mb(),
                                "clients": len(router.clusters.clients.open())}
                log.on = True
                await router.write_many(_items(now, 1))
                await router.read(77, limit=10)
                log.on = False
            finally:
                await router.close()

        asyncio.run(run())
    out["commands"] = sorted(f"{c.name} {c.collection}" for c in log.commands)
    return out


def metadata_by_hand(config: RouterConfig, door: str) -> tuple[float, float]:
    """Wall and CPU seconds of every period's metadata find written by hand on *door*'s pymongo client.

    The router's start-up reads without its own code: one client per server with the cold
    clients' options, ``find({}, limit=10)`` per period under ``pymongo.timeout``, at most
    ``Clusters.WORKERS_PER_CLUSTER`` at a time per server (threads for sync, a semaphore
    on the event loop for async).
    """
    bound = Clusters.WORKERS_PER_CLUSTER
    uris = sorted({c.uri for c in config.clusters})
    finds = [(c.uri, config.database_for(c)) for c in config.clusters]
    options = client_options(config.clusters[0], COLD_OPTIONS)
    name, timeout = config.metadata_collection, config.timeout.total_seconds()
    if door == "sync":
        clients = {u: MongoClient(u, **options) for u in uris}
        pools = {u: ThreadPoolExecutor(bound) for u in uris}

        def one(uri: str, db: str) -> list[dict[str, Any]]:
            with pymongo.timeout(timeout):
                return clients[uri][db][name].find({}, limit=10).to_list()

        t0, c0 = time.perf_counter(), time.process_time()
        for future in [pools[u].submit(one, u, db) for u, db in finds]:
            future.result()
        spent = time.perf_counter() - t0, time.process_time() - c0
        for pool in pools.values():
            pool.shutdown()
        for client in clients.values():
            client.close()
        return spent

    async def run() -> tuple[float, float]:
        aclients = {u: AsyncMongoClient(u, **options) for u in uris}
        slots = {u: asyncio.Semaphore(bound) for u in uris}

        async def one(uri: str, db: str) -> list[dict[str, Any]]:
            async with slots[uri]:
                with pymongo.timeout(timeout):
                    return await aclients[uri][db][name].find({}, limit=10).to_list()

        t0, c0 = time.perf_counter(), time.process_time()
        await asyncio.gather(*(one(u, db) for u, db in finds))
        spent = time.perf_counter() - t0, time.process_time() - c0
        for client in aclients.values():
            await client.close()
        return spent

    return asyncio.run(run())


def _child(uris: Sequence[str], prefix: str, total: int, count: int, door: str, *, by_hand: bool = False) -> dict[str, Any]:
    args = [sys.executable, "-m", "harness.bench.scale", "--child", "--uris", ",".join(uris), "--prefix", prefix,
            "--total", str(total), "--count", str(count), "--door", door, *(["--by-hand"] if by_hand else [])]
    done = subprocess.run(args, capture_output=True, text=True, check=True, timeout=600)
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def bench_scale(uris: Sequence[str], sizes: Sequence[int] = SIZES) -> list[Result]:
    """Start-up, threads, RSS and commands per call over *sizes* periods, both doors; one Result per measure."""
    prefix = f"scale_{uuid.uuid4().hex[:8]}"
    fleet = fleet_config(uris, max(sizes), prefix=prefix)
    register_fleet(fleet)
    try:
        runs = {(door, n): _child(uris, prefix, max(sizes), n, door, by_hand=n == max(sizes))
                for door in ("sync", "async") for n in (3, *sizes)}
    finally:
        drop_fleet(fleet)
    results = []
    for door in ("sync", "async"):
        row = [runs[(door, n)] for n in sizes]
        biggest, smallest = row[-1], row[0]
        starts = [r["startup_s"] for r in row]
        hand, hand_cpu = biggest["by_hand_s"], biggest["by_hand_cpu_s"]
        threads = [r["after"]["threads"] - r["before"]["threads"] for r in row]
        rss = [r["after"]["rss_mb"] - r["before"]["rss_mb"] for r in row]
        sizes_text = ", ".join(f"{n:,}" for n in sizes)
        results.append(Result(
            f"scale_startup_{door}", f"{door} router start-up over {sizes_text} periods on 3 servers (raw: its "
            f"{sizes[-1]:,} metadata finds by hand)", "s", starts, [hand], [starts[-1] / hand], "< 3 s at the most",
            starts[-1] < 3.0,
            note=f"{door}: start-up " + ", ".join(f"{s:.2f} s" for s in starts) + f" for {sizes_text} periods; at "
                 f"{sizes[-1]:,} it used {biggest['startup_cpu_s']:.2f} s of CPU; the same {sizes[-1]:,} metadata finds "
                 f"by hand on pymongo's {'MongoClient' if door == 'sync' else 'AsyncMongoClient'} (same options, 4 at "
                 f"a time per server) took {hand:.2f} s, {hand_cpu:.2f} s of CPU",
        ))
        results.append(Result(
            f"scale_threads_{door}", f"{door} router threads added over {sizes_text} periods", "threads",
            [float(t) for t in threads], [], [], "flat", threads[-1] <= threads[0] + 2,
            note=f"{door}: {', '.join(map(str, threads))} threads added, {biggest['after']['clients']} clients open "
                 f"after a write and a read (at {smallest['periods']:,} periods: {smallest['after']['clients']})",
        ))
        results.append(Result(
            f"scale_rss_{door}", f"{door} router RSS growth over {sizes_text} periods", "MB", rss, [], [],
            "< 50 MB at the most", rss[-1] < 50.0,
            note=f"{door}: RSS grew " + ", ".join(f"{m:.1f} MB" for m in rss) + f" for {sizes_text} periods",
        ))
        three, most = runs[(door, 3)]["commands"], biggest["commands"]
        results.append(Result(
            f"scale_commands_{door}", f"{door} commands for one write and one page read, 3 vs {sizes[-1]:,} periods",
            "commands", [float(len(most))], [float(len(three))], [], "the same commands", most == three,
            note=f"{door}: at 3 periods {three}; at {sizes[-1]:,} {most}",
        ))
    return results


def main(argv: Sequence[str] | None = None) -> int:
    """The child: ``--child --uris U1,U2,U3 --prefix P --count N --door sync|async``; prints its figures as JSON."""
    parser = argparse.ArgumentParser(prog="python -m harness.bench.scale")
    parser.add_argument("--child", action="store_true", required=True)
    parser.add_argument("--uris", required=True)
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--total", type=int, required=True)
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--door", choices=("sync", "async"), required=True)
    parser.add_argument("--by-hand", action="store_true", help="also time the metadata finds written by hand")
    args = parser.parse_args(argv)
    fleet = fleet_config(args.uris.split(","), args.total, prefix=args.prefix)
    config = _subset(fleet, args.count)
    out = measure(config, args.door, now_in(args.total))
    if args.by_hand:
        out["by_hand_s"], out["by_hand_cpu_s"] = metadata_by_hand(config, args.door)
    json.dump(out, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
