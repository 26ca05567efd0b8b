"""A local Redis server on loopback, the message broker for tests and the demo.

One :class:`LocalRedis` is one ``redis-server`` process on a free 127.0.0.1 port with its
own data folder. The append-only file is on and written before each reply, so a restart
(even after SIGKILL) finds every message acknowledged before it; RDB snapshots are off. Readiness is a ``PING`` answered ``PONG``, spoken in RESP over a plain
socket, so the harness needs no Redis client package.

Example::

    with LocalRedis() as broker:
        app.conf.broker_url = broker.url      # 'redis://127.0.0.1:40125/0'
        broker.kill()                         # simulate a crash
        broker.restart()                      # same port, same data
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

from .errors import HarnessError
from .process import DEFAULT_TIMEOUT, POLL_INTERVAL, free_ports, log_tail, spawn_logged, stop_process

__all__ = ["LocalRedis", "find_redis_server"]

logger = logging.getLogger(__name__)

SEARCH_PATHS = (Path("/usr/bin/redis-server"), Path("/usr/sbin/redis-server"), Path("/usr/local/bin/redis-server"))
"""Where ``redis-server`` is looked for when it is not on PATH."""

_PING = b"*1\r\n$4\r\nPING\r\n"


def find_redis_server() -> Path:
    """The ``redis-server`` program: on PATH, else in /usr/bin or /usr/sbin.

    Raises :class:`HarnessError` saying how to install it when it is nowhere.
    """
    found = shutil.which("redis-server")
    if found:
        return Path(found)
    for path in SEARCH_PATHS:
        if path.is_file():
            return path
    raise HarnessError(
        "redis-server is not installed (not on PATH, nor in /usr/bin or /usr/sbin); install "
        "it with `apt-get install -y redis-server` (Debian/Ubuntu; scripts/bootstrap does it "
        "when run as root) or your system's redis package"
    )


def ping(port: int, *, timeout: float = 1.0) -> str:
    """Send ``PING`` to 127.0.0.1:``port`` and return the reply line (``+PONG`` when ready).

    Raises :class:`OSError` when nothing answers.
    """
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(_PING)
        reply = b""
        while not reply.endswith(b"\r\n"):
            chunk = sock.recv(512)
            if not chunk:
                raise ConnectionResetError("Redis closed the connection before replying")
            reply += chunk
    return reply.decode(errors="replace").strip()


class LocalRedis:
    """A ``redis-server`` on 127.0.0.1, started by ``with`` or :meth:`start`.

    ``base_dir`` holds its data and log (a temporary folder, removed on :meth:`stop`, when
    None); ``port`` defaults to a free one. :meth:`kill`, :meth:`restart`, :meth:`pause`
    and :meth:`resume` let tests simulate a broker failure.

    Example::

        >>> with LocalRedis() as broker:  # doctest: +SKIP
        ...     broker.url
        'redis://127.0.0.1:40125/0'
    """

    appendfsync = "always"
    """Redis's ``appendfsync``. ``always`` writes (and syncs) the append-only file before a
    reply, so nothing acknowledged is lost to a kill. With ``everysec`` a write that meets
    a background fsync is postponed but still acknowledged, and a SIGKILL then loses it."""

    def __init__(
        self,
        *,
        base_dir: Path | None = None,
        port: int | None = None,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        if timeout <= 0:
            raise ValueError(f"timeout: must be positive (got {timeout})")
        if port is not None and not 0 < port < 65536:
            raise ValueError(f"port: must be from 1 to 65535 (got {port})")
        self.binary = find_redis_server()
        self.base_dir = base_dir
        self.port = port if port is not None else free_ports(1)[0]
        self.timeout = timeout
        self.data_dir: Path | None = None
        self._temp_dir: Path | None = None
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:PORT/0``."""
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int | None:
        """The server's process id, or None before :meth:`start`."""
        return None if self._process is None else self._process.pid

    @property
    def alive(self) -> bool:
        """True while the server process exists (a paused server is alive)."""
        return self._process is not None and self._process.poll() is None

    @property
    def log_path(self) -> Path | None:
        """The server's log file, once started."""
        return None if self.data_dir is None else self.data_dir / "redis.log"

    def start(self) -> str:
        """Start the server, wait until it answers ``PING``, and return :attr:`url`."""
        if self.data_dir is not None:
            raise HarnessError("this Redis is already started")
        if self.base_dir is None:
            self._temp_dir = Path(tempfile.mkdtemp(prefix="feedrouter-redis-"))
            self.data_dir = self._temp_dir
        else:
            self.base_dir.mkdir(parents=True, exist_ok=True)
            self.data_dir = self.base_dir.resolve()
        atexit.register(self.stop)
        try:
            self._spawn()
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self.url

    def kill(self) -> None:
        """Kill the server with SIGKILL (no clean shutdown) and wait for it to exit."""
        if self._process is None or self._process.poll() is not None:
            return
        self._process.kill()
        self._process.wait()
        logger.info("killed redis-server (port %d)", self.port)

    def pause(self) -> None:
        """Freeze the server with SIGSTOP: it keeps its port but answers nothing."""
        self._running().send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        """Let a paused server run again (SIGCONT)."""
        self._running().send_signal(signal.SIGCONT)

    def restart(self) -> None:
        """Start the server again on the same port and data, and wait for ``PING``.

        A server still running is stopped cleanly first.
        """
        if self.data_dir is None:
            raise HarnessError("this Redis was never started")
        self._stop_process()
        self._spawn()
        self._wait_ready()

    def stop(self) -> None:
        """Stop the server (SIGTERM, SIGKILL after 10 s), remove a temporary folder; repeatable."""
        self._stop_process()
        if self._temp_dir is not None:
            shutil.rmtree(self._temp_dir, ignore_errors=True)
            self._temp_dir = None
        with contextlib.suppress(Exception):
            atexit.unregister(self.stop)

    def __enter__(self) -> LocalRedis:
        if self.data_dir is None:
            self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _running(self) -> subprocess.Popen[bytes]:
        if self._process is None or self._process.poll() is not None:
            raise HarnessError(f"redis-server on port {self.port} is not running")
        return self._process

    def _command(self) -> list[str]:
        assert self.data_dir is not None
        return [
            str(self.binary),
            "--bind", "127.0.0.1",
            "--port", str(self.port),
            "--dir", str(self.data_dir),
            "--appendonly", "yes",
            "--appendfsync", self.appendfsync,
            "--save", "",
            "--protected-mode", "no",
            "--daemonize", "no",
            "--logfile", "",  # stdout, which goes to redis.log
        ]  # fmt: skip

    def _spawn(self) -> None:
        assert self.log_path is not None
        self._process = spawn_logged(self._command(), self.log_path, detached=False)
        logger.info("started redis-server: pid %d on port %d", self._process.pid, self.port)

    def _stop_process(self) -> None:
        if self._process is not None and stop_process(self._process, name=f"redis-server on port {self.port}"):
            logger.info("stopped redis-server (port %d)", self.port)

    def _wait_ready(self) -> None:
        """Block until ``PING`` gets ``PONG`` (not ``-LOADING``); fail fast if the process exits."""
        process = self._running()
        deadline = time.monotonic() + self.timeout
        while True:
            if process.poll() is not None:
                raise HarnessError(
                    f"redis-server exited with code {process.returncode} before answering "
                    f"PING on port {self.port}; last lines of its log:\n{self._log_tail()}"
                )
            try:
                reply = ping(self.port)
            except OSError as exc:
                reply = f"no answer: {exc}"
            if reply == "+PONG" and process.poll() is None:
                return  # (a PONG from a stranger on our port is caught by poll() next round)
            if time.monotonic() >= deadline:
                raise HarnessError(
                    f"redis-server on port {self.port} did not answer PING within "
                    f"{self.timeout:.0f} s ({reply}); last lines of its log:\n{self._log_tail()}"
                )
            time.sleep(POLL_INTERVAL)

    def _log_tail(self) -> str:
        return log_tail([] if self.log_path is None else [self.log_path])
