"""The buckets layout's indexes: valid on a mongos, created before a period is closed, and migration 0005 for the
periods created before them (the command documents, as the migrations' mongos documents are tested)."""

from __future__ import annotations

import importlib.util
import shutil
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import attrs
import pytest
from pymongo import MongoClient

from router import FeedRouter, RouterConfig, data_key
from router.admin.migrate import MigrationContext, default_folder, discover, migrate_cluster
from router.admin.periods import apply_period, index_commands, plan_period
from router.core.layouts import LAYOUTS
from router.core.layouts.buckets import MAX_ITEMS, Buckets
from router.errors import DeleteFailed
from router.model import ClusterMeta
from router.storage.capabilities import Capabilities
from router.storage.clusters import Cluster, Clusters
from harness.localservers import LocalClusters

from .conftest import NOW, P0, P1, P2, register
from .test_buckets_edges import item

SHARDED = Capabilities(sharded=True, server="mongodb", version="7.0")


def _migration(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(f"m_{name}", default_folder() / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_index_command_documents_on_a_mongos_and_elsewhere() -> None:
    """On a mongos (feed sharded on hashed receiver_id by 0001) every unique index starts with the shard key; the
    copy index is partial on items._id existing everywhere."""
    copy_id = {"name": "copy_id", "unique": True, "partialFilterExpression": {"items._id": {"$exists": True}}}
    assert index_commands(Buckets(), collection="feed", sharded=True) == [
        {"createIndexes": "feed", "indexes": [{"key": {"receiver_id": 1, "newest": -1, "_id": -1}, "name": "receiver_newest_id"}]},
        {"createIndexes": "feed", "indexes": [{"key": {"receiver_id": 1, "items._id": 1}, **copy_id}]},
        {"createIndexes": "feed", "indexes": [{"key": {"items.data_key": 1}, "name": "items_data_key"}]},
    ]
    assert index_commands(Buckets(), collection="feed", sharded=False)[1] == {
        "createIndexes": "feed", "indexes": [{"key": {"items._id": 1}, **copy_id}]}
    shard_key = list(_migration("0001_feed_indexes").SHARD_KEY)
    for layout in LAYOUTS.values():
        for command in index_commands(layout, collection="feed", sharded=True):
            spec = command["indexes"][0]
            if spec.get("unique"):
                assert list(spec["key"])[:len(shard_key)] == shard_key, spec


def test_migration_0005_matches_the_layout() -> None:
    """Migration 0005 creates exactly the copy index the layout asks for, on a mongos and elsewhere, and seals with the
    layout's MAX_ITEMS."""
    m = _migration("0005_buckets_copy_index")
    for sharded in (True, False):
        (layout_copy,) = [c for c in index_commands(Buckets(), collection="feed", sharded=sharded)
                          if c["indexes"][0]["name"] == "copy_id"]
        assert m.commands("feed", sharded=sharded)[0] == layout_copy
    assert m.SEALED == MAX_ITEMS


def test_migration_0005_on_a_mongos(make_config: Callable[..., RouterConfig]) -> None:
    """On a mongos, 0005 sends the shard-key-prefixed copy index, then drops the old one, then seals emptied
    buckets; on a cluster without a buckets period it sends nothing."""
    config = make_config()
    register(config)
    cluster = Cluster(config.clusters[2], config)
    try:
        ctx = MigrationContext(cluster, config, SHARDED, dry_run=True)
        _migration("0005_buckets_copy_index").apply(ctx)
        assert ctx.commands == [] and ctx.steps == ["no buckets period here: nothing to change"]
        cluster.write_meta(ClusterMeta(name="cluster_3", start_date=P2, creator_name="tests", layout="buckets"))
        cluster.call("old index", lambda: cluster.feed.create_index([("items._id", 1)], name="items_id", unique=True))
        ctx = MigrationContext(cluster, config, SHARDED, dry_run=True)
        _migration("0005_buckets_copy_index").apply(ctx)
        assert [command for _, command in ctx.commands] == [
            {"createIndexes": "feed", "indexes": [{"key": {"receiver_id": 1, "items._id": 1}, "name": "copy_id",
                                                   "unique": True, "partialFilterExpression": {"items._id": {"$exists": True}}}]},
            {"dropIndexes": "feed", "index": "items_id"},
            {"update": "feed", "updates": [{"q": {"items": {"$size": 0}, "count": {"$lt": MAX_ITEMS}},
                                            "u": {"$max": {"count": MAX_ITEMS}}, "multi": True}]},
        ]
        assert {d for d, _ in ctx.commands} == {config.database_for(config.clusters[2])}
    finally:
        cluster.close()


def test_a_new_period_gets_its_indexes_before_the_previous_one_is_closed(make_config: Callable[..., RouterConfig]) -> None:
    """apply_period creates the buckets indexes first, then closes the open period, then opens the new one."""
    config = make_config()
    register(config, [(P0, None)])
    with Clusters(config) as clusters:
        change = plan_period(clusters, name="cluster_2", start=NOW + timedelta(days=30), close_previous=True,
                             creator="tests", now=NOW, layout="buckets")
        lines = apply_period(clusters, change, migrations=discover(), dry_run=True)
    steps = [line.split(" ")[1] for line in lines if line.startswith("would ")]
    assert steps == ["create", "create", "create", "close", "write"], lines


@pytest.fixture
def old_period(make_config: Callable[..., RouterConfig], raw_clients: dict[str, MongoClient[dict[str, Any]]],
               tmp_path: Path) -> Iterator[RouterConfig]:
    """cluster_3 [P2, open) in buckets as the code before 0005 made it: migrated to 0004, unique items_id index."""
    config = make_config()
    register(config, [(P0, P1), (P1, P2)])
    folder = tmp_path / "migrations"
    shutil.copytree(default_folder(), folder)
    (folder / "0005_buckets_copy_index.py").unlink()
    cluster = Cluster(config.clusters[2], config)
    try:
        migrate_cluster(cluster, config, discover(folder))
        for keys, name, unique in (([("receiver_id", 1), ("newest", -1), ("_id", -1)], "receiver_newest_id", False),
                                   ([("items._id", 1)], "items_id", True), ([("items.data_key", 1)], "items_data_key", False)):
            cluster.call("old index", lambda: cluster.feed.create_index(keys, name=name, unique=unique))
        cluster.write_meta(ClusterMeta(name="cluster_3", start_date=P2, creator_name="tests", layout="buckets"))
    finally:
        cluster.close()
    yield config


def test_migration_0005_lets_deletes_through_emptied_buckets(old_period: RouterConfig, servers: LocalClusters,
                                                             raw_clients: dict[str, MongoClient[dict[str, Any]]]) -> None:
    """Under the old index, a delete that empties a second bucket fails (0 removed) on a server that admits one
    document without items._id (FerretDB 2, as MongoDB); after `migrate` (0005) it goes through, a rerun still stores
    a copy once. The bucket emptied before the migration is sealed by it (``count`` raised to 50); the two emptied
    after it keep the counters a delete leaves (0: a delete lowers them by what left), and appends pass over all three
    (an append needs a bucket holding an element)."""
    config = old_period
    feed = raw_clients["cluster_3"][config.database_for(config.clusters[2])].feed
    with FeedRouter(config, clock=lambda: NOW) as router:
        keys = [data_key("old", r) for r in (1, 2, 3)]
        router.write_many([item(r, P2 + timedelta(days=r), r, key=k) for r, k in zip((1, 2, 3), keys)])
        assert router.delete(keys[0]) == 1
        if servers.backend != "javaserver":  # (mongo-java-server leaves documents without the field out)
            with pytest.raises(DeleteFailed, match=r"\(0 removed\); failed: cluster_3"):
                router.delete(keys[1])
        cluster = Cluster(config.clusters[2], config)
        try:
            report = migrate_cluster(cluster, config, discover())
        finally:
            cluster.close()
        assert report.applied == ("0005_buckets_copy_index",)
        names = {i["name"]: i for i in feed.list_indexes()}
        assert "items_id" not in names and names["copy_id"]["unique"]
        assert router.delete(keys[1]) == 1 and router.delete(keys[2]) == 1
        assert sorted((d["receiver_id"], d["count"], len(d["items"])) for d in feed.find({})) == [
            (1, MAX_ITEMS, 0), (2, 0, 0), (3, 0, 0)]
        new = item(1, P2 + timedelta(days=9), 9)
        ids = router.write_many([new])
        assert router.write_many([attrs.evolve(new, id=ids[0])]) == ids
        assert sum(len(d["items"]) for d in feed.find({"receiver_id": 1})) == 1
