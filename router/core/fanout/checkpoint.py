"""A fan-out job's checkpoint, in the owning cluster: a job document, and one record per batch written.

::

    fanouts:         {_id: job_id, data_key, event_time, batch_size, status, batches_total,
                      runs, error, created_at, updated_at}
    fanout_batches:  {_id: "job_id#n", job: job_id, n, state: "done"|"failed",
                      written, already_present, skipped, error, at}
    fanout_sent:     {_id: "job_id#n", job: job_id, n, at}      (Celery: each batch a publisher sent)

A batch is recorded by *inserting* its document: an insert is atomic on every server,
where concurrent updates of one job document are not (FerretDB loses some of them). A
batch recorded twice (two workers, a redelivered task) is one document, counted once; a
failed record is turned into a done one by the run that writes the batch later, and a
done record is never changed. Any process reads a job's progress from these documents
(:func:`job_status`), not from the engine that ran it.

**Which batches a job can have.** Batch *n* holds the receivers from stream position
``n * batch_size``, at most ``batch_size`` of them; ``batches_total`` is known once a run
or a publisher has read every receiver (a new run or publishing sets it back to unknown
until it has). :func:`check_batch` refuses any other batch before it is written, a
Celery task sent by hand included (:func:`admit_batch` also checks it against the
stored job); :func:`job_status` counts only batches ``0 .. batches_total - 1``.

**Which batches a worker admits.** A batch that arrives as a task is written only if the
job's publisher sent it: the publisher inserts the batch's ``fanout_sent`` document
(:func:`announce_batch`) before it sends the task, and :func:`admit_batch` finds it. While
the job's total is still unknown, a number alone proves nothing (batch 1,000,000 of a job
that will end with 5 batches looks like any other), and what the stored job says depends on
when a worker takes the task; the record of the sent batch does not. Inserts only, one
document per batch: a job published again, or two publishers at once, insert the same
``_id``, which the server refuses as a duplicate, harmlessly (concurrent updates of one
document, which FerretDB v1 loses, are never relied on).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timezone
from typing import Any, Literal

import attrs

from ...errors import ClusterError, ClusterUnavailable, FanOutConflict, InvalidBatch, ItemDeleted, RequestRefused, RouterError
from ...model import to_millis
from ..layouts import outside_clause, posts
from ..writes import Fence, insert_program, refuse_deleted
from .jobs import BatchOutcome, FanOutJob
from ..policy import DUPLICATE_KEY, RetryPolicy, deadline_in
from ..pseudonyms import Pseudonyms
from ..steps import Collection, Concurrently, Delete, Failure, Find, Insert, InsertOutcome, Program, Update, ask


__all__ = [
    "JobStatus", "MAX_JOB_RECEIVERS", "MAX_MISSING_LISTED", "SENT_COLLECTION", "admit_batch", "announce_batch",
    "check_batch", "check_checkpoint", "done_batches", "drop_checkpoint", "drop_jobs", "find_job", "finish_checkpoint",
    "fenced_status", "jobs_of", "job_status", "open_checkpoint", "outside", "read_batches", "record_batch",
    "start_job",
]

log = logging.getLogger(__name__)
UTC = timezone.utc


def start_job(
    job: FanOutJob, *, timeout: float, pseudonyms: Pseudonyms | None = None, policy: RetryPolicy = RetryPolicy(),
) -> Program[tuple[set[int], Fence]]:
    """Register the post by its sender (:mod:`router.core.layouts.posts`), refuse a deleted post or (with *pseudonyms*)
    an erased sender's, then open the job's checkpoint: the batches done, and the fence to write under.

    The registry entry is written before the fence is read, as every writer's documents
    are (:mod:`router.core.writes.fence`): an erasure that began before the read refuses the job
    here, one that began after it finds the post by its entry. A refused post's entry is
    removed again. Raises :class:`~router.errors.SenderErased`, :class:`ItemDeleted`, or the
    cluster's error.
    """
    a = job.activity
    post = posts.Registered(a.sender_id, a.data_key, a.event_time)
    stored = yield from insert_program(job.cluster, posts.REGISTRY, [post.entry()], policy=policy,
                                       deadline=deadline_in(timeout), duplicates="present")
    if stored.failed:
        raise next(iter(stored.failed.values()))
    try:
        fence = yield from refuse_deleted(job.cluster, a.data_key, timeout=timeout, sender=a.sender_id,
                                          pseudonyms=pseudonyms)
    except ItemDeleted:
        # (left behind if this fails: the post's erasure or a later start removes it)
        yield posts.forget(job.cluster, post, deadline_in(timeout))
        raise
    done = yield from open_checkpoint(job, timeout=timeout)
    return done, fence


def jobs_of(cluster: str, keys: Sequence[str], deadline: float) -> Program[list[Any] | Failure]:
    """The ids of the fan-out jobs of the posts *keys* in *cluster* (by the index ``data_key`` of migration 0006)."""
    docs = yield Find(cluster, "fanouts", {"data_key": {"$in": list(keys)}}, deadline, projection={"_id": 1})
    return docs if isinstance(docs, Failure) else [doc["_id"] for doc in docs]


def drop_jobs(cluster: str, job_ids: Sequence[Any], deadline: float) -> list[tuple[Collection, Delete]]:
    """The requests that remove the checkpoints of *job_ids* (batch records, sent-batch records, then the jobs), each
    with its collection."""
    ids = list(job_ids)
    records: tuple[tuple[Collection, dict[str, Any]], ...] = (
        ("fanout_batches", {"job": {"$in": ids}}), (SENT_COLLECTION, {"job": {"$in": ids}}), ("fanouts", {"_id": {"$in": ids}}))
    return [(c, Delete(cluster, c, match, deadline)) for c, match in records]


def drop_checkpoint(job: FanOutJob, *, timeout: float) -> Program[ClusterError | None]:
    """Remove the job's checkpoint (its document and every batch record): what a run does when it finds its post's
    sender erased, so nothing of the post stays. Returns the error that stopped it, or None."""
    for _collection, request in drop_jobs(job.cluster, [job.job_id], deadline_in(timeout)):
        answer = yield request
        if isinstance(answer, Failure):
            log.warning("fan-out %r: its sender was erased, but its checkpoint could not be removed: %s", job.job_id,
                        answer.error, extra=job.log_extra)
            return answer.error
    return None


def fenced_status(status: JobStatus, fence: Fence) -> JobStatus:
    """*status* as the fence tells it: a job whose post was deleted is ``cancelled`` with reason ``deleted``
    (``erased`` when its sender was), unless every batch was done before."""
    if not fence.deleted:
        return status
    return attrs.evolve(status, state="done" if status.state == "done" else "cancelled",
                        reason="erased" if fence.erased else "deleted")


#: Where a Celery publisher records each batch it sends, before sending it (:func:`announce_batch`).
SENT_COLLECTION: Collection = "fanout_sent"

#: The most receivers one job can have: a sanity bound on batch numbers while its total is not known yet
#: (2**40, over a hundred times the people on Earth; batch numbers and positions stay far inside BSON's int64).
MAX_JOB_RECEIVERS = 2**40


def _batch_id(job_id: str, number: int) -> str:
    return f"{job_id}#{number}"


def check_batch(job: FanOutJob, number: object, first: object, receivers: int, *, total: int | None = None) -> None:
    """Raise :class:`InvalidBatch` unless *job* can have batch *number* starting at *first* with *receivers* receivers.

    Example::

        check_batch(job, 3, 3 * job.batch_size, 1000, total=5)     # fine
        check_batch(job, 7, 7 * job.batch_size, 1000, total=5)     # InvalidBatch: must be below the job's 5 batches

    A number is an int from 0, below *total* once the job's batch count is known and
    below the sanity bound of :data:`MAX_JOB_RECEIVERS` receivers always; *first* is the
    stream position ``number * batch_size``; a batch holds at most ``batch_size``
    receivers (fewer in the last batch, or in a job of inactive receivers).
    """
    size = job.batch_size
    if type(number) is not int or number < 0:
        raise InvalidBatch(job.job_id, number, "number", f"must be an int of at least 0 (got {number!r:.40})")
    if total is not None and number >= total:
        raise InvalidBatch(job.job_id, number, "number", f"must be below the job's {total} batches (got {number})")
    limit = -(-MAX_JOB_RECEIVERS // size)
    if number >= limit:
        raise InvalidBatch(job.job_id, number, "number",
                           f"must be below {limit} ({MAX_JOB_RECEIVERS} receivers at most, in batches of {size}) "
                           f"(got {number})")
    if type(first) is not int or first != number * size:
        raise InvalidBatch(job.job_id, number, "first",
                           f"must be {number * size}, the stream position of the batch's first receiver "
                           f"(got {first!r:.40})")
    if receivers > size:
        raise InvalidBatch(job.job_id, number, "receivers",
                           f"must be at most the job's batch_size of {size} (got {receivers})")


def admit_batch(job: FanOutJob, number: object, first: object, receivers: int, *, deadline: float) -> Program[None]:
    """:func:`check_batch`, then again against the job as stored, and the record that its publisher sent it: for a
    batch that comes from elsewhere (a task).

    Raises :class:`InvalidBatch` for a batch the job cannot have (the job never opened
    included) or that its publisher never sent (:func:`announce_batch`), :class:`FanOutConflict`
    for a checkpoint of another activity or batch size, :class:`ClusterError` if the
    checkpoint cannot be read. Nothing is written.
    """
    check_batch(job, number, first, receivers)
    assert type(number) is int  # (check_batch refuses anything else)
    answers = yield Concurrently([
        ask(Find(job.cluster, "fanouts", {"_id": job.job_id}, deadline, limit=1,
                 projection={"data_key": 1, "event_time": 1, "batch_size": 1, "batches_total": 1})),
        ask(Find(job.cluster, SENT_COLLECTION, {"_id": _batch_id(job.job_id, number)}, deadline, limit=1,
                 projection={"_id": 1})),
    ], [job.cluster, job.cluster])
    for answer in answers:
        if isinstance(answer, Failure):
            raise answer.error
    found, sent = answers
    if not found:
        raise InvalidBatch(job.job_id, number, "job", f"has no checkpoint in cluster {job.cluster!r}: it was never "
                                                      "published, or its checkpoint was removed")
    check_checkpoint(job, found[0])
    check_batch(job, number, first, receivers, total=_total(found[0]))
    if not sent:
        raise InvalidBatch(job.job_id, number, "number",
                           f"was never sent by the job's publisher (no record of it in cluster {job.cluster!r}'s "
                           f"{SENT_COLLECTION}): a task made by hand, or sent by a publisher older than this worker")


def announce_batch(jobs: Sequence[FanOutJob], number: int, *, timeout: float) -> Program[list[FanOutJob]]:
    """Record that batch *number* of each of *jobs* (one cluster's) is sent, before its task is: the record
    :func:`admit_batch` asks for. One insert; a batch recorded before (a job published again) stays as it was.

    Returns the jobs whose batch is done by now, not to be sent: only a batch sent before (by an
    earlier publishing, its task perhaps still queued or running) can be, and only for such a
    batch does it read the batch records (one find), so a first publishing pays nothing for it.
    A worker may still finish a batch between that read and its sending; the batch then comes
    twice, and the second delivery writes nothing.

    Raises the cluster's :class:`ClusterError` when the record cannot be stored or read: send nothing then.
    """
    if not jobs:
        return []
    now = datetime.now(UTC)
    docs = [{"_id": _batch_id(j.job_id, number), "job": j.job_id, "n": number, "at": now} for j in jobs]
    outcome: InsertOutcome = yield Insert(jobs[0].cluster, SENT_COLLECTION, docs, deadline_in(timeout))
    if outcome.failure is not None:
        raise outcome.failure.error
    if outcome.write_concern is not None:
        raise ClusterUnavailable(jobs[0].cluster, f"recording batch {number} as sent: {outcome.write_concern}")
    refused = [e for e in outcome.write_errors if e.code != DUPLICATE_KEY]
    if refused:
        raise RequestRefused(jobs[0].cluster, f"recording batch {number} as sent: refused (code {refused[0].code}): "
                                              f"{refused[0].message}", code=refused[0].code)
    before = [jobs[e.index].job_id for e in outcome.write_errors]  # sent by an earlier publishing
    if not before:
        return []
    found = yield Find(jobs[0].cluster, "fanout_batches",
                       {"_id": {"$in": [_batch_id(j, number) for j in before]}, "state": "done"}, deadline_in(timeout),
                       projection={"job": 1})
    if isinstance(found, Failure):
        raise found.error
    done = {d.get("job") for d in found}
    return [j for j in jobs if j.job_id in done]


def _total(doc: Mapping[str, Any]) -> int | None:
    """The job's ``batches_total`` when it is known (every receiver read), else None."""
    total = doc.get("batches_total")
    return total if type(total) is int and total >= 0 else None


def record_batch(job: FanOutJob, outcome: BatchOutcome, timeout: float) -> Program[RouterError | None]:
    """Record batch *outcome* (done or failed) once; a done record is final. Returns an error that stopped it."""
    deadline = deadline_in(timeout)
    now = datetime.now(UTC)
    state = "done" if outcome.complete else "failed"
    fields: dict[str, Any] = {"job": job.job_id, "n": outcome.number, "state": state, "at": now}
    if outcome.complete:
        fields.update(written=outcome.written, already_present=outcome.already_present, skipped=outcome.skipped, error=None)
    else:
        fields["error"] = (str(outcome.errors[0]) if outcome.errors else "failed")[:1000]
    inserted: InsertOutcome = yield Insert(job.cluster, "fanout_batches", [{"_id": _batch_id(job.job_id, outcome.number), **fields}],
                                          deadline)
    error: ClusterError | None = None
    if inserted.failure is not None:
        error = inserted.failure.error
    elif inserted.write_errors and outcome.complete:  # recorded before: turn a failed record into this done one
        answer = yield Update(job.cluster, "fanout_batches",
                              {"_id": _batch_id(job.job_id, outcome.number), "state": "failed"}, {"$set": fields},
                              deadline, one=True)
        if isinstance(answer, Failure):
            error = answer.error
    if error is not None:
        log.warning("fan-out %r: batch %d: saving the checkpoint failed (a resume redoes it, harmlessly): %s",
                    job.job_id, outcome.number, error, extra=job.log_extra)
    return error


def read_batches(cluster: str, job_id: str, *, deadline: float) -> Program[list[dict[str, Any]]]:
    """Every batch record of job *job_id*; raises the cluster's error if they cannot be read."""
    found: list[dict[str, Any]] | Failure = yield Find(
        cluster, "fanout_batches", {"job": job_id}, deadline,
        projection={"n": 1, "state": 1, "written": 1, "already_present": 1, "skipped": 1},
    )
    if isinstance(found, Failure):
        raise found.error
    return found


def find_job(cluster: str, job_id: str, *, deadline: float) -> Program[tuple[JobStatus, str] | Failure | None]:
    """Job *job_id*'s status in *cluster*, from its checkpoint and batch records, with its post's ``data_key``; None
    when *cluster* holds no such job."""
    found = yield Find(cluster, "fanouts", {"_id": job_id}, deadline, limit=1)
    if isinstance(found, Failure) or not found:
        return found if isinstance(found, Failure) else None
    records = yield from read_batches(cluster, job_id, deadline=deadline)
    return job_status(cluster, found[0], records), str(found[0].get("data_key"))


def done_batches(records: Iterable[Mapping[str, Any]]) -> set[int]:
    """The numbers of the batches *records* mark done."""
    return {int(r["n"]) for r in records if r.get("state") == "done" and type(r.get("n")) is int}


def open_checkpoint(job: FanOutJob, *, timeout: float) -> Program[set[int]]:
    """Load (or create) the job's checkpoint and mark it running; return the batch numbers done.

    The job's ``batches_total`` is unknown again until this run has read every receiver
    (they may be more this time), so batches past the old total are not refused meanwhile.

    Raises :class:`FanOutConflict` if the job id's checkpoint belongs to another activity or
    another batch size, :class:`ClusterError` if it cannot be read.
    """
    deadline = deadline_in(timeout)
    found = yield Find(job.cluster, "fanouts", {"_id": job.job_id}, deadline, limit=1)
    if isinstance(found, Failure):
        raise found.error
    now = datetime.now(UTC)
    if not found:
        fresh = {
            "_id": job.job_id, "data_key": job.activity.data_key, "event_time": job.activity.event_time,
            "batch_size": job.batch_size, "status": "running", "batches_total": None, "runs": 1, "error": None,
            "created_at": now, "updated_at": now,
        }
        outcome: InsertOutcome = yield Insert(job.cluster, "fanouts", [fresh], deadline)
        if outcome.failure is not None:
            raise outcome.failure.error
        if not outcome.write_errors:
            return set()
        found = yield Find(job.cluster, "fanouts", {"_id": job.job_id}, deadline, limit=1)  # created meanwhile
        if isinstance(found, Failure):
            raise found.error
        if not found:
            raise FanOutConflict(job.job_id, "its checkpoint was removed while this run opened it")
    check_checkpoint(job, found[0])
    records = yield from read_batches(job.cluster, job.job_id, deadline=deadline)
    answer = yield Update(job.cluster, "fanouts", {"_id": job.job_id},
                          {"$set": {"status": "running", "batches_total": None, "updated_at": now}, "$inc": {"runs": 1}},
                          deadline, one=True)
    if isinstance(answer, Failure):
        raise answer.error
    return done_batches(records)


def check_checkpoint(job: FanOutJob, doc: Mapping[str, Any]) -> None:
    """Raise :class:`FanOutConflict` unless *doc* is this job's checkpoint (same activity, same batch size)."""
    if doc.get("data_key") != job.activity.data_key:
        raise FanOutConflict(job.job_id, f"its checkpoint is for data_key {doc.get('data_key')!r:.80}, not {job.activity.data_key!r:.80}")
    stored = doc.get("event_time")
    if not isinstance(stored, datetime) or to_millis(stored) != to_millis(job.activity.event_time):
        raise FanOutConflict(job.job_id, f"its checkpoint is for event_time {stored!r}, not {job.activity.event_time.isoformat()}")
    if doc.get("batch_size") != job.batch_size:
        raise FanOutConflict(
            job.job_id,
            f"its checkpoint counts batches of {doc.get('batch_size')!r} receivers; resuming with "
            f"batch_size={job.batch_size} would skip the wrong receivers (pass batch_size="
            f"{doc.get('batch_size')!r}, or a new job_id to start over)",
        )


def finish_checkpoint(
    job: FanOutJob, *, status: Literal["done", "failed", "cancelled", "published"], total: int | None, error: str | None,
    timeout: float,
) -> Program[ClusterError | None]:
    """Record how a run (or the publishing of a distributed job) ended; ``total`` once every receiver was read."""
    fields: dict[str, Any] = {"status": status, "error": error, "updated_at": datetime.now(UTC)}
    if total is not None:
        fields["batches_total"] = total
    answer = yield Update(job.cluster, "fanouts", {"_id": job.job_id}, {"$set": fields}, deadline_in(timeout), one=True)
    if isinstance(answer, Failure):
        log.warning("fan-out %r: saving its final state failed: %s", job.job_id, answer.error, extra=job.log_extra)
        return answer.error
    return None


#: The most missing batch numbers a :class:`JobStatus` lists (``batches_missing`` is always the full count).
MAX_MISSING_LISTED = 1000


@attrs.frozen
class JobStatus:
    """A job's progress as its checkpoint tells it, readable from any process.

    ``state`` is ``done`` (every batch written), ``failed`` (some batch failed and the last
    run, or the publisher, has ended), ``cancelled``, or ``running`` (batches still being
    written, or the receivers not all read yet). Counts add up the batches done.

    Once the receivers were all read (``batches_total`` is known), ``batches_missing``
    counts the batches with no record at all (``missing_batches`` lists the first
    :data:`MAX_MISSING_LISTED`): still queued or running, or lost for good when a worker
    gave up on a batch whose cluster was down (its record could not be written either).
    ``recorded`` is what the last run or publisher wrote (``running``, ``published``,
    ``done``, ``failed``, ``cancelled``): with ``published``, every batch was handed to
    the workers, so missing batches that stay missing need the job published again.

    Only batches ``0 .. batches_total - 1`` count (any number from 0 while the total is
    unknown), and ``done`` needs every one of them done. ``batches_ignored`` counts the
    other records: numbers the job cannot have (a task sent by hand before workers
    refused such numbers) or past this run's total (an earlier run read more receivers).

    ``reason`` is ``deleted`` once the post was deleted (:func:`fenced_status`).
    """

    job_id: str
    cluster: str
    state: str
    batches_done: int
    batches_total: int | None
    failed_batches: tuple[int, ...]
    written: int
    already_present: int
    skipped: int
    runs: int
    error: str | None
    updated_at: datetime | None
    batches_missing: int | None = None
    missing_batches: tuple[int, ...] = ()
    recorded: str = "running"
    batches_ignored: int = 0
    reason: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The status as plain JSON values."""
        out = attrs.asdict(self)
        out["failed_batches"] = list(self.failed_batches)
        out["missing_batches"] = list(self.missing_batches)
        out["updated_at"] = self.updated_at.isoformat() if self.updated_at else None
        return out


def job_status(cluster: str, doc: Mapping[str, Any], records: Iterable[Mapping[str, Any]]) -> JobStatus:
    """The :class:`JobStatus` of job document *doc* and its batch *records* (stored in *cluster*)."""
    total = _total(doc)
    records = list(records)
    ours = [r for r in records if type(r.get("n")) is int and 0 <= r["n"] and (total is None or r["n"] < total)]
    done = {r["n"]: r for r in ours if r.get("state") == "done"}  # one record per number: its _id is "job#n"
    failed = tuple(sorted({r["n"] for r in ours if r.get("state") == "failed"} - done.keys()))
    recorded = str(doc.get("status") or "running")
    if total is not None and len(done) == total:  # every number counted is below total: all of 0 .. total-1
        state = "done"
    elif recorded == "cancelled":
        state = "cancelled"
    elif recorded == "failed" or (failed and recorded in ("published", "done")):
        state = "failed"
    else:
        state = "running"
    missing: int | None = None
    listed: list[int] = []
    if total is not None:
        seen = {r["n"] for r in ours}
        absent = [n for n in range(total) if n not in seen]
        missing, listed = len(absent), absent[:MAX_MISSING_LISTED]
    counted = done.values()
    return JobStatus(
        job_id=str(doc.get("_id")), cluster=cluster, state=state, batches_done=len(done), batches_total=total,
        failed_batches=failed, written=sum(int(r.get("written") or 0) for r in counted),
        already_present=sum(int(r.get("already_present") or 0) for r in counted),
        skipped=sum(int(r.get("skipped") or 0) for r in counted), runs=int(doc.get("runs") or 0), error=doc.get("error"),
        updated_at=doc.get("updated_at") if isinstance(doc.get("updated_at"), datetime) else None,
        batches_missing=missing, missing_batches=tuple(listed), recorded=recorded, batches_ignored=len(records) - len(ours),
    )


def outside(start: datetime | None, end: datetime | None) -> tuple[dict[str, Any], str]:
    """The filter of checkpoints whose activity is outside ``[start, end)``, and the field that gives its time
    (a checkpoint lives in the cluster that owns its activity's time, like the copies)."""
    return outside_clause(start, end, earliest="event_time", latest="event_time"), "event_time"
