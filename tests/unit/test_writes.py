"""The insert program, driven by hand: each request answered as a driver would."""

from __future__ import annotations

from typing import Any

from bson import ObjectId

from router import ClusterUnavailable, ItemRefused
from router.core.policy import RetryPolicy, deadline_in
from router.core.steps import Insert, InsertOutcome, WriteError
from router.core.writes import InsertResult, insert_program


def test_documents_that_timed_out_are_failed_not_retried_nor_refused() -> None:
    """MaxTimeMSExpired (50) on some documents: they fail with ClusterUnavailable (repeatable), with no second insert."""
    docs: list[dict[str, Any]] = [{"_id": ObjectId(), "n": i} for i in range(3)]
    program = insert_program("cluster_1", "feed", docs, policy=RetryPolicy(), deadline=deadline_in(10),
                             duplicates="present")
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
