"""Measures of the write path: CPU per item, and throughput against raw insert_many."""

from __future__ import annotations

import bisect
import statistics
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

import attrs
import bson
import mmh3
from bson import ObjectId
from pymongo import MongoClient

from router.core.layouts import LAYOUTS
from router.ids import data_key
from router.model import ClusterMeta, FeedItem
from router.sync import FeedRouter
from .common import (NAMES, NOW, P0, P1, P2, PATIENT, Result, bench_config, cpu_timed, interleave, make_items, register,
                     timed, with_client_options)

#: The posts registry's index (migration 0006's ``sender_time_id``), made again after each reset, as a period has it.
POSTS_INDEX = (("sender_id", 1), ("event_time", 1), ("_id", 1))


def bench_writes(uris: Sequence[str], n: int, reps: int) -> Result:
    """write_many of n items over three periods vs raw insert_many of the same built documents, clusters in parallel."""
    r, w = _write_vs_insert(uris, "bench_router", n, reps, again=False)
    ratios = [a / b for a, b in zip(r, w)]
    return Result("write_ratio", f"write throughput, {n:,} items over 3 clusters", "items/s", r, w, ratios,
                  ">= 0.95", statistics.median(ratios) >= 0.95)


def bench_write_again(uris: Sequence[str], n: int, reps: int) -> Result:
    """The same, each write_many made a second time (a caller's retry): the feed emptied in between, its posts left
    registered, so the row shows what a write of posts registered already costs."""
    r, w = _write_vs_insert(uris, "bench_router_again", n, reps, again=True)
    ratios = [a / b for a, b in zip(r, w)]
    return Result("write_again_ratio", f"write throughput, the same {n:,} items written again (a retry)", "items/s", r, w,
                  ratios, "-", True, "each write_many's items were written once before (their copies removed since, "
                  "their posts still registered); the same insert_many as write_ratio's")


def bench_write_batches(uris: Sequence[str], n: int, reps: int, sizes: Sequence[int] = (1000, 5000, 25000)) -> list[Result]:
    """write_many at each ``write.batch_size`` of *sizes* in turn (the order turned each repetition), and insert_many of
    the same documents, in one run: what larger batches buy (FerretDB 2 refuses more than 25,000 writes per command)."""
    rates: dict[int, list[float]] = {size: [] for size in sizes}
    raw: list[float] = []

    def measure(router: FeedRouter, write: Callable[[], float], insert: Callable[[], float]) -> None:
        settings = router.settings
        for rep in range(reps + 1):  # the first repetition warms up
            turn = rep % len(sizes)
            for size in [*sizes[turn:], *sizes[:turn]]:
                router.settings = attrs.evolve(settings, write=attrs.evolve(settings.write, batch_size=size))
                rate = write()
                if rep:
                    rates[size].append(rate)
            rate = insert()
            if rep:
                raw.append(rate)
        router.settings = settings

    # One insert of a large batch may take longer than the default socketTimeoutMS (10 s) on a loaded machine.
    _write_vs_insert(uris, "bench_router_batches", n, reps, again=False, measure=measure,
                     options={"socketTimeoutMS": int(PATIENT.total_seconds() * 1000)})
    return [Result(f"write_batch_{size}", f"write throughput, {n:,} items over 3 clusters, write.batch_size {size:,}",
                   "items/s", rates[size], raw, [a / b for a, b in zip(rates[size], raw)], "-", True,
                   f"write_many at batch_size {size:,}: {statistics.median(rates[size]):,.0f} items/s, against "
                   f"{statistics.median(rates[sizes[0]]):,.0f} at {sizes[0]:,} in the same run")
            for size in sizes]


def _write_vs_insert(uris: Sequence[str], database: str, n: int, reps: int, *, again: bool,
                     measure: Callable[[FeedRouter, Callable[[], float], Callable[[], float]], Any] | None = None,
                     options: dict[str, Any] | None = None) -> tuple[list[float], list[float]]:
    """Rates of write_many of n items (written once before, unmeasured, when *again*) and of insert_many of their
    documents, alternately (or as *measure* takes them); the router's collections are emptied before each write
    (its posts only when not *again*). *options*: driver options of the router's clusters."""
    config = attrs.evolve(bench_config(uris, database), timeout=PATIENT)
    if options:
        config = with_client_options(config, **options)
    register(config)
    raw_db = "bench_raw"
    clients: list[MongoClient[dict[str, Any]]] = [MongoClient(u, tz_aware=True) for u in uris]
    items = make_items(n)
    with FeedRouter(config, clock=lambda: NOW, refresh=False) as router:
        prepared = router.prepare(items)
        copies = LAYOUTS["copies"]  # (the bench's periods are copies periods)
        raw_docs = {name: copies.documents(batch) for name, (_, batch) in prepared.batches.items()}

        def reset(db: str, *, posts: bool = True) -> None:
            for c in clients:
                c[db].feed.drop()
                for index in copies.indexes():
                    c[db].feed.create_index(list(index.keys), name=index.name)
                if posts:
                    c[db].posts.drop()
                    c[db].posts.create_index(list(POSTS_INDEX), name="sender_time_id")

        def run_router() -> float:
            reset(database)
            if again:
                router.write_many(items)
                reset(database, posts=False)
            return n / timed(lambda: router.write_many(items))

        def run_raw() -> float:
            reset(raw_db)
            colls = {name: clients[NAMES.index(name)][raw_db].feed for name in raw_docs}

            def insert() -> None:
                futures = [
                    router.clusters.submit(name, lambda c=colls[name], d=docs: c.insert_many(d, ordered=False))
                    for name, docs in raw_docs.items()
                ]
                for f in futures:
                    f.result()

            return n / timed(insert)

        if measure is not None:
            measure(router, run_router, run_raw)
            r: list[float] = []
            w: list[float] = []
        else:
            r, w = interleave(reps, run_router, run_raw)
    for c in clients:
        c.close()
    return r, w


def bench_cpu(n: int, reps: int) -> Result:
    """Routing + _id + data_key + document building, no I/O, vs bson.encode of the same documents (CPU time)."""
    from router.core.layouts.copies import Copies
    from router.core.periods.routing import Routing
    from router.core.writes.insert import prepare, prepare_documents
    from router.timemap import TimeMap

    metas = [ClusterMeta(name=NAMES[0], start_date=P0, end_date=P1), ClusterMeta(name=NAMES[1], start_date=P1, end_date=P2),
             ClusterMeta(name=NAMES[2], start_date=P2)]
    routing = Routing(TimeMap(metas), NOW)  # the write path only (router.core.writes.insert.prepare): no connections needed
    step = (NOW - P0) / n
    times = [P0 + step * i for i in range(n)]

    def build_and_prepare() -> Any:
        items = [FeedItem(receiver_id=1_000_000 + i % 5000, sender_id=1_000_765, event_time=times[i], type=1,
                          data={"fabula_id": i}, data_key=data_key("fabula", i)) for i in range(n)]
        return prepare(items, routing)

    copies = Copies()  # the documents the write path builds, as the copies layout builds them from a batch
    docs = [d for _, (_, batch) in build_and_prepare().batches.items() for d in batch.documents(copies)]
    items = [FeedItem(receiver_id=d["receiver_id"], sender_id=d["sender_id"], event_time=d["event_time"], type=d["type"],
                      data=d["data"], data_key=d["data_key"]) for d in docs]
    keys = list(range(n))

    def run_router() -> float:
        def work() -> None:
            for k in keys:
                data_key("fabula", k)
            prepare_documents(items, routing, register=False)  # as write_many builds them (the registry aside)

        return cpu_timed(work) / n * 1e9

    def run_encode() -> float:
        encode = bson.encode
        return cpu_timed(lambda: [encode(d) for d in docs]) / n * 1e9

    r, w = interleave(reps, run_router, run_encode)
    ratios = [a / b for a, b in zip(r, w)]
    return Result("cpu_ratio", f"router CPU per item (route, _id, data_key, document), {n:,} items", "ns/item", r, w,
                  ratios, "<= 1.20", statistics.median(ratios) <= 1.20)


def _handwritten_write(clients: dict[str, Any], database: str, starts: list[float], names: list[str],
                       rows: list[tuple[int, int, datetime, int]]) -> None:
    """What a service would write by hand for the same job: find the period, make an ObjectId carrying the event
    second, hash the data_key with mmh3, build the document, insert_many per cluster."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for receiver, sender, event_time, n in rows:
        ts = event_time.timestamp()
        name = names[bisect.bisect_right(starts, ts) - 1]
        oid = ObjectId(int(ts).to_bytes(4, "big") + ObjectId().binary[4:])
        key = mmh3.hash_bytes(f"fabula_{n}".encode()).hex()
        groups.setdefault(name, []).append({"_id": oid, "data_key": key, "receiver_id": receiver, "sender_id": sender,
                                            "event_time": event_time, "type": 1, "data": {"fabula_id": n}})
    for name, docs in groups.items():
        clients[name][database].feed.insert_many(docs, ordered=False)


def bench_handwritten(uris: Sequence[str], n: int, reps: int) -> Result:
    """Client CPU per item: write_many of FeedItems (with data_key) vs the same job hand-written on pymongo."""
    config = attrs.evolve(bench_config(uris, "bench_router_cpu"), timeout=PATIENT)
    register(config)
    raw_db = "bench_hand_cpu"
    clients: dict[str, MongoClient[dict[str, Any]]] = {name: MongoClient(u, tz_aware=True) for name, u in zip(NAMES, uris)}
    starts = [P0.timestamp(), P1.timestamp(), P2.timestamp()]
    step = (NOW - P0) / n
    rows = [(1_000_000 + i % 5000, 1_000_765, P0 + step * i, i) for i in range(n)]

    def reset(database: str) -> None:
        for c in clients.values():
            c[database].feed.drop()
            c[database].posts.drop()  # (each repetition writes the same posts: registered afresh, as the first time)
            c[database].posts.create_index(list(POSTS_INDEX), name="sender_time_id")

    with FeedRouter(config, clock=lambda: NOW, refresh=False) as router:
        def run_router() -> float:
            reset(config.database)
            began = time.process_time()
            router.write_many(FeedItem(receiver_id=r, sender_id=s, event_time=t, type=1, data={"fabula_id": k},
                                       data_key=data_key("fabula", k)) for r, s, t, k in rows)
            return (time.process_time() - began) / n * 1e9

        def run_hand() -> float:
            reset(raw_db)
            began = time.process_time()
            _handwritten_write(clients, raw_db, starts, list(NAMES), rows)
            return (time.process_time() - began) / n * 1e9

        r, w = interleave(reps, run_router, run_hand)
    for c in clients.values():
        c.close()
    ratios = [a / b for a, b in zip(r, w)]
    note = (f"client CPU per item (process time), {n:,} items over 3 clusters: the router "
            f"{statistics.median(r):,.0f} ns, hand-written pymongo {statistics.median(w):,.0f} ns; the router also "
            "checks every item before writing any and reports per-item outcomes")
    return Result("handwritten_ratio", f"write path CPU per item vs hand-written pymongo, {n:,} items", "ns/item", r, w,
                  ratios, "<= 1.10", statistics.median(ratios) <= 1.10, note)
