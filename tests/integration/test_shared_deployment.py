"""Periods that share a deployment, when it dies or hangs: p1-p3 on deployment A (one server, a database each), p0 on
deployment B. A deployment found down costs its periods one turn, calls stay within ``timeout``, and its client is not
made again and again."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from typing import Any

import attrs
import pytest
from pymongo import MongoClient, monitoring

from router import FeedItem, FeedRouter, RouterConfig, RouterError, data_key
from router.config import ClusterConfig
from harness.localservers import LocalClusters, LocalServer

from .conftest import NOW, UTC, register
from .test_faults import in_thread, timed

#: p0 (deployment B), then p1, p2, p3 (deployment A), newest last.
STARTS = (datetime(2024, 1, 1, tzinfo=UTC), datetime(2024, 3, 1, tzinfo=UTC), datetime(2024, 5, 1, tzinfo=UTC),
          datetime(2024, 7, 1, tzinfo=UTC))
PERIODS = tuple(zip(STARTS, (*STARTS[1:], None)))
NAMES = ("p0", "p1", "p2", "p3")
ON_A = ("p3", "p2", "p1")  # newest first, as a page asks them
TIMEOUT = timedelta(seconds=2)
#: How far past ``timeout`` a call may return with a deployment dead: CPU time on two cores shared with the servers
#: and other test runs. The overrun this bounds was pymongo's server selection, which looks again only every 0.5 s:
#: 0.45-0.5 s past the deadline (and 1.1 s on the async refresh).
MARGIN = 0.3


@pytest.fixture(scope="module")
def deployment_a() -> Iterator[LocalServer]:
    """Deployment A: one server of this module's own, which its tests kill or stop."""
    with LocalClusters(1, names=["deployment_a"]) as local:
        yield local.servers[0]


@pytest.fixture
def shared(
    deployment_a: LocalServer, servers: LocalClusters, db_name: str, open_router: Callable[..., Any]
) -> Iterator[Callable[..., FeedRouter]]:
    """Open a router (through the test's door) over p0 on B and p1-p3 on A, each period in a database of its own."""
    databases = {n: f"{db_name}_{n}" for n in NAMES}

    def make(*, event_listeners: Any = None, **settings: Any) -> FeedRouter:
        options = settings.pop("options", {})
        uris = {"p0": servers.uris[0], **{n: deployment_a.uri for n in ON_A}}
        config = RouterConfig(
            database=db_name, timeout=settings.pop("timeout", TIMEOUT),
            clusters=tuple(ClusterConfig(name=n, uri=uris[n], options=dict(options), database=databases[n]) for n in NAMES),
            **settings,
        )
        register(config, PERIODS)
        extra = {"event_listeners": event_listeners} if event_listeners else {}
        router: FeedRouter = open_router(config, clock=lambda: NOW, refresh=False, **extra)
        return router

    yield make
    if deployment_a.alive:
        deployment_a.resume()  # a failed test may have left it stopped; SIGCONT to a running server is harmless
    else:
        deployment_a.restart()
    client: MongoClient[dict[str, Any]]
    with MongoClient(deployment_a.uri) as client:
        for n in ON_A:
            client.drop_database(databases[n])
    with MongoClient(servers.uris[0]) as client:
        client.drop_database(databases["p0"])


def one_each(receiver: int) -> list[FeedItem]:
    """One item for *receiver* in each period, p0's first."""
    return [FeedItem(receiver_id=receiver, sender_id=1, event_time=start + timedelta(days=5), type=1, data={"p": p},
                     data_key=data_key("shared", receiver * 10 + p)) for p, start in enumerate(STARTS)]


def fault(server: LocalServer, how: str) -> None:
    if how == "kill":
        server.kill()
    else:
        server.pause()


@pytest.mark.parametrize("how", [
    pytest.param("kill", marks=pytest.mark.needs_durable_server),  # the restarted server must still hold A's items
    "stop",
])
def test_a_dead_deployment_leaves_the_other_its_partial_page(
    shared: Callable[..., FeedRouter], deployment_a: LocalServer, how: str
) -> None:
    """timeout 2s, one item per period, deployment A killed or stopped: a partial page serves p0's item within the
    timeout and names exactly A's three periods, twice in a row (the second time pymongo may know A is down); once A
    is back, the cursor yields A's items, each once. Before: 0 items after about 2 s, and p0 listed unavailable too."""
    router = shared()
    router.write_many(one_each(1))
    assert [i.data["p"] for i in router.read(1).items] == [3, 2, 1, 0]
    fault(deployment_a, how)
    pages = []
    for _ in range(2):
        elapsed, page = timed(lambda: router.read(1, on_unavailable="partial"))
        assert not isinstance(page, Exception), page
        assert [i.data["p"] for i in page.items] == [0], (how, page.unavailable, f"{elapsed:.2f} s")
        assert page.partial and sorted(page.unavailable) == sorted(ON_A)
        assert elapsed < TIMEOUT.total_seconds() + MARGIN, f"{elapsed:.2f} s"
        pages.append(page)
    if how == "kill":
        deployment_a.restart()
    else:
        deployment_a.resume()
    cursor, owed = pages[-1].next_cursor, []
    for _ in range(5):  # a restarted server may still be too slow for its first turn: the page then owes A again
        later = in_thread(lambda: router.read(1, cursor=cursor, on_unavailable="partial"))
        owed += [i.data["p"] for i in later.items]
        cursor = later.next_cursor
        if not later.partial:
            break
    assert owed == [3, 2, 1] and cursor is None


@pytest.mark.parametrize("how", ["kill", "stop"])
def test_no_call_overruns_the_timeout_with_a_dead_deployment(
    shared: Callable[..., FeedRouter], deployment_a: LocalServer, how: str
) -> None:
    """timeout 2s, deployment A killed or stopped: reads (raise and partial), writes into A's periods, a write mixing
    both deployments and refresh each return (or raise a RouterError) within timeout + MARGIN, several times over.
    Before: read and refresh 2.45-2.49 s, the async door's write 2.50 s and refresh 3.11 s."""
    router = shared()
    router.write_many(one_each(2))
    fault(deployment_a, how)
    items = one_each(3)
    calls: dict[str, Callable[[], Any]] = {
        "read raise": lambda: router.read(2, on_unavailable="raise"),
        "read partial": lambda: router.read(2, on_unavailable="partial"),
        "write": lambda: router.write(items[3]),
        "write_many": lambda: router.write_many(items),
        "refresh": lambda: router.refresh(),
    }
    bound = TIMEOUT.total_seconds() + MARGIN
    for round_ in range(2):
        for name, call in calls.items():
            elapsed, outcome = timed(call)
            assert not isinstance(outcome, Exception) or isinstance(outcome, RouterError), (name, outcome)
            assert elapsed < bound, f"round {round_}: {name} took {elapsed:.2f} s (bound {bound} s): {outcome!r}"


class ServersOpened(monitoring.ServerListener):
    """Which client (topology) started monitoring which server: one per client made, at its first request."""

    def __init__(self) -> None:
        self.clients: dict[tuple[str, int], set[Any]] = {}

    def opened(self, event: monitoring.ServerOpeningEvent) -> None:
        self.clients.setdefault(event.server_address, set()).add(event.topology_id)

    def description_changed(self, event: monitoring.ServerDescriptionChangedEvent) -> None:
        pass

    def closed(self, event: monitoring.ServerClosedEvent) -> None:
        pass


def test_a_down_deployments_client_is_not_made_again_and_again(
    shared: Callable[..., FeedRouter], deployment_a: LocalServer
) -> None:
    """clients.idle_close 200ms, deployment A killed: writes into p3 (each waits for A longer than idle_close) and into
    p0 (deployment B) by turns. A's client is made once; before, its idle time was counted from the request's start, so
    the next request to B closed it and every write to p3 made a new one."""
    listener = ServersOpened()
    router = shared(client_idle_close=timedelta(milliseconds=200), event_listeners=[listener])
    items = one_each(5)
    router.write_many(items)  # A's client is made here
    deployment_a.kill()
    listener.clients.clear()
    for n in range(3):
        elapsed, outcome = timed(lambda: router.write(attrs.evolve(items[3], data_key=data_key("again", n))))
        assert isinstance(outcome, RouterError) and elapsed > 0.2, (outcome, elapsed)
        router.write(attrs.evolve(items[0], data_key=data_key("again", n)))
    made_again = [made for (_host, port), made in listener.clients.items() if port == deployment_a.port]
    assert made_again == [], made_again
