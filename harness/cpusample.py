"""Where a test run's CPU goes: every process's CPU time, sampled while the run lasts, summed by kind.

``scripts/test`` runs ``python -m harness.cpusample OUT`` beside its two pytest runs and stops it
(SIGTERM) when they end: every 2 s it reads each process's CPU time from ``/proc`` and adds what it
used since the last look to its kind (:func:`kind`: PostgreSQL, FerretDB, the JVMs, the test
processes, ...); at the end it writes the totals to *OUT* (TSV: kind, CPU-seconds) and prints
them (after its first look it says ``cpusample: sampling`` on stderr). A process that starts and
ends between two looks is missed (a short ``feedrouter`` subprocess), and so is what a process uses
after the last look before it ends, so the totals are a lower bound. Linux only (``/proc``);
elsewhere it says so and writes nothing.

Example (the line of a fresh-clone run on 2 cores, 2026-11-29)::

    $ python -m harness.cpusample .cache/test-times/cpu.tsv &   # ... then kill -TERM $!
    cpu by process kind: postgres 1,103 s (46%), tests 708 s (29%), java 229 s (10%), ferretdb 200 s (8%), ...
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import FrameType

from .process import proc_stat

__all__ = ["kind", "main", "summary"]

#: How often the processes are looked at, seconds.
INTERVAL = 2.0
_PROC = Path("/proc")


def kind(comm: str, cmdline: str) -> str:
    """The kind of a process, from its ``comm`` (the executable's short name) and its command line."""
    line = cmdline.lower()
    if comm == "postgres" or cmdline.startswith("postgres:"):
        return "postgres"
    if comm == "ferretdb" or "/ferretdb " in line:
        return "ferretdb"
    if comm == "java":
        return "java"
    if comm.startswith("redis"):
        return "redis"
    if "celery" in line:
        return "celery"
    if "pytest" in line or "exec(eval(sys.stdin.readline()))" in line:  # an xdist worker's command line
        return "tests"
    if "python" in comm or "python" in line:
        return "python"
    return "other"


def _read(pid: str) -> tuple[int, int] | None:
    """A process's start time and CPU ticks (user + system), or None once it is gone."""
    fields = proc_stat(pid)
    return None if fields is None else (int(fields[19]), int(fields[11]) + int(fields[12]))


def _describe(pid: str) -> str | None:
    try:
        comm = (_PROC / pid / "comm").read_text().strip()
        cmdline = (_PROC / pid / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return None
    return kind(comm, cmdline)


def _pids() -> Iterator[str]:
    return (name for name in os.listdir(_PROC) if name.isdigit())


def summary(totals: Mapping[str, float]) -> str:
    """One line: each kind's CPU-seconds and share, the largest first."""
    whole = sum(totals.values()) or 1.0
    parts = [f"{k} {v:,.0f} s ({v / whole:.0%})" for k, v in sorted(totals.items(), key=lambda kv: -kv[1]) if v >= 0.5]
    return "cpu by process kind: " + (", ".join(parts) if parts else "nothing measured")


def main(argv: list[str]) -> int:
    """Sample until SIGTERM or SIGINT, then write and print the totals (see the module docstring)."""
    if len(argv) != 1:
        print("usage: python -m harness.cpusample OUT.tsv", file=sys.stderr)
        return 2
    if not _PROC.is_dir():
        print("cpusample: no /proc here; CPU by process kind not measured", file=sys.stderr)
        return 0
    out = Path(argv[0])
    ticks = os.sysconf("SC_CLK_TCK")
    stopping = False

    def stop(_signum: int, _frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    seen: dict[str, tuple[int, int, str]] = {}  # pid -> (start, ticks at the last look, kind)
    totals: dict[str, int] = {}
    first = True
    while not stopping:
        alive: dict[str, tuple[int, int, str]] = {}
        for pid in _pids():
            now = _read(pid)
            if now is None:
                continue
            start, used = now
            before = seen.get(pid)
            if before is not None and before[0] == start:
                used_before, what = before[1], before[2]
            else:  # new since the last look (or a reused pid): all it used counts, but not before the first look
                described = _describe(pid)
                if described is None:
                    continue
                used_before, what = (used if first else 0), described
            totals[what] = totals.get(what, 0) + used - used_before
            alive[pid] = (start, used, what)
        if first:  # (to stderr: the summary stays the last line of stdout)
            print("cpusample: sampling", file=sys.stderr, flush=True)
        seen, first = alive, False
        deadline = time.monotonic() + INTERVAL
        while not stopping and time.monotonic() < deadline:
            time.sleep(0.1)
    seconds = {k: v / ticks for k, v in totals.items()}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(f"{k}\t{v:.1f}\n" for k, v in sorted(seconds.items(), key=lambda kv: -kv[1])))
    print(summary(seconds))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
