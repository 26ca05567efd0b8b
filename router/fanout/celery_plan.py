"""How a stream batch becomes Celery tasks: which receivers go to which job and queue. Pure, no Celery.

:mod:`router.fanout.celery` sends what :func:`plan_parts` decides; this module needs no
broker, so its rules are tested on their own and ``feedrouter fanout-status`` can name
the inactive job without Celery installed.

**Two jobs when inactive receivers are included.** Receivers are cut into batches of
``batch_size`` by their position in the stream (:func:`router.core.fanout.plan.batches`),
whoever is active. Stream batch *n* becomes:

* batch *n* of the job itself (``job_id``), on the high-priority queue: the whole batch,
  with the positions of its inactive receivers in ``skip`` (they count as ``skipped``).
  This is exactly the batch *n* ``FeedRouter.fan_out(..., active=...)`` writes, so the
  two engines share checkpoints and either can resume the other's job;
* with ``include_inactive``, batch *n* of a second job, :func:`inactive_job_id` (``job_id
  + "/inactive"``), on the low-priority queue: the inactive receivers only. It has its
  own checkpoint with the same ``batch_size``, so every batch number stays unique within
  its job and the numbering never depends on who is active.

**Resuming.** Each part is skipped when its own checkpoint records it done. When one part
of a stream batch is done and the other is not, the other is sent with *every* valid
receiver of the batch, so a receiver whose activity changed between the two runs cannot
fall between the parts (the ones already written count as ``already_present``).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from ..core.fanout import FanOutJob, SKIP, announce_batch, finish_checkpoint, open_checkpoint, start_job
from ..core.writes import receiver_problem
from ..core.policy import RetryPolicy
from ..core.pseudonyms import Pseudonyms
from ..core.steps import Program
from ..errors import InvalidItem
from ..model import identity, is_id

__all__ = [
    "ACTIVE_QUEUE",
    "INACTIVE_QUEUE",
    "INACTIVE_SUFFIX",
    "Part",
    "PublishRun",
    "Published",
    "check_json_data",
    "inactive_job_id",
    "plan_parts",
    "sendable",
]

log = logging.getLogger(__name__)

#: The queue of active receivers' batches; workers consume it first.
ACTIVE_QUEUE = "feedrouter.active"
#: The queue of inactive receivers' batches (``include_inactive=True``); consumed when the active one is empty.
INACTIVE_QUEUE = "feedrouter.inactive"
#: Added to a job id to name the job of its inactive receivers.
INACTIVE_SUFFIX = "/inactive"

_SCALARS = (str, int, bool, type(None))


def inactive_job_id(job_id: str) -> str:
    """The id of the job that writes *job_id*'s inactive receivers (``include_inactive=True``).

    Example::

        inactive_job_id("6c1b07bc...:1714825815250")   # '6c1b07bc...:1714825815250/inactive'
    """
    return job_id + INACTIVE_SUFFIX


@attrs.frozen
class Part:
    """One task to send: batch ``number`` of the job (``inactive`` False) or of its inactive job.

    ``receivers`` is what the task carries; ``skip`` the positions in it of receivers that
    get no copy in this job (inactive ones, in the job itself).
    """

    inactive: bool
    receivers: list[Any]
    skip: list[int]

    @property
    def queue(self) -> str:
        return INACTIVE_QUEUE if self.inactive else ACTIVE_QUEUE


def plan_parts(
    chunk: list[Any], *, active: Callable[[Any], bool] | None, done: bool, inactive_done: bool | None,
) -> list[Part]:
    """The tasks for one stream batch (see the module docstring); an empty list when every part is done.

    *done* says the job's own batch is recorded done; *inactive_done* the inactive job's,
    or None when inactive receivers are not included (they are then only skipped).
    *active* is called on valid receivers only, as ``batch_program`` would.
    """
    split = inactive_done is not None
    parts: list[Part] = []
    if done and (not split or inactive_done):
        return parts
    skip: list[int] = []
    if active is not None:
        skip = [i for i, r in enumerate(chunk) if receiver_problem(r) is None and not active(r)]
    if not done:
        parts.append(Part(False, chunk, [] if inactive_done else skip))
    if split and not inactive_done:
        if done:  # the job's own part is done: its sibling takes every valid receiver
            rest = [r for r in chunk if receiver_problem(r) is None]
        else:
            rest = [chunk[i] for i in skip]
        parts.append(Part(True, rest, []))
    return parts


def sendable(chunk: list[Any], first: int) -> list[Any]:
    """*chunk* as JSON can carry it: a receiver that is no JSON scalar (never a valid id) becomes ``None``.

    The worker then fails it at its position as it fails any invalid receiver; the real
    value is logged here, where it is known.
    """
    if all(type(r) in _SCALARS for r in chunk):  # ints and strs: the usual case, nothing to copy
        return chunk
    out: list[Any] = []
    for position, r in enumerate(chunk, first):
        if type(r) in _SCALARS or (type(r) is float and math.isfinite(r)):
            out.append(r)
        elif is_id(r):  # an Int64 (a 64-bit id read from MongoDB) travels as its int: the same receiver
            out.append(identity(r))
        else:
            log.warning("receivers[%d]: %.80r cannot travel as JSON; sent as null, it fails as an invalid receiver",
                        position, r)
            out.append(None)
    return out


def check_json_data(data: Any, path: str = "data") -> None:
    """Raise :class:`InvalidItem` naming the first value in *data* that JSON cannot carry to a worker unchanged.

    Celery tasks here are JSON only (no pickle), so an activity's ``data`` may hold only
    strings, ints, finite floats, booleans, None, lists and string-keyed mappings.
    """
    kind = type(data)
    if kind in _SCALARS:
        return
    if kind is float:
        if not math.isfinite(data):
            raise InvalidItem(path, f"must be a finite number to travel as JSON to Celery workers (got {data!r})")
        return
    if isinstance(data, Mapping):
        for key, value in data.items():
            check_json_data(value, f"{path}.{key}")
        return
    if kind in (list, tuple):
        for i, value in enumerate(data):
            check_json_data(value, f"{path}[{i}]")
        return
    raise InvalidItem(
        path, "must be JSON (str, int, float, bool, None, list or mapping) to travel to Celery workers "
        f"(got {kind.__name__}); convert it first, e.g. a datetime to an ISO string",
    )


@attrs.frozen(kw_only=True)
class Published:
    """What :func:`~router.fanout.celery.publish_fan_out` handed to the workers.

    Progress is in the checkpoints, from any process: ``router.fan_out_status(job_id)``
    (and ``inactive_job_id``'s, when inactive receivers were included).

    * ``batches_total``: stream batches read (each job's ``batches_total``).
    * ``tasks_sent``: tasks sent; ``batches_resumed``: parts the checkpoints record done,
      not sent again.
    * ``receivers``: receivers read; ``elapsed_seconds``: time spent publishing.
    """

    job_id: str
    cluster: str
    inactive_job_id: str | None
    batches_total: int
    tasks_sent: int
    batches_resumed: int
    receivers: int
    elapsed_seconds: float

    @property
    def job_ids(self) -> tuple[str, ...]:
        """Every job this publishing fed: the job, then its inactive job if any."""
        return (self.job_id,) if self.inactive_job_id is None else (self.job_id, self.inactive_job_id)


class PublishRun:
    """One publishing of a job to Celery, as the core's run loop (:func:`~router.core.fanout.runs.run_loop`) sees it.

    What a batch's tasks are (:func:`plan_parts`), what is opened, announced and recorded in
    the checkpoints, and how the publishing ends are here; the publisher only sends. It
    never stops early but for an error, which it records as ``failed`` and raises again.
    """

    def __init__(self, jobs: Sequence[FanOutJob], *, active: Callable[[Any], bool] | None, timeout: float,
                 pseudonyms: Pseudonyms | None = None, policy: RetryPolicy = RetryPolicy()) -> None:
        self.jobs = list(jobs)
        self.active = active
        self.timeout = timeout
        #: What the start reads erasure records with (the router's), and the retries of its registry insert.
        self.pseudonyms = pseudonyms
        self.policy = policy
        self.started = time.monotonic()
        self.stopping = False
        self.raised: BaseException | None = None
        self.done: set[int] = set()
        self.side_done: set[int] = set()
        self.total = self.sent = self.resumed = self.read = 0

    @property
    def split(self) -> bool:
        """Whether inactive receivers go to a job of their own."""
        return len(self.jobs) > 1

    def open(self) -> Program[None]:
        """Open the checkpoints (refusing a deleted post, :class:`~router.errors.ItemDeleted`, and an erased sender's,
        :class:`~router.errors.SenderErased`), learn what is done."""
        self.done, _ = yield from start_job(self.jobs[0], timeout=self.timeout, pseudonyms=self.pseudonyms,
                                            policy=self.policy)
        if self.split:
            self.side_done = yield from open_checkpoint(self.jobs[1], timeout=self.timeout)

    def admit(self, number: int, first: int, chunk: list[Any]) -> Any:
        """The parts of stream batch *number* to send as ``(number, first, parts)``, or :data:`SKIP` when every part is
        recorded done."""
        self.total, self.read = number + 1, self.read + len(chunk)
        parts = plan_parts(sendable(chunk, first), active=self.active, done=number in self.done,
                           inactive_done=(number in self.side_done) if self.split else None)
        self.resumed += len(self.jobs) - len(parts)
        return (number, first, parts) if parts else SKIP

    def announce(self, number: int, parts: Sequence[Part]) -> Program[list[Part]]:
        """Record batch *number* of each part's job as sent, before it is (workers admit only those); return the parts
        to send: those whose batch a worker did not finish since :meth:`open` read the checkpoints (a task still queued
        from an earlier publishing), which count as resumed."""
        done = yield from announce_batch([self._job(p) for p in parts], number, timeout=self.timeout)
        send = [p for p in parts if self._job(p) not in done]
        self.resumed += len(parts) - len(send)
        return send

    def _job(self, part: Part) -> FanOutJob:
        return self.jobs[1] if part.inactive else self.jobs[0]

    def exhausted(self) -> None:
        """Every receiver was read."""

    def stop(self, trouble: BaseException, *, raised: bool) -> None:
        """An error stopped the publishing (the receivers, *active*, the broker, the interrupted caller)."""
        self.raised = self.raised or trouble
        self.stopping = True

    def finish(self) -> Program[Published]:
        """Record how the publishing ended in each checkpoint: ``published`` with the batch count, or ``failed`` with
        the error, which is then raised again."""
        job = self.jobs[0]
        if self.raised is not None:
            text = f"{type(self.raised).__name__}: {self.raised}"
            for j in self.jobs:
                yield from finish_checkpoint(j, status="failed", total=None, error=text[:1000], timeout=self.timeout)
            log.error("fan-out %r: publishing stopped after %d batches (%d tasks sent): %s", job.job_id, self.total,
                      self.sent, text, extra=job.log_extra)
            raise self.raised
        for j in self.jobs:
            error = yield from finish_checkpoint(j, status="published", total=self.total, error=None, timeout=self.timeout)
            if error is not None:  # the tasks are out; only the status lacks its total until published again
                log.warning("fan-out %r: %d batches published, but the total was not recorded: %s", j.job_id, self.total,
                            error, extra=j.log_extra)
        published = Published(job_id=job.job_id, cluster=job.cluster,
                              inactive_job_id=self.jobs[1].job_id if self.split else None, batches_total=self.total,
                              tasks_sent=self.sent, batches_resumed=self.resumed, receivers=self.read,
                              elapsed_seconds=time.monotonic() - self.started)
        log.info("fan-out %r: published %d tasks for %d receivers in %.1f s (%d batches done earlier)", job.job_id,
                 self.sent, self.read, published.elapsed_seconds, self.resumed, extra=job.log_extra)
        return published
