"""Fan-out arithmetic without a server: batches, the checkpoint's done field, job status, job JSON."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from router import Activity, FanOutConflict, InvalidItem, data_key
from router.core.checkpoint import check_checkpoint, done_batches, job_status
from router.core.fanout import FanOutJob, batches

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
    from router.core.writes import insert_program
    from router.storage.requests import insert_outcome

    details = {"writeErrors": [{"index": 1, "code": 11000, "errmsg": "dup"}], "writeConcernErrors": [], "nInserted": 0}
    outcome = insert_outcome(BulkWriteError(details))
    program = insert_program("c", "feed", [{"_id": i} for i in range(3)], policy=RetryPolicy(), deadline=1e12,
                             duplicates="present")
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
    from router.core.checkpoint import MAX_MISSING_LISTED

    got = job_status("c2", {"_id": "j", "status": "published", "batches_total": MAX_MISSING_LISTED + 500}, _records([0]))
    assert got.batches_missing == MAX_MISSING_LISTED + 499
    assert len(got.missing_batches) == MAX_MISSING_LISTED and got.missing_batches[0] == 1
