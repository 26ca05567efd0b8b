"""Many periods on few deployments: a database per period, clients shared per deployment, made on first use."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from pymongo import MongoClient

from router import ClusterConfig, FeedItem, RouterConfig, data_key
from router.testing.localservers import LocalClusters

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
