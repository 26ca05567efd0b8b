"""CPU time, read from ``/proc`` (Linux): of the whole machine, and of the processes behind a server's port.

The Celery measure says where its time went with these: how busy the machine was, and
how much of it the servers (FerretDB or mongod, and the PostgreSQL behind FerretDB), the
broker and the workers used. A server is found by the port in its URI: the process
listening there, everything it started, and for FerretDB on PostgreSQL the process
listening on the port of its ``--postgresql-url``, with its children (one per connection).
Exited children count too (their time is added to their parent's ``cutime``/``cstime``).

Example::

    servers = server_pids(uris)
    before = Snapshot.take({"servers": servers})
    ...
    spent = Snapshot.take({"servers": servers}).minus(before)
    spent.busy_share, spent.seconds["servers"]
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from urllib.parse import urlsplit

import attrs

__all__ = ["Snapshot", "listening_pids", "server_pids"]

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PROC = Path("/proc")


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:  # the process is gone, or not ours to read
        return ""


def _stat(pid: int) -> tuple[int, float]:
    """The parent pid and the CPU seconds (own and waited-for children) of *pid*; (0, 0.0) when it is gone."""
    text = _read(_PROC / str(pid) / "stat")
    if not text:
        return 0, 0.0
    fields = text[text.rindex(")") + 2:].split()  # after "pid (comm) "
    ppid = int(fields[1])
    utime, stime, cutime, cstime = (int(x) for x in fields[11:15])
    return ppid, (utime + stime + cutime + cstime) / _TICK


def _pids() -> list[int]:
    return [int(p.name) for p in _PROC.iterdir() if p.name.isdigit()]


def _with_descendants(roots: Iterable[int]) -> set[int]:
    children: dict[int, list[int]] = {}
    for pid in _pids():
        children.setdefault(_stat(pid)[0], []).append(pid)
    found, todo = set(), list(roots)
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(children.get(pid, []))
    return found


def listening_pids(port: int) -> set[int]:
    """The processes with a socket listening on TCP *port* (IPv4 or IPv6)."""
    inodes = set()
    for table in ("tcp", "tcp6"):
        for line in _read(_PROC / "net" / table).splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                inodes.add(f"socket:[{fields[9]}]")
    found = set()
    for pid in _pids():
        try:
            links = {os.readlink(fd) for fd in (_PROC / str(pid) / "fd").iterdir()}
        except OSError:
            continue
        if links & inodes:
            found.add(pid)
    return found


def server_pids(uris: Sequence[str]) -> set[int]:
    """The processes serving *uris* (by port), with the PostgreSQL behind a FerretDB, and all their children."""
    roots: set[int] = set()
    for uri in uris:
        for host in urlsplit(uri).netloc.rsplit("@", 1)[-1].split(","):
            roots |= listening_pids(int(host.rsplit(":", 1)[1]) if ":" in host else 27017)
    for pid in list(roots):
        backend = re.search(r"--postgresql-url=\S*?:(\d+)/", _read(_PROC / str(pid) / "cmdline").replace("\0", " "))
        if backend:
            roots |= listening_pids(int(backend.group(1)))
    return _with_descendants(roots)


@attrs.frozen
class Snapshot:
    """The machine's busy and total CPU seconds, and the CPU seconds of named groups of processes, at one moment."""

    wall: float
    busy: float
    total: float
    seconds: Mapping[str, float]

    @classmethod
    def take(cls, groups: Mapping[str, Iterable[int]]) -> Snapshot:
        """Read ``/proc/stat`` and each group's processes (and their children) now."""
        cpu = [int(x) / _TICK for x in _read(_PROC / "stat").splitlines()[0].split()[1:]]
        idle = cpu[3] + cpu[4]  # idle, iowait
        return cls(time.monotonic(), sum(cpu) - idle, sum(cpu),
                   {name: sum(_stat(p)[1] for p in _with_descendants(pids)) for name, pids in groups.items()})

    def minus(self, earlier: Snapshot) -> Snapshot:
        """What was spent from *earlier* to this snapshot."""
        return Snapshot(self.wall - earlier.wall, self.busy - earlier.busy, self.total - earlier.total,
                        {k: v - earlier.seconds.get(k, 0.0) for k, v in self.seconds.items()})

    @property
    def busy_share(self) -> float:
        """How busy the machine's cores were, 0 to 1 (a spent snapshot)."""
        return self.busy / self.total if self.total else 0.0

    def share(self, name: str) -> float:
        """The share of the machine's CPU that group *name* used (a spent snapshot)."""
        return self.seconds[name] / self.total if self.total else 0.0
