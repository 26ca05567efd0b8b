"""The exception hierarchy: everything the router raises on purpose is a :class:`RouterError`.

Branches are shallow. Errors about the caller's input also derive from
:class:`ValueError` so generic validation code keeps working.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import attrs

__all__ = [
    "RouterError",
    "GroupsUnsupported",
    "ConfigError",
    "ConfigProblem",
    "MetadataError",
    "NoClusterForTime",
    "ClusterError",
    "ClusterUnavailable",
    "RequestRefused",
    "InvalidItem",
    "InvalidCursor",
    "WriteFailed",
    "DeleteFailed",
    "MigrationError",
    "PeriodChangeRefused",
    "ClusterRetired",
    "StaleMetadata",
    "RolloverError",
    "FanOutFailed",
    "FanOutConflict",
    "InvalidBatch",
    "ItemRefused",
    "RouterClosed",
    "UpdateFailed",
    "WrongEventLoop",
    "ItemDeleted",
    "UnknownLayout",
    "BucketsFull",
    "SenderErased",
    "ErasureFailed",
    "PushNotConfigured",
]


class RouterError(Exception):
    """Raised for every failure the router reports on purpose; catch this to catch them all."""


class ConfigProblem:
    """One problem found in a configuration file: where it is, which field, what is wrong."""

    __slots__ = ("source", "line", "column", "path", "message")

    def __init__(self, source: str, line: int, column: int, path: str, message: str) -> None:
        self.source = source
        self.line = line
        self.column = column
        self.path = path
        self.message = message

    def __str__(self) -> str:
        where = f"{self.source}:{self.line}:{self.column}" if self.line else self.source
        return f"{where}: {self.path}: {self.message}" if self.path else f"{where}: {self.message}"

    def __repr__(self) -> str:
        return f"ConfigProblem({str(self)!r})"


class ConfigError(RouterError, ValueError):
    """Raised when ``clusters.yaml`` (or the equivalent mapping) is invalid.

    Carries every problem found, not just the first: ``problems`` is a list of
    :class:`ConfigProblem`, each with ``source``, ``line``, ``column`` and ``path``.
    """

    def __init__(self, problems: list[ConfigProblem]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(str(p) for p in self.problems))


class MetadataError(RouterError):
    """Raised when the clusters' metadata documents do not form a valid time map.

    ``problems`` lists every problem found (overlaps, missing or duplicate documents,
    ``_id`` not matching the configured name, several open-ended periods).
    """

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__("invalid cluster metadata:\n  " + "\n  ".join(self.problems))


class UnknownLayout(MetadataError):
    """Raised by any operation that touches a cluster whose metadata names a layout this router does not know
    (written by a newer feed-router): ``cluster`` and ``layout`` name them. The router still starts and serves
    the other periods; ``feedrouter check`` reports the cluster."""

    def __init__(self, cluster: str, layout: str, known: Sequence[str]) -> None:
        self.cluster = cluster
        self.layout = layout
        RouterError.__init__(self, f"cluster {cluster!r}: its period's layout {layout!r:.80} is not one this router knows "
                                   f"({', '.join(known)}); upgrade feed-router to use this cluster")
        self.problems = [str(self)]


class GroupsUnsupported(RouterError):
    """Raised by ``read_groups`` and ``unseen_groups`` when a cluster's server cannot group on the server (FerretDB v1
    implements none of ``$max``, ``$ifNull``, ``$push``, ``$topN`` in ``aggregate``): ``cluster`` names it. Grouped
    reads need MongoDB, FerretDB 2 or mongo-java-server; ``mark_read`` works everywhere."""

    def __init__(self, cluster: str, answer: str) -> None:
        self.cluster = cluster
        super().__init__(f"cluster {cluster!r}: grouped reads need a server that groups in aggregate ($max, $ifNull, "
                         f"$topN or $push: MongoDB, FerretDB 2, mongo-java-server); this one refused: {answer}")


class NoClusterForTime(RouterError, LookupError):
    """Raised when no cluster's period holds an ``event_time``; nothing is written elsewhere."""

    def __init__(self, event_time: datetime, message: str, *, index: int | None = None) -> None:
        self.event_time = event_time
        self.index = index
        where = f"items[{index}].event_time: " if index is not None else ""
        super().__init__(where + message)


class ClusterRetired(NoClusterForTime):
    """Raised for a write whose ``event_time`` falls in the period of a retired cluster."""


class StaleMetadata(RouterError):
    """Raised when a write lies beyond what the router's time map can vouch for, and a refresh did not help.

    A map refreshed at time R is trusted for ``event_time`` before ``R + lead_time``:
    rollovers are announced at least one lead time before their boundary. Later
    times might belong to a period the router has not heard of, so it refuses
    rather than guess.
    """


class ClusterError(RouterError):
    """Raised (``from`` the driver's error) when a cluster did not carry out a request: the base of
    :class:`ClusterUnavailable` (no answer) and :class:`RequestRefused` (an answer that refuses).

    ``cluster`` names the cluster, never its URI.
    """

    def __init__(self, cluster: str, message: str) -> None:
        self.cluster = cluster
        super().__init__(f"cluster {cluster!r}: {message}")


class ClusterUnavailable(ClusterError):
    """Raised (``from`` the driver's error) when a cluster cannot be reached, or gave no answer in time (a timeout,
    a connection lost, no server to select). Trying again later may work.

    ``cluster`` names the cluster, never its URI.
    """


class RequestRefused(ClusterError):
    """Raised (``from`` the driver's error) when a cluster's server answered a request with an error: the cluster is
    up and refuses this request (a reply larger than it sends, a statement larger than it takes, an operator it does
    not implement, a write it rejects, credentials it does not accept). The same request is refused again.

    ``cluster`` names the cluster, never its URI; ``code`` is the server's error code (``None`` when the driver could
    not even encode the request).
    """

    def __init__(self, cluster: str, message: str, *, code: int | None = None) -> None:
        self.code = code
        super().__init__(cluster, message)


class BucketsFull(ClusterUnavailable):
    """No longer raised: an update of a ``buckets`` period moves a copy whose bucket has no room for its new data to
    one that has (``router.core.layouts.bucket_edits``). Kept so that code catching it still runs. It was raised
    (inside :class:`UpdateFailed`'s ``failed``) when such copies kept their old data; ``copies`` is how many."""

    def __init__(self, cluster: str, data_key: str, copies: int, size: int) -> None:
        self.data_key = data_key
        self.copies = copies
        super().__init__(cluster, f"update {data_key}: {copies} copies kept their old data: their buckets have no room "
                                  f"for {size} more bytes (the byte cap of a bucket); delete the item "
                                  "and write it again, or update it with smaller data")


class InvalidItem(RouterError, ValueError):
    """Raised when a feed item (or a field of it) is malformed; ``field`` names the field."""

    def __init__(self, field: str, message: str, *, index: int | None = None) -> None:
        self.field = field
        self.index = index
        prefix = f"items[{index}].{field}" if index is not None else field
        super().__init__(f"{prefix}: {message}")


class ItemRefused(InvalidItem):
    """Raised (in ``WriteFailed.failed``) for an item a cluster refused for itself: its content or its chosen ``_id``.

    ``cluster`` names the cluster and ``code`` is the server's error code (11000 when a
    caller-chosen ``_id`` already holds another item). The other items of the call are
    not affected; writing this one again will be refused again.
    """

    def __init__(self, cluster: str, code: int | None, message: str) -> None:
        self.cluster = cluster
        self.code = code
        super().__init__("item", f"refused by cluster {cluster!r} (code {code}): {message}")


class RouterClosed(RouterError):
    """Raised by a call made after ``close()`` began; calls already running when it began complete first."""


class WrongEventLoop(RouterError, RuntimeError):
    """Raised when an ``AsyncFeedRouter`` is awaited outside the event loop that started it.

    Its clients belong to that loop: a call from another loop, or after that loop ended,
    is refused before anything is sent. Start one router per event loop.
    """


class InvalidCursor(RouterError, ValueError):
    """Raised when a page cursor string was not produced by this router version."""


class WriteFailed(RouterError):
    """Raised when some items of a ``write_many`` were not written, or their outcome is unknown.

    ``failed`` maps the index of every item not confirmed written to the reason (a
    :class:`ClusterError` naming the cluster, or :class:`ItemRefused`); ``ids``
    holds, in input order, the ``_id`` each item was given: the items whose index is not
    in ``failed`` are stored under it. To repeat the write safely, write
    :meth:`unwritten` (the failed items carrying those ids): an item the first attempt
    did store is then found, not stored twice.
    """

    def __init__(self, failed: Mapping[int, BaseException], ids: list[Any]) -> None:
        self.failed = dict(failed)
        self.ids = ids
        first = sorted(self.failed.items())[:5]
        shown = "; ".join(f"items[{i}]: {e}" for i, e in first)
        more = f" (and {len(self.failed) - len(first)} more)" if len(self.failed) > len(first) else ""
        super().__init__(f"{len(self.failed)} of {len(ids)} items not written: {shown}{more}")

    def unwritten(self, items: Sequence[Any]) -> list[Any]:
        """The items of the failed call (pass them in the order given) not confirmed written, each with its ``_id``
        set, ready to be written again without a second copy (items refused for themselves are left out)."""
        return [
            attrs.evolve(items[i], id=self.ids[i])
            for i in sorted(self.failed)
            if not isinstance(self.failed[i], ItemRefused)
        ]


class DeleteFailed(RouterError):
    """Raised when a delete could not reach every cluster.

    ``deleted`` counts the copies removed from the clusters that answered;
    ``failed`` maps each cluster that did not finish to its :class:`ClusterError`
    (:class:`ClusterUnavailable`, or :class:`RequestRefused`). Running the same delete again
    finishes it (once the cause is gone).
    """

    def __init__(self, deleted: int, failed: Mapping[str, ClusterError]) -> None:
        self.deleted = deleted
        self.failed = dict(failed)
        names = ", ".join(sorted(self.failed))
        super().__init__(f"delete reached only part of the clusters ({deleted} removed); failed: {names}")


class UpdateFailed(RouterError):
    """Raised when an update could not reach every cluster.

    ``updated`` counts the documents changed in the clusters that answered; ``failed``
    maps each cluster that did not finish to its :class:`ClusterError` (:class:`ClusterUnavailable`,
    or :class:`RequestRefused`). Running the same update again finishes it (documents already
    changed are skipped).
    """

    def __init__(self, updated: int, failed: Mapping[str, ClusterError]) -> None:
        self.updated = updated
        self.failed = dict(failed)
        names = ", ".join(sorted(self.failed))
        super().__init__(f"update reached only part of the clusters ({updated} changed); failed: {names}")


class MigrationError(RouterError):
    """Raised when migrations cannot be applied: a changed or unknown applied migration, a bad file."""


class PeriodChangeRefused(RouterError):
    """Raised when a change to the periods (add-cluster, rollover) would overlap, strand data or misroute writes.

    ``problems`` lists every reason; no cluster was changed.
    """

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__("refused:\n  " + "\n  ".join(self.problems))


class RolloverError(RouterError):
    """Raised when a rollover cannot be done: no ready standby, too late for the boundary, lease lost."""


class FanOutFailed(RouterError):
    """Raised when a fan-out ends with receivers that have no confirmed copy, or stops early.

    ``result`` is the :class:`~router.fanout.FanOutResult`: its counts,
    ``failed_receivers`` (the first :data:`~router.fanout.MAX_FAILED_RECEIVERS`),
    ``errors``, ``complete`` (False when the job stopped before reading every receiver)
    and ``cancelled``. Every copy written stays; run the fan-out again with the same
    ``job_id`` to complete it.
    """

    def __init__(self, result: Any) -> None:
        self.result = result
        if result.cancelled:
            what = "was cancelled"
        elif not result.complete:
            what = "stopped early"
        else:
            what = "finished with failures"
        first = f"; first error: {result.errors[0]}" if result.errors else ""
        super().__init__(
            f"fan-out {result.job_id!r} to cluster {result.cluster!r} {what}: {result.failed} receivers failed, "
            f"{result.written} written, {result.already_present} already present, {result.skipped} skipped, "
            f"{result.resumed} in batches done earlier{first}; run it again with job_id={result.job_id!r} to complete it"
        )


class FanOutConflict(RouterError, ValueError):
    """Raised when a job id's checkpoint belongs to another fan-out, or was cut into other batches.

    Resuming needs the same activity (``data_key`` and ``event_time``) and the same
    ``batch_size`` as the run that made the checkpoint; ``job_id`` names the job.
    """

    def __init__(self, job_id: str, message: str) -> None:
        self.job_id = job_id
        super().__init__(f"fan-out job {job_id!r}: {message}")


class InvalidBatch(InvalidItem):
    """Raised when a fan-out batch has a number, position or receiver count its job cannot have; nothing is written.

    ``job_id`` and ``number`` name the batch (``number`` as it came, perhaps not an int),
    ``field`` what was wrong (``number``, ``first``, ``receivers`` or ``job``). A Celery
    worker rejects such a task for good: no delivery of it could ever be written.
    """

    def __init__(self, job_id: str, number: object, field: str, message: str) -> None:
        self.field = field
        self.index = None
        self.job_id = job_id
        self.number = number
        RouterError.__init__(self, f"fan-out {job_id!r:.200}: batch {number!r:.40} refused, nothing written: {field}: {message}")


class ItemDeleted(RouterError):
    """Raised when a fan-out, publish or resume meets a ``data_key`` that was deleted: a deleted post stays deleted.

    ``delete(data_key)`` leaves a tombstone (:mod:`router.core.writes.fence`) that every
    fan-out batch, backfill and Celery worker checks, so no copy outlives the delete.
    ``data_key`` names the post; ``result`` is the :class:`~router.fanout.FanOutResult`
    of a run the delete stopped (``cancelled``), else None. Publish the post under a new
    ``data_key`` to show it again.
    """

    def __init__(self, data_key: str, *, result: Any = None) -> None:
        self.data_key = data_key
        self.result = result
        stopped = ""
        if result is not None:
            stopped = (f"; fan-out {result.job_id!r} stopped after {result.batches} batches, "
                       "its copies removed")
        super().__init__(f"data_key {data_key!r:.80} was deleted: it is not published again{stopped}")


class SenderErased(ItemDeleted):
    """Raised when a fan-out, publish or resume meets a post whose sender was erased (``erase_user``): an erased
    user's posts are never written again. ``data_key`` names the post; ``result`` is the
    :class:`~router.fanout.FanOutResult` of a run the erasure stopped (``cancelled``, reason ``erased``), else None.
    The message never names the user."""

    def __init__(self, data_key: str, *, result: Any = None) -> None:
        self.data_key = data_key
        self.result = result
        stopped = ""
        if result is not None:
            stopped = f"; fan-out {result.job_id!r} stopped after {result.batches} batches, its copies removed"
        RouterError.__init__(self, f"data_key {data_key!r:.80}: its sender was erased: it is not written again{stopped}")


class ErasureFailed(RouterError):
    """Raised when an erasure could not finish in every cluster (a cluster down, or a step refused).

    ``request_id`` names the erasure's record; ``counts`` holds what was removed in the clusters that finished,
    by cluster and collection; ``failed`` maps each cluster that did not finish to its error. Nothing names the
    user. Calling ``erase_user`` again with the same user finishes it (``feedrouter check`` reports it meanwhile).
    """

    def __init__(self, request_id: str, counts: Mapping[str, Mapping[str, int]],
                 failed: Mapping[str, BaseException]) -> None:
        self.request_id = request_id
        self.counts = {name: dict(c) for name, c in counts.items()}
        self.failed = dict(failed)
        first = "; ".join(f"{name}: {error}" for name, error in sorted(self.failed.items())[:3])
        super().__init__(f"erasure {request_id} did not finish in {len(self.failed)} clusters ({first}); "
                         "call erase_user again with the same user to finish it")


class PushNotConfigured(RouterError):
    """Raised by ``subscribe`` (and ``feedrouter tail``) when ``clusters.yaml`` has no ``push:`` section: live feeds
    need a Redis (``push: {redis: redis://host:6379/0}``), and every router and worker that writes must name it too."""
