"""A batch in flight finishes on every Celery pool: what a prefork pool process does with SIGTERM during a batch.

A warm shutdown (SIGTERM to the worker's main process) sends nothing to the pool processes:
the main process stops taking tasks and waits for the running ones. But SIGTERM often
reaches every process of the worker at once: systemd's default ``KillMode=control-group``,
``kill -TERM -<pgid>``, a container runtime that signals the whole group. A prefork pool
process dies of it at once (Celery resets SIGTERM to its default in each pool process, and
billiard then turns it into an exit). Killed mid-batch, it has written the batch's copies (or
some), or left an insert the cluster carries out later, and no record: the broker delivers
the batch again later, so nothing is lost, but until then the status counts it missing.

So a pool process defers SIGTERM while it writes a batch (:func:`sigterm_deferred`): the
batch finishes, is recorded, and its result reaches the main process, which acknowledges
it; :data:`EXIT_AFTER` seconds later the process ends as the signal asked (the handler it
had before the batch gets the signal again). A cold shutdown, or a task revoked with
``terminate=True``, also lets a running batch finish (each request of a batch is bounded by
``timeout``). The main process of a ``solo`` or ``threads`` worker handles SIGTERM itself
(Celery's warm shutdown): there, and on any thread but a process's main thread, nothing is
changed.

Example::

    with sigterm_deferred():
        outcome = write_batch(...)          # a SIGTERM meanwhile ends this process once the batch is done
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["EXIT_AFTER", "sigterm_deferred"]

log = logging.getLogger(__name__)

#: Seconds between the end of a batch during which SIGTERM came and the process ending: time for the pool process
#: to hand the batch's result to the main process (a dict, over a pipe).
EXIT_AFTER = 1.0


def _pool_process() -> bool:
    """Whether this is a pool process of a prefork worker (not the worker's main process), on its main thread."""
    from billiard.process import current_process

    return threading.current_thread() is threading.main_thread() and current_process().name != "MainProcess"


@contextmanager
def sigterm_deferred(what: str = "the batch") -> Iterator[None]:
    """Run the body with SIGTERM deferred to its end, in a prefork pool process (elsewhere, nothing changes)."""
    if not _pool_process():
        yield
        return
    received: list[int] = []

    def defer(signum: int, _frame: Any) -> None:
        if not received:
            log.warning("pool process %d: SIGTERM: %s finishes first, then the process exits", os.getpid(), what)
        received.append(signum)

    previous = signal.signal(signal.SIGTERM, defer)
    if previous is None:  # a handler not installed from Python: the default's effect
        previous = signal.SIG_DFL
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        if received:
            timer = threading.Timer(EXIT_AFTER, os.kill, (os.getpid(), signal.SIGTERM))
            timer.daemon = True
            timer.start()
