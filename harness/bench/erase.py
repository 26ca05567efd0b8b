"""Measures for erasing a user: what finding a sender's copies costs the writers, and what an erasure costs.

Erasing a user must find every copy they sent, in every receiver's feed, in every period.
The page index starts with the receiver and the edit index with the data_key, so neither
finds a sender's copies. Two ways were measured, each with and without, alternating, in one
run on the same server:

* an index on the sender (:func:`bench_sender_index`): a cost on every copy written, on
  fan-out (the writer of most copies) and on ``write_many``;
* the posts registry the router keeps instead (:mod:`router.core.layouts.posts`,
  :func:`bench_registry`): one small document per sender and write, beside the copies; and the erasure
  check every fan-out batch makes (one more find, at the same time as the edit fence's).

:func:`bench_erase` times an erasure and counts its requests.

Example::

    row = bench_sender_index(uris, copies=20_000, reps=3)
"""

from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from typing import Any

import attrs
from pymongo import MongoClient

from router.core.layouts import LAYOUTS, FanBatch, Post, outbox, posts
from router.ids import copy_ids, data_key, outbox_id
from router.model import Activity, FeedItem
from router.sync import FeedRouter

from ..commands import CommandLog
from .common import NOW, P0, P1, P2, PATIENT, Result, bench_config, make_items, register, timed

__all__ = ["SENDER_INDEX", "bench_erase", "bench_registry", "bench_sender_index"]

#: The index erasure would use to find a sender's copies in a copies period.
SENDER_INDEX = [("sender_id", 1)]


def bench_sender_index(uris: Sequence[str], *, copies: int = 50_000, writes: int = 20_000, reps: int = 3) -> Result:
    """Fan-out rate (and write_many rate, in the note) with a sender index over without it."""
    config = attrs.evolve(bench_config(uris, "bench_sender_index"), timeout=PATIENT)
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


# -- what the chosen design costs the writers, and what an erasure costs ---------------------------


def _alternate(reps: int, run: Callable[[bool], float]) -> dict[bool, list[float]]:
    """``run(on)`` and ``run(not on)`` alternately, the first repetition a warm-up; rates by switch."""
    rates: dict[bool, list[float]] = {True: [], False: []}
    for rep in range(reps + 1):
        for on in ((True, False) if rep % 2 else (False, True)):
            rate = run(on)
            if rep:
                rates[on].append(rate)
    return rates


def bench_registry(uris: Sequence[str], *, writes: int = 20_000, copies: int = 50_000, reps: int = 3) -> list[Result]:
    """What registering posts by sender and checking erasure records cost the writers, against neither, in one run:
    ``write_many`` with the registry / without (items each of its own post, the worst case; and posts of 100
    receivers each), and fan-out with the erasure check / without (the registry there is one insert per job)."""
    config = attrs.evolve(bench_config(uris, "bench_registry"), timeout=PATIENT)
    register(config)
    raw: MongoClient[dict[str, Any]] = MongoClient(uris[2], tz_aware=True)
    try:
        with FeedRouter(config, clock=lambda: NOW, refresh=False) as router:
            settings = router.settings
            runs = itertools.count()

            def write_many(shared: bool) -> Callable[[bool], float]:
                def run(on: bool) -> float:
                    router.settings = attrs.evolve(settings, write=attrs.evolve(settings.write, register=on))
                    n = next(runs)
                    items = make_items(writes, receivers=5_000, start=P2 + timedelta(days=2), end=NOW,
                                       key_offset=1_000_000 * (n + 1))
                    if shared:  # posts of 100 receivers each, as a caller writing its own fan-out would
                        items = [attrs.evolve(item, data_key=data_key("shared", 1_000_000 * (n + 1) + i // 100))
                                 for i, item in enumerate(items)]
                    return writes / timed(lambda: router.write_many(items))
                return run

            def fan_out(on: bool) -> float:
                router.settings = attrs.evolve(settings, pseudonyms=settings.pseudonyms if on else None)
                n = next(runs)
                post = Activity(sender_id=n, event_time=P2 + timedelta(days=1, milliseconds=n), type=1, data={"post": n},
                                data_key=data_key("registry-bench", n))
                return copies / timed(lambda: router.fan_out(post, range(copies)))

            own, shared, fanned = _alternate(reps, write_many(False)), _alternate(reps, write_many(True)), _alternate(reps, fan_out)
            router.settings = settings
    finally:
        raw.drop_database("bench_registry")
        raw.close()

    def row(name: str, what: str, unit: str, rates: dict[bool, list[float]], note: str) -> Result:
        ratios = [a / b for a, b in zip(rates[True], rates[False])]
        return Result(name, what, unit, rates[True], rates[False], ratios, "-", True,
                      f"{note}: {statistics.median(rates[True]):,.0f}/s with vs {statistics.median(rates[False]):,.0f}/s "
                      f"without (median ratio {statistics.median(ratios):.3f})")

    return [
        row("registry_write_many", f"write_many of {writes:,} items, each its own post: with the posts registry / without "
            "(items/s)", "items/s", own, "one registry document per sender and 500 posts, sent beside the copies"),
        row("registry_write_many_shared", f"write_many of {writes:,} items, posts of 100 receivers: with the posts "
            "registry / without (items/s)", "items/s", shared, "one registry document per sender and 500 posts (of 100 "
            "copies each)"),
        row("erasure_check_fanout", f"fan-out of {copies:,} copies: with the erasure check / without (copies/s)",
            "copies/s", fanned, "one more find per batch (erasures, the pseudonyms of the sender and its receivers), "
            "sent with the edit fence's"),
    ]


def bench_erase(uris: Sequence[str], *, followers: int = 10_000, posts: int = 1_000, inbox: int = 1_000) -> Result:
    """``erase_user`` of a user with *followers* followers and *posts* posts spread over the 3 periods, each pushed to
    every follower (*followers* x *posts* copies), an inbox of *inbox* items and a seen marker: the time it takes and
    the requests it sends. The copies are stored by plain ``insert_many`` of the copies layout's documents (with the
    posts' registry, outbox and job records), which is not measured."""
    log = CommandLog()
    config = attrs.evolve(bench_config(uris, "bench_erase", listener=log), timeout=PATIENT)
    register(config)
    clients: list[MongoClient[dict[str, Any]]] = [MongoClient(u, tz_aware=True) for u in uris]
    user, starts = 1_000_765, (P0, P1, P2)
    try:
        began = time.perf_counter()
        with ThreadPoolExecutor(3) as pool:
            list(pool.map(lambda i: _store_posts(clients[i]["bench_erase"], user, starts[i], range(i, posts, 3),
                                                 followers), range(3)))
        stored = time.perf_counter() - began
        with FeedRouter(config, clock=lambda: NOW, refresh=False) as router:
            router.write_many([FeedItem(receiver_id=user, sender_id=2_000_000 + i % 500, event_time=P2 + timedelta(minutes=i),
                                        type=1, data={"n": i}, data_key=data_key("erase-inbox", i)) for i in range(inbox)])
            router.mark_seen(user, router.read(user, limit=1).items[0])
            log.clear()
            log.on = True
            took = timed(lambda: router.erase_user(user, requested_by="bench"))
            log.on = False
            result = router.erasure_status(user)
        left = sum(c["bench_erase"].feed.count_documents({"$or": [{"sender_id": user}, {"receiver_id": user}]})
                   for c in clients)
    finally:
        for client in clients:
            client.drop_database("bench_erase")
            client.close()
    by_name = {name: log.total(name) for name in ("find", "delete", "insert", "update")}
    copies = followers * posts
    note = (f"{copies:,} copies of {posts:,} posts over 3 periods, {inbox:,} items received: erased in {took:.1f} s "
            f"({copies / took:,.0f} copies/s), {len(log.commands):,} requests ({', '.join(f'{n} {k}' for k, n in by_name.items())}), "
            f"{left} documents left naming the user, finished: {result.finished}; storing them took {stored:.0f} s")
    return Result("erase_user", f"erase_user: {followers:,} followers, {posts:,} posts over 3 periods (s)", "s", [took],
                  [float(len(log.commands))], [], "-", left == 0 and result.finished, note)


def _store_posts(db: Any, user: int, start: datetime, numbers: Iterable[int], followers: int) -> None:
    """Store posts *numbers* of *user* as publish would have (outbox entry, registry entry, job record, one copy per
    follower), from *start* on, with plain insert_many."""
    receivers = list(range(1, followers + 1))
    chunk: list[dict[str, Any]] = []
    for n in numbers:
        when = start + timedelta(hours=n, milliseconds=7)
        key = data_key("erase-bench", n)
        seconds = int(when.timestamp())
        post = Activity(sender_id=user, event_time=when, type=1, data={"post": n}, data_key=key)
        db.outbox.insert_many(outbox.OUTBOX.documents([Post(outbox_id(seconds, key), post)]))
        db.posts.insert_many(posts.REGISTRY.documents([posts.Registered(user, key, when).entry()]))
        db.fanouts.insert_one({"_id": f"{key}:{n}", "data_key": key, "event_time": when, "batch_size": 1000,
                               "status": "done", "batches_total": -(-followers // 1000), "runs": 1})
        chunk += LAYOUTS["copies"].fan_documents(FanBatch(copy_ids(seconds, key, receivers), receivers, user, when, 1,
                                                          {"post": n}, key))
        if len(chunk) >= 20_000:
            db.feed.insert_many(chunk, ordered=False)
            chunk = []
    if chunk:
        db.feed.insert_many(chunk, ordered=False)
