"""Many periods on few deployments: a database per period, clients shared per deployment, made on first use."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from pymongo import MongoClient

from router import ClusterConfig, FeedItem, RouterConfig, data_key
from harness.fleet import fleet_config, register_fleet
from harness.localservers import LocalClusters

from .conftest import NAMES, NOW, PERIODS, register

Clients = dict[str, MongoClient[dict[str, Any]]]


def item(receiver: int, n: int, when: Any) -> FeedItem:
    return FeedItem(receiver_id=receiver, sender_id=1, event_time=when, type=1, data={"n": n}, data_key=data_key("fabula", n))


@pytest.fixture
def one_server_config(servers: LocalClusters, raw_clients: Clients, db_name: str) -> Iterator[RouterConfig]:
    """The three standard periods on ONE server, each in a database of its own (dropped afterwards)."""
    uri = servers.uris[0]
    config = RouterConfig(
        database=db_name,
        clusters=tuple(ClusterConfig(name=n, uri=uri, database=f"{db_name}_{i}") for i, n in enumerate(NAMES)),
    )
    yield config
    for i in range(len(NAMES)):
        raw_clients[NAMES[0]].drop_database(f"{db_name}_{i}")


def test_periods_in_databases_of_one_deployment(
    one_server_config: RouterConfig, open_router: Callable[..., Any], raw_clients: Clients, db_name: str
) -> None:
    """Each period's metadata, migrations and copies live in its own database; the top-level one stays empty."""
    config = one_server_config
    register(config)
    router = open_router(config, clock=lambda: NOW)
    times = [start + timedelta(days=3) for start, _ in PERIODS]
    router.write_many([item(7, i, t) for i, t in enumerate(times)])
    assert [i.data["n"] for i in router.read(7, limit=10).items] == [2, 1, 0]
    client = raw_clients[NAMES[0]]
    for i, name in enumerate(NAMES):
        db = client[f"{db_name}_{i}"]
        assert db.metadata.find_one({})["_id"] == name  # type: ignore[index]
        assert [d["data"]["n"] for d in db.feed.find({})] == [i]
        assert db.migrations.count_documents({}) >= 1
    assert client[db_name].list_collection_names() == []


def test_clients_are_made_on_first_use_and_shared_per_deployment(
    one_server_config: RouterConfig, open_router: Callable[..., Any]
) -> None:
    """After start-up no client is left open; three periods on one server then share one client."""
    config = one_server_config
    register(config)
    router = open_router(config, clock=lambda: NOW, refresh=False)
    assert router.clusters.clients.open() == []  # start-up read every period's metadata, then let go
    router.write_many([item(7, i, start + timedelta(days=1)) for i, (start, _) in enumerate(PERIODS)])
    assert len(router.read(7, limit=10).items) == 3
    assert [(c.kind, c.in_use) for c in router.clusters.clients.open()] == [("hot", False)]


def test_only_the_deployments_in_use_have_clients(make_router: Callable[..., Any]) -> None:
    """Writing into the newest period opens its deployment's client and no other."""
    router = make_router(refresh=False)
    router.write_many([item(7, 1, NOW)])
    assert [c.uri for c in router.clusters.clients.open()] == [router.clusters["cluster_3"].spec.display_uri]


def test_an_idle_client_is_closed_and_made_again_on_demand(make_router: Callable[..., Any]) -> None:
    """A client unused for longer than clients.idle_close goes at the next use of another; the next call makes it again."""
    router = make_router(refresh=False, idle_close=timedelta(milliseconds=1))
    newest, oldest = NOW, PERIODS[0][0] + timedelta(days=1)
    router.write_many([item(7, 1, newest)])
    time.sleep(0.05)  # longer than idle_close: not waiting for readiness, letting the client go idle
    router.write_many([item(7, 2, oldest)])
    assert [c.uri for c in router.clusters.clients.open()] == [router.clusters["cluster_1"].spec.display_uri]
    router.write_many([item(7, 3, newest)])
    assert [i.data["n"] for i in router.read(7, limit=10).items] == [3, 1, 2]


@pytest.fixture(scope="module")
def fleet() -> Iterator[RouterConfig]:
    """1,000 weekly periods on three servers of this file's own, a database each (metadata only); the servers are
    stopped afterwards. (On the session's servers, dropping the 1,000 databases took longer than starting three.)"""
    with LocalClusters(3) as local:
        config = fleet_config(local.uris, 1000, prefix="fleet")
        register_fleet(config)
        yield config


def test_a_router_over_a_thousand_periods_on_three_servers(
    fleet: RouterConfig, open_router: Callable[..., Any], door: str
) -> None:
    """It starts, writes each item into the period owning its time, and pages through them newest first."""
    receiver = {"sync": 11, "async": 12}[door]  # the fleet is shared by both doors' runs
    router = open_router(fleet, clock=lambda: NOW, refresh=False)
    assert len(router.timemap.periods) == 1000
    times = [NOW - timedelta(weeks=w, hours=1) for w in (0, 1, 2, 30, 500, 990)]
    router.write_many([item(receiver, n, t) for n, t in enumerate(times)])
    for n, t in enumerate(times):
        owner = router.timemap.cluster_for(t)
        stored = MongoClient(router.clusters[owner].spec.uri)
        try:
            assert stored[fleet.database_for(owner)].feed.count_documents({"receiver_id": receiver, "data.n": n}) == 1
        finally:
            stored.close()
    seen, cursor = [], None
    while True:
        page = router.read(receiver, limit=2, cursor=cursor)
        seen += [i.data["n"] for i in page.items]
        cursor = page.next_cursor
        if cursor is None:
            break
    assert seen == list(range(len(times)))
    assert len(router.clusters.clients.open()) <= 3


def test_equivalent_uris_share_one_client(
    servers: LocalClusters, raw_clients: Clients, db_name: str, open_router: Callable[..., Any]
) -> None:
    """Three periods whose URIs differ only in spelling (host case, the slash before the options, an option in the
    URI or under options) are one deployment: one client serves them all (they got three)."""
    port = raw_clients[NAMES[0]].address[1]
    spellings = [
        (f"mongodb://localhost:{port}/?maxPoolSize=7", {}),
        (f"mongodb://LocalHost:{port}?maxpoolsize=7", {}),
        (f"mongodb://localhost:{port}", {"maxPoolSize": 7}),
    ]
    config = RouterConfig(database=db_name, clusters=tuple(
        ClusterConfig(name=n, uri=u, options=o, database=f"{db_name}_{i}") for i, (n, (u, o)) in enumerate(zip(NAMES, spellings))
    ))
    try:
        register(config)
        router = open_router(config, clock=lambda: NOW, refresh=False)
        router.write_many([item(7, i, start + timedelta(days=1)) for i, (start, _) in enumerate(PERIODS)])
        assert [i.data["n"] for i in router.read(7, limit=10).items] == [2, 1, 0]
        assert [c.kind for c in router.clusters.clients.open()] == ["hot"]
    finally:
        for i in range(len(NAMES)):
            raw_clients[NAMES[0]].drop_database(f"{db_name}_{i}")


def test_a_database_in_the_uri_path_holds_the_period(
    servers: LocalClusters, raw_clients: Clients, db_name: str, open_router: Callable[..., Any]
) -> None:
    """`uri: mongodb://h:p/<db>` without `database:` keeps the period in <db> (it went to the top-level database)."""
    own = f"{db_name}_own"
    config = RouterConfig(database=db_name, clusters=tuple(
        ClusterConfig(name=n, uri=f"{u}/{own}" if n == NAMES[2] else u) for n, u in zip(NAMES, servers.uris)
    ))
    try:
        register(config)
        router = open_router(config, clock=lambda: NOW, refresh=False)
        router.write_many([item(8, 1, NOW)])
        assert [i.data["n"] for i in router.read(8).items] == [1]
        client = raw_clients[NAMES[2]]
        assert client[own].feed.count_documents({"receiver_id": 8}) == 1
        assert client[own].metadata.find_one({})["_id"] == NAMES[2]  # type: ignore[index]
        assert client[db_name].feed.count_documents({}) == 0
    finally:
        raw_clients[NAMES[2]].drop_database(own)
