"""The test pool's emptying of a registered database (tests/integration/pool.py) on the session's servers."""

from __future__ import annotations

from typing import Any

import attrs
from pymongo import MongoClient

from harness.clusters import LocalClusters
from router import FeedItem, FeedRouter, RouterConfig, data_key

from .conftest import NOW, register
from .pool import DatabasePool, new_name

Clients = dict[str, MongoClient[dict[str, Any]]]


def items() -> list[FeedItem]:
    return [FeedItem(receiver_id=r, sender_id=1, event_time=NOW, type=1, data={"n": r}, data_key=data_key("pool", r))
            for r in range(1, 50)]


def test_an_emptied_database_is_as_registering_left_it(servers: LocalClusters, raw_clients: Clients,
                                                       make_config: Any) -> None:
    """A database given back to the pool keeps its collections, their indexes and its migrations; every other
    collection is empty (on FerretDB 2 its tables truncated) and takes the same writes again."""
    config: RouterConfig = make_config()
    name = config.database
    pool = DatabasePool(raw_clients, empty=servers.empty)
    template = pool.take("copies", register=lambda db: register(attrs.evolve(config, database=db), layout="copies"))
    register(config, layout="copies")
    with FeedRouter(config, clock=lambda: NOW, refresh=False) as router:
        router.write_many(items())
    migrations = {s: sorted(c[name].migrations.distinct("_id")) for s, c in raw_clients.items()}
    indexes = {s: sorted(i["name"] for i in c[name].feed.list_indexes()) for s, c in raw_clients.items()}
    assert pool.give_back(name)
    assert servers.empty(new_name()) is (servers.backend == "ferretdb2")  # a database that does not exist: nothing
    for server, client in raw_clients.items():
        db = client[name]
        left = {c: db[c].count_documents({}) for c in db.list_collection_names() if c != "migrations"}
        assert "feed" in left and set(left.values()) == {0}, left
        assert sorted(db.migrations.distinct("_id")) == migrations[server] != []
        assert sorted(i["name"] for i in db.feed.list_indexes()) == indexes[server]
    register(config, layout="copies")
    with FeedRouter(config, clock=lambda: NOW, refresh=False) as router:
        assert len(router.write_many(items())) == 49
    assert sum(c[name].feed.count_documents({}) for c in raw_clients.values()) == 49
    for client in raw_clients.values():
        client.drop_database(template)
