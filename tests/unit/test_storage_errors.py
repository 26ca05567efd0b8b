"""Driver errors, classified."""

from __future__ import annotations

from pymongo.errors import (
    AutoReconnect,
    ExecutionTimeout,
    NetworkTimeout,
    ServerSelectionTimeoutError,
    WTimeoutError,
    _OperationCancelled,
)

from router.storage.errors import classify


def test_a_timeout_is_a_timeout_however_pymongo_shows_it() -> None:
    """The socket timeout, the server's time limit, a write concern's wtimeout and a request pymongo cancelled because
    its monitor timed out on the cluster are all timeouts, never retried; a dropped connection stays transient."""
    timeouts = [
        NetworkTimeout("timed out"),
        ExecutionTimeout("operation exceeded time limit", 50),
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
