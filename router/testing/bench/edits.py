"""Measures of edits: delete(data_key) over every cluster."""

from __future__ import annotations

import os
import statistics
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from pymongo import MongoClient

from ...ids import data_key
from ...model import FeedItem
from ...sync import FeedRouter
from .common import NOW, P0, P1, P2, Result, bench_config, interleave, make_items, register, timed


def bench_delete(uris: Sequence[str], reps: int, copies: int) -> Result:
    """delete(data_key) across 3 clusters (in parallel) vs the slowest single-cluster raw delete."""
    config = bench_config(uris, "bench_delete")
    register(config)
    clients: list[MongoClient[dict[str, Any]]] = [MongoClient(u, tz_aware=True) for u in uris]
    key = data_key("fabula", 424242)
    with FeedRouter(config, clock=lambda: NOW, refresh=False) as router:
        router.write_many(make_items(3_000, receivers=500))  # other items, so the deletes have something to skip
        copy_items = [FeedItem(receiver_id=r, sender_id=1, event_time=t, type=1, data={"fabula_id": 424242}, data_key=key)
                      for r in range(copies) for t in (P0 + timedelta(days=9), P1 + timedelta(days=9), P2 + timedelta(days=9))]

        def run_router() -> float:
            router.write_many(copy_items)
            return timed(lambda: router.delete(key)) * 1e3

        sums: list[float] = []

        def run_raw() -> float:
            router.write_many(copy_items)
            each = []
            for client in clients:
                feed = client["bench_delete"].feed
                each.append(timed(lambda: feed.delete_many({"data_key": key})))
            sums.append(sum(each) * 1e3)
            return max(each) * 1e3

        r, w = interleave(reps, run_router, run_raw)
    for c in clients:
        c.close()
    ratios = [a / b for a, b in zip(r, w)]
    note = (f"the three single-cluster deletes one after another take {statistics.median(sums):.1f} ms (median); "
            f"the router's parallel delete takes {statistics.median(r):.1f} ms, "
            f"{statistics.median(r) / statistics.median(sums):.2f} of that, on {os.cpu_count()} cores shared with the servers")
    return Result("delete_ratio", f"delete(data_key), {copies} copies in each of 3 clusters, vs slowest single cluster",
                  "ms", r, w, ratios, "<= 1.3", statistics.median(ratios) <= 1.3, note)
