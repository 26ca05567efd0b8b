"""mongo-java-server: a second, independent MongoDB-wire server for the tests, in memory.

FerretDB v1 does not apply one document's filter and update atomically (its update reads
the matching documents, changes them in Go and writes them back in a separate statement:
``internal/handler/msg_update.go`` and ``common.UpdateDocument`` in v1.24.2), so concurrent
appends to one document are lost there. `mongo-java-server
<https://github.com/bwaldvogel/mongo-java-server>`_ (Maven ``de.bwaldvogel:mongo-java-server``
1.47.0, in-memory backend) applies each collection's writes one at a time (its collections
extend ``AbstractSynchronizedMongoCollection``), as MongoDB applies one document's filter
and update atomically; guarantees that rest on that are proven on it.

Out of the box it reports wire version 8, which pymongo 4.20 refuses (it needs 9 or
more), so the server is started by a tiny launcher class of ours that gives its
``MemoryBackend`` a ``MongoVersion`` reporting wire version 13 (MongoDB 5.0).
:func:`ensure_javaserver` fetches the jars once with Maven (``mvn
dependency:copy-dependencies`` of a generated pom) into the cache folder
(:func:`~harness.ferretdb.cache_dir`) and compiles the launcher there with
``javac``, under a file lock; afterwards it only checks a stamp.

What it lacks: everything is in memory (a restart starts empty); it answers ``isMaster``
but not ``hello``; no sharding, users or transactions. Unique indexes are enforced (code
11000). One bug matters to the tests: ``dropIndexes`` by name also removes every other
index of that name in the database from the server's catalogue, while the collections
still hold them, and dropping such a collection, or its database, then fails the server's
own consistency check. Migration 0002 drops ``feed``'s ``data_key`` index while ``outbox``
has one of that name, so :func:`drop_database` clears ``outbox``'s first.

Example::

    with LocalJavaServer() as server:
        client = pymongo.MongoClient(server.uri)
        client.admin.command("ping")

It is also a backend of :class:`~harness.clusters.LocalClusters`
(``backend="javaserver"``, or ``scripts/clusters start --backend javaserver``).
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from pymongo import MongoClient
from pymongo.errors import OperationFailure

from .errors import HarnessError
from .ferretdb import cache_dir
from .process import DEFAULT_TIMEOUT, build_once, tail

if TYPE_CHECKING:
    from .server import LocalServer

__all__ = [
    "FORGOTTEN_INDEXES",
    "JAVASERVER_VERSION",
    "WIRE_VERSION",
    "LocalJavaServer",
    "drop_database",
    "ensure_javaserver",
    "javaserver_command",
]

logger = logging.getLogger(__name__)

JAVASERVER_VERSION = "1.47.0"
"""The mongo-java-server release fetched from Maven Central."""

WIRE_VERSION = 13
"""The wire version the launcher reports (MongoDB 5.0); pymongo 4.20 needs at least 9."""

LAUNCHER = "FeedRouterJavaServer"
"""The launcher's class name; it takes the port and listens on 127.0.0.1."""

DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:2.8"
"""The Maven plugin that copies the jars, pinned (2.8 is Maven 3.8's default)."""

_LAUNCHER_SOURCE = f"""\
import java.util.List;

import de.bwaldvogel.mongo.MongoServer;
import de.bwaldvogel.mongo.MongoVersion;
import de.bwaldvogel.mongo.backend.memory.MemoryBackend;

/** mongo-java-server, in memory, on 127.0.0.1:PORT, reporting wire version {WIRE_VERSION}. */
public final class {LAUNCHER} {{
    private static final class Wire{WIRE_VERSION} implements MongoVersion {{
        @Override public List<Integer> getVersionArray() {{ return List.of(5, 0, 0); }}
        @Override public int getWireVersion() {{ return {WIRE_VERSION}; }}
    }}

    public static void main(String[] args) throws InterruptedException {{
        int port = Integer.parseInt(args[0]);
        MongoServer server = new MongoServer(new MemoryBackend().version(new Wire{WIRE_VERSION}()));
        server.bind("127.0.0.1", port);
        Runtime.getRuntime().addShutdownHook(new Thread(server::shutdownNow));
        System.out.println("{LAUNCHER}: listening on 127.0.0.1:" + port);
        System.out.flush();
        Thread.currentThread().join();
    }}
}}
"""

_POM = f"""\
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>feedrouter.testing</groupId>
  <artifactId>javaserver-jars</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>de.bwaldvogel</groupId>
      <artifactId>mongo-java-server</artifactId>
      <version>{JAVASERVER_VERSION}</version>
    </dependency>
  </dependencies>
</project>
"""

_STAMP = hashlib.sha256((_POM + _LAUNCHER_SOURCE).encode()).hexdigest()[:16]
"""Written last by a build; a home whose stamp differs (another pom or launcher) is rebuilt."""

_BUILD_TIMEOUT = 1800.0


def ensure_javaserver(*, cache: Path | None = None) -> Path:
    """Return the folder holding the server's jars and compiled launcher, building it if needed.

    The folder is ``<cache>/mongo-java-server-1.47.0`` (``jars/``, ``classes/``, ``stamp``).
    Building needs ``mvn``, ``javac`` and Maven Central (about a minute the first time,
    while Maven fetches its plugin), once, under a file lock so concurrent callers build
    it once.

    Example::

        >>> ensure_javaserver()  # doctest: +SKIP
        PosixPath('/var/cache/feed-router/mongo-java-server-1.47.0')
    """
    cache = cache_dir() if cache is None else cache
    home = cache / f"mongo-java-server-{JAVASERVER_VERSION}"
    build_once(
        cache / f"mongo-java-server-{JAVASERVER_VERSION}.lock",
        built=lambda: _built(home),
        build=lambda: _build(home, cache=cache),
    )
    return home


def javaserver_command(home: Path, *, port: int, data_dir: Path) -> list[str]:
    """The command line of one server on 127.0.0.1:``port``, from a folder :func:`ensure_javaserver` built.

    ``data_dir`` holds nothing (the server keeps everything in memory) but is named on
    the command line, so a pid recorded by the CLI ``start`` is recognised by ``stop``.

    Example::

        >>> javaserver_command(Path("/c/mongo-java-server-1.47.0"), port=27018, data_dir=Path("/d"))[-2:]
        ['FeedRouterJavaServer', '27018']
    """
    return [
        _tool("java"),
        "-Xmx1g",
        "-XX:+UseSerialGC",  # one GC thread: the test machines are small and shared
        # A thread per connection: the server runs each command on its connection's netty event loop, and by default
        # there are two loops a core, so a monitor's hello could wait behind another connection's long write there.
        f"-Dio.netty.eventLoopThreads={EVENT_LOOPS}",
        f"-Dfeedrouter.dir={data_dir}",
        "-cp", f"{home / 'classes'}{os.pathsep}{home / 'jars'}{os.sep}*",
        LAUNCHER,
        str(port),
    ]  # fmt: skip


EVENT_LOOPS = 256
"""The server's netty event loops (``io.netty.eventLoopThreads``): more than the connections the tests open to it."""


FORGOTTEN_INDEXES = (("outbox", "data_key"),)
"""(collection, index name) that migration 0002's ``dropIndexes`` of ``feed``'s ``data_key`` makes the server forget."""


def drop_database(client: MongoClient[Any], name: str) -> None:
    """Drop database *name* on a mongo-java-server, first dropping what its catalogue forgot.

    A database the router's migrations reached cannot be dropped as it is (see the module
    docstring): when the plain drop fails, each index of :data:`FORGOTTEN_INDEXES` is
    dropped by name (which the server still does) and the database dropped again. A
    failure of that second attempt is raised.

    Example::

        >>> drop_database(pymongo.MongoClient(server.uri), "t_0123456789ab")  # doctest: +SKIP
    """
    try:
        client.drop_database(name)
    except OperationFailure:
        database = client[name]
        for collection, index in FORGOTTEN_INDEXES:
            database[collection].drop_index(index)
        client.drop_database(name)


class LocalJavaServer:
    """One mongo-java-server (in memory) on a free 127.0.0.1 port, started by ``with`` or :meth:`start`.

    ``base_dir`` holds its log (a temporary folder, removed on :meth:`stop`, when None).
    :attr:`server` is the :class:`~harness.server.LocalServer` for faults
    (``kill``, ``pause``, ``restart``; a restarted server is empty).

    Example::

        >>> with LocalJavaServer() as server:  # doctest: +SKIP
        ...     server.uri
        'mongodb://127.0.0.1:40125'
    """

    def __init__(self, *, base_dir: Path | None = None, timeout: float = DEFAULT_TIMEOUT) -> None:
        from .clusters import LocalClusters  # clusters imports this module for its backend

        self._clusters = LocalClusters(1, base_dir=base_dir, backend="javaserver", names=["javaserver"], timeout=timeout)

    @property
    def uri(self) -> str:
        """``mongodb://127.0.0.1:PORT``, once started."""
        return self.server.uri

    @property
    def server(self) -> LocalServer:
        """The running server process and its faults."""
        if not self._clusters.servers:
            raise HarnessError("this mongo-java-server is not started")
        return self._clusters.servers[0]

    def start(self) -> str:
        """Build if needed, start the server, wait until it answers ``ping``, return :attr:`uri`."""
        return self._clusters.start()[0]

    def stop(self) -> None:
        """Stop the server (SIGTERM, SIGKILL after 10 s) and remove a temporary folder; repeatable."""
        self._clusters.stop()

    def __enter__(self) -> LocalJavaServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _built(home: Path) -> bool:
    try:
        stamp = (home / "stamp").read_text().strip()
    except OSError:
        return False
    return (
        stamp == _STAMP
        and (home / "classes" / f"{LAUNCHER}.class").is_file()
        and (home / "jars" / f"mongo-java-server-{JAVASERVER_VERSION}.jar").is_file()
    )


def _tool(name: str) -> str:
    found = shutil.which(name)
    if found:
        return found
    raise HarnessError(
        f"`{name}` is not on PATH; mongo-java-server needs a JDK and Maven (Debian: "
        "apt-get install default-jdk-headless maven; scripts/bootstrap does it when run as root)"
    )


def _run(command: list[str], *, what: str, cwd: Path) -> None:
    try:
        result = subprocess.run(
            command, cwd=cwd, capture_output=True, text=True, check=False, timeout=_BUILD_TIMEOUT
        )
    except subprocess.TimeoutExpired as exc:
        raise HarnessError(f"{what} took more than {_BUILD_TIMEOUT / 60:.0f} minutes") from exc
    if result.returncode != 0:
        raise HarnessError(f"{what} failed (exit code {result.returncode}):\n{tail(result.stdout + result.stderr)}")


def _build(home: Path, *, cache: Path) -> None:
    mvn, javac = _tool("mvn"), _tool("javac")
    logger.info("fetching mongo-java-server %s with Maven into %s (once)", JAVASERVER_VERSION, home)
    work = Path(tempfile.mkdtemp(prefix="javaserver-build-", dir=cache))
    try:
        (work / "pom.xml").write_text(_POM)
        _run(
            [mvn, "-B", "-q", "-f", str(work / "pom.xml"), f"{DEPENDENCY_PLUGIN}:copy-dependencies",
             f"-DoutputDirectory={work / 'jars'}", "-DincludeScope=runtime"],
            what=f"`mvn dependency:copy-dependencies` of de.bwaldvogel:mongo-java-server:{JAVASERVER_VERSION}",
            cwd=work,
        )  # fmt: skip
        source = work / f"{LAUNCHER}.java"
        source.write_text(_LAUNCHER_SOURCE)
        _run(
            [javac, "-d", str(work / "classes"), "-cp", f"{work / 'jars'}{os.sep}*", str(source)],
            what=f"`javac {LAUNCHER}.java`",
            cwd=work,
        )
        (work / "stamp").write_text(_STAMP + "\n")
        (work / "pom.xml").unlink()
        if home.exists():
            shutil.rmtree(home)
        os.replace(work, home)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    logger.info("built %s", home)
