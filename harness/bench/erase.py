"""Measures for erasing a user: what an index on the sender costs the writers.

Erasing a user must find every copy they sent, in every receiver's feed, in every period.
The page index starts with the receiver and the edit index with the data_key, so neither
finds a sender's copies; an index on the sender would, at a cost on every copy written.
This measures that cost on fan-out (the writer of most copies) and on ``write_many``, with
the index and without, alternating, in one run on the same server.

Example::

    row = bench_sender_index(uris, copies=20_000, reps=3)
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from pymongo import MongoClient

from router.ids import data_key
from router.model import Activity
from router.sync import FeedRouter

from .common import NOW, P2, Result, bench_config, make_items, register

__all__ = ["SENDER_INDEX", "bench_sender_index"]

#: The index erasure would use to find a sender's copies in a copies period.
SENDER_INDEX = [("sender_id", 1)]


def bench_sender_index(uris: Sequence[str], *, copies: int = 50_000, writes: int = 20_000, reps: int = 3) -> Result:
    """Fan-out rate (and write_many rate, in the note) with a sender index over without it."""
    config = bench_config(uris, "bench_sender_index")
    register(config)
    raw: MongoClient[dict[str, Any]] = MongoClient(uris[2], tz_aware=True)
    coll = raw["bench_sender_index"].feed
    fan: dict[bool, list[float]] = {True: [], False: []}
    many: dict[bool, list[float]] = {True: [], False: []}
    try:
        with FeedRouter(config, clock=lambda: NOW, refresh=False) as router:
            for rep in range(reps + 1):  # the first repetition warms up
                for indexed in ((True, False) if rep % 2 else (False, True)):
                    if indexed:
                        coll.create_index(SENDER_INDEX, name="bench_sender")
                    n = 2 * rep + indexed
                    post = Activity(sender_id=n, event_time=P2 + timedelta(days=1, milliseconds=n), type=1,
                                    data={"post": n}, data_key=data_key("sender-bench", n))
                    began = time.perf_counter()
                    router.fan_out(post, range(copies))
                    fan_rate = copies / (time.perf_counter() - began)
                    items = make_items(writes, receivers=5_000, start=P2 + timedelta(days=2), end=NOW,
                                       key_offset=1_000_000 * (n + 1))
                    began = time.perf_counter()
                    router.write_many(items)
                    many_rate = writes / (time.perf_counter() - began)
                    if rep:
                        fan[indexed].append(fan_rate)
                        many[indexed].append(many_rate)
                    if indexed:
                        coll.drop_index("bench_sender")
    finally:
        raw.drop_database("bench_sender_index")
        raw.close()
    ratios = [a / b for a, b in zip(fan[True], fan[False])]
    many_ratio = statistics.median(a / b for a, b in zip(many[True], many[False]))
    note = (f"fan-out of {copies:,} copies: {statistics.median(fan[True]):,.0f}/s with {SENDER_INDEX} vs "
            f"{statistics.median(fan[False]):,.0f}/s without; write_many of {writes:,} items: "
            f"{statistics.median(many[True]):,.0f}/s vs {statistics.median(many[False]):,.0f}/s (ratio {many_ratio:.3f})")
    return Result("sender_index", "fan-out rate with a sender index / without (copies/s)", "copies/s", fan[True],
                  fan[False], ratios, "-", True, note)
