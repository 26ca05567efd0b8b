"""The conversation between the I/O-free core and a driver: requests the core yields, answers it gets back.

Every operation of the router is a *program*: a generator that yields one request at a
time and receives the driver's answer. The core decides everything (where a write goes,
what a page asks for, when to retry); a driver (threads over ``MongoClient``, or asyncio
over ``AsyncMongoClient``) only carries requests out. This is the sans-I/O design of h11:
one core, two thin drivers, no rule written twice.

Example (a program and how any driver runs it)::

    def count_program(cluster):
        docs = yield Find(cluster, "feed", {"receiver_id": 7}, deadline=deadline)
        return len(docs) if not isinstance(docs, Failure) else 0

    # a driver:  reply = None; loop: request = program.send(reply); reply = execute(request)

A request that reaches a server carries an absolute ``deadline`` (``time.monotonic()``
seconds): the driver gives the server only what is left of it (``pymongo.timeout``), so
no call waits longer than its deadline. Driver errors never reach the core as
exceptions: they come back as a :class:`Failure` value, already classified.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping, Sequence
from typing import Any, Literal, TypeAlias, TypeVar

import attrs

from ..errors import ClusterError
from ..observe import Event
from .push import Push

__all__ = [
    "Aggregate",
    "Collection",
    "Concurrently",
    "Count",
    "Delete",
    "Failure",
    "FailureKind",
    "Find",
    "HOLDING_STAGES",
    "Insert",
    "InsertOutcome",
    "Program",
    "Push",
    "Refresh",
    "Report",
    "Request",
    "Sleep",
    "Update",
    "UpdateOutcome",
    "Upserts",
    "WriteError",
    "ask",
]

T = TypeVar("T")
#: A collection, by role; the storage layer maps each to the configured name.
Collection: TypeAlias = Literal["feed", "outbox", "fanouts", "fanout_batches", "fanout_sent", "metadata", "seen", "edits",
                                "posts", "erasures"]
#: How a failed request failed, which decides what may be done next (see :mod:`router.core.policy`).
FailureKind: TypeAlias = Literal["transient", "timeout", "cancelled", "unavailable", "refused", "too_large", "unsupported"]


@attrs.frozen(slots=True)
class Failure:
    """A request that failed as a whole. ``error`` names the cluster and never holds a password.

    * ``transient``: the connection broke mid-request, or a step-down; the request may or
      may not have been carried out, and trying again may work.
    * ``timeout``: no answer before the deadline (or the socket timeout); not retried,
      because the time it had is spent (and the server may still be carrying it out).
    * ``cancelled``: the server stopped the request at its time limit (``maxTimeMS``:
      MongoDB's MaxTimeMSExpired, FerretDB 2's cancelled statement) and answered so; it
      works on it no more (of a multi-document write, FerretDB 2 did nothing, MongoDB
      perhaps a part). Not retried as it was; a smaller one may pass.
    * ``unavailable``: no server could be selected, or the router is closing.
    * ``refused``: the server answered with an error (authentication, a bad command).
    * ``too_large``: the server refused a statement as too large for it (FerretDB's limits on
      statement parameters: 32,766 on SQLite, 65,535 on PostgreSQL); a smaller one may pass.
    * ``unsupported``: the server does not implement an operator or stage the request uses (FerretDB v1's
      aggregation); no retry can help.
    """

    kind: FailureKind
    error: ClusterError

    @property
    def retryable(self) -> bool:
        """True for the one kind worth trying again within the deadline."""
        return self.kind == "transient"

    @property
    def cluster_down(self) -> bool:
        """True when the cluster gave no answer (``transient``, ``timeout``, ``unavailable``); False when it answered
        with a refusal (``refused``, ``too_large``, ``unsupported``) or stopped the request at its time limit
        (``cancelled``)."""
        return self.kind in ("transient", "timeout", "unavailable")


@attrs.frozen(slots=True)
class Find:
    """``find`` on one cluster; answered with the list of documents, or a :class:`Failure`.

    *moving*: a matching document's *sort* fields may change while it is read (a bucket's ``newest``): an answer the
    server cuts short (16 MiB) is then read on by the documents not received yet, never after the last one received
    (:mod:`router.storage.finds`), and comes in no single order."""

    cluster: str
    collection: Collection
    filter: Mapping[str, Any]
    deadline: float
    sort: Sequence[tuple[str, int]] | None = None
    limit: int = 0
    projection: Mapping[str, Any] | None = None
    moving: bool = False


@attrs.frozen(slots=True)
class Count:
    """``count_documents`` on one cluster, stopping at *limit* (0: no limit); answered with the count or a :class:`Failure`."""

    cluster: str
    collection: Collection
    filter: Mapping[str, Any]
    deadline: float
    limit: int = 0


#: The stages that make FerretDB 2 hold an aggregate's whole answer from its first batch (DocumentDB's persistent
#: cursor, a PostgreSQL cursor ``WITH HOLD``: one snapshot), so that ``getMore`` goes on through that answer exactly.
#: A pipeline of streamable stages alone (``$match``, ``$project``, ``$set`` ...) is continued from the heap position
#: of its last row instead, which repeats rows updated meanwhile and skips those written into space VACUUM freed
#: before it (``docs/ferretdb2-cursor-bug.md``).
HOLDING_STAGES = frozenset({"$group", "$sort", "$unwind", "$count", "$sortByCount", "$bucket", "$bucketAuto", "$facet",
                            "$lookup"})


def _held(_instance: Any, _attribute: Any, pipeline: Sequence[Mapping[str, Any]]) -> None:
    if not any(HOLDING_STAGES.intersection(stage) for stage in pipeline):
        raise ValueError(f"pipeline: an aggregate the router sends must hold one of {sorted(HOLDING_STAGES)}, so that "
                         f"FerretDB 2 continues it exactly (got stages {[next(iter(s), '?') for s in pipeline]})")


@attrs.frozen(slots=True)
class Aggregate:
    """``aggregate`` on one cluster (a counting or grouping pipeline: what it returns is small, whatever it reads on
    the server); answered with the list of result documents, or a :class:`Failure`.

    Its answer may pass one batch (10,000 rows, or 16 MiB), and is then read on by ``getMore``: the pipeline must hold
    a stage of :data:`HOLDING_STAGES` (refused with ``ValueError`` otherwise), which makes that exact."""

    cluster: str
    collection: Collection
    pipeline: Sequence[Mapping[str, Any]] = attrs.field(validator=_held)
    deadline: float


@attrs.frozen(slots=True)
class Insert:
    """Unordered ``insert_many``; answered with an :class:`InsertOutcome` (never a bare Failure)."""

    cluster: str
    collection: Collection
    documents: Sequence[Mapping[str, Any]]
    deadline: float


@attrs.frozen(slots=True)
class Delete:
    """``delete_many``; answered with the number deleted, or a :class:`Failure`."""

    cluster: str
    collection: Collection
    filter: Mapping[str, Any]
    deadline: float


@attrs.frozen(slots=True)
class Update:
    """``update_many`` (or ``update_one`` with *one*); answered with an :class:`UpdateOutcome` or a Failure."""

    cluster: str
    collection: Collection
    filter: Mapping[str, Any]
    update: Mapping[str, Any]
    deadline: float
    upsert: bool = False
    one: bool = False
    array_filters: Sequence[Mapping[str, Any]] | None = None


@attrs.frozen(slots=True)
class Upserts:
    """Unordered ``bulk_write`` of ``update_one(filter, update, upsert=True)``, one per pair in *ops*; answered,
    like :class:`Insert`, with an :class:`InsertOutcome` whose write errors name positions in *ops*."""

    cluster: str
    collection: Collection
    ops: Sequence[tuple[Mapping[str, Any], Mapping[str, Any]]]
    deadline: float


@attrs.frozen(slots=True)
class Sleep:
    """Pause this program (not the others) for *seconds*; answered with ``None``."""

    seconds: float


@attrs.frozen(slots=True)
class Concurrently:
    """Run sub-programs at the same time; answered with their return values, in order.

    ``lanes[i]`` names the cluster sub-program ``i`` talks to, so a driver can keep a hung
    cluster from tying up the others (one thread pool per cluster). A sub-program that
    raises makes the whole request raise, after the others finished.
    """

    programs: Sequence[Program[Any]]
    lanes: Sequence[str]


@attrs.frozen(slots=True)
class Report:
    """Tell the operator something (a metrics :class:`~router.observe.Event`); answered with ``None``."""

    event: Event


@attrs.frozen(slots=True)
class Refresh:
    """Reload every cluster's metadata now; answered with the new routing, or the RouterError that stopped it."""


@attrs.frozen(slots=True)
class WriteError:
    """One document an insert refused: its position in the request, the server's code and message."""

    index: int
    code: int | None
    message: str


@attrs.frozen(slots=True)
class InsertOutcome:
    """What an unordered insert did, document by document.

    Documents not named in ``write_errors`` were stored, unless ``failure`` is set (the
    send failed: every such document's outcome is unknown) or ``write_concern`` is set
    (they were stored, but less durably than asked: in doubt).
    """

    write_errors: tuple[WriteError, ...] = ()
    failure: Failure | None = None
    write_concern: str | None = None


@attrs.frozen(slots=True)
class UpdateOutcome:
    """What an update did: documents matched and modified."""

    matched: int
    modified: int


Request: TypeAlias = (Find | Count | Aggregate | Insert | Upserts | Delete | Update | Sleep | Concurrently | Refresh | Report
                      | Push)
#: A core operation: yields requests, receives answers, returns a value of type T.
Program: TypeAlias = Generator[Request, Any, T]


def ask(request: Find) -> Program[list[dict[str, Any]] | Failure]:
    """A program of one :class:`Find`: what lets a single request run beside others in :class:`Concurrently`."""
    answer: list[dict[str, Any]] | Failure = yield request
    return answer
