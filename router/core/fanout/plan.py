"""Fan-out on write, engine-free: plan a job, cut receivers into batches, write one batch, keep the checkpoint.

Any engine drives these: the thread pool of ``FeedRouter.fan_out``, the asyncio tasks of
``AsyncFeedRouter.fan_out``, or Celery workers (:mod:`router.fanout.celery`). Each only
decides *where* a batch runs; what a batch does is here, once.

**Where.** Every copy of one activity has the same ``event_time``, so the whole job goes
to one cluster, chosen by :meth:`~router.core.periods.routing.Routing.locate` (with the horizon
rule) before anything is written.

**Idempotent ids.** A copy's ``_id`` is :func:`router.ids.copy_id` of the event second,
``data_key`` and receiver: writing it again (a rerun, a retry, a task delivered twice)
is a duplicate-key no-op counted ``already_present``. Exactly one copy per receiver.

**Batches.** Receivers are cut into batches of ``batch_size`` consecutive receivers;
batch numbers are positions in the stream, so a resume must read the same receivers in
the same order with the same ``batch_size``. Each written batch is recorded in the job's
checkpoint (:mod:`router.core.fanout.checkpoint`). A batch the job cannot have (a number out of
range, a wrong position, more receivers than ``batch_size``) is refused before anything is
written, in every engine (:func:`~router.core.fanout.checkpoint.check_batch`).


**Edits.** After its insert a batch reads the post's edit fence (:mod:`router.core.writes.fence`):
copies of a post deleted meanwhile are removed again, copies of one updated meanwhile get
the new data, so ``delete`` and ``update`` hold against fan-outs still running.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import timezone
from typing import Any

import attrs

from ...errors import InvalidItem, RouterError
from ...ids import copy_ids
from ...model import Activity, to_millis, to_utc
from ...observe import Event
from .checkpoint import admit_batch, check_batch, drop_checkpoint, record_batch
from ..writes import Fence, InsertResult, NEVER, Parties, check_activity, insert_program, receiver_problem, settle
from .jobs import (
    DEFAULT_CONCURRENCY,
    MAX_BATCH_SIZE,
    MAX_ERRORS,
    MAX_FAILED_RECEIVERS,
    BatchOutcome,
    FanOutJob,
    positive_int,
)
from ..layouts import LAYOUTS, EditSettings, FanBatch, Layout, layout_for
from ..push import PushCopies, cleanups
from ..policy import RetryPolicy, deadline_in
from ..pseudonyms import Pseudonyms
from ..periods import Routing, routed
from ..steps import Failure, Program, Report

__all__ = [
    "BatchOutcome",
    "DEFAULT_CONCURRENCY",
    "FANOUTS_COLLECTION",
    "FanOutJob",
    "MAX_BATCH_SIZE",
    "MAX_ERRORS",
    "MAX_FAILED_RECEIVERS",
    "batch_program",
    "batches",
    "receiver_stream",
    "plan_job",
    "positive_int",
]

log = logging.getLogger(__name__)
UTC = timezone.utc

#: The collection, in the owning cluster's database, that holds one checkpoint per job.
FANOUTS_COLLECTION = "fanouts"

def plan_job(
    activity: Activity, routing: Routing, *, batch_size: int, job_id: str | None = None
) -> Program[FanOutJob]:
    """Check *activity*, choose its cluster (refreshing once past the horizon) and name the job.

    The default job id is ``f"{data_key}:{event_time in UTC ms}"``, so running the same
    activity again resumes it. Raises :class:`InvalidItem`, :class:`NoClusterForTime`,
    :class:`StaleMetadata` before anything is written.
    """
    ts = check_activity(activity)
    size = positive_int("batch_size", batch_size, maximum=MAX_BATCH_SIZE)
    if job_id is None:
        job_id = f"{activity.data_key}:{to_millis(activity.event_time)}"
    elif not isinstance(job_id, str) or not job_id or len(job_id) > 1024:
        raise InvalidItem("job_id", f"must be a non-empty str of at most 1024 characters (got {job_id!r:.80})")
    def owner(r: Routing) -> tuple[str, str]:
        name = r.locate(ts)[0]
        return name, layout_for(r.timemap, name).name

    cluster, layout = yield from routed(owner, routing, where=lambda _past: (activity.event_time, "event_time"))
    event_time = to_utc(activity.event_time)
    return FanOutJob(job_id=job_id, cluster=cluster, activity=attrs.evolve(activity, event_time=event_time),
                     batch_size=size, layout=layout)


def receiver_stream(receivers: object) -> Iterator[Any]:
    """``iter(receivers)``, or :class:`InvalidItem` when *receivers* is not iterable."""
    try:
        return iter(receivers)  # type: ignore[call-overload, no-any-return]
    except TypeError:
        raise InvalidItem("receivers", f"must be an iterable of receiver ids (got {type(receivers).__name__})") from None


def batches(receivers: Iterable[Any], size: int) -> Iterator[tuple[int, int, list[Any]]]:
    """``(number, position of its first receiver, receivers)`` for consecutive batches of *size*, read lazily."""
    stream = iter(receivers)
    number = position = 0
    while True:
        chunk = []
        for receiver in stream:
            chunk.append(receiver)
            if len(chunk) == size:
                break
        if not chunk:
            return
        yield number, position, chunk
        number += 1
        position += len(chunk)


def batch_program(
    job: FanOutJob,
    number: int,
    first: int,
    receivers: Sequence[Any],
    *,
    policy: RetryPolicy,
    timeout: float,
    active: Callable[[Any], bool] | None = None,
    data: Any = None,
    record: bool = True,
    admit: bool = False,
    known: Fence = NEVER,
    pseudonyms: Pseudonyms | None = None,
) -> Program[BatchOutcome]:
    """Write batch *number* (receivers from stream position *first*), settle it with the edit fence and record it
    in the checkpoint.

    Receivers that are not valid ids fail alone, named with their stream position; ones
    *active* rejects are skipped. *data* is the activity's data encoded once per job
    (shared by every copy). *known* is the newest fence the engine has seen: a deleted
    post's batch writes nothing, an updated one's writes the new data. After the insert
    the fence is read (:func:`~router.core.writes.fence.settle`): copies of a post deleted
    meanwhile are removed again and the batch is not recorded. With *pseudonyms* (every
    engine passes the router's) the erasure records are read at the same time: copies of a
    post whose sender was erased are removed again (the fence says :data:`~router.core.writes.fence.ERASED`)
    and so is the job's checkpoint (when *record*), and the copies of erased receivers are
    removed again, counted ``skipped``. So no engine handles an erasure itself: a run stops
    at such a batch (:meth:`~router.core.fanout.tally.RunState.add`, read by the run loop). The
    batch gets ``timeout`` seconds, retries included.

    A batch the job cannot have raises :class:`~router.errors.InvalidBatch` before
    anything is written. With *admit* (a batch that comes from elsewhere, e.g. a Celery
    task), the job's stored checkpoint is read first and the batch checked against it
    (:func:`~router.core.fanout.checkpoint.admit_batch`).
    """
    if admit:
        yield from admit_batch(job, number, first, len(receivers), deadline=deadline_in(timeout))
    else:
        check_batch(job, number, first, len(receivers))
    if known.deleted:
        gone = BatchOutcome(number=number, receivers=len(receivers), written=0, already_present=0, skipped=0,
                            failed_receivers=(), invalid=0, errors=(), fence=known)
        return (yield from _forget_job(job, gone, timeout)) if record and known.erased else gone
    valid: list[int | str] = []
    invalid: list[RouterError] = []
    skipped = 0
    for position, receiver in enumerate(receivers, first):
        problem = receiver_problem(receiver)
        if problem is not None:
            invalid.append(InvalidItem(f"receivers[{position}]", problem))
        elif active is not None and not active(receiver):
            skipped += 1
        else:
            valid.append(receiver)
    a = job.activity
    ids = copy_ids(job.seconds, a.data_key, valid)
    shared = known.data if known.updated else a.data if data is None else data
    copies = FanBatch(ids, valid, a.sender_id, a.event_time, a.type, shared, a.data_key)
    layout = LAYOUTS[job.layout]
    written = already = 0
    failed: list[int | str] = []
    errors: list[RouterError] = list(invalid)
    stopped: Failure | None = None
    fence: Fence | None = None
    if valid:
        result = yield from insert_program(
            job.cluster, layout, copies, policy=policy, deadline=deadline_in(timeout), duplicates="present"
        )
        written, already, stopped = result.written, len(result.present), result.stopped
        failed = [valid[p] for p in sorted(result.failed)]
        yield PushCopies(a, valid, ids, shared, skip=result.failed)  # stored: live subscribers (router.core.live)
        reasons: list[RouterError] = list(result.failed.values())
        if stopped is None:  # (a cluster that failed the insert is not asked again in this batch)
            settled = yield from settle(job.cluster, layout.fix, {a.data_key: ids}, seqs={a.data_key: known.seq},
                                        timeout=timeout, parties=Parties({a.data_key: a.sender_id}, {a.data_key: valid},
                                                                         forget=_forget(layout, timeout)),
                                        pseudonyms=pseudonyms)
            if isinstance(settled, Failure):  # the copies are in doubt until the fence is read: not written
                written, already, failed, stopped = 0, 0, list(valid), settled
                reasons.append(settled.error)
            else:
                fence = settled.fences[a.data_key]
                yield from cleanups(settled.fences, {a.data_key: known.seq})  # what the fence undid, live
                if fence.deleted:  # deleted (or its sender erased) meanwhile: settle removed them again
                    written = already = 0
                elif settled.erased:  # erased receivers: their copies were removed again, and they count as skipped
                    written, already, skipped = _without(settled.erased, valid, result, written, already, skipped)
        seen: set[str] = set()
        for error in reasons:
            if str(error) not in seen:
                seen.add(str(error))
                errors.append(error)
    outcome = BatchOutcome(
        number=number, receivers=len(receivers), written=written, already_present=already, skipped=skipped,
        failed_receivers=tuple(failed), invalid=len(invalid), errors=tuple(errors), stopped=stopped, fence=fence,
    )
    for outcome_name, count in (("written", written), ("already_present", already), ("skipped", skipped),
                                ("failed", outcome.failed)):
        if count:
            yield Report(Event("fanout_copies", count, cluster=job.cluster, outcome=outcome_name))
    if invalid:
        log.warning("fan-out %r: batch %d: %d invalid receivers, e.g. %s", job.job_id, number, len(invalid), invalid[0],
                    extra=job.log_extra)
    if record and fence is not None and fence.erased:
        return (yield from _forget_job(job, outcome, timeout))
    if record and not (fence is not None and fence.deleted):
        trouble = yield from record_batch(job, outcome, timeout)
        if trouble is not None:
            outcome = attrs.evolve(outcome, errors=outcome.errors + (trouble,))
    return outcome


def _forget_job(job: FanOutJob, outcome: BatchOutcome, timeout: float) -> Program[BatchOutcome]:
    """A batch that found its post's sender erased removes the job's checkpoint, whichever engine runs it (a run's
    batch, a Celery task): nothing of the post stays. (A run removes it again when it ends, after its last batch.)"""
    trouble = yield from drop_checkpoint(job, timeout=timeout)
    return outcome if trouble is None else attrs.evolve(outcome, errors=outcome.errors + (trouble,))


def _without(erased: frozenset[int | str], valid: Sequence[Any], result: InsertResult, written: int, already: int,
             skipped: int) -> tuple[int, int, int]:
    """The batch's counts once the copies of *erased* receivers were removed again: they count as skipped."""
    present = set(result.present)
    gone = [p for p, receiver in enumerate(valid) if receiver in erased and p not in result.failed]
    again = sum(1 for p in gone if p in present)
    return written - (len(gone) - again), already - again, skipped + len(gone)


def _forget(layout: Layout, timeout: float) -> Callable[[str, int | str], Program[tuple[int, Any]]]:
    """What removes everything of an erased receiver a batch meets, in the layout's steps."""
    return lambda cluster, receiver: layout.remove_received(cluster, receiver, EditSettings(timeout=timeout))
