"""Honest deadlines with a cluster hung (SIGSTOP): a socket timeout is a timeout, and a hung cluster leaves the
others their time."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from pymongo import monitoring

from router import Activity, ClusterUnavailable, FeedItem, FeedRouter, RouterConfig, RouterError, WriteFailed, data_key
from router.observe.prometheus import PrometheusMetrics
from harness.localservers import LocalClusters, LocalServer

from .conftest import NAMES, NOW, P0, P1, P2, register
from .test_faults import HANG, feed_items, in_thread, timed

#: The calls' timeout in the page tests (clusters.yaml ``timeout``).
TIMEOUT = timedelta(seconds=2)


@pytest.fixture(scope="module")
def own_servers() -> Iterator[LocalClusters]:
    """Three servers of this module's own, which its tests stop (SIGSTOP) and resume."""
    with LocalClusters(3, names=[f"own_{n}" for n in NAMES]) as local:
        yield local


@pytest.fixture
def hung_router(
    own_servers: LocalClusters, make_config: Callable[..., RouterConfig], open_router: Callable[..., Any]
) -> Iterator[Callable[..., tuple[FeedRouter, list[LocalServer]]]]:
    """Make a router (through the test's door) over the module's own servers: cluster_1 oldest, cluster_3 newest."""
    opened: list[Any] = []

    def make(*, metrics: Any = None, **kwargs: Any) -> tuple[FeedRouter, list[LocalServer]]:
        config = make_config(uris=own_servers.uris, **kwargs)
        register(config)
        router = open_router(config, clock=lambda: NOW, refresh=False, metrics=metrics)
        opened.append(router)
        return router, list(own_servers.servers)

    yield make
    for server in own_servers.servers:
        server.resume()  # a failed test may have left one stopped; SIGCONT to a running server is harmless
    for router in opened:
        in_thread(router.close)


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


def test_a_socket_timeout_is_a_timeout_on_every_path(
    hung_router: Callable[..., tuple[FeedRouter, list[LocalServer]]], caplog: pytest.LogCaptureFixture
) -> None:
    """socketTimeoutMS 2000, the default 10 s timeout, cluster_2 stopped: write_many fails in about the socket timeout,
    naming cluster_2, with no retry logged or counted; reads, edits and fan-out come back as soon.

    Before, pymongo ignored socketTimeoutMS under the call's deadline (10.0 s), and on the async door the request
    it cancelled when its monitor timed out was retried as transient (10.1 s)."""
    registry = CollectorRegistry()
    router, servers = hung_router(socketTimeoutMS=2000, metrics=PrometheusMetrics(registry=registry))
    router.write_many(feed_items(1, 30))
    items = feed_items(1, 30, offset=100)
    in_p1 = [i for i, it in enumerate(items) if P1 <= it.event_time < P2]
    bound = 2.0 + 3.0  # the socket timeout, with room for a loaded machine; the deadline is 10 s
    servers[1].pause()
    try:
        with caplog.at_level(logging.DEBUG, logger="router.core.writes.insert"):
            elapsed, outcome = timed(lambda: router.write_many(items))
        assert isinstance(outcome, WriteFailed), outcome
        assert sorted(outcome.failed) == in_p1
        assert {e.cluster for e in outcome.failed.values()} == {"cluster_2"}  # type: ignore[attr-defined]
        assert elapsed < bound, f"write_many took {elapsed:.1f} s"
        assert "transient error; retry" not in caplog.text
        assert sample(registry, "feedrouter_retries_total", cluster="cluster_2", op="insert.feed") == 0
        assert sample(registry, "feedrouter_requests_total", cluster="cluster_2", op="insert.feed", outcome="timeout") == 1

        activity = Activity(sender_id=7, event_time=P1 + timedelta(days=2), type=1, data={}, data_key=data_key("a", 1))
        calls: dict[str, Callable[[], Any]] = {
            "read": lambda: router.read(1, limit=100, on_unavailable="raise"),
            "update": lambda: router.update(data_key("f", 1), {"n": -1}),
            "delete": lambda: router.delete(data_key("f", 2)),
            "fan_out": lambda: router.fan_out(activity, range(50)),
        }
        for name, call in calls.items():
            elapsed, outcome = timed(call)
            assert isinstance(outcome, RouterError), (name, outcome)
            assert elapsed < bound, f"{name} took {elapsed:.1f} s: {outcome!r}"
        assert sample(registry, "feedrouter_retries_total", cluster="cluster_2", op="insert.fanout_batches") == 0
    finally:
        servers[1].resume()


def test_a_request_cancelled_on_a_timeout_is_not_retried(
    hung_router: Callable[..., tuple[FeedRouter, list[LocalServer]]], caplog: pytest.LogCaptureFixture
) -> None:
    """No socket timeout before the 10 s deadline, a quick heartbeat: when pymongo's monitor times out on the stopped
    cluster it cancels the insert in flight; that is a timeout too, not retried (it was retried as transient)."""
    registry = CollectorRegistry()
    router, servers = hung_router(socketTimeoutMS=60_000, heartbeatFrequencyMS=500, connectTimeoutMS=1000,
                                  metrics=PrometheusMetrics(registry=registry))
    router.write_many(feed_items(2, 30))
    items = [it for it in feed_items(2, 30, offset=100) if P1 <= it.event_time < P2]
    servers[1].pause()
    try:
        with caplog.at_level(logging.DEBUG, logger="router.core.writes.insert"):
            elapsed, outcome = timed(lambda: router.write_many(items))
    finally:
        servers[1].resume()
    assert isinstance(outcome, WriteFailed), outcome
    assert sorted(outcome.failed) == list(range(len(items)))
    assert "transient error; retry" not in caplog.text
    assert sample(registry, "feedrouter_retries_total", cluster="cluster_2", op="insert.feed") == 0
    assert sample(registry, "feedrouter_requests_total", cluster="cluster_2", op="insert.feed", outcome="timeout") == 1
    assert elapsed < HANG


#: The three periods' bounds, oldest first (the newest ends at the tests' "now").
BOUNDS = (P0, P1, P2, NOW)


def period_items(receiver: int, per_period: int) -> list[FeedItem]:
    """*per_period* items for *receiver* in each of the three periods."""
    out = []
    for p, (start, end) in enumerate(zip(BOUNDS, BOUNDS[1:])):
        span = (end - start) / (per_period + 1)
        out += [FeedItem(receiver_id=receiver, sender_id=1, event_time=start + span * (i + 1), type=1,
                         data={"n": p * 100 + i}, data_key=data_key("d", p * 100 + i)) for i in range(per_period)]
    return out


@pytest.mark.parametrize("options", [{}, {"socketTimeoutMS": 1500}], ids=["default_socket_timeout", "socket_timeout_1.5s"])
def test_a_hung_cluster_leaves_the_others_a_partial_page(
    hung_router: Callable[..., tuple[FeedRouter, list[LocalServer]]], options: dict[str, Any]
) -> None:
    """timeout 2s, each cluster stopped in turn (newest, middle, oldest): the partial page holds the other two
    clusters' items, names only the stopped one, and once it is back the next cursor yields its items exactly once.

    Before, a stopped newest cluster used up the deadline: 0 items, all three clusters unavailable."""
    router, servers = hung_router(timeout=TIMEOUT, **options)
    per_period = 4  # a page of 10 needs all three clusters
    for position in (2, 1, 0):  # cluster_3 (newest) first
        receiver = 10 + position
        items = period_items(receiver, per_period)
        router.write_many(items)
        hung = NAMES[position]
        healthy = [it for it in items if not BOUNDS[position] <= it.event_time < BOUNDS[position + 1]]
        servers[position].pause()
        try:
            page = in_thread(lambda: router.read(receiver, limit=10, on_unavailable="partial"))
        finally:
            servers[position].resume()
        assert page.partial and page.unavailable == (hung,), (hung, page.unavailable)
        newest_first = sorted(healthy, key=lambda it: it.event_time, reverse=True)
        assert [it.data["n"] for it in page.items] == [it.data["n"] for it in newest_first], hung
        assert hung not in page.sources and page.next_cursor is not None
        seen = list(page.items)
        cursor = page.next_cursor
        while cursor is not None:
            later = in_thread(lambda: router.read(receiver, limit=10, cursor=cursor, on_unavailable="partial"))
            assert not later.partial, (hung, later.unavailable)
            seen += later.items
            cursor = later.next_cursor
        assert sorted(it.data["n"] for it in seen) == sorted(it.data["n"] for it in items), hung
        assert len({it.id for it in seen}) == len(items)


class TimeLimits(monitoring.CommandListener):
    """The ``maxTimeMS`` of every find, aggregate, insert, update and delete started while ``on``, with its name."""

    NAMES = ("find", "aggregate", "insert", "update", "delete")

    def __init__(self) -> None:
        self.on = False
        self.sent: list[tuple[str, Any]] = []

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        if self.on and event.command_name in self.NAMES:
            self.sent.append((event.command_name, event.command.get("maxTimeMS")))

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass


def test_every_request_carries_its_deadline_to_the_server(
    hung_router: Callable[..., tuple[FeedRouter, list[LocalServer]]]
) -> None:
    """timeout 3s: every find, count (an aggregate), insert, update and delete the calls send carries ``maxTimeMS``,
    more than 0 and at most the timeout, so the server stops what the router stops waiting for. (The async door
    sends it with its reads itself, which it bounds with asyncio.timeout; elsewhere pymongo.timeout sends it.)"""
    limits = TimeLimits()
    router, _servers = hung_router(timeout=timedelta(seconds=3), event_listeners=[limits])
    limits.on = True
    items = period_items(30, 4)
    router.write_many(items)
    assert len(router.read(30, limit=10).items) == 10
    router.unseen_count(30)
    router.update(items[0].data_key, {"n": -1})
    router.delete(items[1].data_key)
    assert {name for name, _ in limits.sent} == set(TimeLimits.NAMES), limits.sent
    assert all(isinstance(ms, int) and 0 < ms <= 3000 for _, ms in limits.sent), limits.sent


def test_reads_cut_at_their_deadline_give_their_connections_back(
    hung_router: Callable[..., tuple[FeedRouter, list[LocalServer]]]
) -> None:
    """maxPoolSize 1, timeout 1s, the newest cluster stopped (SIGSTOP): four reads at once each fail as a timeout
    naming it (one waiting for its answer, three for the one connection; the async door cuts them with
    asyncio.timeout, cancelling pymongo mid-request). Once the cluster is back, reads are answered again, one after
    another and four at once: no connection went back to the pool half-read, and none was lost from it."""
    registry = CollectorRegistry()
    router, servers = hung_router(timeout=timedelta(seconds=1), maxPoolSize=1,
                                  metrics=PrometheusMetrics(registry=registry))
    router.write_many([it for it in period_items(40, 3) if it.event_time >= P2])  # a page the newest period fills
    assert len(router.read(40, limit=3).items) == 3
    servers[2].pause()
    try:
        with ThreadPoolExecutor(4) as pool:
            outcomes = list(pool.map(lambda _: timed(lambda: router.read(40, limit=3)), range(4)))
    finally:
        servers[2].resume()
    for _elapsed, outcome in outcomes:
        assert isinstance(outcome, ClusterUnavailable) and outcome.cluster == "cluster_3", outcome
    assert sample(registry, "feedrouter_requests_total", cluster="cluster_3", op="find.feed", outcome="timeout") == 4
    for _ in range(3):
        assert len(in_thread(lambda: router.read(40, limit=3)).items) == 3
    with ThreadPoolExecutor(4) as pool:
        pages = list(pool.map(lambda _: in_thread(lambda: router.read(40, limit=3)), range(4)))
    assert [len(p.items) for p in pages] == [3, 3, 3, 3]
