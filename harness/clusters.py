"""Several local servers, one per cluster, started and stopped together; the backends.

Backends (``backend=`` or ``$FEED_TEST_BACKEND``):

* ``mongod``: one mongod per cluster, each with its own data folder.
* ``ferretdb2``: FerretDB v2.7.0 on DocumentDB (:mod:`harness.documentdb`), one
  PostgreSQL server with the DocumentDB extension and one FerretDB process per cluster. It
  applies one document's filter and update atomically, uses indexes for filters and enforces
  unique indexes; it has no transactions, no change streams and no index-ordered sorts. A
  fault (:meth:`LocalServer.kill`, ``pause``) hits the cluster's FerretDB; its PostgreSQL
  stays up until :meth:`LocalClusters.stop`.
* ``ferretdb-pg``: FerretDB v1.24.2 with its ``postgresql`` handler, one process per
  cluster, all backed by ONE local PostgreSQL (:mod:`harness.postgres`) holding
  one database per cluster. A fault (:meth:`LocalServer.kill`, ``pause``) hits one
  cluster's FerretDB; PostgreSQL stays up until :meth:`LocalClusters.stop`.
* ``ferretdb-sqlite`` (alias ``ferretdb``): FerretDB v1.24.2 with its ``sqlite`` handler,
  one folder of SQLite files per cluster; needs nothing but the FerretDB binary.
* ``javaserver``: mongo-java-server 1.47.0 in memory, one JVM per cluster
  (:mod:`harness.javaserver`), only when asked for. It applies a document's filter
  and update atomically, as MongoDB does and FerretDB v1 does not; it keeps nothing across
  a restart, and its queries scan rather than use secondary indexes (unique indexes are
  enforced).
* ``docker``: testcontainers' ``mongo:7``, only when asked for.
* ``auto`` (the default): ``mongod`` if it is on PATH, else ``ferretdb2`` (built on first use
  by ``scripts/build-ferretdb2``; it fails, saying why, when it cannot be built).

FerretDB v1.24.2 (``ferretdb-pg``, ``ferretdb-sqlite``) stays for what needs a server that
loses concurrent updates of one document: the refusal of layouts that need atomic appends.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import contextlib
import logging
import os
import shutil
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import pymongo
import pymongo.errors

from .errors import HarnessError
from .documentdb import (DOCUMENTDB_SETTINGS, DOCUMENTDB_SETUP, DOCUMENTDB_VERSION, FERRETDB2_VERSION, empty_database,
                         ensure_ferretdb2, vacuum_collection)
from .ferretdb import FERRETDB_VERSION, ensure_ferretdb
from .javaserver import JAVASERVER_VERSION, ensure_javaserver
from .postgres import RESERVED_DATABASES, LocalPostgres, find_postgres
from .process import DEFAULT_TIMEOUT, free_ports
from .server import LocalServer, server_command

__all__ = ["BACKENDS", "BACKEND_ENV", "LocalClusters"]

logger = logging.getLogger(__name__)

BACKENDS = ("auto", "mongod", "ferretdb2", "ferretdb-pg", "ferretdb-sqlite", "ferretdb", "javaserver", "docker")
"""Accepted values for ``backend`` and ``$FEED_TEST_BACKEND`` (``ferretdb`` = ``ferretdb-sqlite``)."""

ALIASES = {"ferretdb": "ferretdb-sqlite"}

BACKEND_ENV = "FEED_TEST_BACKEND"

POSTGRES_DIR = "postgres"
"""The folder, under the clusters' base folder, of the ``ferretdb-pg`` backend's PostgreSQL."""

POSTGRES_LOG = "postgres.log"


def _resolve_backend(backend: str | None) -> str:
    """Turn ``auto``/None/an alias into a concrete backend name, checking it can run here."""
    source = "backend"
    if backend is None:
        backend = os.environ.get(BACKEND_ENV) or "auto"
        source = f"${BACKEND_ENV}"
    if backend not in BACKENDS:
        message = f"{source}: must be one of {', '.join(BACKENDS)} (got {backend!r})"
        if source == "backend":
            raise ValueError(message)
        raise HarnessError(message)
    backend = ALIASES.get(backend, backend)
    if backend == "auto":
        return "mongod" if shutil.which("mongod") else "ferretdb2"
    if backend == "mongod" and not shutil.which("mongod"):
        raise HarnessError(f"{source}: 'mongod' was asked for but is not on PATH")
    if backend == "ferretdb-pg" and find_postgres() is None:
        raise HarnessError(
            f"{source}: 'ferretdb-pg' was asked for but no PostgreSQL server was found "
            "(initdb, pg_ctl and postgres on PATH or in /usr/lib/postgresql/*/bin); "
            "install it (Debian: apt-get install postgresql) or run scripts/bootstrap as root"
        )
    return backend


class LocalClusters:
    """Several local servers, one per cluster name, started and stopped together.

    ``base_dir`` holds one folder per cluster, and for ``ferretdb-pg`` the PostgreSQL
    data folder ``postgres/`` and its log ``postgres.log`` (a temporary folder, removed on
    :meth:`stop`, when None). As root, when PostgreSQL's own user cannot reach
    ``base_dir``, ``postgres/`` is a symlink to a temporary folder that :meth:`stop`
    removes. ``backend`` defaults to ``$FEED_TEST_BACKEND``, else
    ``auto`` (see the module docstring); :attr:`backend` is the name it resolved to.
    ``detached`` servers run in their own session and are not stopped when this Python
    process exits (the CLI ``start`` uses it); otherwise :meth:`stop` also runs at
    interpreter exit. ``ports`` fixes the servers' ports, one per cluster (default: free
    ports on 127.0.0.1; PostgreSQL always gets a free port).

    Example::

        >>> with LocalClusters(2, names=["eu", "us"]) as clusters:  # doctest: +SKIP
        ...     clusters.uris
        ['mongodb://127.0.0.1:40123', 'mongodb://127.0.0.1:40125']
    """

    def __init__(
        self,
        count: int = 3,
        *,
        base_dir: Path | None = None,
        backend: str | None = None,
        names: Sequence[str] | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        detached: bool = False,
        ports: Sequence[int] | None = None,
    ) -> None:
        if count < 1:
            raise ValueError(f"count: must be at least 1 (got {count})")
        if names is None:
            names = [f"cluster_{i}" for i in range(1, count + 1)]
        names = list(names)
        if len(names) != count:
            raise ValueError(f"names: expected {count} names (got {len(names)}: {names})")
        if len(set(names)) != len(names):
            raise ValueError(f"names: must be unique (got {names})")
        for name in names:
            if not name or "/" in name or name in (".", ".."):
                raise ValueError(f"names: {name!r} cannot be a folder name")
        if timeout <= 0:
            raise ValueError(f"timeout: must be positive (got {timeout})")
        self.count = count
        self.names = names
        self.backend = _resolve_backend(backend)
        """The backend in use: ``mongod``, ``ferretdb-pg``, ``ferretdb-sqlite``, ``javaserver`` or ``docker``."""
        if self.backend == "ferretdb-pg":
            taken = {*RESERVED_DATABASES, POSTGRES_DIR, POSTGRES_LOG}
            for name in names:
                if name in taken or len(name.encode()) > 63:
                    raise ValueError(
                        f"names: {name!r} cannot name a cluster on ferretdb-pg (a PostgreSQL "
                        f"database name of at most 63 bytes, not one of {', '.join(sorted(taken))})"
                    )
        self.base_dir = base_dir
        self.timeout = timeout
        self.detached = detached
        if ports is not None and (len(ports) != count or any(not 0 < p < 65536 for p in ports)):
            raise ValueError(f"ports: expected {count} ports from 1 to 65535 (got {list(ports)})")
        self.ports = list(ports) if ports is not None else None
        self.servers: list[LocalServer] = []
        self.postgres: LocalPostgres | None = None
        """The PostgreSQL behind every cluster on ``ferretdb-pg``, once started; else None."""
        self.postgres_servers: list[LocalPostgres] = []
        """Every PostgreSQL started: the one of ``ferretdb-pg``, or one per cluster on ``ferretdb2``."""
        self._temp_dir: Path | None = None
        self._started = False

    @property
    def uris(self) -> list[str]:
        """The servers' URIs, in the order of ``names``."""
        return [server.uri for server in self.servers]

    @property
    def server_description(self) -> str:
        """What serves the clusters, for reports: ``FerretDB v1.24.2 (PostgreSQL 15.18)``.

        Example::

            >>> LocalClusters(1, backend="ferretdb-sqlite").server_description  # doctest: +SKIP
            'FerretDB v1.24.2 (SQLite)'
        """
        if self.backend == "ferretdb2":
            pg = self.postgres_servers[0].version if self.postgres_servers else "15"
            return f"FerretDB {FERRETDB2_VERSION} (DocumentDB {DOCUMENTDB_VERSION}, PostgreSQL {pg})"
        if self.backend == "ferretdb-pg":
            found = self.postgres.binaries if self.postgres else find_postgres()
            return f"FerretDB {FERRETDB_VERSION} (PostgreSQL {found.version if found else '?'})"
        if self.backend == "ferretdb-sqlite":
            return f"FerretDB {FERRETDB_VERSION} (SQLite)"
        if self.backend == "javaserver":
            return f"mongo-java-server {JAVASERVER_VERSION} (in memory)"
        version = "?"
        if self.servers:
            client: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(
                self.servers[0].uri, directConnection=True, serverSelectionTimeoutMS=2000
            )
            with contextlib.suppress(pymongo.errors.PyMongoError), client:
                version = str(client.admin.command("buildInfo").get("version", "?"))
        return f"MongoDB {version} ({self.backend})"

    def start(self) -> list[str]:
        """Start every server, wait until each answers ``ping``, and return their URIs.

        If any server fails, the ones already started are stopped and
        :class:`HarnessError` says why, with the end of the failing server's log.

        Example::

            >>> clusters = LocalClusters(2)  # doctest: +SKIP
            >>> try:  # doctest: +SKIP
            ...     uris = clusters.start()
            ... finally:
            ...     clusters.stop()
        """
        if self._started:
            raise HarnessError("these clusters are already started")
        self._started = True
        if not self.detached:
            atexit.register(self.stop)
        try:
            if self.backend == "docker":
                self._start_docker()
            else:
                self._start_processes()
        except BaseException:
            self.stop()
            raise
        return self.uris

    def stop(self) -> None:
        """Stop every server, then PostgreSQL, and remove temporary folders; repeatable.

        Example::

            >>> clusters.stop()  # doctest: +SKIP
        """
        servers = [server for server in self.servers if server.alive]
        if servers:
            with concurrent.futures.ThreadPoolExecutor(len(servers)) as pool:
                for future in [pool.submit(server.stop) for server in servers]:
                    future.result()
        if self.postgres_servers:
            with concurrent.futures.ThreadPoolExecutor(len(self.postgres_servers)) as pool:
                for future in [pool.submit(pg.stop) for pg in self.postgres_servers]:
                    future.result()
        if self._temp_dir is not None:
            shutil.rmtree(self._temp_dir, ignore_errors=True)
            self._temp_dir = None
        with contextlib.suppress(Exception):
            atexit.unregister(self.stop)

    def create_user(self, name: str, password: str) -> None:
        """Let clients authenticate as ``name``/``password`` on every cluster.

        On ``ferretdb2`` this is a ``createUser`` (or ``updateUser``) on each server: clients
        without credentials are still served (``--no-auth``), a client with credentials must
        give these, with SCRAM-SHA-256 (the driver's default; PLAIN is refused). On
        ``ferretdb-pg`` FerretDB passes PLAIN credentials through to PostgreSQL, which
        checks them; this creates (or updates) that PostgreSQL role, with rights on every
        cluster's database. ``ferretdb-sqlite`` accepts any PLAIN credentials, so there is
        nothing to do; ``mongod`` and ``docker`` run without access control and get no user.

        Example::

            >>> clusters.create_user("feed", "s3cret")  # doctest: +SKIP
            >>> pymongo.MongoClient(f"mongodb://feed:s3cret@127.0.0.1:{port}/")  # doctest: +SKIP
        """
        if self.backend == "ferretdb2":
            if not self.servers or not all(server.alive for server in self.servers):
                raise HarnessError("create_user: start the clusters first")
            for server in self.servers:
                _create_wire_user(server.uri, name, password)
            return
        if self.backend != "ferretdb-pg":
            logger.debug("create_user: nothing to do on %s", self.backend)
            return
        if self.postgres is None or not self.postgres.alive:
            raise HarnessError("create_user: start the clusters first")
        self.postgres.create_user(name, password, databases=self.names)

    def vacuum(self, name: str, database: str, collection: str) -> bool:
        """Free the space of *collection*'s dead document versions on cluster *name* now (PostgreSQL's ``VACUUM`` of
        the table DocumentDB keeps it in); False, doing nothing, on a backend that keeps no such table.

        Tests use it to make FerretDB 2 place the next updated documents before a cursor's position, where
        ``getMore`` would skip them (``docs/ferretdb2-cursor-bug.md``), instead of waiting for autovacuum.

        Example::

            >>> clusters.vacuum("cluster_1", "feeds", "feed")  # doctest: +SKIP
            True
        """
        if self.backend != "ferretdb2":
            return False
        vacuum_collection(self.postgres_servers[self.names.index(name)], database, collection)
        return True

    def empty(self, database: str, *, keep: Iterable[str] = ()) -> tuple[str, ...] | None:
        """Empty every collection of *database* but those in *keep*, on every cluster, as a new database is (each
        table and index DocumentDB keeps them in truncated), and return each cluster's catalog of it (collections,
        options, indexes: :func:`~harness.documentdb.empty_database`); None, doing nothing, on a backend that keeps
        no such tables.

        Example::

            >>> clusters.empty("feeds", keep=["migrations"])  # doctest: +SKIP
            ('collection feed ...', 'collection feed ...', 'collection feed ...')
        """
        if self.backend != "ferretdb2":
            return None
        kept = list(keep)
        with concurrent.futures.ThreadPoolExecutor(len(self.postgres_servers)) as pool:
            return tuple(pool.map(lambda pg: empty_database(pg, database, keep=kept), self.postgres_servers))

    @property
    def auth_mechanism(self) -> str:
        """The ``authMechanism`` a client names with the credentials :meth:`create_user` made: ``PLAIN`` on FerretDB 1
        (it passes them to PostgreSQL), ``SCRAM-SHA-256`` elsewhere (FerretDB 2 refuses PLAIN)."""
        return "PLAIN" if self.backend in ("ferretdb-pg", "ferretdb-sqlite") else "SCRAM-SHA-256"

    def __enter__(self) -> LocalClusters:
        if not self._started:
            self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _root(self) -> Path:
        if self.base_dir is None:
            self._temp_dir = Path(tempfile.mkdtemp(prefix="feedrouter-clusters-"))
            os.chmod(self._temp_dir, 0o711)  # PostgreSQL's own user must reach postgres/ in it
            return self._temp_dir
        self.base_dir.mkdir(parents=True, exist_ok=True)
        return self.base_dir.resolve()

    def _start_processes(self) -> None:
        if self.backend == "mongod":
            found = shutil.which("mongod")
            if not found:
                raise HarnessError("'mongod' is not on PATH")
            binary = Path(found)
        elif self.backend == "javaserver":
            binary = ensure_javaserver()
        elif self.backend == "ferretdb2":
            tree = ensure_ferretdb2()
            binary = tree.ferretdb
        else:
            binary = ensure_ferretdb()
        root = self._root()
        urls: dict[str, str] = {}
        behind: dict[str, LocalPostgres] = {}  # the PostgreSQL behind each cluster
        if self.backend == "ferretdb-pg":
            self.postgres = LocalPostgres.create(
                root / POSTGRES_DIR,
                log_path=root / POSTGRES_LOG,
                detached=self.detached,
                max_connections=100 * self.count + 20,  # FerretDB pools: 50 a role, 2 roles
            )
            self.postgres_servers.append(self.postgres)
            self.postgres.start(databases=self.names, timeout=self.timeout)
            urls = {name: self.postgres.url(name) for name in self.names}
            behind = {name: self.postgres for name in self.names}
        elif self.backend == "ferretdb2":
            binaries = tree.binaries
            for name in self.names:
                self.postgres_servers.append(LocalPostgres.create(
                    root / name / POSTGRES_DIR,
                    log_path=root / name / POSTGRES_LOG,
                    binaries=binaries,
                    detached=self.detached,
                    max_connections=200,
                    settings=DOCUMENTDB_SETTINGS,
                    library_path=tree.library_path,
                    extensions=("documentdb",),
                    setup_sql=DOCUMENTDB_SETUP,
                ))
            with concurrent.futures.ThreadPoolExecutor(len(self.postgres_servers)) as pool:
                for future in [pool.submit(pg.start, timeout=self.timeout) for pg in self.postgres_servers]:
                    future.result()
            behind = dict(zip(self.names, self.postgres_servers, strict=True))
            urls = {name: pg.url("postgres") for name, pg in behind.items()}
        for name, port in zip(self.names, self.ports or free_ports(self.count), strict=True):
            data_dir = root / name
            url = urls.get(name)
            server = LocalServer(
                name=name,
                port=port,
                uri=f"mongodb://127.0.0.1:{port}",
                data_dir=data_dir,
                backend=self.backend,
                command=server_command(
                    self.backend, data_dir=data_dir, port=port, binary=binary, postgresql_url=url
                ),
                detached=self.detached,
                extra_logs=(behind[name].log_path,) if name in behind else (),
            )
            self.servers.append(server)
            server._spawn()
        with concurrent.futures.ThreadPoolExecutor(len(self.servers)) as pool:
            futures = [
                pool.submit(server._wait_ready, timeout=self.timeout) for server in self.servers
            ]
            for future in futures:
                future.result()

    def _start_docker(self) -> None:
        try:
            from testcontainers.mongodb import (  # type: ignore[import-not-found, import-untyped, unused-ignore]
                MongoDbContainer,
            )
        except ImportError as exc:
            raise HarnessError(
                "backend 'docker' needs the testcontainers package "
                "(pip install 'testcontainers[mongodb]') and a Docker engine"
            ) from exc
        if self.detached:
            raise HarnessError("backend 'docker' cannot start detached servers; use `run`")
        root = self._root()
        for name in self.names:
            container = MongoDbContainer("mongo:7")
            try:
                container.start()
            except Exception as exc:
                raise HarnessError(f"{name}: cannot start mongo:7 container: {exc}") from exc
            port = int(container.get_exposed_port(27017))
            self.servers.append(
                LocalServer(
                    name=name,
                    port=port,
                    uri=str(container.get_connection_url()),
                    data_dir=root / name,
                    backend="docker",
                    container=container,
                )
            )


def _create_wire_user(uri: str, name: str, password: str) -> None:
    """``createUser`` (``updateUser`` if it exists) on the server at *uri*, with no roles (``--no-auth`` serves all)."""
    client: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(uri, directConnection=True, serverSelectionTimeoutMS=10_000)
    with client:
        users = client.admin.command("usersInfo", name).get("users", [])
        if users:
            client.admin.command("updateUser", name, pwd=password)
        else:
            client.admin.command("createUser", name, pwd=password, roles=[])
    logger.info("%s %s on %s", "updated" if users else "created", name, uri)
