"""mongo-java-server, the second wire server: the router on it, the concurrent-append race, capabilities.

The race is what a bucketed layout rests on: two processes append to the same documents
with a filter (``$ne`` the value, ``n`` below a cap) and an update (``$push``, ``$inc``).
A server that applies one document's filter and update atomically keeps every append and
never overshoots the cap; mongo-java-server must, and does. FerretDB's figures are only
recorded (printed, and kept as test properties): losing appends is its behaviour, not ours.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import attrs
import pytest
from pymongo import MongoClient

from router import ClusterConfig, FeedItem, FeedRouter, RouterConfig, data_key
from router.storage.clusters import Cluster
from harness.javaserver import JAVASERVER_VERSION, LocalJavaServer, ensure_javaserver
from harness.localservers import LocalClusters, main

from .append_child import COLLECTION
from .conftest import P0, register

CHILD = Path(__file__).with_name("append_child.py")
REPO = Path(__file__).resolve().parents[2]
#: Documents appended to, appends per process, and processes.
DOCUMENTS, APPENDS, PROCESSES = 4, 400, 2
#: Hard bound on one race, far above what it takes (a few seconds): a hang fails, it does not stall the suite.
RACE_TIMEOUT = 300


@pytest.fixture(scope="module")
def javaserver() -> Iterator[LocalJavaServer]:
    """One mongo-java-server for this module (built first if the cache has none)."""
    with LocalJavaServer() as server:
        yield server


@pytest.fixture(scope="module")
def ferretdb_uri(ferretdb1: LocalClusters) -> str:
    """A FerretDB 1 (its updates of one document are not atomic)."""
    return ferretdb1.uris[0]


@attrs.frozen
class Race:
    """What one race did: appends tried and acknowledged, items kept, and the counters' sum."""

    attempted: int
    modified: int
    kept: int
    counted: int
    per_document: tuple[int, ...]


def race(uri: str, *, cap: int) -> Race:
    """Seed DOCUMENTS empty buckets, let PROCESSES children append to them at once, count what stayed."""
    database = f"t_{uuid.uuid4().hex[:12]}"
    client: MongoClient[dict[str, Any]] = MongoClient(uri)
    try:
        buckets = client[database][COLLECTION]
        buckets.insert_many([{"_id": d, "items": [], "n": 0} for d in range(DOCUMENTS)])
        children = [
            subprocess.Popen(
                [sys.executable, str(CHILD), json.dumps({
                    "uri": uri, "database": database, "documents": list(range(DOCUMENTS)),
                    "appends": APPENDS, "tag": f"p{p}", "cap": cap,
                })],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO,
            )
            for p in range(PROCESSES)
        ]  # fmt: skip
        try:
            for child in children:  # every child has connected before any appends
                assert child.stdout is not None and child.stdout.readline().strip() == "ready"
            for child in children:
                assert child.stdin is not None
                child.stdin.write("go\n")
                child.stdin.flush()
            outputs = [child.communicate(timeout=RACE_TIMEOUT)[0] for child in children]
        finally:
            for child in children:
                child.kill()
                child.wait()
        assert [child.returncode for child in children] == [0] * PROCESSES, outputs
        docs = sorted(buckets.find({}), key=lambda doc: doc["_id"])
        return Race(
            attempted=APPENDS * PROCESSES,
            modified=sum(json.loads(out.strip().splitlines()[-1])["modified"] for out in outputs),
            kept=sum(len(doc["items"]) for doc in docs),
            counted=sum(doc["n"] for doc in docs),
            per_document=tuple(len(doc["items"]) for doc in docs),
        )
    finally:
        client.drop_database(database)
        client.close()


def capabilities(uri: str) -> Any:
    config = RouterConfig(database="caps", clusters=(ClusterConfig(name="probe", uri=uri, options={}),))
    cluster = Cluster(config.clusters[0], config)
    try:
        return cluster.capabilities()
    finally:
        cluster.close()


def test_every_concurrent_append_is_kept_on_javaserver(javaserver: LocalJavaServer) -> None:
    """Two processes, 400 appends each, 4 shared documents: all 800 kept, counters agree, each acknowledged."""
    result = race(javaserver.uri, cap=APPENDS * PROCESSES)
    print(f"mongo-java-server {JAVASERVER_VERSION}: {result}")
    assert result.kept == result.attempted == result.modified == result.counted == 800
    assert result.per_document == (200,) * DOCUMENTS


def test_the_size_filter_never_overshoots_on_javaserver(javaserver: LocalJavaServer) -> None:
    """With the cap at half the appends each document gets, each document stops at the cap exactly."""
    cap = APPENDS * PROCESSES // DOCUMENTS // 2
    result = race(javaserver.uri, cap=cap)
    assert result.per_document == (cap,) * DOCUMENTS
    assert result.kept == result.counted == result.modified == cap * DOCUMENTS


def test_javaserver_is_recognised_and_updates_atomically(javaserver: LocalJavaServer) -> None:
    """capabilities(): mongo-java-server (no gitVersion, serverStatus process java), atomic, not a mongos."""
    caps = capabilities(javaserver.uri)
    assert (caps.server, caps.atomic_updates, caps.sharded, caps.version) == ("mongo-java-server", True, False, "5.0.0")


def test_ferretdb_is_reported_non_atomic_and_its_race_recorded(
    ferretdb_uri: str, record_property: Any
) -> None:
    """capabilities().atomic_updates is False on FerretDB 1; what the same race keeps there is recorded, not asserted."""
    caps = capabilities(ferretdb_uri)
    assert (caps.server, caps.atomic_updates) == ("ferretdb", False)
    result = race(ferretdb_uri, cap=APPENDS * PROCESSES)
    print(f"FerretDB {caps.version}: {result}")
    record_property("ferretdb_race", attrs.asdict(result))
    assert result.kept <= result.attempted


def test_the_router_works_on_javaserver(javaserver: LocalJavaServer) -> None:
    """Migrations apply; items written through FeedRouter read back newest first, page by page, and delete."""
    config = RouterConfig(
        database=f"t_{uuid.uuid4().hex[:12]}",
        clusters=(ClusterConfig(name="cluster_1", uri=javaserver.uri, options={}),),
    )
    register(config, periods=((P0, None),))
    key = data_key("fabula", 7)
    items = [
        FeedItem(receiver_id=r, sender_id=1, event_time=P0 + timedelta(minutes=i), type=1, data={"n": i},
                 data_key=key if i % 10 == 0 else data_key("fabula", 1000 + i))
        for i in range(200) for r in (1, 2)
    ]  # fmt: skip
    with FeedRouter(config) as router:
        assert len(router.write_many(items)) == 400
        first = router.read(1, limit=30)
        assert [x.data["n"] for x in first.items] == list(range(199, 169, -1))
        assert first.next_cursor is not None
        second = router.read(1, limit=30, cursor=first.next_cursor)
        assert [x.data["n"] for x in second.items] == list(range(169, 139, -1))
        assert router.delete(key) == 40
        assert [x.data["n"] for x in router.read(2, limit=3).items] == [199, 198, 197]
    # The database is not dropped: mongo-java-server 1.47.0 cannot drop it after 0002 (dropping
    # feed's index `data_key` also forgets outbox's index of that name, and dropping outbox then
    # fails an internal check). The server is in memory and goes away with this module.
    client: MongoClient[dict[str, Any]] = MongoClient(javaserver.uri)
    with client:
        assert client[config.database].feed.count_documents({}) == 360
        assert client[config.database].feed.count_documents({"data_key": key}) == 0


def test_javaserver_is_built_once_and_the_cli_names_it(capsys: pytest.CaptureFixture[str]) -> None:
    """ensure_javaserver() reuses the cached build (its stamp is not rewritten); `build javaserver` prints it."""
    home = ensure_javaserver()
    stamp = (home / "stamp").stat().st_mtime_ns
    assert ensure_javaserver() == home and (home / "stamp").stat().st_mtime_ns == stamp
    assert main(["build", "javaserver"]) == 0
    assert capsys.readouterr().out.strip() == str(home)
