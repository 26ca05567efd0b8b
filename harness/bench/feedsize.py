"""Page latency against the size of the receiver's feed, in each layout.

On MongoDB the page index ``{receiver_id, event_time, _id}`` hands a page its 50 items in
order, whatever the feed's size. FerretDB 2 on DocumentDB uses the index for the
``receiver_id`` match only and then sorts every item of the receiver (a Sort node over a
bitmap scan; see :mod:`harness.bench.plans`), so a copies page costs more as the
feed grows; a buckets page sorts the receiver's buckets, fifty times fewer documents.
This measures both, on the same server, for receivers holding 100 to 20,000 items.

Example::

    rows = bench_feed_size(uris, sizes=(100, 1_000, 20_000), rounds=15)
"""

from __future__ import annotations

import logging
import statistics
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from pymongo import MongoClient
from pymongo.errors import PyMongoError

from router.admin.migrate import discover
from router.admin.periods import apply_period, plan_period
from router.config import ClusterConfig, RouterConfig
from router.ids import data_key
from router.model import FeedItem
from router.storage.clusters import Clusters
from router.sync import FeedRouter
from .common import NAMES, NOW, P0, P1, P2, Result, timed

__all__ = ["bench_feed_size"]

logger = logging.getLogger(__name__)

PAGE = 50
_CHUNK = 1_000


def _config(uri: str, database: str, layout: str) -> RouterConfig:
    config = RouterConfig(
        database=database, timeout=timedelta(seconds=60),
        clusters=tuple(ClusterConfig(name=n, uri=uri, options={}, database=f"{database}_{i}") for i, n in enumerate(NAMES)),
    )
    with Clusters(config) as clusters:
        for name, (start, end) in zip(NAMES, ((P0, P1), (P1, P2), (P2, None))):
            change = plan_period(clusters, name=name, start=start, end=end, creator="bench", now=start, layout=layout)
            apply_period(clusters, change, migrations=discover())
    return config


def _load(router: FeedRouter, receiver: int, count: int) -> None:
    """*count* items of *receiver*, spread over the newest period (the one every page here reads)."""
    start, step = P2 + timedelta(days=1), (NOW - P2 - timedelta(days=2)) / count
    items = [FeedItem(receiver_id=receiver, sender_id=7, event_time=start + step * i, type=1, data={"n": i},
                      data_key=data_key("size", receiver * 1_000_000 + i)) for i in range(count)]
    for i in range(0, count, _CHUNK):
        router.write_many(items[i:i + _CHUNK])


def bench_feed_size(uris: Sequence[str], *, sizes: Sequence[int] = (100, 1_000, 20_000), rounds: int = 15,
                    reps: int = 3) -> list[Result]:
    """One row per layout: the newest page's median latency at each feed size (router column, in *sizes* order);
    the ratios are each size's latency over the smallest's. Reported, not judged."""
    uri = uris[-1]
    rows: list[Result] = []
    raw: MongoClient[dict[str, Any]] = MongoClient(uri, tz_aware=True)
    try:
        for layout in ("copies", "buckets"):
            config = _config(uri, f"bench_size_{layout}", layout)
            try:
                with FeedRouter(config, clock=lambda: NOW, refresh=False) as router:
                    for size in sizes:
                        _load(router, 2_000_000 + size, size)
                    per_size: dict[int, list[float]] = {size: [] for size in sizes}
                    for rep in range(reps + 1):  # the first repetition warms up
                        for size in (sizes if rep % 2 else list(reversed(sizes))):
                            ms = statistics.median(
                                timed(lambda: router.read(2_000_000 + size, limit=PAGE)) for _ in range(rounds)) * 1e3
                            if rep:
                                per_size[size].append(ms)
                medians = [statistics.median(per_size[size]) for size in sizes]
                rows.append(Result(
                    f"page_vs_feed_size_{layout}",
                    f"newest page of {PAGE} ({layout}) for receivers holding {', '.join(f'{s:,}' for s in sizes)} items",
                    "ms", medians, [], [m / medians[0] for m in medians], "-", True,
                    f"{layout}: " + ", ".join(f"{s:,} items {m:.2f} ms" for s, m in zip(sizes, medians))
                    + f" (median of {reps} repetitions of the median of {rounds} reads); the ratio is each size over {sizes[0]:,}",
                ))
                logger.info("%s", rows[-1].note)
            finally:
                for spec in config.clusters:
                    try:
                        raw.drop_database(config.database_for(spec))
                    except PyMongoError as exc:
                        logger.warning("could not drop %s: %s", config.database_for(spec), exc)
    finally:
        raw.close()
    return rows
