"""Rollover, live metadata and retirement against real servers, with a controllable clock."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from bson import ObjectId
from prometheus_client import CollectorRegistry
from pymongo import MongoClient

from router import ClusterConfig, ClusterMeta, FeedItem, ReadWindow, RouterConfig, data_key
from router.admin.indexes import create_feed_indexes
from router.admin.migrate import discover, migrate_cluster
from router.admin.periods import retire
from router.admin.rollover import RolloverScheduler, do_rollover, plan_rollover
from router.config import RolloverConfig
from router.core.layouts import DEFAULT, LAYOUTS, Copy
from router.errors import ClusterRetired, PeriodChangeRefused, RolloverError, StaleMetadata
from router.observe.prometheus import PrometheusMetrics
from router.storage.clusters import Cluster, Clusters
from harness.localservers import LocalClusters

from . import stored
from .conftest import DOOR_PER_LAYOUT, drop_database, running
from .pool import new_name

#: A storage contract file: every test here runs once per layout the servers hold (see conftest.py).
pytestmark = pytest.mark.contract

UTC = timezone.utc
P0 = datetime(2024, 3, 1, tzinfo=UTC)
P1 = datetime(2024, 4, 1, tzinfo=UTC)
B = datetime(2024, 5, 1, tzinfo=UTC)  # the next monthly boundary after cluster_2 opened
LEAD = timedelta(days=7)
T0 = datetime(2024, 4, 20, tzinfo=UTC)  # inside the window [B - 2*lead, B - lead]


class Clock:
    """A clock the test moves by hand."""

    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


class Env:
    """The first *count* of the file's local servers: cluster_1 [P0, P1), cluster_2 [P1, open), the rest standby
    (migrated, empty); every period, and every one a rollover adds, in *layout*; all in *database* (``feed`` unless
    given)."""

    def __init__(self, local: LocalClusters, *, count: int = 3, standby_migrated: bool = True,
                 refresh: timedelta = timedelta(seconds=60), layout: str = DEFAULT, database: str = "feed") -> None:
        self.local = local
        self.database = database
        servers = local.servers[:count]
        names = [s.name for s in servers]
        self.config = RouterConfig(
            database=database,
            clusters=tuple(
                ClusterConfig(name=s.name, uri=s.uri, options={"serverSelectionTimeoutMS": 2000, "connectTimeoutMS": 2000})
                for s in servers
            ),
            refresh_interval=refresh,
            read_window=ReadWindow(),
            rollover=RolloverConfig(period="monthly", lead_time=LEAD, standby=tuple(names[2:]), layout=layout),
        )
        migrations = discover()
        for spec in self.config.clusters:
            c = Cluster(spec, self.config)
            if spec.name in ("cluster_1", "cluster_2") or standby_migrated:
                migrate_cluster(c, self.config, migrations)
            if spec.name == "cluster_1":
                c.write_meta(ClusterMeta(name="cluster_1", start_date=P0, end_date=P1, creator_name="t", layout=layout))
                create_feed_indexes(c, LAYOUTS[layout])
            if spec.name == "cluster_2":
                c.write_meta(ClusterMeta(name="cluster_2", start_date=P1, creator_name="t", layout=layout))
                create_feed_indexes(c, LAYOUTS[layout])
            c.close()
        self.raw = {s.name: MongoClient(s.uri, tz_aware=True) for s in servers}

    def meta(self) -> dict[str, list[dict[str, Any]]]:
        return {n: list(c[self.database].metadata.find({}, {"_id": 1, "start_date": 1, "end_date": 1}))
                for n, c in self.raw.items()}

    def feed(self, name: str) -> list[Copy]:
        """The copies cluster *name* stores, read through its period's layout."""
        return stored.copies(self.raw[name][self.database])

    def close(self) -> None:
        for c in self.raw.values():
            c.close()


@pytest.fixture(scope="module")
def rollover_servers() -> Iterator[LocalClusters]:
    """Four servers of this file's own, which its tests pause, kill and restart; each test has a database of its own
    on them (:func:`own_env`), on the first three (:func:`env3`) or on all four. (A set per test cost three or four
    server starts each, 20 times a run.)"""
    with LocalClusters(4) as local:
        yield local


@pytest.fixture
def own_env(rollover_servers: LocalClusters) -> Iterator[Callable[..., Env]]:
    """Make an :class:`Env` (its arguments but the database) on the file's servers, every one running, in a database
    of its own; dropped afterwards."""
    made: list[Env] = []

    def make(**kwargs: Any) -> Env:
        made.append(Env(rollover_servers, database=new_name(), **kwargs))
        return made[-1]

    for server in rollover_servers.servers:
        running(server)
    yield make
    for server in rollover_servers.servers:
        running(server)
    for env in made:
        for client in env.raw.values():
            drop_database(client, env.database, rollover_servers.backend)
        env.close()


@pytest.fixture
def env3(layout: str, own_env: Callable[..., Env]) -> Env:
    """Three periods' servers of the file's, every period in the test's layout, refreshed every 100 ms."""
    return own_env(refresh=timedelta(milliseconds=100), layout=layout)


def item(t: datetime, n: int, sender: int) -> FeedItem:
    return FeedItem(receiver_id=n % 5, sender_id=sender, event_time=t, type=1, data={"n": n}, data_key=data_key("f", n))


def wait_for(condition: Any, what: str, timeout: float = 20.0) -> None:
    """Poll a condition a background thread will make true (bounded)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


@DOOR_PER_LAYOUT
def test_scheduler_rolls_over_while_two_routers_write(env3: Env, open_router: Callable[..., Any]) -> None:
    """The scheduler opens cluster_3 at B; the fresh router routes across B, the stale one refuses rather than guess."""
    clock = Clock(T0)
    fresh = open_router(env3.config, clock=clock)                 # background refresh every 100 ms
    stale = open_router(env3.config, clock=clock, refresh=False)  # refresh stopped, map from T0
    scheduler = RolloverScheduler(env3.config, clock=clock, interval=timedelta(milliseconds=100))
    rolled = threading.Event()
    tick = scheduler.tick

    def watched_tick() -> list[str]:
        lines = tick()
        if lines:
            rolled.set()
        return lines

    scheduler.tick = watched_tick  # type: ignore[method-assign]
    try:
        scheduler.start()
        assert rolled.wait(30), f"no rollover; last error: {scheduler.last_error}"
        meta = env3.meta()
        assert meta["cluster_2"][0]["end_date"] == B
        assert meta["cluster_3"][0]["start_date"] == B and meta["cluster_3"][0]["end_date"] is None

        clock.now = B - timedelta(minutes=1)  # the boundary is near; writes straddle it
        wait_for(lambda: "cluster_3" in fresh.timemap.all_clusters() and fresh.refreshed_at == clock.now, "fresh router refresh")
        straddling = [B - timedelta(hours=1), B - timedelta(milliseconds=1), B, B + timedelta(hours=1)]
        fresh.write_many([item(t, i, sender=1) for i, t in enumerate(straddling)])

        # The stale router's one refresh attempt cannot see cluster_2, the period being closed (hung):
        # its last known period is open-ended and overlaps cluster_3's new one, so the map is refused
        # and the router must not guess.
        env3.local.servers[1].pause()
        try:
            with pytest.raises(StaleMetadata, match=r"items\[0\].event_time: 2024-04-30T23:00:00\+00:00 is past what the time map"):
                stale.write_many([item(t, 100 + i, sender=2) for i, t in enumerate(straddling)])
            with pytest.raises(StaleMetadata):
                stale.prepare([item(B, 150, sender=2)])  # prepare does no I/O: it says so, never guesses
        finally:
            env3.local.servers[1].resume()
        stale.write(item(T0 + timedelta(days=1), 200, sender=2))  # well inside what it knew: fine
        stale.write_many([item(t, 300 + i, sender=2) for i, t in enumerate(straddling)])  # refresh works now

        c2, c3 = env3.feed("cluster_2"), env3.feed("cluster_3")
        assert all(d.event_time < B for d in c2) and all(d.event_time >= B for d in c3)
        assert sorted(d.data["n"] for d in c2) == [0, 1, 200, 300, 301]
        assert sorted(d.data["n"] for d in c3) == [2, 3, 302, 303]
        assert env3.feed("cluster_1") == []
    finally:
        scheduler.close()
        fresh.close()
        stale.close()


def test_two_schedulers_racing_make_one_period(own_env: Callable[..., Env]) -> None:
    """Two schedulers ticking at once over two standbys: exactly one new period appears."""
    env = own_env(count=4)
    clock = Clock(T0)
    a = RolloverScheduler(env.config, clock=clock, owner="a")
    b = RolloverScheduler(env.config, clock=clock, owner="b")
    barrier = threading.Barrier(2)
    results: dict[str, list[str]] = {}

    def run(s: RolloverScheduler) -> None:
        barrier.wait()
        results[s.owner] = s.tick()

    threads = [threading.Thread(target=run, args=(s,)) for s in (a, b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for again in (a, b):  # re-running changes nothing
        again.tick()
    meta = env.meta()
    assert meta["cluster_4"] == [] and len(meta["cluster_3"]) == 1
    assert meta["cluster_3"][0]["start_date"] == B and meta["cluster_2"][0]["end_date"] == B
    assert sum(1 for lines in results.values() if any("write metadata" in x for x in lines)) == 1
    with Clusters(env.config) as clusters:
        assert clusters.load_timemap().all_clusters() == ["cluster_1", "cluster_2", "cluster_3"]
    a.close()
    b.close()


def test_no_ready_standby_fails_early_and_clearly(own_env: Callable[..., Env], caplog: pytest.LogCaptureFixture) -> None:
    """An unmigrated standby is reported at the first tick, weeks before the boundary, and the manual rollover refuses;
    the scheduler's gauges show it, and show the standby ready once it is migrated."""
    registry = CollectorRegistry()
    env = own_env(standby_migrated=False)
    early = Clock(P1 + timedelta(days=1))  # 2024-04-02: far from the window
    scheduler = RolloverScheduler(env.config, clock=early, metrics=PrometheusMetrics(registry=registry))
    with caplog.at_level(logging.ERROR, logger="router.admin.rollover"):
        assert scheduler.tick() == []
    assert registry.get_sample_value("feedrouter_standby_ready") == 0
    assert registry.get_sample_value("feedrouter_next_boundary_timestamp_seconds") == B.timestamp()
    assert isinstance(scheduler.last_error, RolloverError)
    assert "no standby cluster is ready for the rollover at 2024-05-01T00:00:00+00:00" in str(scheduler.last_error)
    assert f"standby cluster 'cluster_3' is not migrated ({', '.join(m.id for m in discover())} pending)" in caplog.text
    with Clusters(env.config) as clusters, pytest.raises(RolloverError, match="not migrated"):
        do_rollover(clusters, env.config, now=T0, owner="me")
    assert env.meta()["cluster_3"] == [] and env.meta()["cluster_2"][0].get("end_date") is None
    # a standby holding data is not ready either
    migrate_cluster(Cluster(env.config.clusters[2], env.config), env.config, discover())
    assert scheduler.tick() == [] and scheduler.last_error is None
    assert registry.get_sample_value("feedrouter_standby_ready") == 1
    env.raw["cluster_3"][env.database].feed.insert_one({"receiver_id": 1, "event_time": B})
    with Clusters(env.config) as clusters, pytest.raises(RolloverError, match=r"already holds 1 documents \(1 feed\)"):
        plan_rollover(clusters, env.config, now=T0)
    scheduler.close()


def test_manual_rollover_too_late_or_dry_run(env3: Env) -> None:
    """Less than a lead time before B is too late; a dry run changes nothing."""
    before = env3.meta()
    with Clusters(env3.config) as clusters:
        with pytest.raises(RolloverError, match="too late to roll over at 2024-05-01"):
            do_rollover(clusters, env3.config, now=B - LEAD + timedelta(seconds=1), owner="me", at=B)
        lines = do_rollover(clusters, env3.config, now=T0, owner="me", dry_run=True)
        assert "open cluster 'cluster_3': [2024-05-01T00:00:00Z, open)" in lines
        assert env3.meta() == before
        # when late for B, the automatic choice moves on to the next boundary that is still a lead time away
        plan = plan_rollover(clusters, env3.config, now=B - timedelta(days=2))
        assert plan.boundary == datetime(2024, 6, 1, tzinfo=UTC)


def test_retired_cluster_skipped_by_reads_covered_by_deletes(env3: Env, open_router: Callable[..., Any]) -> None:
    """After retire: reads skip cluster_1, writes into its period fail, deletes still reach it."""
    clock = Clock(T0)
    key = data_key("fabula", 1)
    with open_router(env3.config, clock=clock, refresh=False) as router:
        router.write_many([
            FeedItem(receiver_id=1, sender_id=1, event_time=t, type=1, data={}, data_key=key)
            for t in (P0 + timedelta(days=1), P1 + timedelta(days=1))
        ])
        assert router.read(1).sources == ("cluster_2", "cluster_1")
        with Clusters(env3.config) as clusters:
            with pytest.raises(PeriodChangeRefused, match="has not ended yet"):
                retire(clusters, "cluster_2", now=clock.now)
            retire(clusters, "cluster_1", now=clock.now)
            retire(clusters, "cluster_1", now=clock.now)  # idempotent
        router.refresh()
        assert router.timemap.retired == {"cluster_1"}
        page = router.read(1)
        assert page.sources == ("cluster_2",) and page.queried == ("cluster_2",)
        with pytest.raises(ClusterRetired, match="belongs to cluster 'cluster_1' .* which is retired"):
            router.write(item(P0 + timedelta(days=2), 9, sender=1))
        assert router.delete(key) == 2
        assert env3.feed("cluster_1") == [] and env3.feed("cluster_2") == []


def test_refresh_keeps_going_when_an_unrelated_cluster_is_down(env3: Env, open_router: Callable[..., Any]) -> None:
    """cluster_1 (a closed period) dies; refreshes keep its last known period, so writes past the old horizon go on."""
    clock = Clock(T0)
    with open_router(env3.config, clock=clock, refresh=False) as router:
        env3.local.servers[0].kill()
        clock.now = T0 + LEAD + timedelta(days=1)  # past the horizon of the map loaded at T0
        router.write(item(clock.now, 1, sender=1))  # refresh (cluster_1 unreachable) still succeeds
        assert router.refreshed_at == clock.now
        assert router.timemap.all_clusters() == ["cluster_1", "cluster_2"]
        assert [d.data["n"] for d in env3.feed("cluster_2")] == [1]
        env3.local.servers[0].restart()


def test_interrupted_rollover_is_finished_by_a_rerun(env3: Env, layout: str) -> None:
    """A crash after closing cluster_2 at B but before opening cluster_3: the next tick finishes it."""
    with Clusters(env3.config) as clusters:
        clusters["cluster_2"].write_meta(ClusterMeta(name="cluster_2", start_date=P1, end_date=B, creator_name="t"))
    late = Clock(B - timedelta(days=1))  # past the deadline: finishing is allowed anyway
    scheduler = RolloverScheduler(env3.config, clock=late)
    lines = scheduler.tick()
    scheduler.close()
    assert scheduler.last_error is None, scheduler.last_error
    named = "" if layout == DEFAULT else f", layout {layout}"
    assert f"write metadata of cluster 'cluster_3': [2024-05-01T00:00:00Z, open){named}" in lines
    assert env3.meta()["cluster_3"][0]["start_date"] == B


def test_every_time_placed_record_blocks_a_rollover_that_would_strand_it(env3: Env) -> None:
    """A seen marker, a read mark of groups, a pulled post's outbox entry or a fan-out job dated past B in cluster_2
    each refuse the rollover at B (each counted and named); a standby holding any of them is not ready; without them
    it goes through."""
    c2, c3 = env3.raw["cluster_2"][env3.database], env3.raw["cluster_3"][env3.database]
    after = B + timedelta(hours=5)
    records = [
        ("seen", after, {"receiver_id": 1, "event_time": after, "key": ObjectId()}),
        ("seen", after, {"receiver_id": 1, "group": "*", "read_time": after, "read_key": ObjectId()}),  # (no event_time)
        ("outbox", after - timedelta(hours=1),
         {"sender_id": "celeb", "event_time": after - timedelta(hours=1), "data_key": "k", "type": 1, "data": {}}),
        ("fanouts", after - timedelta(hours=2),
         {"_id": "job", "data_key": "k2", "event_time": after - timedelta(hours=2), "batch_size": 10}),
    ]
    for collection, when, doc in records:
        c2[collection].insert_one(dict(doc))
        with Clusters(env3.config) as clusters, pytest.raises(RolloverError) as info:
            plan_rollover(clusters, env3.config, now=T0)
        assert (f"cluster 'cluster_2' holds 1 documents at or after 2024-05-01T00:00:00+00:00 (latest "
                f"{when.isoformat()}; 1 {collection})") in str(info.value), str(info.value)
        c2[collection].delete_many({})
        c3[collection].insert_one(dict(doc))  # the same record on the standby: it is not empty
        with Clusters(env3.config) as clusters, pytest.raises(RolloverError) as info:
            plan_rollover(clusters, env3.config, now=T0)
        assert f"standby cluster 'cluster_3' already holds 1 documents (1 {collection})" in str(info.value)
        c3[collection].delete_many({})
    c2["seen"].insert_one({"receiver_id": 1, "event_time": B - timedelta(hours=1), "key": ObjectId()})  # inside: fine
    with Clusters(env3.config) as clusters:
        do_rollover(clusters, env3.config, now=T0, owner="me")
    assert env3.meta()["cluster_2"][0]["end_date"] == B
