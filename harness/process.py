"""Process plumbing shared by the local servers: free ports, pids, stopping, log tails, build locks.

Every local server (FerretDB, mongod, PostgreSQL, Redis) is a child process on loopback
with a log file; this module holds what they have in common so each server module only
says how its own program is started and asked whether it is ready.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "DEFAULT_TIMEOUT",
    "POLL_INTERVAL",
    "STOP_GRACE",
    "CHECKOUT",
    "build_once",
    "checkout_env",
    "children_of",
    "file_lock",
    "free_ports",
    "log_tail",
    "pid_alive",
    "pid_is_server",
    "spawn_logged",
    "stop_pids",
    "stop_process",
    "tail",
]

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 60.0
"""Seconds to wait for a server to answer after it is started."""

STOP_GRACE = 10.0
"""Seconds a server gets to exit after its stop signal before it is sent SIGKILL."""

POLL_INTERVAL = 0.05
"""Seconds between two looks at a condition that has no event to wait on (a pid, a port)."""

_LOG_TAIL_LINES = 20


#: The checkout this harness runs from: a child Python that imports ``router``, ``harness`` or ``tests`` needs it on its path.
CHECKOUT = Path(__file__).resolve().parents[1]


def checkout_env(**extra: str) -> dict[str, str]:
    """This process's environment plus ``extra``, with the checkout first on ``PYTHONPATH``: a child Python then imports
    this checkout's code, not an installed copy."""
    path = os.pathsep.join(p for p in (str(CHECKOUT), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, **extra, "PYTHONPATH": path}


def free_ports(count: int) -> list[int]:
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


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created if missing): one build at a time across processes."""
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def build_once(lock_path: Path, *, built: Callable[[], bool], build: Callable[[], None]) -> bool:
    """Run ``build`` unless ``built()``, holding :func:`file_lock` on ``lock_path`` and asking again once it is held.

    Concurrent callers (other processes too) build once; returns whether this call built.
    """
    if built():
        return False
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(lock_path):
        if built():  # another process built it while we waited
            return False
        build()
    return True


def tail(text: str, lines: int = _LOG_TAIL_LINES) -> str:
    """The last ``lines`` lines of ``text``, for error messages."""
    return "\n".join(text.strip().splitlines()[-lines:])


def log_tail(paths: Iterable[Path]) -> str:
    """The end of each non-empty log file, headed by its path, for error messages."""
    parts = []
    for path in paths:
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        if text.strip():
            parts.append(f"--- {path}\n{tail(text)}")
    return "\n".join(parts) or "(the log is empty)"


def proc_stat(pid: int | str) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after the command name (the state first, then the parent's pid, ...), or None
    when it cannot be read (the process is gone, or there is no procfs)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rpartition(")")[2].split()


def pid_alive(pid: int) -> bool:
    """True while ``pid`` is a running process (a zombie no one reaped yet has exited)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    fields = proc_stat(pid)
    return fields is None or fields[0] != "Z"


def pid_is_server(pid: int, marker: str) -> bool:
    """Guard against a recycled pid: the server's command line names ``marker`` (its folder)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except FileNotFoundError:
        return not Path("/proc/self").exists()  # no procfs: trust the pid
    except OSError:
        return False
    return marker in cmdline


def spawn_logged(
    command: Sequence[str], log_path: Path, *, detached: bool, **popen_kwargs: Any
) -> subprocess.Popen[bytes]:
    """Start ``command`` with no stdin and its stdout and stderr appended to ``log_path``.

    ``detached`` puts it in a session of its own (it outlives us; stop it by pid);
    ``popen_kwargs`` (``cwd``, ``env``) go to :class:`subprocess.Popen` as they are.
    """
    with open(log_path, "ab") as output:
        return subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=detached,
            **popen_kwargs,
        )


def stop_process(
    process: subprocess.Popen[bytes],
    *,
    name: str,
    sig: signal.Signals = signal.SIGTERM,
    grace: float = STOP_GRACE,
) -> bool:
    """Send ``sig`` (and SIGCONT, so a paused process can act on it), SIGKILL after ``grace``.

    Returns whether the process was still running (whether there was anything to stop).
    """
    if process.poll() is not None:
        return False
    with contextlib.suppress(ProcessLookupError):
        process.send_signal(sig)
        process.send_signal(signal.SIGCONT)
    try:
        process.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        logger.warning("%s did not exit %.0f s after %s; killing it", name, grace, sig.name)
        process.kill()
        process.wait()
    return True


def children_of(pid: int) -> list[int]:
    """The live processes whose parent is *pid* (from /proc; none without procfs)."""
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        fields = proc_stat(entry.name)
        if fields is not None and len(fields) > 1 and fields[1] == str(pid) and fields[0] != "Z":
            found.append(int(entry.name))
    return found


def stop_pids(
    pids: Mapping[int, str], *, sig: signal.Signals = signal.SIGTERM, grace: float = STOP_GRACE
) -> None:
    """Stop processes that are not our children (recorded by an earlier ``start``).

    ``pids`` maps each pid to a name for the logs; the caller has checked each is still
    the server it recorded. SIGKILL goes to those still alive after ``grace`` seconds.
    """
    waiting = dict(pids)
    for pid in list(waiting):
        try:
            os.kill(pid, sig)
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            del waiting[pid]
    deadline = time.monotonic() + grace
    while waiting and time.monotonic() < deadline:
        waiting = {pid: name for pid, name in waiting.items() if pid_alive(pid)}
        if waiting:
            time.sleep(POLL_INTERVAL)
    for pid, name in waiting.items():
        logger.warning("%s (pid %d) ignored %s for %.0f s; killing it", name, pid, sig.name, grace)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + grace
    while any(pid_alive(pid) for pid in waiting) and time.monotonic() < deadline:
        time.sleep(POLL_INTERVAL)  # SIGKILL cannot be ignored: this is brief
