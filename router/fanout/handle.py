"""What both engines' fan-out handles show: the job, its cluster, progress and errors so far."""

from __future__ import annotations

from ..core.fanout import FanOutProgress, RunState
from ..errors import RouterError

__all__ = ["HandleView"]


class HandleView:
    """The watching half of a fan-out handle (the waiting half is the engine's own)."""

    _run: RunState

    @property
    def job_id(self) -> str:
        """The job id (its checkpoint's ``_id``)."""
        return self._run.job.job_id

    @property
    def cluster(self) -> str:
        """The cluster the copies go to."""
        return self._run.job.cluster

    @property
    def progress(self) -> FanOutProgress:
        """Counts so far; final once the job is done."""
        return self._run.progress()

    @property
    def errors(self) -> tuple[RouterError, ...]:
        """Errors so far (failed batches, invalid receivers, checkpoint updates that failed)."""
        return self._run.errors()

    @property
    def cancel_requested(self) -> bool:
        """True once ``cancel()`` (or the router's ``close()``) asked the job to stop."""
        return self._run.cancelled

    def done(self) -> bool:  # pragma: no cover - each engine defines it
        raise NotImplementedError

    def __repr__(self) -> str:
        state = "done" if self.done() else "running"
        p = self.progress
        return f"<{type(self).__name__} {self.job_id!r} to {self.cluster!r} {state}: {p.written} written, {p.failed} failed>"
