"""Measures of the two storage layouts, ``copies`` vs ``buckets``, on one server (issues 19 and 26, "Measured").

Both layouts are measured on the same server, in one run, with the same items: two routers
of three clusters each (a database per cluster), every period in one layout. The items all
fall in the newest period, so a page reads one cluster and the figures compare the
layouts alone. Ratios are buckets / copies. ``scripts/bench`` runs it on FerretDB 2 on
DocumentDB, which appends to a bucket atomically and reports index sizes; the figures
are about that server (it sorts a receiver's documents rather than reading them in index
order: see :mod:`harness.bench.feedsize`), not about MongoDB.

Example::

    rows = bench_layouts(uri, items=100_000, fanout=20_000)

or ``python -m harness.bench.layouts [--uri URI] [--small]`` (rows as JSON on stdout; without ``--uri``
it starts one local server of the default backend).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import logging
import pstats
import statistics
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import attrs
import bson
from pymongo import MongoClient, UpdateOne
from pymongo.errors import OperationFailure

from router.admin.migrate import discover
from router.admin.periods import apply_period, plan_period
from router.config import ClusterConfig, RouterConfig
from router.core.layouts.buckets import Buckets
from router.core.layouts.values import FanBatch
from router.core.steps import Upserts
from router.ids import copy_ids, data_key
from router.model import Activity
from router.storage.clusters import Clusters
from router.sync import FeedRouter
from ..commands import CommandLog
from ..localservers import LocalClusters
from .common import NAMES, NOW, P0, P1, P2, Result, make_items, timed

__all__ = ["bench_layouts", "main"]

logger = logging.getLogger(__name__)

LAYOUTS = ("copies", "buckets")
PAGE = 50
_LOAD_CHUNK = 500


@attrs.define
class _Side:
    """One layout's router, its database names and its command log."""

    layout: str
    config: RouterConfig
    router: FeedRouter
    log: CommandLog

    @property
    def newest(self) -> str:
        """The database of the newest period, where every item lives."""
        return self.config.database_for(self.config.clusters[-1])


def _open(uri: str, layout: str, prefix: str) -> _Side:
    """Three clusters on *uri*, a database each, every period in *layout*, given by the operator path."""
    log = CommandLog()
    config = RouterConfig(
        database=f"{prefix}_{layout}",
        timeout=timedelta(seconds=120),  # the load writes large batches
        clusters=tuple(ClusterConfig(name=n, uri=uri, options={"event_listeners": [log]}, database=f"{prefix}_{layout}_{i}")
                       for i, n in enumerate(NAMES)),
    )
    with Clusters(config) as clusters:
        for name, (start, end) in zip(NAMES, ((P0, P1), (P1, P2), (P2, None))):
            change = plan_period(clusters, name=name, start=start, end=end, creator="bench", now=start, layout=layout)
            apply_period(clusters, change, migrations=discover())
    return _Side(layout, config, FeedRouter(config, clock=lambda: NOW, refresh=False), log)


def _drop(raw: MongoClient[dict[str, Any]], databases: Sequence[str]) -> None:
    for name in databases:
        try:
            raw.drop_database(name)
        except OperationFailure as exc:  # mongo-java-server 1.47 fails dropping a database whose indexes hold entries
            logger.warning("could not drop %s (%s); dropping its collections", name, exc.code)
            for collection in raw[name].list_collection_names():
                raw[name].drop_collection(collection)


@contextmanager
def _sides(uri: str | None, prefix: str) -> Iterator[tuple[_Side, _Side, MongoClient[dict[str, Any]]]]:
    server = LocalClusters(1, names=["layouts"]) if uri is None else None
    target = server.start()[0] if server is not None else uri
    assert target is not None
    raw: MongoClient[dict[str, Any]] = MongoClient(target, tz_aware=True)
    opened: list[_Side] = []
    try:
        for layout in LAYOUTS:
            opened.append(_open(target, layout, prefix))
        yield opened[0], opened[1], raw
    finally:
        for side in opened:
            side.router.close()
            if server is None:  # a server we did not start keeps running: leave it as we found it
                _drop(raw, [side.config.database_for(spec) for spec in side.config.clusters])
        raw.close()
        if server is not None:
            server.stop()


def _page_counts(side: _Side, receiver: int, deep: int) -> tuple[dict[str, Any], dict[str, Any], str | None]:
    """What the server sent for the newest page and page *deep* of *receiver*; and the cursor reaching page *deep*."""
    def counted(cursor: str | None) -> tuple[dict[str, Any], str | None]:
        side.log.clear()
        side.log.on = True
        page = side.router.read(receiver, limit=PAGE, cursor=cursor)
        side.log.on = False
        names = sorted({c.name for c in side.log.commands})
        return ({"documents": side.log.documents, "items": len(page.items),
                 "requests": {n: side.log.total(n) for n in names}}, page.next_cursor)

    newest, cursor = counted(None)
    for _ in range(deep - 2):
        cursor = side.router.read(receiver, limit=PAGE, cursor=cursor).next_cursor
    deep_cursor = cursor
    far, _ = counted(cursor)
    return newest, far, deep_cursor


def _latency(side: _Side, receiver: int, cursor: str | None, rounds: int) -> float:
    """Median milliseconds of *rounds* reads of one page."""
    return statistics.median(timed(lambda: side.router.read(receiver, limit=PAGE, cursor=cursor)) for _ in range(rounds)) * 1e3


def _stored(raw: MongoClient[dict[str, Any]], database: str, items: int) -> tuple[float, str]:
    """Bytes stored per item in ``feed`` of *database*: collStats data + indexes, or BSON bytes of the documents."""
    db = raw[database]
    try:
        stats = db.command("collStats", "feed")
    except Exception:  # the server may not answer collStats; fall back to the documents themselves
        stats = {}
    data, index = stats.get("size"), stats.get("totalIndexSize")
    if isinstance(data, (int, float)) and data > 0 and isinstance(index, (int, float)) and index > 0:
        return (data + index) / items, f"collStats size {data:,} + totalIndexSize {index:,} B"
    encoded = sum(len(bson.encode(d)) for d in db.feed.find({}))
    return encoded / items, (f"BSON bytes of the documents, {encoded:,} B (collStats gave size {data!r}, "
                             f"totalIndexSize {index!r}: indexes not reported by this server)")


def _fan_out_rate(side: _Side, post: int, receivers: range) -> float:
    activity = Activity(sender_id=1_000_765, event_time=P2 + timedelta(days=5, milliseconds=post), type=1,
                        data={"post": post}, data_key=data_key("post", post))
    # The default batches in flight, the same for both layouts.
    return len(receivers) / timed(lambda: side.router.fan_out(activity, iter(receivers)))


def _profile_batch(raw: MongoClient[dict[str, Any]], side: _Side, post: int, receivers: range) -> str:
    """One buckets fan-out batch replayed in this thread (the router runs batches on worker threads, out of
    cProfile's sight): the upserts the layout builds, sent as the storage driver sends them."""
    when = P2 + timedelta(days=6, milliseconds=post)
    key = data_key("post", post)
    ids = copy_ids(int(when.timestamp()), key, list(receivers))
    batch = FanBatch(ids=ids, receivers=list(receivers), sender_id=1_000_765, event_time=when, type=1,
                     data={"post": post}, data_key=key)
    coll = raw[side.newest].feed
    profile = cProfile.Profile()
    began = time.perf_counter()
    profile.enable()
    layout = Buckets()
    request = layout.store("cluster_3", batch.documents(layout), time.monotonic() + 600)
    assert isinstance(request, Upserts)
    coll.bulk_write([UpdateOne(f, u, upsert=True) for f, u in request.ops], ordered=False)
    profile.disable()
    wall = time.perf_counter() - began
    out = io.StringIO()
    stats = pstats.Stats(profile, stream=out)
    rows = sorted(stats.stats.items(), key=lambda kv: kv[1][2], reverse=True)[:3]  # type: ignore[attr-defined]
    top = "; ".join(f"{fn[2]} ({fn[0].rsplit('/', 1)[-1]}:{fn[1]}) {tt * 1e3:.0f} ms own time" for fn, (_, _, tt, _, _) in rows)
    return f"one batch of {len(receivers):,} upserts replayed under cProfile took {wall * 1e3:.0f} ms; top own time: {top}"


def bench_layouts(uri: str | None = None, *, items: int = 100_000, receivers: int = 50, deep: int = 20,
                  fanout: int = 20_000, reps: int = 5, rounds: int = 7, prefix: str = "bench_layouts") -> list[Result]:
    """The four rows of issue 19 (buckets / copies), on the server at *uri* (or one started here).

    *items* are written to the newest period of each layout, round-robin over *receivers*
    receivers (so each holds ``items / receivers``, which must reach page *deep*);
    fan-out goes to *fanout* fresh receivers, *reps* times per layout, alternating.
    """
    per = items // receivers
    if per < deep * PAGE:
        raise ValueError(f"deep: page {deep} needs {deep * PAGE} items per receiver (got {per}: items {items} / receivers {receivers})")
    all_items = make_items(items, receivers=receivers, start=P2 + timedelta(days=1), end=NOW)
    with _sides(uri, prefix) as (copies, buckets, raw):
        load: dict[str, float] = {}
        for side in (copies, buckets):
            load[side.layout] = sum(timed(lambda: side.router.write_many(all_items[i:i + _LOAD_CHUNK]))
                                    for i in range(0, items, _LOAD_CHUNK))
        logger.info("loaded %d items: copies %.1f s, buckets %.1f s", items, load["copies"], load["buckets"])
        receiver = 1_000_000 + receivers // 2

        # 4 (measured first, before the fan-outs add buckets of one item to fresh receivers). Bytes per item.
        b_bytes, b_how = _stored(raw, buckets.newest, items)
        c_bytes, c_how = _stored(raw, copies.newest, items)
        size = Result(
            "layout_bytes_per_item", "bytes stored per item (data + indexes where reported): buckets vs copies", "B/item",
            [b_bytes], [c_bytes], [b_bytes / c_bytes], "<= 1.0", b_bytes <= c_bytes,
            f"newest period's feed after loading {items:,} items ({per:,} per receiver, full buckets); buckets: {b_how}; "
            f"copies: {c_how}",
        )
        logger.info("%s", attrs.asdict(size))

        # 1. documents the server returns per page
        counts = {side.layout: _page_counts(side, receiver, deep) for side in (copies, buckets)}
        (c_new, c_deep, c_cur), (b_new, b_deep, b_cur) = counts["copies"], counts["buckets"]
        docs = Result(
            "layout_page_documents", f"documents returned per page of {PAGE}, newest page and page {deep}: buckets vs copies",
            "documents", [float(b_new["documents"]), float(b_deep["documents"])],
            [float(c_new["documents"]), float(c_deep["documents"])],
            [b_new["documents"] / max(c_new["documents"], 1), b_deep["documents"] / max(c_deep["documents"], 1)],
            "buckets <= 2 per 50 items", all(p["documents"] <= 2 and p["items"] == PAGE for p in (b_new, b_deep)),
            f"buckets newest {b_new}, page {deep} {b_deep}; copies newest {c_new}, page {deep} {c_deep}",
        )

        logger.info("%s", attrs.asdict(docs))

        # 2. page latency, same receiver, same pages
        b_ms, c_ms, b_deep_ms, c_deep_ms = [], [], [], []
        for rep in range(reps + 1):  # the first repetition warms up
            order = (buckets, copies) if rep % 2 else (copies, buckets)
            got = {side.layout: (_latency(side, receiver, None, rounds), _latency(side, receiver, counts[side.layout][2], rounds))
                   for side in order}
            if rep:
                b_ms.append(got["buckets"][0])
                c_ms.append(got["copies"][0])
                b_deep_ms.append(got["buckets"][1])
                c_deep_ms.append(got["copies"][1])
        ratios = [b / c for b, c in zip(b_ms, c_ms)]
        deep_ratio = statistics.median(b / c for b, c in zip(b_deep_ms, c_deep_ms))
        latency = Result(
            "layout_page_latency", f"newest page latency ({PAGE} items, {items:,} items in the cluster): buckets vs copies",
            "ms", b_ms, c_ms, ratios, "<= 1.0", statistics.median(ratios) <= 1.0,
            f"median of {rounds} reads per repetition; page {deep}: buckets {statistics.median(b_deep_ms):.2f} ms, copies "
            f"{statistics.median(c_deep_ms):.2f} ms (ratio {deep_ratio:.3f}); {receivers} receivers of {per:,} items; "
            f"loading {items:,} items with write_many took copies {load['copies']:.1f} s, buckets {load['buckets']:.1f} s",
        )

        logger.info("%s", attrs.asdict(latency))

        # 3. fan-out throughput, and a profile of one buckets batch
        b_rate: list[float] = []
        c_rate: list[float] = []
        fresh = range(20_000_000, 20_000_000 + fanout)
        for rep in range(reps):
            order = (buckets, copies) if rep % 2 else (copies, buckets)
            for side in order:
                (b_rate if side is buckets else c_rate).append(_fan_out_rate(side, rep, fresh))
        batch = range(30_000_000, 30_000_000 + buckets.config.batch_size)
        profile = _profile_batch(raw, buckets, 99, batch)
        f_ratios = [b / c for b, c in zip(b_rate, c_rate)]
        fan = Result(
            "layout_fanout", f"fan-out throughput, one post to {fanout:,} receivers: buckets vs copies", "copies/s",
            b_rate, c_rate, f_ratios, ">= 0.5", statistics.median(f_ratios) >= 0.5,
            f"default batches in flight; repetition k fans post k out to the same receivers (from rep 2 on, buckets append to existing buckets); {profile}",
        )

    logger.info("%s", attrs.asdict(fan))
    return [docs, latency, fan, size]


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m harness.bench.layouts [--uri URI] [--items N] [--fanout N] [--reps N] [--small]``."""
    parser = argparse.ArgumentParser(prog="python -m harness.bench.layouts", description=__doc__.split("\n\n")[0])
    parser.add_argument("--uri", help="a running server (default: start one of the default local backend)")
    parser.add_argument("--items", type=int, default=100_000, help="items per layout in the measured cluster")
    parser.add_argument("--receivers", type=int, default=50, help="receivers the items are spread over")
    parser.add_argument("--fanout", type=int, default=20_000, help="receivers of each fan-out")
    parser.add_argument("--reps", type=int, default=5, help="repetitions per measure")
    parser.add_argument("--small", action="store_true", help="tiny sizes: checks the benchmark runs")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(message)s")
    if args.small:
        rows = bench_layouts(args.uri, items=2_000, receivers=2, deep=20, fanout=500, reps=2, rounds=3)
    else:
        rows = bench_layouts(args.uri, items=args.items, receivers=args.receivers, fanout=args.fanout, reps=args.reps)
    sys.stdout.write(json.dumps([attrs.asdict(r) for r in rows], indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
