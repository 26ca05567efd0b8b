"""Migrations against real servers: once, idempotent, tamper-proof, and the mongos command documents."""

from __future__ import annotations

import importlib.util
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pymongo import MongoClient

from router import RouterConfig
from router.admin.migrate import MigrationContext, default_folder, discover, migrate_cluster
from router.errors import MigrationError
from router.storage.clusters import Capabilities, Cluster
from harness.proxy import LegacyHelloProxy

#: The migrations the package ships, in order (each one's own effects are checked below).
SHIPPED = tuple(m.id for m in discover())

Clients = dict[str, MongoClient[dict[str, Any]]]


@pytest.fixture
def cluster(make_config: Callable[..., RouterConfig]) -> Any:
    config = make_config()
    c = Cluster(config.clusters[0], config)
    yield c, config
    c.close()


def test_applied_once_then_nothing(cluster: Any, raw_clients: Clients, db_name: str) -> None:
    """The first run creates indexes and records the migration; the second applies nothing."""
    c, config = cluster
    migrations = discover()
    first = migrate_cluster(c, config, migrations)
    assert first.applied == SHIPPED
    assert any("sharding skipped: ferretdb" in s or "sharding skipped: mongodb" in s for s in first.steps)
    db = raw_clients["cluster_1"][db_name]
    assert {i["name"] for i in db.feed.list_indexes()} <= {"_id_"}  # a period's feed indexes are its layout's
    outbox = {i["name"]: dict(i["key"]) for i in db.outbox.list_indexes()}
    assert outbox["sender_time_id"] == {"sender_id": 1, "event_time": -1, "_id": -1}
    assert outbox["data_key"] == {"data_key": 1}
    assert {i["name"]: dict(i["key"]) for i in db.fanout_batches.list_indexes()}["job"] == {"job": 1}
    assert {i["name"]: dict(i["key"]) for i in db.edits.list_indexes()}["data_key_seq"] == {"data_key": 1, "seq": -1}
    assert "metadata" in db.list_collection_names()
    for migration in migrations:
        record = db.migrations.find_one({"_id": migration.id})
        assert record is not None and record["checksum"] == migration.checksum and record["applied_at"] is not None
    second = migrate_cluster(c, config, migrations)
    assert second.applied == () and second.already == SHIPPED and second.steps == ()
    assert db.migrations.count_documents({}) == len(SHIPPED)
    seen = {i["name"]: dict(i["key"]) for i in db.seen.list_indexes()}
    assert seen["receiver_time_key"] == {"receiver_id": 1, "event_time": -1, "key": -1}
    assert seen["receiver_group_read"] == {"receiver_id": 1, "group": 1, "read_time": -1, "read_key": -1}  # 0007


def test_dry_run_changes_nothing(cluster: Any, raw_clients: Clients, db_name: str) -> None:
    """A dry run lists the commands and writes nothing."""
    c, config = cluster
    report = migrate_cluster(c, config, discover(), dry_run=True)
    assert report.applied == SHIPPED
    assert any(s.startswith("would run on") and "createIndexes" in s for s in report.steps)
    assert db_name not in raw_clients["cluster_1"].list_database_names()


def test_changed_migration_refused(cluster: Any, tmp_path: Path, raw_clients: Clients, db_name: str) -> None:
    """Editing an applied migration is refused with both checksums; nothing more is applied."""
    c, config = cluster
    folder = tmp_path / "migrations"
    shutil.copytree(default_folder(), folder)
    migrate_cluster(c, config, discover(folder))
    path = folder / "0001_feed_indexes.py"
    path.write_text(path.read_text() + "\n# edited\n")
    (folder / "0090_more.py").write_text('"""Another."""\ndef apply(ctx):\n    ctx.note("ran")\n')
    with pytest.raises(MigrationError, match=r"migration 0001_feed_indexes was changed after it was applied \(recorded checksum [0-9a-f]{12}, file now [0-9a-f]{12}\)"):
        migrate_cluster(c, config, discover(folder))
    assert sorted(d["_id"] for d in raw_clients["cluster_1"][db_name].migrations.find({})) == list(SHIPPED)


def test_unknown_applied_migration_refused(cluster: Any, raw_clients: Clients, db_name: str) -> None:
    """A cluster newer than the code is refused."""
    c, config = cluster
    migrate_cluster(c, config, discover())
    raw_clients["cluster_1"][db_name].migrations.insert_one({"_id": "0099_future", "checksum": "x"})
    with pytest.raises(MigrationError, match="has migration 0099_future applied, which this code does not have"):
        migrate_cluster(c, config, discover())


def test_new_migration_applies_after_old(cluster: Any, tmp_path: Path) -> None:
    """A later migration runs once, after the earlier ones."""
    c, config = cluster
    folder = tmp_path / "migrations"
    shutil.copytree(default_folder(), folder)
    (folder / "0090_more.py").write_text('"""Another step."""\ndef apply(ctx):\n    ctx.note("ran 0090")\n')
    report = migrate_cluster(c, config, discover(folder))
    assert report.applied == (*SHIPPED, "0090_more")
    assert report.steps[-1] == "ran 0090"
    assert migrate_cluster(c, config, discover(folder)).applied == ()


@pytest.mark.parametrize(
    "name, body, message",
    [
        ("1_bad.py", "def apply(ctx): pass\n", "must be named NNNN_lowercase_words.py"),
        ("0091_noapply.py", "X = 1\n", "defines no apply"),
        ("0002_again.py", "def apply(ctx): pass\n", "migration number 0002 used twice"),
        ("0092_broken.py", "def apply(ctx):\n  return (\n", "failed to import"),
    ],
)
def test_bad_migration_files(cluster: Any, tmp_path: Path, name: str, body: str, message: str) -> None:
    """Misnamed, incomplete or broken migration files raise MigrationError."""
    c, config = cluster
    folder = tmp_path / "migrations"
    shutil.copytree(default_folder(), folder)
    (folder / name).write_text(body)
    with pytest.raises(MigrationError, match=message):
        migrate_cluster(c, config, discover(folder))


def _first_migration() -> Any:
    return _migration("0001_feed_indexes")


def _migration(name: str) -> Any:
    path = default_folder() / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"m_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_sharding_command_documents() -> None:
    """The exact documents sent to a mongos: enableSharding, then shardCollection on hashed receiver_id."""
    assert _first_migration().sharding_commands("feed", "feed") == [
        ("admin", {"enableSharding": "feed"}),
        ("admin", {"shardCollection": "feed.feed", "key": {"receiver_id": "hashed"}}),
    ]


def test_mongos_path_sends_those_documents(cluster: Any) -> None:
    """On a server that reports itself a mongos, apply() issues the sharding commands after the indexes."""
    c, config = cluster
    ctx = MigrationContext(c, config, Capabilities(sharded=True, server="mongodb", version="7.0"), dry_run=True)
    _first_migration().apply(ctx)
    assert ctx.commands[-2:] == [
        ("admin", {"enableSharding": config.database}),
        ("admin", {"shardCollection": f"{config.database}.feed", "key": {"receiver_id": "hashed"}}),
    ]
    assert ctx.commands[0] == (config.database, {"create": "metadata"})
    assert not any("skipped" in s for s in ctx.steps)


def test_capabilities_of_the_local_server(cluster: Any) -> None:
    """The local test server is not a mongos, and says what it is."""
    c, _ = cluster
    caps = c.capabilities()
    assert caps.sharded is False and caps.server in ("ferretdb", "mongodb") and caps.version


def test_outbox_sharding_command_document() -> None:
    """0002 sends a mongos exactly one document: shard outbox on hashed sender_id."""
    assert _migration("0002_outbox_and_social").sharding_commands("feed") == [
        ("admin", {"shardCollection": "feed.outbox", "key": {"sender_id": "hashed"}}),
    ]


def test_seen_migration_on_a_mongos(cluster: Any) -> None:
    """On a mongos, 0004 creates the seen-marker index, then shards seen on hashed receiver_id."""
    c, config = cluster
    ctx = MigrationContext(c, config, Capabilities(sharded=True, server="mongodb", version="7.0"), dry_run=True)
    _migration("0004_seen_markers").apply(ctx)
    assert [command for _, command in ctx.commands] == [
        {"createIndexes": "seen", "indexes": [{"key": {"receiver_id": 1, "event_time": -1, "key": -1},
                                                "name": "receiver_time_key"}]},
        {"shardCollection": f"{config.database}.seen", "key": {"receiver_id": "hashed"}},
    ]


def test_outbox_migration_on_a_mongos(cluster: Any) -> None:
    """On a mongos, 0002 creates its indexes, then shards outbox; its feed step is the layout's now (noted as
    superseded), and the old data_key index is dropped only where an earlier 0001 left it."""
    c, config = cluster
    ctx = MigrationContext(c, config, Capabilities(sharded=True, server="mongodb", version="7.0"), dry_run=True)
    _migration("0002_outbox_and_social").apply(ctx)
    commands = [command for _, command in ctx.commands]
    assert {"createIndexes": "outbox", "indexes": [{"key": {"sender_id": 1, "event_time": -1, "_id": -1},
                                                      "name": "sender_time_id"}]} in commands
    assert not [command for command in commands if config.feed_collection in (command.get("createIndexes"),
                                                                               command.get("dropIndexes"))]
    assert "index data_key_id on feed: superseded: a period's feed indexes are its layout's, created with the period" \
        in ctx.steps and "index data_key absent on feed: nothing to drop" in ctx.steps
    assert ctx.commands[-1] == ("admin", {"shardCollection": f"{config.database}.outbox", "key": {"sender_id": "hashed"}})
    assert not any("skipped" in s for s in ctx.steps)


def test_capabilities_on_a_server_without_hello(make_config: Callable[..., RouterConfig], raw_clients: Clients) -> None:
    """A server that refuses `hello` (as before MongoDB 4.4, or mongo-java-server): capabilities() asks isMaster."""
    host, port = raw_clients["cluster_1"].address
    proxy = LegacyHelloProxy(port)
    try:
        config = make_config(uris=[proxy.uri, proxy.uri.replace("127.0.0.1", "localhost"), "mongodb://127.0.0.1:9"])
        c = Cluster(config.clusters[0], config)
        try:
            caps = c.capabilities()
        finally:
            c.close()
        assert proxy.refused >= 1  # hello really was refused
        assert caps.sharded is False and caps.server in ("ferretdb", "mongodb") and caps.version
    finally:
        proxy.close()
