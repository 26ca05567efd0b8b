"""Each door against its own baseline: the router's reads vs the same finds written by hand on the same driver.

``async_door_ratio`` compares ``AsyncFeedRouter.read`` with the find it sends, written by
hand on an ``AsyncMongoClient`` with the router's client options, on the same event loop:
the same filter, sort and limit, the same data (a page the newest cluster fills, so one
find per read), the same number of reads at once, the same client options (60 s timeouts:
a throughput measure on a loaded machine must not time out). ``read_cpu_async`` and
``read_cpu_sync`` give the router's own share of the client's CPU per read on each door:
the process's CPU time per read through the router, less the CPU time per read of the
same finds by hand (on the same event loop, or on the same 16 threads), as a share of the
router's.
Router and hand-written runs alternate which goes first, after a warm-up of each.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import timedelta
from typing import Any

import attrs
from pymongo import AsyncMongoClient, MongoClient

from router.aio import AsyncFeedRouter
from router.config import RouterConfig
from router.storage.clients import client_options
from router.sync import FeedRouter
from .common import NOW, P2, Result, bench_config, make_items, register, with_client_options

__all__ = ["bench_doors"]

SORT = [("event_time", -1), ("_id", -1)]
#: One figure: reads per second and client CPU microseconds per read.
Figure = tuple[float, float]


def _figure(count: int, began: tuple[float, float]) -> Figure:
    return count / (time.perf_counter() - began[0]), (time.process_time() - began[1]) / count * 1e6


async def _async_pairs(config: RouterConfig, receivers: list[int], limit: int, reps: int) -> tuple[list[Figure], list[Figure]]:
    newest = config.clusters[-1]
    hand: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(newest.uri, **client_options(newest))
    feed = hand[config.database_for(newest)][config.feed_collection]
    try:
        async with AsyncFeedRouter(config, clock=lambda: NOW, refresh=False) as feeds:
            async def by_router(r: int) -> Any:
                return (await feeds.read(r, limit=limit)).items

            async def by_hand(r: int) -> Any:
                return await feed.find({"receiver_id": r}, sort=SORT, limit=limit).to_list()

            async def once(read: Callable[[int], Awaitable[Any]]) -> Figure:
                began = time.perf_counter(), time.process_time()
                pages = await asyncio.gather(*(read(r) for r in receivers))
                assert all(len(p) == limit for p in pages), "a page the newest period fills"
                return _figure(len(receivers), began)

            await by_router(receivers[0])  # one read first: until a client knows its server, a read may wait only
            await by_hand(receivers[0])  # serverSelectionTimeoutMS (the router's rule), too short for 200 queued reads
            await once(by_router)  # warm-up: connections
            await once(by_hand)
            routed, handed = [], []
            for rep in range(reps):
                first, second = (by_router, by_hand) if rep % 2 == 0 else (by_hand, by_router)
                a, b = await once(first), await once(second)
                routed.append(a if first is by_router else b)
                handed.append(b if first is by_router else a)
            return routed, handed
    finally:
        await hand.close()


def _sync_pairs(config: RouterConfig, receivers: list[int], limit: int, reps: int) -> tuple[list[Figure], list[Figure]]:
    newest = config.clusters[-1]
    hand: MongoClient[dict[str, Any]] = MongoClient(newest.uri, **client_options(newest))
    feed = hand[config.database_for(newest)][config.feed_collection]
    with FeedRouter(config, clock=lambda: NOW, refresh=False) as router, concurrent.futures.ThreadPoolExecutor(16) as pool:
        def once(read: Callable[[int], Any]) -> Figure:
            began = time.perf_counter(), time.process_time()
            pages = list(pool.map(read, receivers))
            assert all(len(p) == limit for p in pages), "a page the newest period fills"
            return _figure(len(receivers), began)

        def by_router(r: int) -> Any:
            return router.read(r, limit=limit).items

        def by_hand(r: int) -> Any:
            return feed.find({"receiver_id": r}, sort=SORT, limit=limit).to_list()

        by_router(receivers[0]), by_hand(receivers[0])  # as on the async door: one read, then a warm-up of each
        once(by_router), once(by_hand)
        routed, handed = [], []
        for rep in range(reps):
            if rep % 2:
                handed.append(once(by_hand))
                routed.append(once(by_router))
            else:
                routed.append(once(by_router))
                handed.append(once(by_hand))
    hand.close()
    return routed, handed


def _cpu_row(door: str, routed: list[Figure], handed: list[Figure], readers: int) -> Result:
    router_cpu, hand_cpu = [f[1] for f in routed], [f[1] for f in handed]
    shares = [1 - h / r for r, h in zip(router_cpu, hand_cpu)]
    where = "one event loop" if door == "async" else "16 threads"
    note = (f"{door}: client CPU per read (process time / reads, {readers} reads at once on {where}): router "
            f"{statistics.median(router_cpu):,.0f} us, the same find by hand {statistics.median(hand_cpu):,.0f} us; the "
            f"router's own share {statistics.median(shares):.0%} [{min(shares):.0%} - {max(shares):.0%}] of its CPU per read")
    return Result(f"read_cpu_{door}", f"client CPU per read, {door} door: router vs the same find by hand (reported)",
                  "us/read", router_cpu, hand_cpu, [r / h for r, h in zip(router_cpu, hand_cpu)], "-", True, note)


def bench_doors(uris: Sequence[str], reps: int, readers: int = 200, limit: int = 20) -> list[Result]:
    """*readers* reads at once of different receivers (200 in the full run), router vs hand-written finds, on each
    door: three rows."""
    base = bench_config(uris, "bench_doors")
    register(base)
    config = attrs.evolve(with_client_options(base, maxPoolSize=16, socketTimeoutMS=60_000), timeout=timedelta(seconds=60))
    receivers = [3_000_000 + i for i in range(readers)]
    with FeedRouter(config, clock=lambda: NOW, refresh=False) as router:  # two pages a receiver, in the newest period
        items = make_items(readers * limit * 2, receivers=readers, start=P2, end=NOW, key_offset=90_000)
        router.write_many([attrs.evolve(it, receiver_id=r) for it, r in zip(items, receivers * limit * 2)])
    a_routed, a_handed = asyncio.run(_async_pairs(config, receivers, limit, reps))
    s_routed, s_handed = _sync_pairs(config, receivers, limit, reps)
    ratios = [r[0] / h[0] for r, h in zip(a_routed, a_handed)]
    note = (f"{readers} reads of {limit} items at once, different receivers, one find each (the newest period fills the "
            f"page), maxPoolSize 16: AsyncFeedRouter.read {statistics.median(r[0] for r in a_routed):,.0f} reads/s, the "
            f"same find by hand on AsyncMongoClient on the same loop {statistics.median(h[0] for h in a_handed):,.0f} reads/s "
            f"(the router's find also carries its deadline as maxTimeMS)")
    return [
        Result("async_door_ratio", f"{readers} concurrent reads: AsyncFeedRouter.read vs the same finds on AsyncMongoClient",
               "reads/s", [r[0] for r in a_routed], [h[0] for h in a_handed], ratios, ">= 0.95",
               statistics.median(ratios) >= 0.95, note),
        _cpu_row("async", a_routed, a_handed, readers),
        _cpu_row("sync", s_routed, s_handed, readers),
    ]
