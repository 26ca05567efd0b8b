"""How each core request maps onto a pymongo collection call, shared by the sync and the async storage.

The two storages differ only in whether they ``await`` the call; what is called, what
its result becomes, and what its failure becomes are decided here, once.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from bson.errors import BSONError
from pymongo import ReadPreference, UpdateOne
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.errors import BulkWriteError, PyMongoError

from ..core.policy import code_kind
from ..core.steps import (
    Aggregate,
    Count,
    Delete,
    Failure,
    Find,
    Insert,
    InsertOutcome,
    Update,
    UpdateOutcome,
    Upserts,
    WriteError,
)
from ..errors import ClusterUnavailable
from ..observe import Event
from .errors import classify
from .finds import read as read_sync
from .finds import WHOLE, max_time_ms, read_async

__all__ = ["IORequest", "IO_REQUESTS", "READS", "Call", "call_for", "describe", "expired", "failed", "insert_outcome", "late",
           "observed", "calls_for", "request_op", "server_deadline", "time_left"]

IORequest = Find | Count | Aggregate | Insert | Upserts | Delete | Update
#: The request types a driver sends to a cluster (for ``isinstance``).
IO_REQUESTS = (Find, Count, Aggregate, Insert, Upserts, Delete, Update)
#: The requests that only read: their pymongo calls take ``maxTimeMS`` (a write's do not: only ``pymongo.timeout``
#: sends one with a write).
READS = (Find, Count, Aggregate)
#: A request ready to send: the call and what turns its result into the core's answer. The call is given *until*,
#: the ``time.monotonic()`` by which the server must stop a read (sent as ``maxTimeMS``, see :func:`server_deadline`),
#: or None where ``pymongo.timeout`` is in force (it sends one itself); it returns a value, or an awaitable of it for
#: the async client.
Call = tuple[Callable[[float | None], Any], Callable[[Any], Any]]

_SENT_AS_IS: Callable[[Any], Any] = lambda raw: raw  # noqa: E731


def _max_time(until: float | None) -> dict[str, int]:
    return {} if until is None else {"maxTimeMS": max_time_ms(until)}


def call_for(request: IORequest, coll: Any) -> Call:
    """The pymongo call for *request* on collection *coll* (sync or async: the same methods)."""
    if isinstance(request, Find):  # read in whole first batches, never by getMore (see router.storage.finds)
        read = read_async if isinstance(coll, AsyncCollection) else read_sync
        return (lambda until: read(coll, request.filter, sort=request.sort, limit=request.limit,
                                   projection=request.projection, moving=request.moving, until=until)), _SENT_AS_IS
    if isinstance(request, Count):
        limit = {"limit": request.limit} if request.limit else {}
        return (lambda until: coll.count_documents(request.filter, **limit, **_max_time(until))), int
    if isinstance(request, Aggregate):
        # Whole in the first batch where it fits (WHOLE rows, 16 MiB). A larger answer is read on by getMore, which is
        # exact because every pipeline the core sends holds a stage that makes FerretDB 2 keep the whole answer from
        # the first batch (Aggregate: HOLDING_STAGES); its getMore would repeat and skip rows of a streamed pipeline.
        pipeline = list(request.pipeline)
        if inspect.iscoroutinefunction(coll.aggregate):  # the async collection: aggregate is awaited for its cursor

            async def aggregate(until: float | None) -> list[dict[str, Any]]:
                return list(await (await coll.aggregate(pipeline, batchSize=WHOLE, **_max_time(until))).to_list())

            return aggregate, _SENT_AS_IS
        return (lambda until: coll.aggregate(pipeline, batchSize=WHOLE, **_max_time(until)).to_list()), _SENT_AS_IS
    # Writes: pymongo's write methods take no maxTimeMS; they run under pymongo.timeout, which sends it (until is None).
    if isinstance(request, Insert):
        documents = list(request.documents)
        return (lambda _until: coll.insert_many(documents, ordered=False)), (lambda _raw: InsertOutcome())
    if isinstance(request, Upserts):
        ops = [UpdateOne(f, u, upsert=True) for f, u in request.ops]
        return (lambda _until: coll.bulk_write(ops, ordered=False)), (lambda _raw: InsertOutcome())
    if isinstance(request, Delete):
        return (lambda _until: coll.delete_many(request.filter)), (lambda raw: int(raw.deleted_count))
    update = coll.update_one if request.one else coll.update_many
    return (
        (lambda _until: update(request.filter, request.update, upsert=request.upsert, array_filters=request.array_filters)),
        (lambda raw: UpdateOutcome(int(raw.matched_count), int(raw.modified_count))),
    )


_WHAT = {"feed": "feed", "outbox": "outbox", "metadata": "metadata", "fanouts": "fan-out checkpoint",
         "fanout_batches": "fan-out checkpoint", "seen": "seen markers",
         "edits": "edit fence", "posts": "posts by sender", "erasures": "erasure records"}


def describe(request: IORequest) -> str:
    """What *request* was doing, for error messages: ``reading metadata``, ``writing feed`` ..."""
    verb = {Find: "reading", Count: "counting", Aggregate: "counting", Insert: "writing", Upserts: "writing", Delete: "deleting from",
            Update: "updating"}[type(request)]
    return f"{verb} {_WHAT.get(request.collection, request.collection)}"


def request_op(request: IORequest) -> str:
    """The ``op`` label of a request: its verb and collection, ``find.feed``, ``insert.outbox`` ..."""
    return f"{type(request).__name__.lower()}.{request.collection}"


def observed(request: IORequest, answer: Any, seconds: float) -> tuple[Event, Event]:
    """The events a request's answer makes: its latency and outcome, and whether its cluster is up.

    An insert whose only write errors are duplicate keys is ``ok``: with derived ids that is
    an idempotent rerun (or a retry whose first attempt landed) finding its documents stored;
    the items and fan-out counters tell those documents apart. The cluster is down (0) after
    a request it gave no answer to (:attr:`Failure.cluster_down`), up (1) after any answer.
    """
    failure = answer.failure if isinstance(answer, InsertOutcome) else answer if isinstance(answer, Failure) else None
    outcome: str
    if failure is not None:
        outcome = failure.kind
    elif isinstance(answer, InsertOutcome) and (
        answer.write_concern or any(code_kind(e.code) != "duplicate" for e in answer.write_errors)
    ):
        outcome = "write_errors"
    else:
        outcome = "ok"
    up = 0.0 if failure is not None and failure.cluster_down else 1.0
    return (
        Event("request", seconds, cluster=request.cluster, op=request_op(request), outcome=outcome),
        Event("cluster_up", up, cluster=request.cluster),
    )


#: How often pymongo looks again for a server while it knows none it may use (``MIN_HEARTBEAT_INTERVAL``): its wait
#: for one ends up to this long after the time it was given.
SELECTION_STEP = 0.5


def calls_for(request: IORequest, client: Any, coll: Any) -> Iterator[tuple[Call, float, bool]]:
    """The calls that carry out *request* on *coll*, each with what it may take: the time left (:func:`time_left`)
    when its turn comes, and whether the client knew a server it may use then.

    Once *client* has found the cluster's servers failing and knows none the request may use,
    a ``ping`` waits for one first: that wait alone is capped at ``serverSelectionTimeoutMS``
    (after pymongo's next check), and the request then gets what is left of its deadline, so
    the first request to a restarted cluster does not have to find the server *and* be
    answered within it. A client not connected yet checks its servers at once: its first
    request is sent as it is, not doubled by a ping. (Whether a server is known is looked up
    once per call sent: a look at the client's topology costs microseconds on every request.)
    """
    known = _server_known(request, client)
    if not known and _servers_failed(client):
        preference = client.read_preference if isinstance(request, READS) else ReadPreference.PRIMARY
        ping: Call = (lambda _until: client.admin.command("ping", read_preference=preference)), _SENT_AS_IS
        yield ping, time_left(request, client, known=False), False
        known = _server_known(request, client)
    yield call_for(request, coll), time_left(request, client, known=known), known


def time_left(request: IORequest, client: Any, *, known: bool | None = None) -> float:
    """The time this request may take: what is left before its deadline (zero or less: do not send it). *known*:
    whether the client knows a server the request may use (looked up when not given).

    Under ``pymongo.timeout`` pymongo ignores ``socketTimeoutMS`` and ``serverSelectionTimeoutMS``
    and waits until the deadline. Both are applied here again: no request waits longer than
    its cluster's ``socketTimeoutMS`` (when set), so a hung cluster fails in the time the
    configuration says, as a timeout; and while the client knows no server the request may
    use (the cluster is down, or not reached yet), the wait for one is capped at
    ``serverSelectionTimeoutMS``, so a dead cluster leaves the rest of the call its time.
    (A read the async storage bounds with ``asyncio.timeout`` gets the same time.)
    Once the client has found its servers failing, that wait is the ``ping`` of
    :func:`calls_for`, and pymongo looks at them again only on its next check, up to
    :data:`SELECTION_STEP` away: the wait gets ``serverSelectionTimeoutMS`` beyond it, or a
    restarted cluster could be missed with a short one.

    While it knows no server it may use, pymongo looks for one again only every
    :data:`SELECTION_STEP`, so such a wait can end that long after the time it was given.
    Where that can happen the request is given that much less than what is left, and one
    with no more than that left is not sent: when the client has found its servers failing,
    and for a write pymongo retries by itself (``retryWrites``), whose second try selects a
    server again. (A client that has not reached its servers yet is woken by its first
    check, so a read on it gets what is left.)
    """
    left = request.deadline - time.monotonic()
    socket_timeout: float | None = client.options.pool_options.socket_timeout
    if socket_timeout:
        left = min(left, socket_timeout)
    if known is None:
        known = _server_known(request, client)
    recheck = not known and _servers_failed(client)
    if recheck or _driver_retries(request, client):
        left -= SELECTION_STEP
    if known:
        return left
    return min(left, float(client.options.server_selection_timeout) + (SELECTION_STEP if recheck else 0.0))


def server_deadline(client: Any, left: float) -> float | None:
    """The ``time.monotonic()`` by which the server must stop a read that may take *left* seconds (sent as
    ``maxTimeMS``), or None when that leaves it less than a millisecond (do not send it).

    As ``pymongo.timeout`` does, the server gets the time less one round trip (the slowest
    of the client's servers' shortest, as its monitors measured them), so that when it stops
    the read at its limit (``cancelled``) its answer comes back before the client stops waiting
    (``timeout``).
    """
    trip = max((s.min_round_trip_time or 0.0 for s in client.topology_description.server_descriptions().values()),
               default=0.0)
    if left - trip < 0.001:
        return None
    return time.monotonic() + left - trip


def _driver_retries(request: IORequest, client: Any) -> bool:
    """Whether pymongo may try *request* a second time by itself: a single-document or bulk write under
    ``retryWrites`` (``update_many`` and ``delete_many`` are not retryable writes)."""
    one = isinstance(request, (Insert, Upserts)) or (isinstance(request, Update) and request.one)
    return one and bool(client.options.retry_writes)


def _server_known(request: IORequest, client: Any) -> bool:
    """Whether *client* knows a server *request* may be sent to now (a readable one for reads, else a writable one)."""
    description = client.topology_description
    if isinstance(request, (Find, Count, Aggregate)):
        return bool(description.has_readable_server(client.read_preference))
    return bool(description.has_writable_server())


def _servers_failed(client: Any) -> bool:
    """Whether *client*'s monitors or requests found one of its servers failing (not just not checked yet)."""
    return any(server.error is not None for server in client.topology_description.server_descriptions().values())


def late(request: IORequest, cluster: str, client: Any) -> Any:
    """The answer for a request not sent: its deadline passed, or too little of it is left (:func:`time_left`)."""
    if request.deadline <= time.monotonic():
        why = "the call's deadline passed before it was sent"
    elif not _server_known(request, client):
        return _as_answer(request, Failure("unavailable", ClusterUnavailable(
            cluster, f"{describe(request)}: no server is known to be up, and too little of the call's time is left to "
            "wait for one")))
    else:
        why = "too little of the call's time was left to send it"
    return _as_answer(request, Failure("timeout", ClusterUnavailable(cluster, f"{describe(request)}: {why}")))


def expired(request: IORequest, cluster: str, client: Any, seconds: float) -> Any:
    """The answer for a request the async storage stopped after *seconds*, its time (:func:`time_left`): what
    ``pymongo.timeout`` gives there. While the client knew no server it may use, the wait for one ran out
    (``unavailable``, as pymongo's ``ServerSelectionTimeoutError``); else the server did not answer in time
    (``timeout``, as its ``NetworkTimeout``)."""
    if not _server_known(request, client):
        return _as_answer(request, Failure("unavailable", ClusterUnavailable(
            cluster, f"{describe(request)}: no server it may use was found in {seconds:.1f} s")))
    return _as_answer(request, Failure("timeout", ClusterUnavailable(
        cluster, f"{describe(request)} timed out: no answer in {seconds:.1f} s")))


def failed(request: IORequest, exc: BaseException, cluster: str, secrets: Sequence[str]) -> Any:
    """The answer for a request the driver failed with *exc*: an insert's per-document outcome, or a Failure.

    Re-raises anything that is not a driver or BSON error (a bug).
    """
    if isinstance(exc, BulkWriteError):
        return insert_outcome(exc)
    if not isinstance(exc, (PyMongoError, BSONError)):
        raise exc
    return _as_answer(request, classify(cluster, exc, doing=describe(request), secrets=secrets))


def unknown(request: IORequest) -> Any:
    """The answer for a request to a cluster the configuration does not have."""
    return _as_answer(request, Failure("unavailable", ClusterUnavailable(request.cluster, "is not in the configuration")))


def _as_answer(request: IORequest, failure: Failure) -> Any:
    return InsertOutcome(failure=failure) if isinstance(request, (Insert, Upserts)) else failure


def insert_outcome(exc: BulkWriteError) -> InsertOutcome:
    """The per-document outcome in an unordered insert's :class:`BulkWriteError` (its ``writeErrors`` only:
    ``nInserted`` is not trusted, as some servers report it wrongly)."""
    details = exc.details
    errors = tuple(
        WriteError(int(e.get("index", 0)), e.get("code"), str(e.get("errmsg", ""))) for e in details.get("writeErrors", [])
    )
    concern = details.get("writeConcernErrors") or []
    return InsertOutcome(write_errors=errors, write_concern=str(concern[0].get("errmsg", "")) if concern else None)


__all__ += ["unknown"]
