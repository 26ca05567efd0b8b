"""The insert program, driven by hand: each request answered as a driver would; a write's shares built."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from bson import ObjectId

from router import ClusterMeta, ClusterUnavailable, FeedItem, ItemRefused
from router.core.policy import RetryPolicy, deadline_in
from router.core.periods.routing import Routing
from router.core.steps import Insert, InsertOutcome, WriteError
from router.core.writes.insert import InsertResult, insert_program, prepare_documents
from router.core.layouts import LAYOUTS, Copy, CopyList
from router.timemap import TimeMap

T = datetime(2024, 7, 2, tzinfo=timezone.utc)


def some_copies(n: int) -> CopyList:
    """*n* copies of one post, for receivers 7, 8, ..."""
    return CopyList([Copy(ObjectId(), 7 + i, 1, T, 1, {"p": 1}, "k") for i in range(n)])


def test_documents_that_timed_out_are_failed_not_retried_nor_refused() -> None:
    """MaxTimeMSExpired (50) on some documents: they fail with ClusterUnavailable (repeatable), with no second insert."""
    program = insert_program("cluster_1", LAYOUTS["copies"], some_copies(3), policy=RetryPolicy(),
                             deadline=deadline_in(10), duplicates="present")
    request = next(program)
    assert isinstance(request, Insert) and len(request.documents) == 3
    outcome = InsertOutcome(write_errors=(WriteError(1, 50, "operation exceeded time limit"), WriteError(2, 2, "bad")))
    try:
        program.send(outcome)
    except StopIteration as stop:
        result: InsertResult = stop.value
    else:  # pragma: no cover - a retry or a pause would be a second request
        raise AssertionError("the insert was tried again")
    assert result.written == 1
    assert isinstance(result.failed[1], ClusterUnavailable) and not isinstance(result.failed[1], ItemRefused)
    assert "timed out" in str(result.failed[1])
    assert isinstance(result.failed[2], ItemRefused)


def test_a_buckets_duplicate_is_read_back_and_a_copy_not_found_is_stored_again() -> None:
    """Fan-out copies into buckets: a duplicate may be the receiver's first bucket, started at once by another writer.
    The copies are read back; one found is present, one not found is sent again (no shared first-bucket _id)."""
    from router.core.layouts import FanBatch
    from router.core.layouts.buckets import Buckets, first_bucket
    from router.core.steps import Find, Upserts

    ids = [ObjectId() for _ in range(3)]
    program = insert_program("cluster_3", Buckets(), FanBatch(ids, [7, 8, 9], 1, T, 1, {"p": 1}, "k"),
                             policy=RetryPolicy(), deadline=deadline_in(10), duplicates="present")
    first = next(program)
    assert isinstance(first, Upserts) and first.ops[0][1]["$setOnInsert"] == {"_id": first_bucket(7)}
    lookup = program.send(InsertOutcome(write_errors=(WriteError(0, 11000, "dup"), WriteError(1, 11000, "dup"))))
    assert isinstance(lookup, Find) and lookup.filter == {"items._id": {"$in": ids[:2]}}
    stored = {"_id": ids[1], "data_key": "k", "sender_id": 1, "event_time": T, "type": 1}  # (the read-back's projection)
    again = program.send([{"receiver_id": 8, "items": [stored]}])
    assert isinstance(again, Upserts) and len(again.ops) == 1 and "$setOnInsert" not in again.ops[0][1]
    assert again.ops[0][1]["$push"]["items"]["_id"] == ids[0]
    try:
        program.send(InsertOutcome())
    except StopIteration as stop:
        result: InsertResult = stop.value
    else:  # pragma: no cover
        raise AssertionError("a third send")
    assert (result.written, result.present, result.failed) == (2, (1,), {})


def test_a_write_is_built_per_cluster_in_input_order_whether_its_items_are_in_time_order_or_not() -> None:
    """prepare_documents: each cluster's share holds its items in input order, each document under the id returned
    at its position, and the registry entries of its posts; items in time order (one run per cluster, sliced) and
    interleaved (picked one by one) give the same shares."""
    metas = [ClusterMeta(name="a", start_date=T, end_date=T + timedelta(days=1)),
             ClusterMeta(name="b", start_date=T + timedelta(days=1))]
    routing = Routing(TimeMap(metas), T + timedelta(days=2))
    items = [FeedItem(receiver_id=i, sender_id=i % 2, event_time=T + timedelta(hours=12 * i), type=1, data={"i": i},
                      data_key=f"k{i}") for i in range(4)]
    for order in ([0, 1, 2, 3], [3, 0, 2, 1]):
        written = [items[i] for i in order]
        built = prepare_documents(written, routing)
        assert set(built.documents) == {"a", "b"}
        for name, (indexes, batch) in built.prepared.batches.items():
            assert [written[i] for i in indexes] == list(batch.items) and sorted(indexes) == indexes
            docs = built.documents[name]
            assert [d["_id"] for d in docs] == [built.prepared.ids[i] for i in indexes] == batch.ids
            assert [d["data_key"] for d in docs] == [written[i].data_key for i in indexes]
            assert sorted((e.sender_id, list(e.keys)) for e in built.entries[name]) == sorted(
                (s, [written[i].data_key for i in indexes if written[i].sender_id == s])
                for s in {written[i].sender_id for i in indexes})
        assert [d["data_key"] for d in built.documents["a"]] == [f"k{i}" for i in order if i < 2]
