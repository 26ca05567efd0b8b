"""The command line's progress line: one line on stderr, rewritten in place while a long command runs.

Shown only to a person at a terminal: when stdout and stderr are both terminals and ``--json``
was not given. A script, a pipe or a log gets none of it, only the result on stdout. The line
is cleared before the result is printed.

* ``status`` and ``migrate``: ``[2/3] cluster_2`` as each cluster finishes.
* ``erase``: ``erasing: 1/3 clusters done; cluster_1 1,204,000 removed, cluster_3 512 removed``
  (every cluster's share runs at once; the documents each has removed so far).
* ``export``: ``exporting: sent 8, received 120,500 (received, reading cluster_2)``.

Example::

    progress = Progress(args, total=len(names))
    rows = status_rows(config, on_done=progress.step)
    progress.close()
"""

from __future__ import annotations

import argparse
import shutil
import sys
import threading
import time
from typing import TextIO

from ..core.privacy import ErasureProgress, ExportProgress, STREAMS

__all__ = ["Progress"]


class Progress:
    """The progress line of one command (see the module's docs); every method is safe from several threads."""

    #: Seconds between two redraws of a line that changes often (a cluster finishing redraws at once).
    EVERY = 0.2

    def __init__(self, args: argparse.Namespace, total: int = 0, stream: TextIO | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.total = total
        self.enabled = not getattr(args, "json", False) and sys.stdout.isatty() and self.stream.isatty()
        self.done = 0
        self._lock = threading.Lock()
        self._drawn = 0.0
        self._removed: dict[str, int] = {}
        self._finished: set[str] = set()
        self._records: dict[str, int] = {}
        self._reading: tuple[str, str] | None = None

    def step(self, what: str) -> None:
        """One of *total* parts finished: ``[i/n] what`` (nothing for a command of one part)."""
        with self._lock:
            self.done += 1
            if self.total > 1:
                self._draw(f"[{self.done}/{self.total}] {what}", now=True)

    def erasure(self, note: ErasureProgress) -> None:
        """``erase_user``'s progress callback: each cluster's documents removed so far, and how many finished."""
        with self._lock:
            self._removed[note.cluster] = note.removed
            if note.finished:
                self._finished.add(note.cluster)
            running = ", ".join(f"{name} {n:,} removed" for name, n in self._removed.items() if name not in self._finished)
            self._draw(f"erasing: {len(self._finished)}/{self.total} clusters done" + (f"; {running}" if running else ""),
                       now=note.finished)

    def export(self, note: ExportProgress) -> None:
        """``export_user``'s progress callback: the records of each stream so far, and where it reads now (redrawn at
        once when it starts another file or period)."""
        with self._lock:
            self._records[note.stream] = note.records
            counts = ", ".join(f"{s} {self._records[s]:,}" for s in STREAMS if s in self._records)
            moved = (note.stream, note.period) != self._reading  # a new file or period: shown at once
            self._reading = (note.stream, note.period)
            self._draw(f"exporting: {counts} ({note.stream}, reading {note.period})", now=moved)

    def close(self) -> None:
        """Clear the line (before the result is printed)."""
        with self._lock:
            if self.enabled and self._drawn:
                self.stream.write("\r\x1b[2K")
                self.stream.flush()

    def _draw(self, text: str, *, now: bool = False) -> None:
        if not self.enabled:
            return
        moment = time.monotonic()
        if not now and moment - self._drawn < self.EVERY:
            return
        self._drawn = moment
        width = max(20, shutil.get_terminal_size().columns - 1)
        self.stream.write(f"\r\x1b[2K{text[:width]}")
        self.stream.flush()
