"""Shared setup of the buckets tests: three periods (copies, buckets, buckets) on one server.

The fixtures ``server``, ``config`` and ``raw`` run a test on two servers that apply one document's filter and update
atomically: the session's (FerretDB 2 on DocumentDB unless ``$FEED_TEST_BACKEND`` says otherwise) and a
mongo-java-server of the module's own (``javaserver``); a module imports them by name."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from pymongo import MongoClient

from router import ClusterConfig, FeedItem, RouterConfig
from router.admin.migrate import discover
from router.admin.periods import apply_period, plan_period
from router.storage.clusters import Clusters
from harness import javaserver as javaservers
from harness.javaserver import LocalJavaServer
from harness.localservers import LocalClusters

from .conftest import NAMES, PERIODS

#: The layout of each standard period in these tests.
LAYOUTS = ("copies", "buckets", "buckets")


def buckets_config(uri: str) -> RouterConfig:
    """Three periods, a database each on the server at *uri*, given their layouts by the operator path."""
    prefix = f"t_{uuid.uuid4().hex[:10]}"
    config = RouterConfig(
        database=prefix,
        clusters=tuple(ClusterConfig(name=n, uri=uri, options={}, database=f"{prefix}_{i}") for i, n in enumerate(NAMES)),
    )
    with Clusters(config) as clusters:
        for name, (start, end), layout in zip(NAMES, PERIODS, LAYOUTS):
            change = plan_period(clusters, name=name, start=start, end=end, creator="tests", now=start, layout=layout)
            apply_period(clusters, change, migrations=discover())
    return config


CHILD = Path(__file__).with_name("buckets_child.py")
REPO = Path(__file__).resolve().parents[2]


def fan_out_at_once(config: RouterConfig, specs: Sequence[dict[str, Any]]) -> list[int]:
    """Run one buckets_child process per spec (``post`` or ``posts``, ``receivers``), released together; their written
    counts."""
    base = {"database": config.database,
            "clusters": [{"name": c.name, "uri": c.uri, "database": config.database_for(c)} for c in config.clusters]}
    children = [subprocess.Popen([sys.executable, str(CHILD), json.dumps({**base, **spec})], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True, cwd=REPO) for spec in specs]
    try:
        for child in children:
            assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        for child in children:
            assert child.stdin is not None
            child.stdin.write("go\n")
            child.stdin.flush()
        outputs = [child.communicate(timeout=600)[0] for child in children]
    finally:
        for child in children:
            child.kill()
            child.wait()
    return [int(json.loads(out.strip().splitlines()[-1])["written"]) for out in outputs]


def page_all(router: Any, receiver: int, limit: int, **kw: Any) -> list[FeedItem]:
    """Every item of *receiver*'s feed, page by page of *limit*."""
    out: list[FeedItem] = []
    cursor = None
    while True:
        page = router.read(receiver, limit=limit, cursor=cursor, **kw)
        out.extend(page.items)
        cursor = page.next_cursor
        if cursor is None:
            return out


def feed(raw: MongoClient[dict[str, Any]], config: RouterConfig, i: int) -> Any:
    """Period *i*'s feed collection, through plain pymongo."""
    return raw[config.database_for(config.clusters[i])].feed


def copies_per_receiver(raw: MongoClient[dict[str, Any]], config: RouterConfig, i: int) -> dict[Any, int]:
    """How many copies each receiver has in the buckets of period *i*, counted in the documents themselves."""
    counts: dict[Any, int] = {}
    for doc in feed(raw, config, i).find({}):
        counts[doc["receiver_id"]] = counts.get(doc["receiver_id"], 0) + len(doc["items"])
    return counts


@pytest.fixture(scope="module")
def javaserver() -> Iterator[LocalJavaServer]:
    with LocalJavaServer() as server:
        yield server


@pytest.fixture(params=["harness", "javaserver"])
def server(request: pytest.FixtureRequest) -> Iterator[tuple[str, bool]]:
    """The URI of a server that appends atomically, and whether it is mongo-java-server."""
    if request.param == "javaserver":
        yield request.getfixturevalue("javaserver").uri, True
    else:
        local: LocalClusters = request.getfixturevalue("servers")
        yield local.uris[0], local.backend == "javaserver"


@pytest.fixture
def config(server: tuple[str, bool]) -> Iterator[RouterConfig]:
    uri, java = server
    config = buckets_config(uri)
    yield config
    client: MongoClient[dict[str, Any]] = MongoClient(uri)
    for spec in config.clusters:
        (javaservers.drop_database if java else MongoClient.drop_database)(client, config.database_for(spec))
    client.close()


@pytest.fixture
def raw(server: tuple[str, bool]) -> Iterator[MongoClient[dict[str, Any]]]:
    client: MongoClient[dict[str, Any]] = MongoClient(server[0], tz_aware=True)
    yield client
    client.close()
