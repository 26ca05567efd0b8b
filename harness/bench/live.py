"""Measures of live feeds: what pushing costs a fan-out, how fast a write reaches a subscriber, what one costs idle.

* ``live_fanout_idle`` / ``live_fanout_1pct``: fan-out throughput with ``push:`` configured and nobody
  connected, and with 1% of the receivers subscribed (in this process, on an asyncio loop of their own),
  each against the same fan-out with no ``push:`` (today's), the three alternating in every repetition;
  targets >= 0.97 and >= 0.90.
* ``live_write_idle``: ``write_many`` throughput with ``push:`` and nobody connected vs no ``push:``
  (reported: the items are looked up in the presence set, encoded only for members present).
* ``live_latency_<n>``: write-to-delivery latency with *n* subscribers in one process (one
  ``AsyncFeedRouter``, a consumer task each): a ``write`` to a random subscribed receiver, timed from
  the call to the subscriber's hand; the note gives p50 and p99, and from the write's return.
* ``live_idle_memory``: Python memory per idle subscriber (tracemalloc, the subscription open and
  caught up, no consumer task), and Redis memory per subscriber (``INFO memory``: its channel and
  its presence entry).

A local Redis of its own (:class:`harness.redis.LocalRedis`); figures on this machine are for indication only
(2 shared cores: see the load in the run's environment).
"""

from __future__ import annotations

import asyncio
import random
import statistics
import threading
import time
import tracemalloc
from collections.abc import Coroutine, Sequence
from datetime import timedelta
from typing import Any, TypeVar

import attrs
import redis
from pymongo import MongoClient

from router import Activity, AsyncFeedRouter, AsyncSubscription, FeedItem, NewItem, RouterConfig, data_key
from router.observe import Event, Metrics
from router.pushconfig import PushConfig
from router.sync import FeedRouter
from ..redis import LocalRedis
from .common import NOW, P2, Result, bench_config, interleave, make_items, register, timed

__all__ = ["LIVE_SIZES", "LiveSizes", "bench_live", "bench_live_write"]

T = TypeVar("T")
FIRST = 10_000_000


@attrs.frozen
class LiveSizes:
    """Receivers of the fan-out rows and their repetitions (after a warm-up of each, unless one repetition);
    subscriber counts of the latency rows, writes timed per count; subscribers opened for the memory row."""

    fanout: int
    reps: int
    subscribers: tuple[int, ...]
    writes: int
    idle: int
    #: Items of the write_many row.
    items: int = 30_000
    #: Repetitions of the write_many row (its :func:`~harness.bench.common.interleave`).
    write_reps: int = 5


LIVE_SIZES = {
    "full": LiveSizes(fanout=200_000, reps=3, subscribers=(1_000, 10_000), writes=200, idle=10_000, items=30_000,
                      write_reps=5),
    "small": LiveSizes(fanout=2_000, reps=1, subscribers=(20, 100), writes=20, idle=100, items=1_000, write_reps=1),
}


class _Pushed(Metrics):
    """Counts the messages Redis handed to subscriber processes."""

    def __init__(self) -> None:
        self.messages = 0.0

    def record(self, event: Event) -> None:
        if event.name == "pushed":
            self.messages += event.value


class _Loop:
    """An event loop on a thread of its own, for the subscribers."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="bench-live-loop", daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(30)
        self.loop.close()


def _pushed(config: RouterConfig, url: str, prefix: str) -> RouterConfig:
    return attrs.evolve(config, push=PushConfig(redis=url, prefix=prefix))


async def _open(feeds: AsyncFeedRouter, receivers: Sequence[int]) -> list[AsyncSubscription]:
    """Subscriptions of *receivers*, subscribed and caught up, 200 at a time."""
    subs: list[AsyncSubscription] = []
    for start in range(0, len(receivers), 200):
        chunk = [feeds.subscribe(r) for r in receivers[start:start + 200]]
        await asyncio.gather(*(s.get(timeout=0) for s in chunk))
        subs += chunk
    return subs


async def _close(subs: Sequence[AsyncSubscription]) -> None:
    await asyncio.gather(*(s.close() for s in subs))


def bench_live(uris: Sequence[str], sizes: LiveSizes) -> list[Result]:
    """The live feeds' rows (see the module's docs)."""
    with LocalRedis() as server:
        return [*_fanout_rows(uris, server.url, sizes), *_latency_rows(uris, server.url, sizes),
                _memory_row(uris, server.url, sizes)]


def bench_live_write(uris: Sequence[str], sizes: LiveSizes) -> Result:
    """The ``write_many`` row (a step of its own: ``scripts/bench --only live_write``)."""
    with LocalRedis() as server:
        return _write_row(uris, server.url, sizes)


def _write_row(uris: Sequence[str], url: str, sizes: LiveSizes) -> Result:
    patient = timedelta(seconds=60)  # one write_many of every item: on a loaded machine 10 s is not always enough
    plain_config = attrs.evolve(bench_config(uris, "bench_live_w0"), timeout=patient)
    pushed_config = _pushed(attrs.evolve(bench_config(uris, "bench_live_w1"), timeout=patient), url, "bench-write")
    for config in (plain_config, pushed_config):
        register(config)
    clients: list[MongoClient[dict[str, Any]]] = [MongoClient(u) for u in uris]
    items = make_items(sizes.items)
    with FeedRouter(plain_config, clock=lambda: NOW, refresh=False) as plain, \
            FeedRouter(pushed_config, clock=lambda: NOW, refresh=False) as pushed:

        def run(router: FeedRouter) -> float:
            for client in clients:
                client[router.config.database].feed.delete_many({})
            return len(items) / timed(lambda: router.write_many(items))

        with_push, without = interleave(sizes.write_reps, lambda: run(pushed), lambda: run(plain))
    for client in clients:
        for config in (plain_config, pushed_config):
            client.drop_database(config.database)
        client.close()
    ratios = [a / b for a, b in zip(with_push, without)]
    return Result("live_write_idle", f"write_many throughput, push: and nobody connected vs no push: "
                  f"({len(items):,} items over 3 clusters)", "items/s", with_push, without, ratios, "-", True,
                  f"{sizes.write_reps} repetitions alternating which goes first; a push per write_many: one round trip "
                  "(TIME, ZMSCORE) that finds nobody, nothing encoded")


def _fanout_rows(uris: Sequence[str], url: str, sizes: LiveSizes) -> list[Result]:
    base = bench_config(uris, "bench_live")
    register(base)
    idle, busy = _pushed(base, url, "bench-idle"), _pushed(base, url, "bench-busy")
    raw: MongoClient[dict[str, Any]] = MongoClient(uris[2], tz_aware=True)
    n = sizes.fanout
    when = P2 + timedelta(days=5)
    counter = iter(range(1, 1_000_000))
    watched = list(range(FIRST, FIRST + n, 100))  # 1%
    loop = _Loop()
    pushed = _Pushed()
    subscribers = AsyncFeedRouter(busy, clock=lambda: NOW, refresh=False)
    try:
        loop.run(subscribers.start())
        began = time.perf_counter()
        subs = loop.run(_open(subscribers, watched))
        opened = time.perf_counter() - began
        with FeedRouter(base, clock=lambda: NOW, refresh=False) as plain, \
                FeedRouter(idle, clock=lambda: NOW, refresh=False) as alone, \
                FeedRouter(busy, clock=lambda: NOW, refresh=False, metrics=pushed) as heard:

            def run(router: FeedRouter) -> float:
                raw["bench_live"].feed.delete_many({})
                k = next(counter)
                post = Activity(sender_id=1_000_765, event_time=when, type=1, data={"fabula_id": k},
                                data_key=data_key("live-bench", k))
                return n / timed(lambda: router.fan_out(post, range(FIRST, FIRST + n)))

            if sizes.reps > 1:  # warm up (one repetition, the small run's, checks that the rows run: none)
                for router in (plain, alone, heard):
                    run(router)
            warm_pushes = pushed.messages
            today: list[float] = []
            quiet: list[float] = []
            listened: list[float] = []
            orders = [(plain, today), (alone, quiet), (heard, listened)]
            for rep in range(sizes.reps):
                for router, into in orders[rep % 3:] + orders[:rep % 3]:  # each goes first in turn
                    into.append(run(router))
        delivered = pushed.messages - warm_pushes
        loop.run(_close(subs))
    finally:
        loop.run(subscribers.close())
        loop.close()
        raw.drop_database("bench_live")
        raw.close()
    idle_ratios = [a / b for a, b in zip(quiet, today)]
    busy_ratios = [a / b for a, b in zip(listened, today)]
    shared = (f"{n:,} receivers per fan-out, batches of {base.batch_size}, {sizes.reps} repetitions alternating "
              "which goes first")
    return [
        Result("live_fanout_idle", f"fan-out throughput, push: and nobody connected vs no push: ({n:,} receivers)",
               "copies/s", quiet, today, idle_ratios, ">= 0.97", statistics.median(idle_ratios) >= 0.97,
               f"{shared}; each batch one round trip to Redis that publishes nothing"),
        Result("live_fanout_1pct", f"fan-out throughput, 1% of receivers subscribed vs no push: ({n:,} receivers)",
               "copies/s", listened, today, busy_ratios, ">= 0.90", statistics.median(busy_ratios) >= 0.90,
               f"{shared}; {len(watched):,} subscribers in this process (opened in {opened:.1f} s), "
               f"{delivered:,.0f} messages delivered for {len(watched) * sizes.reps:,} copies expected"),
    ]


def _latency_rows(uris: Sequence[str], url: str, sizes: LiveSizes) -> list[Result]:
    rows = []
    for count in sizes.subscribers:
        config = _pushed(bench_config(uris, f"bench_live_{count}"), url, f"bench-latency-{count}")
        register(config)
        rows.append(_latency(config, count, sizes.writes))
        client: MongoClient[dict[str, Any]] = MongoClient(uris[2])
        client.drop_database(config.database)
        client.close()
    return rows


def _latency(config: RouterConfig, count: int, writes: int) -> Result:
    receivers = [FIRST + i for i in range(count)]
    arrived: dict[Any, float] = {}
    loop = _Loop()
    subscribers = AsyncFeedRouter(config, clock=lambda: NOW, refresh=False)

    async def consume(live: AsyncSubscription) -> None:
        async for event in live:
            if isinstance(event, NewItem):
                arrived[event.item.id] = time.perf_counter()

    try:
        loop.run(subscribers.start())
        subs = loop.run(_open(subscribers, receivers))

        async def start() -> list[asyncio.Task[None]]:
            return [asyncio.get_running_loop().create_task(consume(s)) for s in subs]

        tasks = loop.run(start())
        called: dict[Any, float] = {}
        returned: dict[Any, float] = {}
        rng = random.Random(7)
        with FeedRouter(config, clock=lambda: NOW, refresh=False) as writer:
            for k in range(writes):
                item = FeedItem(receiver_id=rng.choice(receivers), sender_id=1_000_765,
                                event_time=P2 + timedelta(days=6, seconds=k), type=1, data={"k": k},
                                data_key=data_key("latency", k))
                t0 = time.perf_counter()
                oid = writer.write(item)
                called[oid], returned[oid] = t0, time.perf_counter()
            deadline = time.monotonic() + 60
            while len(arrived) < writes and time.monotonic() < deadline:
                time.sleep(0.01)

        async def stop() -> None:
            await asyncio.gather(*(s.close() for s in subs))
            await asyncio.gather(*tasks, return_exceptions=True)

        loop.run(stop())
    finally:
        loop.run(subscribers.close())
        loop.close()
    late = [(arrived[o] - called[o]) * 1000 for o in called if o in arrived]
    after = [(arrived[o] - returned[o]) * 1000 for o in called if o in arrived]

    def pct(xs: list[float], q: float) -> float:
        return sorted(xs)[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")

    note = (f"{count:,} subscribers in one process (one AsyncFeedRouter, a task each), {writes} writes to random ones: "
            f"from the write call p50 {pct(late, 0.5):.2f} ms, p99 {pct(late, 0.99):.2f} ms; from its return p50 "
            f"{pct(after, 0.5):.2f} ms, p99 {pct(after, 0.99):.2f} ms; {len(late)} of {writes} delivered")
    return Result(f"live_latency_{count}", f"write-to-delivery latency, {count:,} subscribers in one process", "ms",
                  late, [], [], "-", len(late) == writes, note)


def _memory_row(uris: Sequence[str], url: str, sizes: LiveSizes) -> Result:
    config = _pushed(bench_config(uris, "bench_live_idle"), url, "bench-idle-memory")
    register(config)
    count = sizes.idle
    receivers = [FIRST + i for i in range(count)]
    loop = _Loop()
    feeds = AsyncFeedRouter(config, clock=lambda: NOW, refresh=False)
    info = redis.Redis.from_url(url)
    try:
        loop.run(feeds.start())
        loop.run(_open(feeds, receivers[:10]))  # the hub made and connected: not an idle subscriber's cost
        redis_before = int(info.info("memory")["used_memory"])
        tracemalloc.start()
        before = tracemalloc.take_snapshot()
        subs = loop.run(_open(feeds, receivers[10:]))
        after = tracemalloc.take_snapshot()
        tracemalloc.stop()
        redis_after = int(info.info("memory")["used_memory"])
        grown = sum(stat.size_diff for stat in after.compare_to(before, "filename"))
        loop.run(_close(subs))
    finally:
        loop.run(feeds.close())
        loop.close()
        info.close()
        client: MongoClient[dict[str, Any]] = MongoClient(uris[2])
        client.drop_database(config.database)
        client.close()
    opened = count - 10
    python = grown / opened
    kept = (redis_after - redis_before) / opened
    return Result("live_idle_memory", f"memory per idle subscriber ({opened:,} open: Python, Redis)", "bytes",
                  [python], [kept], [], "-", True,
                  f"Python (tracemalloc, the subscription open and caught up, no consumer task): {python:,.0f} bytes; "
                  f"Redis (INFO used_memory: its channel, its presence entry): {kept:,.0f} bytes")
