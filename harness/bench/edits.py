"""Measures of edits: delete(data_key) over every cluster; a delete of 400,000 copies; an update during a fan-out."""

from __future__ import annotations

import itertools
import os
import statistics
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

from pymongo import MongoClient

from router.errors import DeleteFailed
from router.ids import data_key
from router.model import Activity, FeedItem
from router.sync import FeedRouter
from .common import NOW, P0, P1, P2, Result, bench_config, interleave, make_items, register, timed


def bench_delete(uris: Sequence[str], reps: int, copies: int, each: int = 8) -> Result:
    """delete(data_key) across 3 clusters vs the same deletes sent raw to the 3 clusters at once: each cluster's copies
    and outbox entry (a thread each). A repetition times *each* deletes one after another, a new post each, and gives
    the milliseconds per delete: one delete of ~15 ms on 2 cores shared with the servers spreads too widely alone."""
    config = bench_config(uris, "bench_delete")
    register(config)
    clients: list[MongoClient[dict[str, Any]]] = [MongoClient(u, tz_aware=True) for u in uris]
    posts = itertools.count(424_242)

    def post_copies() -> tuple[str, list[FeedItem]]:
        """A post never deleted before (a delete is once per post), with *copies* copies in each period."""
        n = next(posts)
        key = data_key("fabula", n)
        return key, [FeedItem(receiver_id=r, sender_id=1, event_time=t, type=1, data={"fabula_id": n}, data_key=key)
                     for r in range(copies) for t in (P0 + timedelta(days=9), P1 + timedelta(days=9), P2 + timedelta(days=9))]

    collections = [client["bench_delete"][name] for client in clients for name in ("feed", "outbox")]
    with FeedRouter(config, clock=lambda: NOW, refresh=False) as router, ThreadPoolExecutor(len(collections)) as pool:
        router.write_many(make_items(3_000, receivers=500))  # other items, so the deletes have something to skip
        for collection in collections:
            collection.find_one({})  # each client connected before it is timed

        def posts_written() -> list[str]:
            keys = []
            for _ in range(each):
                key, items = post_copies()
                router.write_many(items)
                keys.append(key)
            return keys

        def run_router() -> float:
            keys = posts_written()
            return timed(lambda: [router.delete(key) for key in keys]) * 1e3 / each

        alone: list[float] = []

        def run_raw() -> float:
            keys = posts_written()
            each_feed: list[float] = []

            def one(collection: Any, key: str) -> int:
                began = time.perf_counter()
                deleted = int(collection.delete_many({"data_key": key}).deleted_count)
                if collection.name == "feed":
                    each_feed.append(time.perf_counter() - began)
                return deleted

            took = timed(lambda: [list(pool.map(one, collections, [key] * len(collections))) for key in keys]) * 1e3 / each
            alone.append(statistics.median(each_feed) * 1e3)
            return took

        r, w = interleave(reps, run_router, run_raw)
    for c in clients:
        c.close()
    ratios = [a / b for a, b in zip(r, w)]
    note = (f"the raw deletes (copies and outbox entry, the 3 clusters at once) take {statistics.median(w):.1f} ms "
            f"(median of {reps} repetitions of {each} deletes; a cluster's delete of copies {statistics.median(alone):.1f} "
            f"ms); the router's delete takes {statistics.median(r):.1f} ms: per cluster the tombstone, then the copies, "
            "the outbox entry and the superseded edit records at once (two round trips); a new post each time; on "
            f"{os.cpu_count()} cores shared with the servers")
    return Result("delete_ratio", f"delete(data_key), {copies} copies in each of 3 clusters, vs the same deletes sent raw "
                  "to the 3 clusters at once", "ms", r, w, ratios, "<= 1.3", statistics.median(ratios) <= 1.3, note)


def bench_big_edits(uris: Sequence[str], *, copies: int = 400_000, during: int = 40_000) -> list[Result]:
    """Two reported rows, with the default timeouts: ``delete`` of a post with *copies* copies in one cluster, and
    ``update`` of a post while its *during*-receiver background fan-out runs (then the old copies left once it ends)."""
    config = bench_config(uris, "bench_big_edits")
    register(config)
    raw: MongoClient[dict[str, Any]] = MongoClient(uris[2], tz_aware=True)
    feed = raw["bench_big_edits"].feed
    try:
        with FeedRouter(config, clock=lambda: NOW, refresh=False) as router:
            big = Activity(sender_id=1, event_time=P2 + timedelta(days=3), type=1, data={"v": 0}, data_key=data_key("big", 1))
            fanned = timed(lambda: router.fan_out(big, range(copies), concurrency=4))
            calls: list[float] = []
            removed = 0
            while feed.count_documents({"data_key": big.data_key}, limit=1):  # each further call makes progress
                started = time.perf_counter()
                try:
                    removed += router.delete(big.data_key)
                except DeleteFailed as exc:
                    removed += exc.deleted
                calls.append(time.perf_counter() - started)
                if len(calls) > 20:
                    break
            left = feed.count_documents({"data_key": big.data_key})
            delete = Result(
                "delete_big", f"delete(data_key) of a post with {copies:,} copies in one cluster (default timeouts)", "s",
                [sum(calls)], [], [], "-", left == 0,
                f"{len(calls)} call(s) ({', '.join(f'{c:.1f} s' for c in calls)}), {removed:,} copies counted, {left:,} "
                f"left; the fan-out that wrote them took {fanned:.1f} s ({copies / fanned:,.0f} copies/s)",
            )
            post = Activity(sender_id=2, event_time=P2 + timedelta(days=4), type=1, data={"v": 0}, data_key=data_key("big", 2))
            handle = router.fan_out(post, range(during), concurrency=4, background=True)
            while handle.progress.written < during // 4 and not handle.done():
                time.sleep(0.01)
            started = time.perf_counter()
            router.update(post.data_key, {"v": 1})
            took = time.perf_counter() - started
            at = handle.progress.written
            handle.result(timeout=600)
            old = feed.count_documents({"data_key": post.data_key, "data.v": 0})
            update = Result(
                "update_during_fanout", f"update(data_key) during its {during:,}-receiver background fan-out", "s",
                [took], [], [], "-", old == 0,
                f"the update began with {at:,} copies written and returned in {took:.2f} s; once the fan-out ended, "
                f"{old:,} copies held the old data (of {feed.count_documents({'data_key': post.data_key}):,})",
            )
    finally:
        raw.drop_database("bench_big_edits")
        raw.close()
    return [delete, update]
