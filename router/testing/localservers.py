"""Local MongoDB-wire servers ("clusters") on loopback, for tests, the demo and benchmarks.

Each cluster is one server process with its own free port and data folder. The backend is
``mongod`` when it is on ``PATH``, otherwise FerretDB with its SQLite handler, which this
module builds from source with the Go toolchain into a cache folder the first time it is
needed (about a minute). A ``docker`` backend (testcontainers) is used only when asked for.

Use it when you need real servers on this machine; do not use it to run anything that
must outlive a test session unattended (the CLI ``start``/``stop`` pair is the closest
thing to that, and it is still a development tool). It is not part of the ``RouterError``
hierarchy: failures raise :class:`HarnessError`.

Example::

    with LocalClusters(2) as clusters:
        client = pymongo.MongoClient(clusters.uris[0])
        client.admin.command("ping")

From a shell: ``python -m router.testing.localservers run --count 3 -- pytest tests/integration``
runs the command with ``FEEDROUTER_URIS`` set to the comma-separated URIs.
"""

from __future__ import annotations

import argparse
import atexit
import concurrent.futures
import contextlib
import fcntl
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import attrs
import pymongo
import pymongo.errors

__all__ = [
    "BACKENDS",
    "FERRETDB_VERSION",
    "HarnessError",
    "LocalClusters",
    "LocalServer",
    "cache_dir",
    "ensure_ferretdb",
    "main",
]

logger = logging.getLogger(__name__)

FERRETDB_VERSION = "v1.24.2"
"""The FerretDB release built and run by the ``ferretdb`` backend."""

FERRETDB_MODULE = "github.com/FerretDB/FerretDB"

BACKENDS = ("auto", "mongod", "ferretdb", "docker")
"""Accepted values for ``backend`` and the ``FEED_TEST_BACKEND`` environment variable."""

BACKEND_ENV = "FEED_TEST_BACKEND"
CACHE_ENV = "FEEDROUTER_CACHE"
URIS_ENV = "FEEDROUTER_URIS"
STATE_FILE = "servers.json"

DEFAULT_TIMEOUT = 60.0
"""Seconds to wait for a server to answer ``ping`` after it is started."""

STOP_GRACE = 10.0
"""Seconds a server gets to exit after SIGTERM before it is sent SIGKILL."""

_PING_SLICE_MS = 500
_LOG_TAIL_LINES = 20


class HarnessError(Exception):
    """Raised when a local server cannot be built, started, reached or stopped."""


# --------------------------------------------------------------------------- cache and build


def cache_dir() -> Path:
    """Return the folder where built tools (the FerretDB binary) are kept.

    ``$FEEDROUTER_CACHE`` if set; else ``<checkout>/.cache`` when this package sits in a
    source checkout (a ``pyproject.toml`` beside ``router/``); else ``~/.cache/feed-router``.

    Example::

        >>> cache_dir()  # doctest: +SKIP
        PosixPath('/work/main/.cache')
    """
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env).expanduser()
    checkout = Path(__file__).resolve().parents[1]
    if (checkout / "pyproject.toml").exists():
        return checkout / ".cache"
    return Path.home() / ".cache" / "feed-router"


def ensure_ferretdb(*, cache: Path | None = None) -> Path:
    """Return the path of a working FerretDB binary, building it first if it is missing.

    The binary lives at ``<cache>/ferretdb-v1.24.2/ferretdb``. Building needs the Go
    toolchain and the Go module proxy, takes about a minute, and is guarded by a file lock
    so concurrent callers build it once.

    Example::

        >>> ensure_ferretdb()  # doctest: +SKIP
        PosixPath('/work/main/.cache/ferretdb-v1.24.2/ferretdb')
    """
    cache = cache_dir() if cache is None else cache
    binary = cache / f"ferretdb-{FERRETDB_VERSION}" / "ferretdb"
    if _ferretdb_works(binary):
        return binary
    cache.mkdir(parents=True, exist_ok=True)
    with _file_lock(cache / f"ferretdb-{FERRETDB_VERSION}.lock"):
        if _ferretdb_works(binary):  # another process built it while we waited
            return binary
        _build_ferretdb(binary, cache=cache)
    if not _ferretdb_works(binary):
        raise HarnessError(
            f"built {binary} but `{binary} --version` does not report {FERRETDB_VERSION}"
        )
    return binary


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _ferretdb_works(binary: Path) -> bool:
    if not binary.is_file():
        return False
    try:
        result = subprocess.run(
            [str(binary), "--version"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        logger.warning("cannot run %s --version: %s", binary, exc)
        return False
    if result.returncode != 0 or FERRETDB_VERSION not in result.stdout:
        logger.warning(
            "%s --version gave exit code %s and no %s; rebuilding",
            binary,
            result.returncode,
            FERRETDB_VERSION,
        )
        return False
    return True


def _go_executable() -> str:
    found = shutil.which("go")
    if found:
        return found
    fallback = Path("/usr/local/go/bin/go")
    if fallback.is_file():
        return str(fallback)
    raise HarnessError(
        "the Go toolchain (`go`) is not on PATH; it is needed to build FerretDB "
        f"{FERRETDB_VERSION} (or install mongod, or set {BACKEND_ENV}=docker)"
    )


def _tail(text: str, lines: int = _LOG_TAIL_LINES) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def _build_ferretdb(binary: Path, *, cache: Path) -> None:
    go = _go_executable()
    env = dict(os.environ)
    env.update(
        GOTOOLCHAIN="local",
        GOFLAGS="-buildvcs=false",
        GOWORK="off",
        CGO_ENABLED="0",  # the SQLite handler is pure Go; no C compiler needed
    )
    logger.info("building FerretDB %s into %s (about a minute, once)", FERRETDB_VERSION, binary)
    download = subprocess.run(
        [go, "mod", "download", "-json", f"{FERRETDB_MODULE}@{FERRETDB_VERSION}"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    try:
        info: dict[str, Any] = json.loads(download.stdout)
    except json.JSONDecodeError:
        info = {}
    if download.returncode != 0 or "Dir" not in info or info.get("Error"):
        detail = info.get("Error") or _tail(download.stderr + download.stdout)
        raise HarnessError(
            f"`go mod download {FERRETDB_MODULE}@{FERRETDB_VERSION}` failed "
            f"(exit code {download.returncode}):\n{detail}"
        )
    commit = str(info.get("Origin", {}).get("Hash", ""))

    binary.parent.mkdir(parents=True, exist_ok=True)
    partial = binary.parent / f".ferretdb.{os.getpid()}.tmp"
    workdir = Path(tempfile.mkdtemp(prefix="ferretdb-build-", dir=cache))
    try:
        source = workdir / "src"
        shutil.copytree(info["Dir"], source, symlinks=True)
        _make_writable(source)
        version_dir = source / "build" / "version"
        version_dir.mkdir(parents=True, exist_ok=True)
        (version_dir / "version.txt").write_text(FERRETDB_VERSION + "\n")
        if commit:
            (version_dir / "commit.txt").write_text(commit + "\n")
        try:
            build = subprocess.run(
                [go, "build", "-trimpath", "-o", str(partial), "./cmd/ferretdb"],
                cwd=source,
                capture_output=True,
                text=True,
                env=env,
                check=False,
                timeout=1800,
            )
        except subprocess.TimeoutExpired as exc:
            raise HarnessError("`go build` of FerretDB took more than 30 minutes") from exc
        if build.returncode != 0:
            raise HarnessError(
                f"`go build ./cmd/ferretdb` failed (exit code {build.returncode}):\n"
                + _tail(build.stderr + build.stdout)
            )
        os.replace(partial, binary)
    finally:
        _make_writable(workdir)
        shutil.rmtree(workdir, ignore_errors=True)
        partial.unlink(missing_ok=True)
    logger.info("built %s", binary)


def _make_writable(root: Path) -> None:
    """``chmod -R u+w``: the Go module cache is read-only."""
    for folder, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            path = os.path.join(folder, name)
            if not os.path.islink(path):
                os.chmod(path, os.stat(path).st_mode | 0o200)
    if root.exists():
        os.chmod(root, os.stat(root).st_mode | 0o700)


# --------------------------------------------------------------------------- servers


def _free_ports(count: int) -> list[int]:
    """Ports free on 127.0.0.1, all held open together so none is handed out twice."""
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sockets.append(sock)
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _command(backend: str, *, data_dir: Path, port: int, binary: Path) -> list[str]:
    if backend == "mongod":
        return [
            str(binary),
            "--dbpath", str(data_dir),
            "--port", str(port),
            "--bind_ip", "127.0.0.1",
            "--logpath", str(data_dir / "mongod.log"),
            "--logappend",
        ]  # fmt: skip
    return [
        str(binary),
        "--handler=sqlite",
        f"--sqlite-url=file:{data_dir}/",  # the trailing slash makes it a folder
        f"--listen-addr=127.0.0.1:{port}",
        f"--state-dir={data_dir}",
        "--debug-addr=-",
        "--telemetry=disable",
        "--log-level=warn",
    ]


@attrs.define(eq=False)
class LocalServer:
    """One local MongoDB-wire server process: its name, port, URI, data folder and backend.

    Made by :class:`LocalClusters`; the methods act on the running process so tests can
    simulate failures.

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
    backend: str
    _command: list[str] = attrs.field(factory=list, repr=False, alias="command")
    _detached: bool = attrs.field(default=False, repr=False, alias="detached")
    _process: subprocess.Popen[bytes] | None = attrs.field(
        default=None, repr=False, alias="process"
    )
    _container: Any = attrs.field(default=None, repr=False, alias="container")

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
        """The files the server logs to, for reading after a failure."""
        if self.backend == "mongod":
            return [self.data_dir / "mongod.log", self.data_dir / "mongod.stdout.log"]
        if self.backend == "ferretdb":
            return [self.data_dir / "ferretdb.log"]
        return []

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
        """Freeze the server with SIGSTOP: it keeps its port but answers nothing."""
        if self._container is not None:
            self._container.get_wrapped_container().pause()
            return
        self._signal(signal.SIGSTOP)

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
        process = self._process
        if process is None or process.poll() is not None:
            return
        process.terminate()
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGCONT)  # a paused process must run to exit
        try:
            process.wait(timeout=STOP_GRACE)
        except subprocess.TimeoutExpired:
            logger.warning(
                "%s did not exit %.0f s after SIGTERM; killing it", self.name, STOP_GRACE
            )
            process.kill()
            process.wait()
        logger.info("stopped %s (port %d)", self.name, self.port)

    def _signal(self, sig: signal.Signals) -> None:
        if self._process is None or self._process.poll() is not None:
            raise HarnessError(f"{self.name}: not running (cannot send {sig.name})")
        self._process.send_signal(sig)

    def _spawn(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        log = self.log_paths[-1]
        with open(log, "ab") as output:
            self._process = subprocess.Popen(
                self._command,
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=self._detached,
            )
        logger.info(
            "started %s: %s pid %d on port %d",
            self.name,
            self.backend,
            self._process.pid,
            self.port,
        )

    def _wait_ready(self, *, timeout: float) -> None:
        """Block until the server answers ``ping``; fail fast if the process exits.

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
        parts = []
        for path in self.log_paths:
            try:
                text = path.read_text(errors="replace")
            except OSError:
                continue
            if text.strip():
                parts.append(f"--- {path}\n{_tail(text)}")
        return "\n".join(parts) or "(the log is empty)"


def _container_status(container: Any) -> str:
    try:
        wrapped = container.get_wrapped_container()
        wrapped.reload()
        return str(wrapped.status)
    except Exception:  # noqa: BLE001 - a vanished container is simply not alive
        return "gone"


def _resolve_backend(backend: str | None) -> str:
    """Turn ``auto``/None into a concrete backend name, checking it can run here."""
    source = "backend"
    if backend is None:
        backend = os.environ.get(BACKEND_ENV) or "auto"
        source = f"${BACKEND_ENV}"
    if backend not in BACKENDS:
        message = f"{source}: must be one of {', '.join(BACKENDS)} (got {backend!r})"
        if source == "backend":
            raise ValueError(message)
        raise HarnessError(message)
    if backend == "auto":
        return "mongod" if shutil.which("mongod") else "ferretdb"
    if backend == "mongod" and not shutil.which("mongod"):
        raise HarnessError(f"{source}: 'mongod' was asked for but is not on PATH")
    return backend


class LocalClusters:
    """Several local servers, one per cluster name, started and stopped together.

    ``base_dir`` holds one data folder per cluster (a temporary folder, removed on
    :meth:`stop`, when None). ``backend`` defaults to ``$FEED_TEST_BACKEND``, else
    ``auto``: ``mongod`` if it is on PATH, else FerretDB. ``detached`` servers run in
    their own session and are not stopped when this Python process exits (the CLI
    ``start`` uses it); otherwise :meth:`stop` also runs at interpreter exit.
    ``ports`` fixes the ports, one per cluster (default: free ports on 127.0.0.1).

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
        self.base_dir = base_dir
        self.timeout = timeout
        self.detached = detached
        if ports is not None and (len(ports) != count or any(not 0 < p < 65536 for p in ports)):
            raise ValueError(f"ports: expected {count} ports from 1 to 65535 (got {list(ports)})")
        self.ports = list(ports) if ports is not None else None
        self.servers: list[LocalServer] = []
        self._temp_dir: Path | None = None
        self._started = False

    @property
    def uris(self) -> list[str]:
        """The servers' URIs, in the order of ``names``."""
        return [server.uri for server in self.servers]

    def start(self) -> list[str]:
        """Start every server, wait until each answers ``ping``, and return their URIs.

        If any server fails, the ones already started are stopped and
        :class:`HarnessError` says why, with the end of the failing server's log.

        Example::

            >>> clusters = LocalClusters(2)  # doctest: +SKIP
            >>> try:
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
        """Stop every server and remove the temporary folder; safe to call repeatedly.

        Example::

            >>> clusters.stop()  # doctest: +SKIP
        """
        servers = [server for server in self.servers if server.alive]
        if servers:
            with concurrent.futures.ThreadPoolExecutor(len(servers)) as pool:
                for future in [pool.submit(server.stop) for server in servers]:
                    future.result()
        if self._temp_dir is not None:
            shutil.rmtree(self._temp_dir, ignore_errors=True)
            self._temp_dir = None
        with contextlib.suppress(Exception):
            atexit.unregister(self.stop)

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
            return self._temp_dir
        self.base_dir.mkdir(parents=True, exist_ok=True)
        return self.base_dir.resolve()

    def _start_processes(self) -> None:
        if self.backend == "mongod":
            found = shutil.which("mongod")
            if not found:
                raise HarnessError("'mongod' is not on PATH")
            binary = Path(found)
        else:
            binary = ensure_ferretdb()
        root = self._root()
        for name, port in zip(self.names, self.ports or _free_ports(self.count), strict=True):
            data_dir = root / name
            server = LocalServer(
                name=name,
                port=port,
                uri=f"mongodb://127.0.0.1:{port}",
                data_dir=data_dir,
                backend=self.backend,
                command=_command(self.backend, data_dir=data_dir, port=port, binary=binary),
                detached=self.detached,
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


# --------------------------------------------------------------------------- CLI


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie no one has reaped yet has exited
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[0] != "Z"


def _pid_is_server(pid: int, data_dir: str) -> bool:
    """Guard against a recycled pid: the server's command line names its data folder."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except FileNotFoundError:
        return not Path("/proc/self").exists()  # no procfs: trust the pid
    except OSError:
        return False
    return data_dir in cmdline


def _stop_pids(entries: list[dict[str, Any]]) -> list[str]:
    """SIGTERM each recorded server, SIGKILL the ones still alive after 10 s."""
    waiting: dict[int, str] = {}
    for entry in entries:
        pid, name = int(entry["pid"]), str(entry["name"])
        if not _pid_alive(pid) or not _pid_is_server(pid, str(entry["data_dir"])):
            logger.info("%s (pid %d) is not running", name, pid)
            continue
        os.kill(pid, signal.SIGTERM)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
        waiting[pid] = name
    deadline = time.monotonic() + STOP_GRACE
    while waiting and time.monotonic() < deadline:
        waiting = {pid: name for pid, name in waiting.items() if _pid_alive(pid)}
        if waiting:
            time.sleep(0.05)
    for pid, name in waiting.items():
        logger.warning("%s (pid %d) ignored SIGTERM for %.0f s; killing it", name, pid, STOP_GRACE)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return [str(entry["name"]) for entry in entries]


def _cmd_build(args: argparse.Namespace) -> int:
    print(ensure_ferretdb())
    return 0


def _cmd_start(args: argparse.Namespace) -> int:
    folder: Path = args.dir.resolve()
    state = folder / STATE_FILE
    if state.exists():
        raise HarnessError(f"{state} exists: servers may be running; run `stop --dir {args.dir}`")
    ports = None if args.first_port is None else list(range(args.first_port, args.first_port + args.count))
    clusters = LocalClusters(
        args.count, base_dir=folder, backend=args.backend, timeout=args.timeout, detached=True, ports=ports
    )
    clusters.start()
    entries = [
        {
            "name": server.name,
            "port": server.port,
            "uri": server.uri,
            "pid": server.pid,
            "backend": server.backend,
            "data_dir": str(server.data_dir),
        }
        for server in clusters.servers
    ]
    partial = state.with_suffix(".json.tmp")
    partial.write_text(json.dumps(entries, indent=2) + "\n")
    os.replace(partial, state)
    for uri in clusters.uris:
        print(uri)
    return 0


def _cmd_stop(args: argparse.Namespace) -> int:
    state = args.dir / STATE_FILE
    try:
        entries = json.loads(state.read_text())
    except FileNotFoundError:
        raise HarnessError(f"{state} not found: nothing was started there") from None
    except (OSError, ValueError) as exc:
        raise HarnessError(f"{state}: cannot read it: {exc}") from exc
    names = _stop_pids(entries)
    state.unlink()
    logger.info("stopped %s", ", ".join(names))
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    command: list[str] = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        raise _UsageError("run: give the command to run after --")
    with LocalClusters(args.count, backend=args.backend, timeout=args.timeout) as clusters:
        env = dict(os.environ)
        env[URIS_ENV] = ",".join(clusters.uris)
        try:
            completed = subprocess.run(command, env=env, check=False)
        except FileNotFoundError:
            print(f"run: command not found: {command[0]}", file=sys.stderr)
            return 127
        except KeyboardInterrupt:
            return 130
    code = completed.returncode
    return 128 - code if code < 0 else code


class _UsageError(Exception):
    pass


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m router.testing.localservers",
        description="Start and stop local MongoDB-wire servers for tests and the demo.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logs, tracebacks")
    sub = parser.add_subparsers(dest="action", required=True)

    build = sub.add_parser("build", help=f"build FerretDB {FERRETDB_VERSION}; print its path")
    build.set_defaults(handler=_cmd_build)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--count", type=int, default=3, help="number of servers (default 3)")
        p.add_argument(
            "--backend",
            choices=BACKENDS,
            default=None,
            help=f"default: ${BACKEND_ENV}, else auto",
        )
        p.add_argument(
            "--timeout",
            type=float,
            default=DEFAULT_TIMEOUT,
            help="seconds to wait for each server to answer ping",
        )

    start = sub.add_parser("start", help="start detached servers; print their URIs")
    common(start)
    start.add_argument("--dir", type=Path, required=True, help="folder for data and servers.json")
    start.add_argument(
        "--first-port",
        type=int,
        default=None,
        help="listen on FIRST_PORT, FIRST_PORT+1, ... (default: free ports chosen at random)",
    )
    start.set_defaults(handler=_cmd_start)

    stop = sub.add_parser("stop", help="stop the servers recorded in DIR/servers.json")
    stop.add_argument("--dir", type=Path, required=True)
    stop.set_defaults(handler=_cmd_stop)

    run = sub.add_parser(
        "run", help=f"start servers, run a command with ${URIS_ENV} set, stop them"
    )
    common(run)
    run.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ARGS...")
    run.set_defaults(handler=_cmd_run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: ``build``, ``start``, ``stop`` and ``run``; returns the exit code.

    Exit codes: 0 ok, 1 the servers could not be built, started or stopped, 2 usage; ``run``
    exits with its command's code.

    Example::

        $ python -m router.testing.localservers run --count 2 -- sh -c 'echo $FEEDROUTER_URIS'
        mongodb://127.0.0.1:40123,mongodb://127.0.0.1:40125
    """
    parser = _parser()
    args = parser.parse_args(argv)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG if args.verbose else logging.INFO)
    try:
        return int(args.handler(args))
    except _UsageError as exc:
        parser.error(str(exc))
    except (HarnessError, ValueError) as exc:
        if args.verbose:
            logger.exception("failed")
        else:
            print(f"error: {exc}", file=sys.stderr)
        return 1 if isinstance(exc, HarnessError) else 2
    finally:
        logger.removeHandler(handler)


if __name__ == "__main__":
    # Run the imported module's main so loggers are named router.testing.localservers, not __main__.
    from router.testing.localservers import main as _main

    sys.exit(_main())
