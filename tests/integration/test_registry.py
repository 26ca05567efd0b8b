"""The posts registry on real servers: what the export and the erasure find through it, whatever wrote it.

A post is registered by every write that stores it (``write_many``, a fan-out job's start,
``publish``), and by migration 0006 for what was stored before; migration 0008 turns the
registry documents of one post each into documents of a write each. However often and in
whichever shape a post is registered, its sender's export lists it once and their erasure
removes every copy of it. Both doors, both layouts.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from bson.int64 import Int64
from pymongo import MongoClient, monitoring

from router import Activity, FeedItem, RouterConfig, data_key
from router.admin.migrate import MIGRATIONS_COLLECTION, discover, migrate_cluster
from router.core.layouts import posts
from router.storage.clusters import Clusters
from harness.localservers import LocalClusters

from .conftest import NOW, P0, P2
from .erasure import BIG_USER as BIG, Clients, layout_config, naming
from .erasure import config, layout, router  # noqa: F401 - fixtures


def sent(router: Any, user: Any, folder: Path) -> list[dict[str, Any]]:
    """The user's export's ``sent`` records."""
    folder.mkdir()
    router.export_user(user, folder)
    return [json.loads(line) for line in (folder / "sent.jsonl").read_text().splitlines()]


def store(router: Any, user: int, n: int, receivers: range) -> list[str]:
    """Posts of *user* in two periods: *n* written by ``write_many`` to *receivers*, and one published; their keys."""
    keys = []
    for start in (P0, P2):
        items = [FeedItem(receiver_id=r, sender_id=user, event_time=start + timedelta(days=3, minutes=i), type=1,
                          data={"n": i}, data_key=data_key("registry", f"{start.month}/{i}"))
                 for i in range(n) for r in receivers]
        router.write_many(items)
        post = Activity(sender_id=user, event_time=start + timedelta(days=4), type=2, data={"pushed": True},
                        data_key=data_key("registry-pushed", start.month))
        router.publish(post, list(receivers), pull=False)
        keys += sorted({i.data_key for i in items}) + [post.data_key]
    return keys


def rerun_migrations(raw_clients: Clients, config: RouterConfig, *ids: str) -> None:
    """Forget the registry and the records of migrations *ids*, then migrate every cluster again."""
    for spec in config.clusters:
        db = raw_clients[spec.name][config.database_for(spec)]
        db["posts"].drop()
        db[MIGRATIONS_COLLECTION].delete_many({"_id": {"$in": list(ids)}})
    with Clusters(config) as clusters:
        for name in clusters.names:
            migrate_cluster(clusters[name], config, discover())


def test_a_post_stored_again_after_migration_0006_is_exported_once(
    router: Any, config: RouterConfig, raw_clients: Clients, tmp_path: Path,
) -> None:
    """A 64-bit user's posts registered by migration 0006 (which reads the sender back as an ``Int64``), then stored
    again by the router (a plain int): the export lists each post once, and the erasure removes every copy."""
    keys = store(router, BIG, 3, range(10, 13))
    rerun_migrations(raw_clients, config, "0006_erasure")
    store(router, BIG, 3, range(20, 22))  # the same posts, to other receivers
    records = sent(router, BIG, tmp_path / "export")
    assert sorted(r["data_key"] for r in records) == sorted(keys)
    assert [r["event_time"] for r in records] == sorted(r["event_time"] for r in records)
    router.erase_user(BIG, requested_by="tests")
    assert naming(raw_clients, config, Int64(BIG)) == []


class Replies(monitoring.CommandListener):
    """Counts the write errors in the replies to every insert a client sent."""

    def __init__(self) -> None:
        self.errors = 0

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        pass

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        if event.command_name == "insert":
            self.errors += len(event.reply.get("writeErrors", ()))

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass


def registered(raw_clients: Clients, config: RouterConfig, user: Any) -> list[dict[str, Any]]:
    """The user's registry documents in every period."""
    return [doc for s in config.clusters for doc in raw_clients[s.name][config.database_for(s)]["posts"].find({"sender_id": user})]


def test_writing_the_same_items_again_registers_them_without_a_duplicate(
    make_config: Callable[..., RouterConfig], layout: str, open_router: Callable[..., Any], raw_clients: Clients,
    tmp_path: Path,
) -> None:
    """A write_many made again (a retry): no insert is answered with a duplicate key (nothing for the driver to build
    an error of), each write registers one document per sender and KEYS posts, and the export lists each post once."""
    replies = Replies()
    config = layout_config(make_config, layout, event_listeners=[replies])
    router = open_router(config, clock=lambda: NOW)
    many = posts.KEYS + 100
    items = [FeedItem(receiver_id=1000 + i, sender_id=BIG, event_time=P2 + timedelta(days=2, seconds=i), type=1,
                     data={"i": i}, data_key=data_key("again", i)) for i in range(many)]
    items += [FeedItem(receiver_id=r, sender_id=5, event_time=P2 + timedelta(days=3), type=1, data={}, data_key="shared")
              for r in range(20)]
    for _ in range(2):
        router.write_many(items)
    assert replies.errors == 0
    mine = registered(raw_clients, config, BIG)
    assert sorted(d["n"] for d in mine) == [100, 100, posts.KEYS, posts.KEYS]
    assert [d["n"] for d in registered(raw_clients, config, 5)] == [1, 1]
    records = sent(router, BIG, tmp_path / "export")
    assert [r["data_key"] for r in records] == [data_key("again", i) for i in range(many)]


@pytest.mark.parametrize("door", ["sync"])
def test_migration_0008_lists_the_posts_of_one_post_documents_by_sender(
    router: Any, config: RouterConfig, raw_clients: Clients, tmp_path: Path,
) -> None:
    """Posts registered one to a document (as migration 0006 does): migration 0008 turns them into documents of up to
    KEYS posts of one sender, each post at its time; a run stopped part-way and run again stores nothing twice; the
    export and the erasure then find every post."""
    # KEYS + 31 posts of one sender in two periods, to one receiver (the registry is by sender and post, not receiver)
    keys = store(router, BIG, posts.KEYS + 30, range(10, 11))
    store(router, 6, 2, range(10, 11))
    rerun_migrations(raw_clients, config, "0006_erasure")
    before = {(d["data_key"], d["event_time"]) for d in registered(raw_clients, config, BIG)}
    assert len(before) == len(keys) and all("keys" not in d for d in registered(raw_clients, config, BIG))
    db = raw_clients["cluster_1"][config.database_for(config.clusters[0])]
    stopped = list(db["posts"].find({"sender_id": BIG}).sort([("event_time", 1), ("_id", 1)]).limit(posts.KEYS))
    with Clusters(config) as clusters:
        for name in clusters.names:
            raw_clients[name][config.database_for(clusters[name].spec)][MIGRATIONS_COLLECTION].delete_one(
                {"_id": "0008_registry_by_write"})
            report = migrate_cluster(clusters[name], config, discover())
            assert report.applied == ("0008_registry_by_write",)
    mine = registered(raw_clients, config, BIG)
    assert all(d["n"] == len(d["keys"]) == len(d["times"]) <= posts.KEYS for d in mine)
    assert {(k, t) for d in mine for k, t in zip(d["keys"], d["times"])} == before
    assert len(mine) == 4  # KEYS + 31 posts in two documents, in each of the two periods
    db["posts"].insert_many(stopped)  # as if a run had stored its first document and stopped before removing these
    regroup = next(m for m in discover() if m.id == "0008_registry_by_write").load().regroup
    assert regroup(db["posts"]) == (len(stopped), 0)  # the same document again: stored once
    assert len(registered(raw_clients, config, BIG)) == 4
    assert sorted(r["data_key"] for r in sent(router, BIG, tmp_path / "export")) == sorted(keys)
    router.erase_user(BIG, requested_by="tests")
    assert naming(raw_clients, config, Int64(BIG)) == [] and registered(raw_clients, config, 6) != []


@pytest.mark.parametrize(("door", "layout"), [("sync", "copies")])
def test_migration_0008_on_a_server_without_atomic_updates(
    make_config: Callable[..., RouterConfig], ferretdb1: LocalClusters, open_router: Callable[..., Any], layout: str,
    tmp_path: Path,
) -> None:
    """FerretDB 1 runs migration 0008's pipeline too: the posts registered one to a document by migration 0006 (from
    its ``find``, on this server) are listed by sender, and the export and the erasure find every one."""
    config = layout_config(make_config, layout, uris=ferretdb1.uris)
    router = open_router(config, clock=lambda: NOW)
    keys = store(router, 7, 4, range(10, 12))
    raw: Clients = {spec.name: MongoClient(spec.uri, tz_aware=True) for spec in config.clusters}
    try:
        rerun_migrations(raw, config, "0006_erasure", "0008_registry_by_write")
        mine = registered(raw, config, 7)
        assert len(mine) == 2 and sorted(k for d in mine for k in d["keys"]) == sorted(keys)
        assert sorted(r["data_key"] for r in sent(router, 7, tmp_path / "export")) == sorted(keys)
        router.erase_user(7, requested_by="tests")
        assert naming(raw, config, 7) == []
    finally:
        for client in raw.values():
            client.close()
