"""Fixtures for tests against real MongoDB-wire servers.

Three local servers (mongod if on PATH, else FerretDB; ``$FEED_TEST_BACKEND`` chooses, e.g.
``javaserver``) are started once per test session by :mod:`harness.localservers` (under
pytest-xdist, once per worker: each worker has servers, ports and data folders of its own);
every test gets a database of its own on them, dropped afterwards, or, for a test that
registers it first thing, emptied and kept for another such test (:mod:`.pool`). Nothing here
skips: no server means the tests error, and a test marked for what the servers lack fails.

**One contract suite over every layout.** The storage contract files (marked ``contract``
at module level) run once per layout of :data:`router.core.layouts.LAYOUTS` the session's
servers can hold (``buckets`` needs atomic updates of one document: not FerretDB 1), on
both doors: the ``layout`` fixture gives every period :func:`register` makes that layout,
as APScheduler's ``tests/test_jobstores.py`` runs one suite over every job store. A new
layout is one more row of that table. A contract test about one layout's documents says so
with ``@pytest.mark.layouts("copies", reason=...)``; tests outside the contract files get
the default layout. A test a server cannot run in one layout says so with
``@pytest.mark.unheld(backend, layout, reason=...)`` (:data:`MANY_COPIES`): that case is not
made on that server, never skipped.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Generator, Iterator, Sequence
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from pymongo import MongoClient

from router import AsyncFeedRouter, ClusterConfig, ClusterMeta, FeedRouter, ReadWindow, RouterConfig
from router.admin.indexes import create_feed_indexes
from router.admin.migrate import discover, migrate_cluster
from router.config import RolloverConfig
from router.core.layouts import DEFAULT, LAYOUTS
from router.storage.clusters import Cluster
from harness import javaserver
from harness.clusters import ALIASES, BACKEND_ENV
from harness.localservers import LocalClusters, LocalServer

from ..conftest import SERVED_BY
from .doors import AsyncDoor, LoopThread
from .pool import DatabasePool, new_name

UTC = timezone.utc
#: The three demo periods used by most tests: [P0, P1), [P1, P2), [P2, open).
P0 = datetime(2024, 1, 1, tzinfo=UTC)
P1 = datetime(2024, 4, 1, tzinfo=UTC)
P2 = datetime(2024, 7, 1, tzinfo=UTC)
NOW = datetime(2024, 9, 1, tzinfo=UTC)
NAMES = ("cluster_1", "cluster_2", "cluster_3")
PERIODS: tuple[tuple[datetime, datetime | None], ...] = ((P0, P1), (P1, P2), (P2, None))


@pytest.fixture(scope="session")
def servers(request: pytest.FixtureRequest) -> Iterator[LocalClusters]:
    """Three local servers for the whole session."""
    with LocalClusters(3, names=list(NAMES)) as local:
        request.config.stash[SERVED_BY] = local.server_description
        yield local


#: The backends whose server is FerretDB 1, which loses concurrent updates of one document.
FERRETDB1 = ("ferretdb-pg", "ferretdb-sqlite")


@pytest.fixture(scope="session")
def ferretdb1(servers: LocalClusters) -> Iterator[LocalClusters]:
    """Three FerretDB 1 servers (SQLite), for what needs a server without atomic appends (the refusals of buckets):
    the session's servers when they are FerretDB 1 already."""
    if servers.backend in FERRETDB1:
        yield servers
        return
    with LocalClusters(3, names=list(NAMES), backend="ferretdb-sqlite") as local:
        yield local


def backend() -> str:
    """The session's backend, as ``$FEED_TEST_BACKEND`` names it (aliases resolved; ``auto`` as it is)."""
    name = os.environ.get(BACKEND_ENV) or "auto"
    return ALIASES.get(name, name)


def held_layouts() -> tuple[str, ...]:
    """The layouts the session's servers can hold: every one, but buckets (atomic updates) not on FerretDB 1."""
    atomic = backend() not in FERRETDB1
    return tuple(name for name, layout in LAYOUTS.items() if atomic or not layout.needs_atomic_updates)


#: A contract test of tens of thousands of copies in one period: mongo-java-server answers a buckets append's find of
#: a bucket with room by scanning (it ignores secondary indexes), so there such a fan-out takes minutes, past the
#: calls' timeouts. It runs in every layout elsewhere, and in the other layouts there.
MANY_COPIES = pytest.mark.unheld("javaserver", "buckets", reason="mongo-java-server scans every bucket for each append")


#: The server of scripts/test's second run, which runs the storage contract files again (docs/development.md).
SECOND_SERVER = "javaserver"


#: The front doors, in the order a test runs through them: FeedRouter, then AsyncFeedRouter behind AsyncDoor.
DOORS = ("sync", "async")


#: A heavy race or fault test of a contract file (tens of seconds a case) whose door and layout do not meet: the
#: layout is the core's requests, the door the code that sends them, so it runs through each door once and in each
#: layout once (:func:`door_layout_pairs`), not in all four pairs; the lighter contract tests run every pair
#: (docs/development.md says which guarantee is proven where).
DOOR_PER_LAYOUT = pytest.mark.door_per_layout(
    reason="a heavy case: the door sends the requests the layout builds in the core, so each door once and each layout"
           " once prove it; the lighter contract tests run every door in every layout")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A test that uses ``door`` runs through the doors :func:`_door_names` gives. A test of a ``contract`` file that
    uses ``layout`` (through ``router``, ``make_router`` or ``register``) runs once per layout the servers hold, or per
    layout its ``layouts`` marker names; in every door, or, marked ``door_per_layout``, each door once and each layout
    once (:func:`door_layout_pairs`)."""
    doors = _door_names(metafunc)
    layouts = _layout_names(metafunc)
    if doors and layouts and metafunc.definition.get_closest_marker("door_per_layout") is not None:
        metafunc.parametrize("door,layout", door_layout_pairs(doors, layouts), indirect=True)
        return
    if doors:
        metafunc.parametrize("door", doors, indirect=True)
    if layouts:
        metafunc.parametrize("layout", layouts, indirect=True)


def _layout_names(metafunc: pytest.Metafunc) -> tuple[str, ...]:
    """The layouts a contract test that uses ``layout`` runs in (none for any other test: it gets the default, or what
    its file's ``layout`` fixture gives)."""
    if metafunc.definition.get_closest_marker("contract") is None:
        return ()
    for marker in ("scenario", "both_doors", "door_per_layout"):
        for mark in metafunc.definition.iter_markers(marker):
            assert mark.kwargs.get("reason"), f"{metafunc.definition.nodeid}: @pytest.mark.{marker} needs a reason"
    if "layout" not in metafunc.fixturenames:
        return ()
    names = held_layouts()
    only = metafunc.definition.get_closest_marker("layouts")
    if only is not None:
        assert only.kwargs.get("reason"), f"{metafunc.definition.nodeid}: @pytest.mark.layouts needs a reason"
        names = tuple(n for n in names if n in only.args)
    for unheld in metafunc.definition.iter_markers("unheld"):
        assert unheld.kwargs.get("reason"), f"{metafunc.definition.nodeid}: @pytest.mark.unheld needs a reason"
        server, layout = unheld.args
        names = tuple(n for n in names if not (n == layout and backend() == server))
    return names


def _door_names(metafunc: pytest.Metafunc) -> tuple[str, ...]:
    """The doors a test that uses ``door`` runs through: both, sync then async; a contract test on the second server
    the sync door alone, unless marked ``both_doors``: the async door sends the commands the same core builds, through
    pymongo's async client (its reads carry ``maxTimeMS``), and the ``both_doors`` tests prove those there. None for a
    test without ``door``, or one that names its doors itself (``@pytest.mark.parametrize("door", ...)``): it keeps
    them."""
    if "door" not in metafunc.fixturenames:
        return ()
    for mark in metafunc.definition.iter_markers("parametrize"):
        names = mark.args[0].split(",") if isinstance(mark.args[0], str) else mark.args[0]
        if "door" in (n.strip() for n in names):
            return ()
    one = (backend() == SECOND_SERVER and metafunc.definition.get_closest_marker("contract") is not None
           and metafunc.definition.get_closest_marker("both_doors") is None)
    return DOORS[:1] if one else DOORS


def door_layout_pairs(doors: Sequence[str], layouts: Sequence[str]) -> list[tuple[str, str]]:
    """Each door once and each layout once, the default layout through the sync door: ``[(sync, copies), (async,
    buckets)]``; with one door (the second server) every layout through it, with one layout every door in it."""
    return [(doors[i % len(doors)], layouts[i % len(layouts)]) for i in range(max(len(doors), len(layouts)))]


@pytest.fixture
def layout(request: pytest.FixtureRequest) -> str:
    """The layout of every period this test's routers see (see the module's docstring)."""
    return str(getattr(request, "param", DEFAULT))


@pytest.fixture(autouse=True)
def _server_keeps_what_the_test_needs(request: pytest.FixtureRequest) -> None:
    """A ``needs_durable_server`` test run on in-memory servers fails at once, saying why (deselect it there)."""
    if request.node.get_closest_marker("needs_durable_server") is None:
        return
    servers: LocalClusters = request.getfixturevalue("servers")
    if servers.backend == "javaserver":
        pytest.fail("needs_durable_server: a restarted mongo-java-server is empty, not the same cluster; "
                    "deselect with -m 'not needs_durable_server'", pytrace=False)


@pytest.fixture(scope="session")
def raw_clients(servers: LocalClusters) -> Iterator[dict[str, MongoClient[dict[str, Any]]]]:
    """Plain pymongo clients, one per server, to check storage without the router."""
    clients: dict[str, MongoClient[dict[str, Any]]] = {
        s.name: MongoClient(s.uri, tz_aware=True, serverSelectionTimeoutMS=10_000) for s in servers.servers
    }
    yield clients
    for c in clients.values():
        c.close()


_REPORTS = pytest.StashKey[dict[str, pytest.TestReport]]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item,
                              call: pytest.CallInfo[None]) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Keep each phase's report on the test, for :func:`passed`."""
    report = yield
    item.stash.setdefault(_REPORTS, {})[report.when] = report
    return report


def passed(node: pytest.Item) -> bool:
    """Whether the test's setup and call passed (asked in its teardown)."""
    reports = node.stash.get(_REPORTS, {})
    return all(when in reports and reports[when].passed for when in ("setup", "call"))


@pytest.fixture(scope="session")
def database_pool(servers: LocalClusters, raw_clients: dict[str, MongoClient[dict[str, Any]]]) -> DatabasePool | None:
    """Registered databases kept between tests (see :mod:`.pool`); None on mongo-java-server, whose databases cost
    little to make, and whose drop needs its own steps."""
    if servers.backend == "javaserver":
        return None
    return DatabasePool(raw_clients, empty=servers.empty)


@pytest.fixture
def registered_database() -> None:
    """Requested (directly or through another fixture) by a test that registers its database before anything reads
    it: ``db_name`` may then be an emptied one a passed test registered in the same layout (see :mod:`.pool`).
    ``make_router`` and ``sync_router`` request it."""


@pytest.fixture
def db_name(request: pytest.FixtureRequest, servers: LocalClusters, raw_clients: dict[str, MongoClient[dict[str, Any]]],
            database_pool: DatabasePool | None) -> Iterator[str]:
    """A database name of this test's own: new, or for a test that registers it first thing (``registered_database``)
    an emptied one from the pool; afterwards emptied into the pool if a passed test left it as registering makes it,
    else dropped on every server."""
    name = new_name()
    if database_pool is not None and "registered_database" in request.fixturenames:
        layout = str(request.getfixturevalue("layout"))
        name = database_pool.take(layout, register=lambda name: register(
            RouterConfig(database=name, clusters=tuple(ClusterConfig(name=n, uri=u, options={})
                                                       for n, u in zip(NAMES, servers.uris))), layout=layout))
    yield name
    if database_pool is not None and passed(request.node) and database_pool.give_back(name):
        return
    for c in raw_clients.values():
        drop_database(c, name, servers.backend)


def drop_database(client: MongoClient[Any], name: str, backend: str) -> None:
    """Drop database *name* on *client*'s server, of *backend*: mongo-java-server cannot drop a database the
    migrations reached as it is (an index bug of its own), so there it takes :func:`harness.javaserver.drop_database`."""
    (javaserver.drop_database if backend == "javaserver" else MongoClient.drop_database)(client, name)


def running(server: LocalServer) -> LocalServer:
    """*server*, running again if a test (one that failed, say) left it killed or paused; a server a test file keeps
    for tests that kill, pause and restart it gives each test one that serves."""
    if not server.alive:
        server.restart()
    server.resume()  # SIGCONT to a running server is harmless
    return server


@pytest.fixture(scope="module")
def spare_server() -> Iterator[LocalServer]:
    """One more local server, of the test file's own (its tests kill, pause and restart it): see :func:`spare`."""
    with LocalClusters(1, names=["spare"]) as spare:
        yield spare.servers[0]


@pytest.fixture
def spare(spare_server: LocalServer, db_name: str) -> Iterator[LocalServer]:
    """The file's spare server, running (a test that failed may have left it killed or paused), for a test that puts
    one of its periods there; the test's database on it is dropped afterwards. (A server started for each such test
    cost a server start every time.)"""
    yield running(spare_server)
    with MongoClient(running(spare_server).uri) as client:
        drop_database(client, db_name, spare_server.backend)


@pytest.fixture
def make_config(servers: LocalClusters, db_name: str) -> Callable[..., RouterConfig]:
    """Build a RouterConfig for this test's database over the session's servers."""

    def make(
        *, window: ReadWindow | None = None, batch_size: int = 1000, uris: Sequence[str] | None = None,
        rollover: RolloverConfig | None = None, timeout: timedelta | None = None, pull_threshold: int | None = None,
        idle_close: timedelta | None = None, **options: Any,
    ) -> RouterConfig:
        extra: dict[str, Any] = {"timeout": timeout} if timeout is not None else {}
        if idle_close is not None:
            extra["client_idle_close"] = idle_close
        if pull_threshold is not None:
            extra["pull_threshold"] = pull_threshold
        return RouterConfig(
            database=db_name,
            clusters=tuple(
                ClusterConfig(name=n, uri=u, options=dict(options))
                for n, u in zip(NAMES, uris or servers.uris)
            ),
            read_window=window or ReadWindow(),
            batch_size=batch_size,
            rollover=rollover,
            **extra,
        )

    return make


MIGRATIONS = discover()


def register(config: RouterConfig, periods: Sequence[tuple[datetime, datetime | None]] = PERIODS, *,
             layout: str = DEFAULT) -> None:
    """Migrate each cluster, write its metadata document directly (periods may be deliberately invalid) with
    *layout*, and create that layout's feed indexes, as adding a period does."""
    for spec, (start, end) in zip(config.clusters, periods):
        cluster = Cluster(spec, config)
        try:
            migrate_cluster(cluster, config, MIGRATIONS)
            cluster.write_meta(ClusterMeta(name=spec.name, start_date=start, end_date=end, creator_name="tests",
                                           created_at=start, layout=layout))
            create_feed_indexes(cluster, LAYOUTS[layout])
        finally:
            cluster.close()


@pytest.fixture(scope="session")
def event_loop_thread() -> Iterator[LoopThread]:
    """One real asyncio event loop on a thread of its own, for the async door's tests."""
    loop = LoopThread()
    yield loop
    loop.close()


@pytest.fixture
def door(request: pytest.FixtureRequest) -> str:
    """Which front door a test runs against: ``sync`` or ``async``, each test on both (:func:`_doors`)."""
    return str(request.param)


@pytest.fixture
def open_router(door: str, event_loop_thread: LoopThread) -> Iterator[Callable[..., Any]]:
    """Open a router on a config through this test's door (FeedRouter, or AsyncFeedRouter behind AsyncDoor)."""
    opened: list[Any] = []

    def make(config: RouterConfig, **kwargs: Any) -> Any:
        router: Any
        if door == "sync":
            router = FeedRouter(config, **kwargs)
        else:
            router = AsyncDoor(AsyncFeedRouter(config, **kwargs), event_loop_thread)
        opened.append(router)
        return router

    yield make
    for r in opened:
        r.close()


@pytest.fixture
def make_router(registered_database: None, make_config: Callable[..., RouterConfig], open_router: Callable[..., Any],
                layout: str) -> Callable[..., FeedRouter]:
    """Register the three periods in this test's layout and open a router on them through this test's door (closed
    afterwards)."""

    def make(
        *, clock: Callable[[], datetime] = lambda: NOW, refresh: bool = True, fanout_workers: int = 2, **kwargs: Any
    ) -> FeedRouter:
        config = make_config(**kwargs)
        register(config, layout=layout)
        router: FeedRouter = open_router(config, clock=clock, refresh=refresh, fanout_workers=fanout_workers)
        return router

    return make


@pytest.fixture
def router(make_router: Callable[..., FeedRouter]) -> FeedRouter:
    """A router over the three standard periods, with "now" fixed at 2024-09-01, through this test's door."""
    return make_router()


@pytest.fixture
def sync_router(registered_database: None, make_config: Callable[..., RouterConfig],
                layout: str) -> Iterator[FeedRouter]:
    """A FeedRouter (sync door only, periods in this test's layout), for tests of its own threads and internals."""
    config = make_config()
    register(config, layout=layout)
    with FeedRouter(config, clock=lambda: NOW) as router:
        yield router


def spread(start: datetime, end: datetime, n: int, i: int) -> datetime:
    """The i-th of n instants spread evenly over [start, end)."""
    return start + (end - start) * i / n + timedelta(0)
