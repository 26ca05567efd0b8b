"""Driver errors, classified."""

from __future__ import annotations

from bson.errors import InvalidDocument
from pymongo.errors import (
    AutoReconnect,
    ExecutionTimeout,
    NetworkTimeout,
    OperationFailure,
    ServerSelectionTimeoutError,
    WriteError,
    WTimeoutError,
    _OperationCancelled,
)

from router.errors import ClusterError, ClusterUnavailable, RequestRefused
from router.storage.errors import classify


def test_a_timeout_is_a_timeout_however_pymongo_shows_it() -> None:
    """The socket timeout, the deadline, a write concern's wtimeout and a request pymongo cancelled because
    its monitor timed out on the cluster are all timeouts, never retried; a dropped connection stays transient."""
    timeouts = [
        NetworkTimeout("timed out"),
        WTimeoutError("waiting for replication timed out", 64),
        _OperationCancelled("operation cancelled"),
    ]
    for exc in timeouts:
        failure = classify("cluster_1", exc, doing="writing feed")
        assert (failure.kind, failure.retryable) == ("timeout", False), exc
        assert failure.error.cluster == "cluster_1" and failure.error.__cause__ is exc
    cancelled = classify("cluster_1", timeouts[-1], doing="writing feed").error
    assert "writing feed timed out: the cluster stopped answering" in str(cancelled)
    assert classify("cluster_1", AutoReconnect("connection closed"), doing="writing feed").retryable
    assert classify("cluster_1", ServerSelectionTimeoutError("no servers"), doing="writing feed").kind == "unavailable"


def test_a_request_the_server_stopped_at_its_time_limit_is_cancelled() -> None:
    """MongoDB's MaxTimeMSExpired (50), and FerretDB 2's cancelled statement (PostgreSQL's query_canceled, SQLSTATE
    57014, as code 67371461): ``cancelled`` (the server answered, and works on it no more), not retried, not the
    cluster down; an edit step that met it is split rather than reported refused."""
    ferretdb2 = WriteError("canceling statement due to statement timeout", 67371461,
                           {"index": 0, "code": 67371461, "errmsg": "canceling statement due to statement timeout"})
    for exc in (ExecutionTimeout("operation exceeded time limit", 50), ferretdb2):
        failure = classify("cluster_2", exc, doing="updating feed")
        assert (failure.kind, failure.retryable, failure.cluster_down) == ("cancelled", False, False), exc
    assert classify("cluster_2", WriteError("E11000 duplicate key", 11000), doing="updating feed").kind == "refused"


def test_a_refusal_is_never_a_cluster_unavailable() -> None:
    """A server that answered with an error (a reply too large for it, a statement too large, an operator it does not
    know, a write it rejects) raises RequestRefused with the server's code; only a cluster that gave no answer is
    ClusterUnavailable. Both are ClusterErrors naming the cluster."""
    refusals = [
        OperationFailure("BsonObjectTooLarge", 10334),
        OperationFailure("too many SQL variables", 1),
        OperationFailure("unknown group operator '$topN'", 15952),
        WriteError("E11000 duplicate key", 11000),
        InvalidDocument("cannot encode object"),
    ]
    for exc in refusals:
        failure = classify("cluster_3", exc, doing="counting feed")
        assert failure.kind in ("refused", "too_large", "unsupported") and not failure.cluster_down, exc
        assert isinstance(failure.error, RequestRefused) and not isinstance(failure.error, ClusterUnavailable), exc
        assert isinstance(failure.error, ClusterError) and failure.error.cluster == "cluster_3"
        assert failure.error.__cause__ is exc and "counting feed: the server refused the request" in str(failure.error)
    assert classify("cluster_3", refusals[0], doing="counting feed").error.code == 10334  # type: ignore[attr-defined]
    for exc in (ServerSelectionTimeoutError("no servers"), AutoReconnect("closed"), NetworkTimeout("timed out"),
                ExecutionTimeout("time limit", 50)):
        error = classify("cluster_3", exc, doing="counting feed").error
        assert isinstance(error, ClusterUnavailable) and not isinstance(error, RequestRefused), exc
