"""Measures of the read path: commands per page and first-page latency."""

from __future__ import annotations

import asyncio
import concurrent.futures
import statistics
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import attrs
from pymongo import MongoClient

from router.aio import AsyncFeedRouter
from router.ids import data_key
from router.model import Activity
from router.sync import FeedRouter
from ..commands import CommandLog
from .common import NOW, P0, P1, P2, Result, bench_config, interleave, make_items, register, timed, with_client_options


def bench_pages(uris: Sequence[str]) -> Result:
    """Commands and documents per page: one cluster fills it; then a page spanning three clusters."""
    finds = CommandLog()
    config = bench_config(uris, "bench_pages", listener=finds)
    register(config)
    with FeedRouter(config, clock=lambda: NOW, refresh=False) as router:
        router.write_many(make_items(200, receivers=1, start=P2 + timedelta(days=1), end=NOW))
        spread = (make_items(10, receivers=1, start=P2, end=NOW, key_offset=10_000)
                  + make_items(10, receivers=1, start=P1, end=P2, key_offset=20_000)
                  + make_items(100, receivers=1, start=P0, end=P1, key_offset=30_000))
        router.write_many([attrs.evolve(it, receiver_id=7) for it in spread])
        finds.on = True
        one = router.read(1_000_000, limit=50)
        single = (finds.total("find"), finds.documents, len(one))
        finds.clear()
        three = router.read(7, limit=50)
        spanning = (finds.total("find"), finds.documents, len(three), len(set(three.sources)))
    # A page the newest cluster fills reads exactly its items. Older clusters are asked in waves, each for every
    # entry still missing, so a spanning page may read up to one page more than it serves (here the second wave asks
    # the 10-item and the 100-item clusters for 40 each at once): bounded, and the price of not asking one by one.
    ok = single == (1, 50, 50) and spanning[0] == spanning[3] == 3 and spanning[2] == 50 and spanning[1] <= 2 * spanning[2]
    note = (f"newest cluster fills the page: {single[0]} find, {single[1]} documents for {single[2]} items; "
            f"page over {spanning[3]} clusters: {spanning[0]} finds, {spanning[1]} documents for {spanning[2]} items")
    return Result("commands_per_page", "commands per page (finds; documents read per item served)", "finds",
                  [float(single[0]), float(spanning[0])], [1.0, 3.0], [float(single[1] - single[2]), float(spanning[1] - spanning[2])],
                  "1 find, docs = items; k finds, docs <= 2 x items (waves)", ok, note)


def bench_read(uris: Sequence[str], reps: int, rounds: int) -> Result:
    """First page through the router vs the same indexed find on the newest cluster with raw pymongo."""
    config = bench_config(uris, "bench_read")
    register(config)
    raw: MongoClient[dict[str, Any]] = MongoClient(uris[2], tz_aware=True)
    coll = raw["bench_read"].feed
    with FeedRouter(config, clock=lambda: NOW, refresh=False) as router:
        router.write_many(make_items(5_000, receivers=50, start=P2, end=NOW))
        receiver = 1_000_007

        def run_router() -> float:
            return statistics.median(timed(lambda: router.read(receiver, limit=50)) for _ in range(rounds)) * 1e3

        def run_raw() -> float:
            return statistics.median(
                timed(lambda: list(coll.find({"receiver_id": receiver}, sort=[("event_time", -1), ("_id", -1)], limit=50)))
                for _ in range(rounds)
            ) * 1e3

        r, w = interleave(reps, run_router, run_raw)
    raw.close()
    ratios = [a / b for a, b in zip(r, w)]
    return Result("read_ratio", "first page latency (50 items) vs one raw indexed find", "ms", r, w, ratios,
                  "<= 1.10", statistics.median(ratios) <= 1.10)


def bench_pull_pages(uris: Sequence[str], senders: int = 100, limit: int = 50) -> Result:
    """Paging a feed that pulls 100 senders: finds per cluster per page, documents sent per item served;
    and what publishing for a pulled author costs (inserts: its outbox entry and its registration by sender)."""
    commands = CommandLog()
    config = bench_config(uris, "bench_pull", listener=commands)
    register(config)
    with FeedRouter(config, clock=lambda: NOW, refresh=False) as router:
        names = [f"star-{i}" for i in range(senders)]
        span = (NOW - P0) / (senders * 3)
        for i in range(senders * 3):  # three posts per pulled author, spread over the three periods
            author = names[i % senders]
            activity = Activity(sender_id=author, event_time=P0 + span * i, type=1, data={"n": i},
                                data_key=data_key("pulled", i))
            if i == 0:
                commands.on = True
            router.publish(activity, (f for f in range(1_000_000)), pull=True)
            if i == 0:
                inserts = commands.total("insert")
                commands.on = False
                commands.clear(documents=False)
        router.write_many(make_items(120, receivers=1, start=P0, end=NOW, key_offset=50_000))  # the reader's own feed
        commands.on = True
        cursor, pages, served, worst = None, 0, 0, 0
        while True:
            commands.clear(documents=False)  # the documents add up over the pages
            page = router.read(1_000_000, limit=limit, cursor=cursor, pull=names)
            pages += 1
            served += len(page.items)
            worst = max([worst, *commands.count("find").values()])
            cursor = page.next_cursor
            if cursor is None:
                break
        documents = commands.documents
    expected = senders * 3 + 120
    ok = worst <= 2 and served == expected and inserts == 2
    note = (f"{pages} pages of {limit} pulling {senders} senders: at most {worst} finds per cluster per page; "
            f"{documents} documents sent for {served} items served ({documents / max(served, 1):.2f} per item); "
            f"publishing for a pulled author sent {inserts} inserts (its outbox entry and its posts registry entry)")
    return Result("pull_pages", f"pulled pages ({senders} senders): finds per cluster per page", "finds",
                  [float(worst)], [2.0], [documents / max(served, 1)], "<= 2 finds; docs/item", ok, note)


def bench_async_reads(uris: Sequence[str], reps: int, readers: int = 200) -> Result:
    """*readers* concurrent reads of different receivers (200 in the full run): AsyncFeedRouter on one event loop vs
    FeedRouter on 16 threads.

    Both get ``maxPoolSize: 16``, the connections 16 threads use; the async door with the
    default pool (100) is measured too, for the note: 200 reads at once then open 100
    connections to one server, which loads the local FerretDB more than it helps.
    """
    base = bench_config(uris, "bench_async_reads")
    register(base)
    config = with_client_options(base, maxPoolSize=16)
    receivers = [2_000_000 + i for i in range(readers)]

    async def async_rates(cfg: Any, count: int) -> list[float]:
        async with AsyncFeedRouter(cfg, clock=lambda: NOW, refresh=False) as feeds:
            async def once() -> float:
                began = time.perf_counter()
                await asyncio.gather(*(feeds.read(r, limit=20) for r in receivers))
                return readers / (time.perf_counter() - began)

            await once()  # warm-up: connections
            return [await once() for _ in range(count)]

    with FeedRouter(config, clock=lambda: NOW, refresh=False) as router:
        router.write_many(make_items(readers * 20, receivers=readers, start=P2, end=NOW, key_offset=70_000))
        with concurrent.futures.ThreadPoolExecutor(16) as pool:

            def run_sync() -> float:
                return readers / timed(lambda: list(pool.map(lambda r: router.read(r, limit=20), receivers)))

            run_sync()  # warm-up
            sync_rates, async_equal = [], []
            for _ in range(reps):  # alternate, so drift hits both
                sync_rates.append(run_sync())
                async_equal.extend(asyncio.run(async_rates(config, 1)))
    default_pool = asyncio.run(async_rates(base, max(1, reps // 2)))
    ratios = [a / s for a, s in zip(async_equal, sync_rates)]
    note = (f"{readers} reads of 20 items, different receivers, maxPoolSize 16 on both: async "
            f"{statistics.median(async_equal):,.0f} reads/s on one event loop, sync {statistics.median(sync_rates):,.0f} "
            f"reads/s on 16 threads; async with the default pool of 100: {statistics.median(default_pool):,.0f} reads/s")
    return Result("async_reads", f"{readers} concurrent reads: AsyncFeedRouter vs FeedRouter on 16 threads", "reads/s",
                  async_equal, sync_rates, ratios, ">= 1.0", statistics.median(ratios) >= 1.0, note)
