"""One local MongoDB-wire server process (mongod, FerretDB, mongo-java-server or a container) and its faults.

:class:`LocalServer` is made by :class:`harness.clusters.LocalClusters`; tests use
its methods to simulate failures of one cluster: :meth:`~LocalServer.kill`,
:meth:`~LocalServer.pause`/:meth:`~LocalServer.resume` and :meth:`~LocalServer.restart`.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import attrs
import pymongo
import pymongo.errors

from .errors import HarnessError
from .documentdb import ferretdb2_command
from .ferretdb import ferretdb_command
from .javaserver import javaserver_command
from .process import DEFAULT_TIMEOUT, STOP_GRACE, log_tail, spawn_logged, stop_process

__all__ = ["LocalServer", "server_command"]

logger = logging.getLogger(__name__)

_PING_SLICE_MS = 500


def server_command(
    backend: str, *, data_dir: Path, port: int, binary: Path, postgresql_url: str | None = None
) -> list[str]:
    """The command line of one cluster's server: ``mongod``, FerretDB with its handler, or mongo-java-server.

    ``binary`` is the program, or for ``javaserver`` the folder :func:`ensure_javaserver` built.
    """
    if backend == "mongod":
        return [
            str(binary),
            "--dbpath", str(data_dir),
            "--port", str(port),
            "--bind_ip", "127.0.0.1",
            "--logpath", str(data_dir / "mongod.log"),
            "--logappend",
        ]  # fmt: skip
    if backend == "javaserver":
        return javaserver_command(binary, port=port, data_dir=data_dir)
    if backend == "ferretdb2":
        if postgresql_url is None:
            raise ValueError("ferretdb2 needs postgresql_url")
        return ferretdb2_command(binary, port=port, state_dir=data_dir, postgresql_url=postgresql_url)
    if backend == "ferretdb-pg":
        return ferretdb_command(binary, port=port, state_dir=data_dir, postgresql_url=postgresql_url)
    return ferretdb_command(binary, port=port, state_dir=data_dir, sqlite_dir=data_dir)


@attrs.define(eq=False)
class LocalServer:
    """One local MongoDB-wire server process: its name, port, URI, data folder and backend.

    Made by :class:`LocalClusters`; the methods act on the running process so tests can
    simulate failures. On ``ferretdb2`` and ``ferretdb-pg`` they act on this cluster's FerretDB
    process only: the PostgreSQL behind it stays up.

    Example::

        >>> with LocalClusters(1) as clusters:  # doctest: +SKIP
        ...     server = clusters.servers[0]
        ...     server.kill()
        ...     assert not server.alive
        ...     server.restart()
    """

    name: str
    port: int
    uri: str
    data_dir: Path
    """The cluster's own folder: its data (mongod, SQLite), or FerretDB's state and log."""
    backend: str
    _command: list[str] = attrs.field(factory=list, repr=False, alias="command")
    _detached: bool = attrs.field(default=False, repr=False, alias="detached")
    _process: subprocess.Popen[bytes] | None = attrs.field(
        default=None, repr=False, alias="process"
    )
    _container: Any = attrs.field(default=None, repr=False, alias="container")
    _extra_logs: tuple[Path, ...] = attrs.field(default=(), repr=False, alias="extra_logs")

    @property
    def alive(self) -> bool:
        """True while the server process exists (a paused server is alive)."""
        if self._container is not None:
            return _container_status(self._container) in ("running", "paused")
        return self._process is not None and self._process.poll() is None

    @property
    def pid(self) -> int | None:
        """The process id, or None for a docker server or one never started."""
        return None if self._process is None else self._process.pid

    @property
    def log_paths(self) -> list[Path]:
        """The files to read after a failure: what it depends on (PostgreSQL's), then its own.

        The last one is where the process's output goes.
        """
        if self.backend == "mongod":
            return [*self._extra_logs, self.data_dir / "mongod.log", self.data_dir / "mongod.stdout.log"]
        if self.backend.startswith("ferretdb"):
            return [*self._extra_logs, self.data_dir / "ferretdb.log"]
        if self.backend == "javaserver":
            return [*self._extra_logs, self.data_dir / "javaserver.log"]
        return list(self._extra_logs)

    def kill(self) -> None:
        """Kill the server with SIGKILL (no clean shutdown) and wait for it to exit."""
        if self._container is not None:
            if self.alive:
                self._container.get_wrapped_container().kill()
            return
        if self._process is None or self._process.poll() is not None:
            return
        self._process.kill()
        self._process.wait()
        logger.info("killed %s (port %d)", self.name, self.port)

    def pause(self) -> None:
        """Freeze the server with SIGSTOP: it keeps its port but answers nothing. Returns once every thread of the
        process is stopped (a thread busy in the kernel stops only when it leaves it)."""
        if self._container is not None:
            self._container.get_wrapped_container().pause()
            return
        self._signal(signal.SIGSTOP)
        assert self._process is not None
        waited = _wait_stopped(self._process.pid, timeout=10.0)
        if waited is not None:
            raise HarnessError(f"{self.name}: pid {self._process.pid} not stopped 10 s after SIGSTOP ({waited})")

    def resume(self) -> None:
        """Let a paused server run again (SIGCONT)."""
        if self._container is not None:
            self._container.get_wrapped_container().unpause()
            return
        self._signal(signal.SIGCONT)

    def restart(self, *, timeout: float = DEFAULT_TIMEOUT) -> None:
        """Start the server again on the same port and data folder and wait for ``ping``.

        A server still running is stopped first.
        """
        if self._container is not None:
            raise HarnessError(f"{self.name}: restart is not supported by the docker backend")
        if self.alive:
            self.stop()
        self._spawn()
        self._wait_ready(timeout=timeout)

    def stop(self) -> None:
        """Stop the server with SIGTERM, SIGKILL after 10 s; safe to call more than once."""
        if self._container is not None:
            container, self._container = self._container, None
            with contextlib.suppress(Exception):
                container.stop()
            return
        if self._process is not None and stop_process(self._process, name=self.name, grace=STOP_GRACE):
            logger.info("stopped %s (port %d)", self.name, self.port)

    def _signal(self, sig: signal.Signals) -> None:
        if self._process is None or self._process.poll() is not None:
            raise HarnessError(f"{self.name}: not running (cannot send {sig.name})")
        self._process.send_signal(sig)

    def _spawn(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._process = spawn_logged(self._command, self.log_paths[-1], detached=self._detached)
        logger.info(
            "started %s: %s pid %d on port %d",
            self.name,
            self.backend,
            self._process.pid,
            self.port,
        )

    def _wait_ready(self, *, timeout: float) -> None:
        """Block until the server answers ``ping`` (and, on ``ferretdb2``, a query, which only PostgreSQL behind it
        can answer); fail fast if the process exits.

        Each ``ping`` blocks in pymongo's server selection for at most half a second, so
        a process that dies is noticed quickly, without sleeping between attempts.
        """
        process = self._process
        if process is None:
            raise HarnessError(f"{self.name}: not started")
        deadline = time.monotonic() + timeout
        client: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(
            self.uri,
            directConnection=True,
            serverSelectionTimeoutMS=_PING_SLICE_MS,
            connectTimeoutMS=2000,
            appname="feed-router-localservers",
        )
        try:
            while True:
                if process.poll() is not None:
                    raise HarnessError(
                        f"{self.name}: {self.backend} exited with code "
                        f"{process.returncode} before answering ping on port "
                        f"{self.port}; last lines of its log:\n{self._log_tail()}"
                    )
                try:
                    client.admin.command("ping")
                    if self.backend == "ferretdb2":  # ping does not reach PostgreSQL; a query does, and warms its pool
                        client.admin.command("listDatabases", nameOnly=True)
                except pymongo.errors.PyMongoError as exc:
                    if time.monotonic() >= deadline:
                        raise HarnessError(
                            f"{self.name}: {self.backend} on port {self.port} did not "
                            f"answer ping within {timeout:.0f} s ({exc}); last lines of "
                            f"its log:\n{self._log_tail()}"
                        ) from exc
                    continue
                if process.poll() is None:
                    return
                # else: someone else answered on our port and our process is gone
        finally:
            client.close()

    def _log_tail(self) -> str:
        return log_tail(self.log_paths)


def _container_status(container: Any) -> str:
    try:
        wrapped = container.get_wrapped_container()
        wrapped.reload()
        return str(wrapped.status)
    except Exception:  # noqa: BLE001 - a vanished container is simply not alive
        return "gone"


def _wait_stopped(pid: int, *, timeout: float) -> str | None:
    """Wait until every thread of *pid* is in state ``T`` (stopped); None once they are, else what is still running."""
    deadline = time.monotonic() + timeout
    while True:
        running = []
        for stat in Path(f"/proc/{pid}/task").glob("*/stat"):
            with contextlib.suppress(OSError):
                state = stat.read_text().rsplit(")", 1)[1].split()[0]
                if state not in ("T", "t", "Z", "X"):
                    running.append(f"thread {stat.parent.name}: {state}")
        if not running:
            return None
        if time.monotonic() > deadline:
            return ", ".join(running)
        time.sleep(0.01)
