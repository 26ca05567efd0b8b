"""The demo: four local clusters, three periods and a rollover to buckets, a few thousand feed items read back newest first.

Run it with ``scripts/demo`` (``python -m harness.demo`` from a checkout). It starts its own four local
servers (mongod if on PATH, else FerretDB 2 on DocumentDB, the default local server),
adds the clusters one at a time the way an operator does (clusters.yaml grows,
add-cluster gives each its period), writes fanned-out posts (including late events that
belong to older periods), pages one receiver's feed across the period boundaries,
deletes one post from every receiver's feed by ``data_key``, lets the rollover
scheduler hand the next period to the standby fourth cluster in the ``buckets`` layout
(``rollover.layout: buckets``; the server must append to a bucket atomically: with
``--backend`` set to FerretDB 1, which does not, the standby runs on mongo-java-server), reads one page that spans the last per-copy period and the first
buckets period, checks every claim with plain pymongo (the documents that page needed
in each layout among them), and stops the servers. On the way, through the asyncio
door, it publishes a celebrity's post that followers pull at read time and rebuilds a
dormant user's feed by backfill; and it fans one post out to thousands of followers on
a real Celery worker (``feedrouter worker``) through a local Redis, which it also
starts and stops (so it needs ``redis-server``: scripts/bootstrap installs it).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import random
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, TextIO

from bson import ObjectId
from pymongo import MongoClient, monitoring

from router.admin.migrate import Migration, discover, migrate_cluster
from router.admin.periods import apply_period, plan_period
from router.admin.rollover import RolloverScheduler, upcoming_boundary
from router.aio import AsyncFeedRouter
from router.config import load_config
from router.errors import RouterError
from router.fanout.celery import app_from_config, publish_fan_out
from router.ids import copy_id, data_key
from router.model import Activity, FeedItem, Page
from router.storage.clusters import Clusters
from router.sync import FeedRouter

from .bench_celery import WorkerProcess
from .localservers import LocalClusters
from .process import log_tail
from .redis import LocalRedis

__all__ = ["run_demo", "demo_periods"]

UTC = timezone.utc
RECEIVERS = ("alice", "bob", "carol", "dave", "erin")
CONFIG_TEMPLATE = """\
# written by the demo (scripts/demo) for its local servers
database: feed_demo
read_window:
  clusters: 3
write:
  batch_size: 500
clusters:
{clusters}
{extra}"""
ROLLOVER = "rollover: {period: monthly, lead_time: 7d, standby: [cluster_4], layout: buckets}\n"
CELERY = "celery: {{broker: '{url}'}}\n"
FOLLOWERS = 8_000
"""How many followers the Celery step fans one post out to."""
SIDE = 60
"""How many of alice's items the rollover step writes on each side of the boundary."""
PAGE = 100
"""The size of the page read across the boundary: all SIDE items in buckets and the newest of the copies."""
BUCKET_CAP = 50
"""The most copies a bucket may hold (``router.core.layouts.buckets.MAX_ITEMS``, checked independently here)."""


def _month_start(t: datetime, back: int) -> datetime:
    """The first instant of the month *back* months before *t*'s month (UTC)."""
    index = t.year * 12 + (t.month - 1) - back
    return datetime(index // 12, index % 12 + 1, 1, tzinfo=UTC)


def demo_periods(now: datetime) -> list[tuple[datetime, datetime | None]]:
    """Three consecutive quarters ending with the open-ended one that holds *now*."""
    b0, b1, b2 = (_month_start(now, k) for k in (6, 3, 0))
    return [(b0, b1), (b1, b2), (b2, None)]


class _Out:
    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def __call__(self, text: str = "") -> None:
        self.stream.write(text + "\n")
        self.stream.flush()


FERRETDB1_BACKENDS = ("ferretdb-pg", "ferretdb-sqlite", "ferretdb")
"""The backends whose server (FerretDB 1) cannot append to a bucket atomically."""


def run_demo(stream: TextIO, *, posts: int = 800, backend: str | None = None, seed: int = 2016) -> int:
    """Run the demo, writing its report to *stream*; return 0 when every check held, else 1."""
    out = _Out(stream)
    rng = random.Random(seed)
    now = datetime.now(UTC).replace(microsecond=0)
    periods = demo_periods(now)
    names = ["cluster_1", "cluster_2", "cluster_3"]
    # The period cluster_4 opens is in buckets, which needs a server that appends to one document atomically;
    # FerretDB 1 does not, so with it the standby runs on mongo-java-server.
    local_clusters = LocalClusters(3, names=names, backend=backend)
    old_ferret = local_clusters.backend in FERRETDB1_BACKENDS
    out("== starting four local clusters (cluster_4 is the standby for the rollover) and a Redis broker")
    with (
        LocalRedis() as broker,  # first: without redis-server the demo stops here, saying how to install it
        local_clusters as local,
        # its folder sits beside the others, so one folder names every server process
        LocalClusters(1, names=["cluster_4"], backend="javaserver" if old_ferret else local.backend,
                      base_dir=local.servers[0].data_dir.parent) as standby,
        tempfile.TemporaryDirectory() as tmp,
    ):
        out(f"   on {local.server_description}" + (f"; cluster_4 on {standby.server_description}" if old_ferret else ""))
        for server in [*local.servers, *standby.servers]:
            out(f"   {server.name}: {server.uri} ({server.backend}, data in {server.data_dir})")
        out(f"   broker: {broker.url} (redis-server, data in {broker.data_dir})")
        servers = [*local.servers, *standby.servers]
        config_path = Path(tmp) / "clusters.yaml"
        cluster_lines = [f"  - name: {s.name}\n    uri: {s.uri}" for s in servers]
        raw: dict[str, MongoClient[dict[str, object]]] = {s.name: MongoClient(s.uri, tz_aware=True) for s in servers}
        try:
            return _run(out, rng, now, periods, names, config_path, cluster_lines, raw, posts, broker)
        except RouterError as exc:
            out(f"!! {type(exc).__name__}: {exc}")
            return 1
        finally:
            for c in raw.values():
                c.close()
            out("== stopping the local clusters and the broker")


def _run(
    out: _Out,
    rng: random.Random,
    now: datetime,
    periods: list[tuple[datetime, datetime | None]],
    names: list[str],
    config_path: Path,
    cluster_lines: list[str],
    raw: dict[str, MongoClient[dict[str, object]]],
    posts: int,
    broker: LocalRedis,
) -> int:
    failures: list[str] = []

    def check(ok: bool, claim: str) -> None:
        out(f"   [{'ok' if ok else 'FAILED'}] {claim}")
        if not ok:
            failures.append(claim)

    out("== adding the clusters one by one, as an operator does (edit clusters.yaml, run add-cluster)")
    migrations = discover()
    for count, (name, (start, _end)) in enumerate(zip(names, periods), start=1):
        config_path.write_text(CONFIG_TEMPLATE.format(clusters="\n".join(cluster_lines[:count]), extra=""))
        with Clusters(load_config(config_path)) as clusters:
            change = plan_period(clusters, name=name, start=start, close_previous=count > 1, creator="demo", now=now)
            for line in apply_period(clusters, change, migrations=migrations):
                if ": run on " not in line:  # the index commands themselves: see `feedrouter migrate --dry-run`
                    out(f"   {line}")

    with FeedRouter.from_yaml(config_path) as router:
        out("   time map loaded by the router from the clusters' metadata:")
        out(router.timemap.describe())

        start = periods[0][0]
        span = (now - start).total_seconds()
        # Fan-out on write: each post is copied into the feed of 2-5 receivers.
        items: list[FeedItem] = []
        keys: list[str] = []
        for post in range(posts):
            t = start + timedelta(seconds=rng.uniform(0, span))
            key = data_key("fabula", 1_000_000 + post)
            keys.append(key)
            sender = rng.randrange(100, 110)
            for receiver in rng.sample(RECEIVERS, rng.randint(2, 5)):
                items.append(
                    FeedItem(receiver_id=receiver, sender_id=sender, event_time=t, type=1,
                             data={"fabula_id": 1_000_000 + post}, data_key=key)
                )
        out(f"== writing {len(items)} feed items ({posts} posts fanned out to {len(RECEIVERS)} receivers)")
        t0 = time.perf_counter()
        ids = router.write_many(items)
        elapsed = time.perf_counter() - t0
        out(f"   {len(ids)} written in {elapsed:.2f} s ({len(ids) / elapsed:,.0f} items/s), grouped per cluster")

        late_time = periods[0][0] + timedelta(days=3)
        late = [
            FeedItem(receiver_id=r, sender_id=999, event_time=late_time + timedelta(minutes=i), type=2,
                     data={"fabula_id": 2_000_000 + i, "note": "late event"}, data_key=data_key("fabula", 2_000_000 + i))
            for i, r in enumerate(RECEIVERS)
        ]
        router.write_many(late)
        out(f"== writing {len(late)} late events dated {late_time.date()} (they belong to cluster_1's period)")
        items.extend(late)

        out("== where the documents are (counted with plain pymongo, not through the router)")
        expected = {n: 0 for n in names}
        for it in items:
            expected[router.timemap.cluster_for(it.event_time)] += 1
        for name in names:
            count = raw[name]["feed_demo"]["feed"].count_documents({})
            out(f"   {name}: {count} documents")
            check(count == expected[name], f"{name} holds exactly the items of its period ({expected[name]})")
        late_docs = raw["cluster_1"]["feed_demo"]["feed"].count_documents({"sender_id": 999})
        check(late_docs == len(late), "every late event went to cluster_1, the cluster owning its time")

        receiver = "alice"
        out(f"== {receiver}'s feed, newest first, 10 per page")
        page = router.read(receiver, limit=10)
        for it, src in zip(page.items, page.sources):
            out(f"   {it.event_time:%Y-%m-%d %H:%M:%S}  from {it.sender_id}  fabula {it.data['fabula_id']:<8} <- {src}")
        out(f"   clusters asked for this page: {', '.join(page.queried)}")
        pages, seen, crossing = 1, list(page.items), None
        cursor = page.next_cursor
        while cursor is not None:
            page = router.read(receiver, limit=10, cursor=cursor)
            pages += 1
            seen.extend(page.items)
            if crossing is None and len(set(page.sources)) > 1:
                crossing = page
            cursor = page.next_cursor
        if crossing is not None:
            out("   a later page that crosses a period boundary:")
            for it, src in zip(crossing.items, crossing.sources):
                out(f"   {it.event_time:%Y-%m-%d %H:%M:%S}  from {it.sender_id}  fabula {it.data['fabula_id']:<8} <- {src}")
        truth = sorted((it for it in items if it.receiver_id == receiver), key=lambda i: i.event_time, reverse=True)
        got_times = [it.event_time for it in seen]
        check(len(seen) == len(truth), f"paging to the end returned all {len(truth)} of {receiver}'s items in {pages} pages")
        check(len({it.id for it in seen}) == len(seen), "no item was returned twice")
        check(got_times == sorted(got_times, reverse=True), "items came newest first across cluster boundaries")

        victim = keys[rng.randrange(len(keys))]
        copies = sum(c["feed_demo"]["feed"].count_documents({"data_key": victim}) for c in raw.values())
        out(f"== deleting post {victim} from every receiver's feed")
        removed = router.delete(victim)
        out(f"   removed {removed} copies")
        left = sum(c["feed_demo"]["feed"].count_documents({"data_key": victim}) for c in raw.values())
        check(removed == copies and left == 0, f"all {copies} copies are gone from every cluster")

    asyncio.run(_social(out, check, config_path, raw, now))
    fanned = _celery(out, check, now, config_path, cluster_lines, raw, broker)
    rolled = _rollover(out, check, now, periods, config_path, cluster_lines, raw, migrations)
    out("== summary")
    out(f"   {len(items)} items in {len(names)} clusters, {pages} pages read for {receiver}, {removed} copies deleted,")
    out(f"   {fanned:,} copies written by a Celery worker, one rollover to cluster_4 (buckets) at {rolled.isoformat()}")
    out("   all checks passed" if not failures else f"   {len(failures)} checks FAILED")
    return 0 if not failures else 1


async def _social(
    out: _Out, check: Callable[[bool, str], None], config_path: Path, raw: dict[str, MongoClient[dict[str, object]]],
    now: datetime,
) -> None:
    """The social half, on the asyncio door: a celebrity pulled at read time, a dormant user rebuilt by backfill."""
    out("== the social half, through AsyncFeedRouter (asyncio, AsyncMongoClient)")
    async with AsyncFeedRouter.from_yaml(config_path) as feeds:
        when = now - timedelta(hours=2)
        celebrity = Activity(sender_id="celebrity", event_time=when, type=1, data={"fabula_id": 4_000_000},
                             data_key=data_key("fabula", 4_000_000))
        followers = (f"fan-{i}" for i in range(1_000_000))  # a generator: never read, the author is pulled
        result = await feeds.publish(celebrity, followers, pull=True)
        owner = result.cluster
        copies = raw[owner]["feed_demo"]["feed"].count_documents({"data_key": celebrity.data_key})
        entries = raw[owner]["feed_demo"]["outbox"].count_documents({"data_key": celebrity.data_key})
        out(f"   celebrity post published to 1,000,000 followers: path {result.path}, one outbox entry in {owner}")
        check(copies == 0 and entries == 1, "a pulled post is stored once, in its author's outbox, with no copies")
        page = await feeds.read("alice", limit=5, pull=["celebrity"])
        for it, src, pulled in zip(page.items, page.sources, page.pulled):
            how = "pulled from the outbox" if pulled else "alice's own copy"
            out(f"   {it.event_time:%Y-%m-%d %H:%M:%S}  from {it.sender_id!s:<10} <- {src}, {how}")
        check(page.items[0].data_key == celebrity.data_key and page.pulled[0],
              "alice's newest item is the celebrity's post, merged in at read time")

        ordinary = Activity(sender_id="bob", event_time=when + timedelta(minutes=5), type=1,
                            data={"fabula_id": 4_000_001}, data_key=data_key("fabula", 4_000_001))
        pushed = await feeds.publish(ordinary, ["carol", "dave", "erin"], active={"carol", "erin"})
        assert pushed.fan_out is not None
        out(f"   bob's post pushed: {pushed.fan_out.written} copies, {pushed.fan_out.skipped} skipped (dave is dormant)")
        dave = raw[owner]["feed_demo"]["feed"].count_documents({"receiver_id": "dave", "sender_id": "bob"})
        check(dave == 0, "the dormant user got no copy")
        rebuilt = await feeds.backfill("dave", ["bob"], since=when - timedelta(days=1))
        copy = raw[owner]["feed_demo"]["feed"].find_one({"receiver_id": "dave", "data_key": ordinary.data_key})
        out(f"   dave is back: backfill copied {rebuilt.written} post(s) from bob's outbox")
        check(copy is not None and copy["_id"] == copy_id(int(ordinary.event_time.timestamp()), ordinary.data_key, "dave"),
              "dave's copy is back, under the same id fan-out would have given it")
        again = await feeds.backfill("dave", ["bob"], since=when - timedelta(days=1))
        check(again.written == 0 and again.already_present == rebuilt.written, "a second backfill stores nothing twice")


def _celery(
    out: _Out, check: Callable[[bool, str], None], now: datetime, config_path: Path, cluster_lines: list[str],
    raw: dict[str, MongoClient[dict[str, object]]], broker: LocalRedis,
) -> int:
    """Add a celery section to clusters.yaml, start one worker on it, fan a post out through Redis; return the copies."""
    out("== fan-out on Celery: clusters.yaml gains celery: {broker}, one `feedrouter -c clusters.yaml worker` runs")
    config_path.write_text(CONFIG_TEMPLATE.format(clusters="\n".join(cluster_lines[:3]), extra=CELERY.format(url=broker.url)))
    worker = WorkerProcess(config_path, name="demo", log_path=config_path.with_name("worker.log")).start()
    try:
        t0 = time.perf_counter()
        worker.wait_ready()
        ready = time.perf_counter() - t0
        post = Activity(sender_id="carol", event_time=now - timedelta(hours=1), type=1, data={"fabula_id": 5_000_000},
                        data_key=data_key("fabula", 5_000_000))
        followers = [f"follower-{i}" for i in range(FOLLOWERS)]
        with FeedRouter.from_yaml(config_path) as router:
            app = app_from_config(router.config)
            try:
                t0 = time.perf_counter()
                published = publish_fan_out(router, app, post, followers)
                deadline = time.monotonic() + 60  # stop waiting early if the broker or the worker is gone
                while ((status := router.fan_out_status(published.job_id)).state == "running" and broker.alive
                       and worker.process is not None and worker.process.poll() is None and time.monotonic() < deadline):
                    time.sleep(0.05)  # progress is read from the checkpoint, as `feedrouter fanout-status` does
                elapsed = time.perf_counter() - t0
            finally:
                app.close()
    finally:
        try:
            worker.stop(grace=10)  # SIGTERM: a warm shutdown
        finally:
            worker.kill()  # no-op after a clean stop; a second Ctrl-C during the shutdown still leaves no worker
    out(f"   worker (pid {worker.pid}) ready in {ready:.1f} s; carol's post sent as {published.tasks_sent} tasks to "
        f"{FOLLOWERS:,} followers; fanout-status says {status.state} after {elapsed:.1f} s ({status.written:,} written)")
    copies = Counter(d["receiver_id"] for c in raw.values()
                     for d in c["feed_demo"]["feed"].find({"data_key": post.data_key}, {"_id": 0, "receiver_id": 1}))
    if status.state != "done":
        out(log_tail([worker.log_path]))
    check(status.state == "done" and set(copies) == set(followers) and set(copies.values()) == {1},
          f"every one of the {FOLLOWERS:,} followers has exactly one copy (counted with pymongo in every cluster)")
    return sum(copies.values())


def _rollover(
    out: _Out,
    check: Callable[[bool, str], None],
    now: datetime,
    periods: list[tuple[datetime, datetime | None]],
    config_path: Path,
    cluster_lines: list[str],
    raw: dict[str, MongoClient[dict[str, object]]],
    migrations: list[Migration],
) -> datetime:
    """Add the standby to clusters.yaml, let the scheduler roll over to it, write across the boundary."""
    out("== rollover: the scheduler hands the next period to the standby cluster_4")
    config_path.write_text(CONFIG_TEMPLATE.format(clusters="\n".join(cluster_lines), extra=ROLLOVER))
    config = load_config(config_path)
    assert config.rollover is not None
    lead = config.rollover.lead_time
    with Clusters(config) as clusters:
        report = migrate_cluster(clusters["cluster_4"], config, migrations)
    out(f"   cluster_4 listed under rollover.standby and migrated ({', '.join(report.applied) or 'already'})")
    boundary = upcoming_boundary(periods[-1][0], now=now, settings=config.rollover)
    window = boundary - 2 * lead + timedelta(hours=1)
    out(f"   next boundary B = {boundary.isoformat()}; the scheduler acts between B - 2*lead and B - lead")
    out(f"   (the demo sets the scheduler's clock to {window.isoformat()}, inside that window)")
    scheduler = RolloverScheduler(config, clock=lambda: window, owner="demo")
    try:
        for line in scheduler.tick():
            if ": run on " not in line:
                out(f"   {line}")
    finally:
        scheduler.close()
    check(scheduler.last_error is None, "the scheduler rolled over without error")
    after = boundary + timedelta(hours=1)
    out(f"== writing across the boundary, {SIDE} of alice's items on each side (router clock set to {after.isoformat()})")
    reads = _Reads({client.address: name for name, client in raw.items()})
    with FeedRouter(config, clock=lambda: after, refresh=False, event_listeners=[reads]) as router:
        out(router.timemap.describe())
        layouts = {name: router.timemap.layout_of(name) for name in raw}
        out(f"   layouts (from the clusters' metadata): {', '.join(f'{n} {layout}' for n, layout in layouts.items())}")
        check(layouts["cluster_4"] == "buckets" and layouts["cluster_3"] == "copies",
              "the period the rollover opened is in buckets; the one before stays in copies")
        edge = [boundary - timedelta(seconds=1), boundary, boundary + timedelta(seconds=1)]
        times = [*edge, *(boundary + k * timedelta(minutes=1) for k in range(1, SIDE - 1)),
                 *(boundary - k * timedelta(minutes=1) for k in range(1, SIDE))]
        router.write_many(
            FeedItem(receiver_id="alice", sender_id=777, event_time=t, type=1, data={"fabula_id": 3_000_000 + i},
                     data_key=data_key("fabula", 3_000_000 + i))
            for i, t in enumerate(times)
        )
        reads.on = True
        page = router.read("alice", limit=PAGE)
        reads.on = False
    shown = [k for k in range(1, len(page.items)) if page.sources[k] != page.sources[k - 1]]
    out(f"   one page of {len(page.items)}, newest first; where it crosses from buckets to copies:")
    for k in range(max(shown[0] - 2, 0), shown[0] + 2) if shown else ():
        it, src = page.items[k], page.sources[k]
        out(f"   {it.event_time:%Y-%m-%d %H:%M:%S}  from {it.sender_id}  fabula {it.data['fabula_id']:<8} <- {src} ({layouts[src]})")
    old = _feed(raw, "cluster_3").count_documents({"sender_id": 777})
    new = sum(x["sender_id"] == 777 for d in _feed(raw, "cluster_4").find({"receiver_id": "alice"}) for x in d["items"])
    check(old == SIDE and new == SIDE, f"the {SIDE} items before B are in cluster_3, the {SIDE} at and after B in cluster_4's buckets")
    times_read = [it.event_time for it in page.items]
    check(len(page.items) == PAGE and page.sources[:SIDE] == ("cluster_4",) * SIDE
          and page.sources[SIDE:] == ("cluster_3",) * (PAGE - SIDE) and times_read == sorted(times_read, reverse=True),
          f"the page holds the {SIDE} items in buckets, then the {PAGE - SIDE} newest per-copy items, newest first")
    _page_documents(out, check, raw, page, layouts, reads)
    return boundary


def _feed(raw: dict[str, MongoClient[dict[str, object]]], name: str) -> Any:
    return raw[name]["feed_demo"]["feed"]


def _page_documents(
    out: _Out, check: Callable[[bool, str], None], raw: dict[str, MongoClient[dict[str, object]]], page: Page,
    layouts: dict[str, str], reads: _Reads,
) -> None:
    """What the page cost in each layout, and that each of its items is stored once: counted with plain pymongo."""
    out("== the page's documents, per period (stored documents counted with plain pymongo, not through the router)")
    ids = [it.id for it in page.items if it.id is not None]
    wanted = set(ids)
    stored: Counter[ObjectId] = Counter()  # a copy is a document of its own, or an element of a bucket's items
    for name in raw:
        for doc in _feed(raw, name).find({"$or": [{"_id": {"$in": ids}}, {"items._id": {"$in": ids}}]}):
            stored.update([x["_id"] for x in doc["items"] if x["_id"] in wanted] if "items" in doc else [doc["_id"]])
    for name in dict.fromkeys(page.sources):
        mine = [it.id for it, src in zip(page.items, page.sources) if src == name]
        if layouts[name] == "buckets":
            docs = _feed(raw, name).count_documents({"items._id": {"$in": mine}})
        else:
            docs = _feed(raw, name).count_documents({"_id": {"$in": mine}})
        out(f"   {name} ({layouts[name]}): {len(mine)} items stored in {docs} documents; the server returned "
            f"{reads.returned[name]} documents to the page's {reads.described(name)}")
        if layouts[name] == "copies":
            check(docs == len(mine), f"{name}'s {len(mine)} items needed one document each")
        else:
            fewest = -(-len(mine) // BUCKET_CAP)
            check(docs == fewest, f"{name}'s {len(mine)} items sit in {fewest} buckets, the fewest possible at {BUCKET_CAP} copies a bucket")
    sizes = [len(d["items"]) for d in _feed(raw, "cluster_4").find({}, {"items._id": 1})]
    out(f"   cluster_4 holds {len(sizes)} buckets, {sum(sizes)} copies, the fullest with {max(sizes, default=0)}")
    check(all(n <= BUCKET_CAP for n in sizes), f"every bucket holds at most {BUCKET_CAP} copies")
    check(len(ids) == len(page.items) and all(stored[i] == 1 for i in ids),
          f"every one of the page's {len(ids)} items is stored exactly once (in all four clusters)")


class _Reads(monitoring.CommandListener):
    """Counts, per cluster, the commands a router sends and the documents its find/getMore replies hold, while on."""

    def __init__(self, clusters: dict[tuple[str, int | None] | None, str]) -> None:
        self.clusters = clusters
        self.on = False
        self.returned: Counter[str] = Counter()
        self.commands: dict[str, Counter[str]] = {}
        self._lock = threading.Lock()

    def described(self, name: str) -> str:
        """``1 find, 1 aggregate``: the commands sent to cluster *name*."""
        sent = self.commands.get(name, Counter())
        return ", ".join(f"{n} {command}{'s' if n > 1 else ''}" for command, n in sent.items()) or "no command"

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        if self.on:
            with self._lock:
                self.commands.setdefault(self.clusters.get(event.connection_id, "?"), Counter())[event.command_name] += 1

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        if self.on and event.command_name in ("find", "getMore"):
            cursor = event.reply.get("cursor", {})
            with self._lock:
                self.returned[self.clusters.get(event.connection_id, "?")] += len(
                    cursor.get("firstBatch", cursor.get("nextBatch", ())))

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m harness.demo [--posts N] [--backend NAME]``: run the demo; exit 0 when every check held, else 1."""
    parser = argparse.ArgumentParser(
        prog="scripts/demo",
        description="Start four local MongoDB-wire servers (mongod if on PATH, else FerretDB 2 on DocumentDB) and a "
        "Redis broker, add three as consecutive periods, write fanned-out feed items (some late), page a feed newest "
        "first across the boundaries, delete one item everywhere, publish a pulled celebrity post and rebuild a "
        "dormant user's feed (asyncio door), fan one post out on a Celery worker, let the rollover scheduler hand the "
        "next period to the fourth (standby) cluster in the buckets layout, read one page that spans the per-copy "
        "and the buckets period, check every claim with plain pymongo, and stop the servers.",
    )
    parser.add_argument("--posts", type=int, default=800, help="posts to fan out (default: %(default)s)")
    parser.add_argument("--backend", choices=["auto", "mongod", "ferretdb2", "ferretdb-pg", "ferretdb-sqlite", "ferretdb",
                                              "docker"], default=None,
                        help="server for the clusters (default: $FEED_TEST_BACKEND, else auto: mongod if on PATH, else "
                        "FerretDB 2 on DocumentDB); with FerretDB 1 (ferretdb-pg, ferretdb-sqlite) the fourth, which "
                        "holds a buckets period, runs on mongo-java-server")
    args = parser.parse_args(argv)
    if args.posts < 1:
        parser.error(f"--posts: must be at least 1 (got {args.posts})")
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    return run_demo(sys.stdout, posts=args.posts, backend=args.backend)


if __name__ == "__main__":
    sys.exit(main())
