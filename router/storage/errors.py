"""Driver errors, classified: what went wrong with a cluster, in the core's terms, without a password.

:func:`classify` is the only place that looks at pymongo's exception types; everything
above it reads a :class:`~router.core.steps.Failure` (and its ``kind``) instead.
"""

from __future__ import annotations

from collections.abc import Sequence

from pymongo.errors import AutoReconnect, ConnectionFailure, InvalidOperation, OperationFailure, ServerSelectionTimeoutError
from pymongo.errors import _OperationCancelled  # private, but the only sign of a request cancelled on a timeout

from ..core.policy import TRANSIENT_WRITE_CODES
from ..core.steps import Failure, FailureKind
from ..errors import ClusterError, ClusterUnavailable, RequestRefused
from ..uris import redact_uri

__all__ = ["QUERY_CANCELED", "REFUSALS", "STATEMENT_TOO_LARGE", "TIME_LIMIT_CODES", "UNSUPPORTED_CODES", "classify",
           "driver_error"]

#: FerretDB's errors for a statement with more parameters than its backend takes:
#: SQLite (32,766) and PostgreSQL's extended protocol (65,535).
STATEMENT_TOO_LARGE = ("too many SQL variables", "extended protocol limited to 65535 parameters")
#: FerretDB 2's code for a statement PostgreSQL cancelled (SQLSTATE 57014, ``query_canceled``, encoded as PostgreSQL
#: encodes SQLSTATEs): what a write gets when it runs past the request's ``maxTimeMS`` ("canceling statement due to
#: statement timeout"), where MongoDB answers MaxTimeMSExpired (50). Nothing of the statement was done.
QUERY_CANCELED = 67371461
#: The codes of a request the server stopped at its time limit (``cancelled``): MaxTimeMSExpired, and FerretDB 2's.
TIME_LIMIT_CODES = frozenset({50, QUERY_CANCELED})


#: The kinds of failure that are a server's answer refusing the request (:class:`RequestRefused`), not a cluster
#: that gave none (:class:`ClusterUnavailable`).
REFUSALS: tuple[FailureKind, ...] = ("refused", "too_large", "unsupported")

#: A server's "not implemented" answers: NotImplemented (238, FerretDB v1's aggregation), an unknown group operator
#: (15952), an unknown expression (168) or pipeline stage (40324).
UNSUPPORTED_CODES = (238, 15952, 168, 40324)


def driver_error(cluster: str, exc: BaseException, *, doing: str, secrets: Sequence[str] = ()) -> ClusterError:
    """The :class:`ClusterError` for a driver error, with any URI password redacted: a :class:`RequestRefused` when
    the server answered with a refusal (:data:`REFUSALS`), else a :class:`ClusterUnavailable`.

    *secrets* (the cluster's configured password) are masked word for word as well.
    Raise it ``from exc`` so the driver's traceback stays attached.
    """
    if isinstance(exc, _OperationCancelled):  # pymongo's own words ("operation cancelled") hide the cause
        return ClusterUnavailable(cluster, f"{doing} timed out: the cluster stopped answering pymongo's monitor, "
                                           "which cancelled the request")
    text = redact_uri(str(exc).split("\n", 1)[0])
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    if len(text) > 300:
        text = text[:297] + "..."
    if _kind(exc) in REFUSALS:
        code = getattr(exc, "code", None)
        return RequestRefused(cluster, f"{doing}: the server refused the request: {type(exc).__name__}: {text}",
                              code=code if isinstance(code, int) else None)
    return ClusterUnavailable(cluster, f"{doing} failed: {type(exc).__name__}: {text}")


def _timed_out(exc: BaseException) -> bool:
    """Did *exc* end a request because the cluster did not answer in time?

    ``PyMongoError.timeout``: the socket timeout or the deadline ran out (``NetworkTimeout``,
    ``ExecutionTimeout``, a write concern's ``wtimeout``). pymongo also *cancels* the requests in
    flight on a cluster whose monitor's heartbeat hit a ``NetworkTimeout`` (``interrupt_connections``):
    that ``AutoReconnect`` says nothing of a timeout, but a timeout is its only cause.
    """
    return bool(getattr(exc, "timeout", False)) or isinstance(exc, _OperationCancelled)


def _kind(exc: BaseException) -> FailureKind:
    if isinstance(exc, ServerSelectionTimeoutError):
        return "unavailable"
    if isinstance(exc, OperationFailure) and exc.code in TIME_LIMIT_CODES:  # the server stopped it, and said so
        return "cancelled"
    if _timed_out(exc):  # before AutoReconnect: NetworkTimeout is one, and a timeout is not retried
        return "timeout"
    if isinstance(exc, AutoReconnect):  # connection lost mid-request, not primary, step-down
        return "transient"
    if isinstance(exc, (ConnectionFailure, InvalidOperation)):
        return "unavailable"
    if isinstance(exc, OperationFailure) and exc.code in TRANSIENT_WRITE_CODES:
        return "transient"
    if isinstance(exc, OperationFailure) and any(m in str(exc) for m in STATEMENT_TOO_LARGE):
        return "too_large"
    if isinstance(exc, OperationFailure) and exc.code in UNSUPPORTED_CODES:
        return "unsupported"
    return "refused"  # the server answered with an error, or BSON could not encode the request


def classify(cluster: str, exc: BaseException, *, doing: str, secrets: Sequence[str] = ()) -> Failure:
    """The :class:`Failure` for driver error *exc* on *cluster*; its error is chained to *exc*."""
    error = driver_error(cluster, exc, doing=doing, secrets=secrets)
    error.__cause__ = exc
    return Failure(_kind(exc), error)
