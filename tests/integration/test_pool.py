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
    nothing = servers.empty(new_name())  # a database that does not exist: nothing to empty, nothing in the catalog
    assert nothing == (("",) * 3 if servers.backend == "ferretdb2" else None)
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


def test_a_database_unlike_what_registering_makes_is_not_kept(servers: LocalClusters, raw_clients: Clients,
                                                               make_config: Any) -> None:
    """A database given back with an index, a collection or a migration record that registering did not make (or
    without one it made) is refused (the caller drops it); one as registering made it is kept."""
    config: RouterConfig = make_config()
    pool = DatabasePool(raw_clients, empty=servers.empty)
    template = pool.take("copies", register=lambda db: register(attrs.evolve(config, database=db), layout="copies"))
    names = [new_name() for _ in range(5)]
    for name in names:
        register(attrs.evolve(config, database=name), layout="copies")
    first = raw_clients["cluster_1"]
    first[names[1]].feed.create_index([("sender_id", 1), ("type", 1)])
    first[names[2]].create_collection("extra")
    first[names[3]].migrations.insert_one({"_id": "9999_not_a_migration", "checksum": "0"})
    first[names[4]].outbox.drop_indexes()
    try:
        assert [pool.give_back(name) for name in names] == [True, False, False, False, False]
        assert pool.take("copies", register=lambda db: None) == names[0]
    finally:
        for client in raw_clients.values():
            for name in [template, *names]:
                client.drop_database(name)
