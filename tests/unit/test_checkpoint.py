"""Fan-out arithmetic without a server: batches, the checkpoint's done field, job status, job JSON."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from router import Activity, FanOutConflict, InvalidItem, data_key
from router.core.fanout.checkpoint import check_checkpoint, done_batches, job_status
from router.core.fanout.plan import FanOutJob, batches

UTC = timezone.utc
WHEN = datetime(2024, 5, 4, 12, 30, 15, 250000, tzinfo=UTC)
ACT = Activity(sender_id=7, event_time=WHEN, type=1, data={"fabula_id": 3}, data_key=data_key("fabula", 3))
JOB = FanOutJob(job_id="j", cluster="c2", activity=ACT, batch_size=1000)


@given(st.integers(min_value=0, max_value=2000), st.integers(min_value=1, max_value=300))
def test_batches_cover_the_stream_once_in_order(n: int, size: int) -> None:
    """Consecutive batches of *size*: numbered from 0, positions add up, every receiver once, lazily."""
    read = []

    def stream():  # type: ignore[no-untyped-def]
        for i in range(n):
            read.append(i)
            yield i

    seen = []
    for number, first, chunk in batches(stream(), size):
        assert first == number * size and len(chunk) == min(size, n - first) and chunk
        assert len(read) <= first + size  # never read ahead of the batch it yields
        seen.extend(chunk)
    assert seen == list(range(n))


def test_done_batches_count_done_records_only() -> None:
    """Only records in state done count; failed ones are listed apart."""
    records = [{"n": 0, "state": "done"}, {"n": 1, "state": "failed"}, {"n": 2, "state": "done"}, {"n": "x", "state": "done"}]
    assert done_batches(records) == {0, 2}


def test_checkpoint_of_another_job_is_a_conflict() -> None:
    """Another data_key, event_time or batch size under the same job id: FanOutConflict naming it."""
    good = {"data_key": ACT.data_key, "event_time": WHEN.replace(microsecond=250000), "batch_size": 1000}
    check_checkpoint(JOB, good)
    for change, message in [({"data_key": "x"}, "data_key"), ({"event_time": datetime(2020, 1, 1, tzinfo=UTC)}, "event_time"),
                            ({"batch_size": 500}, "batches of 500")]:
        with pytest.raises(FanOutConflict, match=message):
            check_checkpoint(JOB, {**good, **change})


def _records(done: list[int], failed: list[int] = ()) -> list[dict[str, object]]:  # type: ignore[assignment]
    return [{"n": n, "state": "done", "written": 5} for n in done] + [{"n": n, "state": "failed"} for n in failed]


@pytest.mark.parametrize(
    "status, done, failed, total, state",
    [
        ("running", [0, 1], [], None, "running"),
        ("published", [0, 1], [], 2, "done"),
        ("published", [0], [1], 2, "failed"),
        ("published", [0], [], 2, "running"),
        ("cancelled", [0], [], None, "cancelled"),
        ("failed", [], [0], None, "failed"),
    ],
)
def test_job_status_from_the_checkpoint(status: str, done: list[int], failed: list[int], total: int | None, state: str) -> None:
    """The state is derived from the batch records and the total, so any process reads the same answer."""
    got = job_status("c2", {"_id": "j", "status": status, "batches_total": total}, _records(done, failed))
    assert got.state == state and got.cluster == "c2" and got.written == 5 * len(done)
    assert got.failed_batches == tuple(failed) and got.batches_done == len(done)
    json.dumps(got.to_json())


def test_job_travels_as_json() -> None:
    """A job description survives JSON (what Celery's serializer sends), millisecond time included."""
    again = FanOutJob.from_json(json.loads(json.dumps(JOB.to_json())))
    assert again == JOB and again.seconds == int(WHEN.timestamp())
    with pytest.raises(InvalidItem, match="job: is not a fan-out job description"):
        FanOutJob.from_json({"job_id": "j"})
    with pytest.raises(InvalidItem, match="data_key"):
        FanOutJob.from_json({**JOB.to_json(), "activity": {**JOB.to_json()["activity"], "data_key": ""}})


def test_insert_counts_come_from_write_errors_only() -> None:
    """An unordered insert's outcome is read from writeErrors; nInserted is ignored (mongo-java-server gets it wrong)."""
    from pymongo.errors import BulkWriteError

    from router.core.policy import RetryPolicy
    from router.core.steps import Insert
    from router.core.writes.insert import insert_program
    from router.storage.requests import insert_outcome

    details = {"writeErrors": [{"index": 1, "code": 11000, "errmsg": "dup"}], "writeConcernErrors": [], "nInserted": 0}
    outcome = insert_outcome(BulkWriteError(details))
    from datetime import datetime, timezone

    from bson import ObjectId

    from router.core.layouts import LAYOUTS, Copy, CopyList

    t = datetime(2024, 7, 2, tzinfo=timezone.utc)
    copies = CopyList([Copy(ObjectId(), r, 1, t, 1, {}, "k") for r in range(3)])
    program = insert_program("c", LAYOUTS["copies"], copies, policy=RetryPolicy(), deadline=1e12, duplicates="present")
    request = next(program)
    assert isinstance(request, Insert) and len(request.documents) == 3
    try:
        program.send(outcome)
    except StopIteration as stop:
        result = stop.value
    assert (result.written, result.present, result.failed) == (2, (1,), {})


def test_job_status_names_missing_batches_once_the_total_is_known() -> None:
    """Batches with no record at all are counted (and listed) once publishing recorded the total; before, unknown."""
    running = job_status("c2", {"_id": "j", "status": "running", "batches_total": None}, _records([0]))
    assert (running.batches_missing, running.missing_batches, running.recorded) == (None, (), "running")
    published = job_status("c2", {"_id": "j", "status": "published", "batches_total": 6}, _records([0, 2], [3]))
    assert (published.state, published.recorded, published.batches_done) == ("failed", "published", 2)
    assert (published.batches_missing, published.missing_batches, published.failed_batches) == (3, (1, 4, 5), (3,))
    lost = job_status("c2", {"_id": "j", "status": "published", "batches_total": 3}, _records([1]))
    assert (lost.state, lost.batches_missing, lost.missing_batches) == ("running", 2, (0, 2))
    done = job_status("c2", {"_id": "j", "status": "published", "batches_total": 2}, _records([0, 1]))
    assert (done.state, done.batches_missing, done.missing_batches) == ("done", 0, ())
    assert json.loads(json.dumps(lost.to_json()))["missing_batches"] == [0, 2]


def test_missing_batches_listed_up_to_a_bound() -> None:
    """A huge job lists at most MAX_MISSING_LISTED missing numbers; the count is exact."""
    from router.core.fanout.checkpoint import MAX_MISSING_LISTED

    got = job_status("c2", {"_id": "j", "status": "published", "batches_total": MAX_MISSING_LISTED + 500}, _records([0]))
    assert got.batches_missing == MAX_MISSING_LISTED + 499
    assert len(got.missing_batches) == MAX_MISSING_LISTED and got.missing_batches[0] == 1


# -- batches a job cannot have, and what the status counts ------------------------------------


@pytest.mark.parametrize(
    "number, first, receivers, total, field, says",
    [
        (-1, -1000, 1000, None, "number", "must be an int of at least 0 (got -1)"),
        ("3", 3000, 1000, None, "number", "must be an int of at least 0 (got '3')"),
        (3.0, 3000, 1000, None, "number", "must be an int"),
        (True, 1000, 1000, None, "number", "must be an int"),
        (5, 5000, 1000, 5, "number", "must be below the job's 5 batches (got 5)"),
        (1_000_000, 1_000_000_000, 1000, 5, "number", "must be below the job's 5 batches (got 1000000)"),
        (2**64, 2**64 * 1000, 1000, None, "number", f"must be below {2**40 // 1000 + 1} "),
        (2**40 // 1000 + 1, (2**40 // 1000 + 1) * 1000, 1, None, "number", "must be below"),
        (3, 0, 1000, None, "first", "must be 3000, the stream position of the batch's first receiver (got 0)"),
        (3, "3000", 1000, None, "first", "must be 3000"),
        (0, 0, 1001, None, "receivers", "must be at most the job's batch_size of 1000 (got 1001)"),
    ],
)
def test_check_batch_refuses_what_the_job_cannot_have(
    number: object, first: object, receivers: int, total: int | None, field: str, says: str
) -> None:
    """Out-of-range, non-int or absurd numbers, wrong positions, oversized batches: InvalidBatch naming job and batch."""
    from router import InvalidBatch
    from router.core.fanout.checkpoint import check_batch

    with pytest.raises(InvalidBatch) as caught:
        check_batch(JOB, number, first, receivers, total=total)
    error = caught.value
    assert (error.job_id, error.number, error.field) == ("j", number, field)
    assert str(error).startswith(f"fan-out 'j': batch {number!r:.40} refused, nothing written: {field}: ")
    assert says in str(error)
    assert isinstance(error, InvalidItem)


@given(st.integers(min_value=0, max_value=3000), st.integers(min_value=1, max_value=300), st.booleans())
def test_check_batch_accepts_every_batch_the_stream_makes(n: int, size: int, known: bool) -> None:
    """Every batch ``batches`` cuts passes, whether the total is known yet or not; the next number is refused once it is."""
    from router import InvalidBatch
    from router.core.fanout.checkpoint import check_batch

    job = FanOutJob(job_id="j", cluster="c2", activity=ACT, batch_size=size)
    cut = list(batches(range(n), size))
    total = len(cut) if known else None
    for number, first, chunk in cut:
        check_batch(job, number, first, len(chunk), total=total)
    check_batch(job, len(cut), len(cut) * size, 0)  # the total not known yet: a later batch may come
    with pytest.raises(InvalidBatch, match=f"must be below the job's {len(cut)} batches"):
        check_batch(job, len(cut), len(cut) * size, 1, total=len(cut))


def _admit(doc: object, number: object = 3, first: object = 3000, *, sent: bool = True) -> object:
    """Run admit_batch against scripted reads: *doc* is the job document (None for none, or a Failure), *sent*
    whether the publisher's record of the batch is found."""
    from router.core.fanout.checkpoint import admit_batch
    from router.core.steps import Concurrently, Find

    program = admit_batch(JOB, number, first, 1000, deadline=1e12)
    request = next(program)
    assert isinstance(request, Concurrently)
    finds = [next(p) for p in request.programs]
    assert all(isinstance(f, Find) for f in finds)
    assert [(f.collection, f.filter) for f in finds] == [("fanouts", {"_id": "j"}), ("fanout_sent", {"_id": f"j#{number}"})]
    try:
        program.send([doc if not isinstance(doc, dict) else [doc], [{"_id": f"j#{number}"}] if sent else []])
    except StopIteration as stop:
        return stop.value
    raise AssertionError("admit_batch asked for more than the job document and the batch's record")


def test_admit_batch_checks_the_stored_job() -> None:
    """A task's batch is checked against the job as stored: its total once known, its activity, that it exists, and
    that its publisher recorded sending it (whether the total is known or not)."""
    from router import ClusterUnavailable, InvalidBatch
    from router.core.fanout.checkpoint import admit_batch
    from router.core.steps import Failure

    stored = {"_id": "j", "data_key": ACT.data_key, "event_time": WHEN, "batch_size": 1000, "batches_total": None}
    assert _admit(stored) is None  # sent by the publisher, the total unknown yet
    assert _admit({**stored, "batches_total": 5}, 4, 4000) is None
    for total in (None, 5):
        with pytest.raises(InvalidBatch, match=r"batch 3 refused, nothing written: number: was never sent by the job's "
                                               r"publisher \(no record of it in cluster 'c2''s fanout_sent\)"):
            _admit({**stored, "batches_total": total}, sent=False)
    with pytest.raises(InvalidBatch, match=r"batch 5 refused, nothing written: number: must be below the job's 5 batches"):
        _admit({**stored, "batches_total": 5}, 5, 5000)
    with pytest.raises(InvalidBatch, match=r"job: has no checkpoint in cluster 'c2': it was never published"):
        _admit([], sent=False)
    with pytest.raises(FanOutConflict, match="batches of 500"):
        _admit({**stored, "batch_size": 500})
    with pytest.raises(ClusterUnavailable):
        _admit(Failure("unavailable", ClusterUnavailable("c2", "down")))
    with pytest.raises(InvalidBatch, match="number: must be an int of at least 0"):  # refused before any read
        next(admit_batch(JOB, -1, -1000, 1000, deadline=1e12))


def test_announce_batch_records_each_part_once() -> None:
    """The publisher's record: one insert of one document per job sent; a duplicate (published again) is fine, any
    other refusal or a failed send raises before the task would be sent."""
    import attrs

    from router import ClusterUnavailable, RequestRefused
    from router.core.fanout.checkpoint import announce_batch
    from router.core.steps import Failure, Insert, InsertOutcome, WriteError

    side = attrs.evolve(JOB, job_id="j/inactive")

    def run(outcome: InsertOutcome) -> Insert:
        program = announce_batch([JOB, side], 7, timeout=5)
        request = next(program)
        assert isinstance(request, Insert)
        with pytest.raises(StopIteration) as stop:
            program.send(outcome)
        assert stop.value.value == []  # nothing done: send every part
        return request

    request = run(InsertOutcome())
    assert (request.cluster, request.collection) == ("c2", "fanout_sent")
    assert [(d["_id"], d["job"], d["n"]) for d in request.documents] == [("j#7", "j", 7), ("j/inactive#7", "j/inactive", 7)]
    with pytest.raises(RequestRefused, match="recording batch 7 as sent: refused"):
        run(InsertOutcome(write_errors=(WriteError(1, 121, "validation"),)))
    with pytest.raises(ClusterUnavailable, match="down"):
        run(InsertOutcome(failure=Failure("unavailable", ClusterUnavailable("c2", "down"))))
    assert list(announce_batch([], 7, timeout=5)) == []


def test_announce_batch_tells_which_parts_sent_before_are_done_by_now() -> None:
    """A job published again: parts recorded sent before (duplicates) are looked up in one find, and those a worker
    finished since are not to be sent; a part sent for the first time costs no find."""
    import attrs

    from router import ClusterUnavailable
    from router.core.fanout.checkpoint import announce_batch
    from router.core.steps import Failure, Find, InsertOutcome, WriteError

    side = attrs.evolve(JOB, job_id="j/inactive")
    program = announce_batch([JOB, side], 7, timeout=5)
    next(program)
    find = program.send(InsertOutcome(write_errors=(WriteError(1, 11000, "duplicate key"),)))  # only side's was there
    assert isinstance(find, Find) and (find.cluster, find.collection) == ("c2", "fanout_batches")
    assert find.filter == {"_id": {"$in": ["j/inactive#7"]}, "state": "done"}
    with pytest.raises(StopIteration) as stop:
        program.send([{"_id": "j/inactive#7", "job": "j/inactive"}])
    assert stop.value.value == [side]
    program = announce_batch([JOB], 7, timeout=5)
    next(program)
    next_request = program.send(InsertOutcome(write_errors=(WriteError(0, 11000, "duplicate key"),)))
    assert isinstance(next_request, Find)
    with pytest.raises(StopIteration) as stop:
        program.send([])  # sent before, not done yet (still queued, running, or lost): send it
    assert stop.value.value == []
    program = announce_batch([JOB], 7, timeout=5)
    next(program)
    program.send(InsertOutcome(write_errors=(WriteError(0, 11000, "duplicate key"),)))
    with pytest.raises(ClusterUnavailable, match="down"):
        program.send(Failure("unavailable", ClusterUnavailable("c2", "down")))


def test_job_status_counts_only_the_jobs_batches() -> None:
    """Records outside 0..total-1 are ignored: no 'done' with a batch missing, no '6 of 5 batches done'."""
    doc = {"_id": "j", "status": "published", "batches_total": 5}
    extra = _records([0, 1, 2, 3, 4, 1_000_000, 5, -1]) + [{"n": 2**64, "state": "done", "written": 5}]
    got = job_status("c2", doc, extra)
    assert (got.state, got.batches_done, got.batches_total, got.written, got.batches_ignored) == ("done", 5, 5, 25, 4)
    # batch 0 lost, a stray batch 7 recorded: not done, batch 0 missing, one batch done of two
    lost = job_status("c2", {**doc, "batches_total": 2}, _records([1, 7], [9]))
    assert (lost.state, lost.batches_done, lost.batches_missing, lost.missing_batches) == ("running", 1, 1, (0,))
    assert (lost.written, lost.failed_batches, lost.batches_ignored) == (5, (), 2)
    running = job_status("c2", {**doc, "status": "running", "batches_total": None}, _records([0, 3], [-2]))
    assert (running.state, running.batches_done, running.failed_batches, running.batches_ignored) == ("running", 2, (), 1)
    assert json.loads(json.dumps(lost.to_json()))["batches_ignored"] == 2
