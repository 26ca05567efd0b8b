"""Measures of the notification calls: an unseen count against one raw count, and what a type index would cost."""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import attrs
from pymongo import MongoClient

from router.sync import FeedRouter
from .common import NOW, P2, PATIENT, Result, bench_config, interleave, make_items, register, timed

#: The index a type-filtered page would use, were it added (migrations/0004 explains why it is not).
TYPE_INDEX = [("receiver_id", 1), ("type", 1), ("event_time", -1), ("_id", -1)]


def bench_unseen(uris: Sequence[str], reps: int, rounds: int) -> Result:
    """``unseen_count`` (marker find, then one count) vs one raw ``count_documents`` of the same items."""
    config = bench_config(uris, "bench_unseen")
    register(config)
    raw: MongoClient[dict[str, Any]] = MongoClient(uris[2], tz_aware=True)
    coll = raw["bench_unseen"].feed
    with FeedRouter(config, clock=lambda: NOW, refresh=False) as router:
        router.write_many(make_items(5_000, receivers=50, start=P2, end=NOW))
        receiver = 1_000_007
        page = router.read(receiver, limit=100)
        router.mark_seen(receiver, page.items[60])
        marker = page.items[60]
        newer = {"receiver_id": receiver, "$or": [{"event_time": {"$gt": marker.event_time}},
                                                  {"event_time": marker.event_time, "_id": {"$gt": marker.id}}]}

        def run_router() -> float:
            return statistics.median(timed(lambda: router.unseen_count(receiver)) for _ in range(rounds)) * 1e3

        def run_raw() -> float:
            return statistics.median(timed(lambda: coll.count_documents(newer, limit=100)) for _ in range(rounds)) * 1e3

        counted = (router.unseen_count(receiver).count, coll.count_documents(newer, limit=100))
        r_ms, w_ms = interleave(reps, run_router, run_raw)
    raw.close()
    ratios = [r / w for r, w in zip(r_ms, w_ms)]
    ok = counted == (60, 60) and statistics.median(ratios) <= 2.5
    note = (f"both count {counted[0]} items newer than the marker; the router asks the newest cluster twice "
            "(the marker, then the count), the raw call once")
    return Result("unseen_count", "unseen count vs one raw count (ms)", "ms", r_ms, w_ms, ratios, "<= 2.5", ok, note)


def bench_type_index(uris: Sequence[str], writes: int, reps: int, rounds: int) -> Result:
    """Write rate with the extra type index over without it; and a rare type's filtered page against a plain page."""
    # A rate, not a deadline: 30,000 items with the extra index took over the default 10 s on a loaded 2-core machine.
    config = attrs.evolve(bench_config(uris, "bench_types"), timeout=PATIENT)
    register(config)
    raw: MongoClient[dict[str, Any]] = MongoClient(uris[2], tz_aware=True)
    coll = raw["bench_types"].feed
    with FeedRouter(config, clock=lambda: NOW, refresh=False) as router:
        receiver = 1_000_003
        mixed = [attrs.evolve(it, type=7 if i % 10 == 0 else 1)
                 for i, it in enumerate(make_items(2_000, receivers=1, start=P2, end=NOW, key_offset=50_000))]
        router.write_many([attrs.evolve(it, receiver_id=receiver) for it in mixed])

        def page(types: list[int] | None) -> float:
            return statistics.median(timed(lambda: router.read(receiver, limit=50, types=types)) for _ in range(rounds)) * 1e3

        filtered, plain = interleave(reps, lambda: page([7]), lambda: page(None))
        rates: dict[bool, list[float]] = {True: [], False: []}
        for rep in range(reps):
            for indexed in ((True, False) if rep % 2 else (False, True)):
                if indexed:
                    coll.create_index(TYPE_INDEX, name="bench_type")
                items = make_items(writes, receivers=5000, start=P2 + timedelta(days=1), end=NOW,
                                   key_offset=100_000 * (rep + 1) + (50_000 if indexed else 0))
                began = time.perf_counter()
                router.write_many(items)
                rates[indexed].append(len(items) / (time.perf_counter() - began))
                if indexed:
                    coll.drop_index("bench_type")
    raw.close()
    ratios = [w / o for w, o in zip(rates[True], rates[False])]
    read_cost = statistics.median(filtered) / statistics.median(plain)
    ok = read_cost <= 3.0
    note = (f"a page of a type 1 in 10 items have, without a type index: {statistics.median(filtered):.1f} ms vs "
            f"{statistics.median(plain):.1f} ms for an unfiltered page ({read_cost:.2f}x; target <= 3); writes with "
            f"the extra index {TYPE_INDEX} run at {statistics.median(rates[True]):,.0f}/s vs "
            f"{statistics.median(rates[False]):,.0f}/s without (ratio shown)")
    return Result("type_index", "write rate with a type index / without (docs/s)", "docs/s", rates[True], rates[False],
                  ratios, "page <= 3x", ok, note)
