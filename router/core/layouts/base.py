"""The layout contract: everything that knows how a period stores its receivers' copies.

A *layout* is the one place that names a field of a stored copy. The rest of the core
speaks in values (:mod:`.values`: a :class:`~.values.Copy`, a batch of copies, a
:class:`~router.model.FeedItem` in a page) and in positions, and asks the cluster's layout
for the requests that store, find, fix, edit and count them; the layout builds its own
documents and reads them back into values. Each period records its layout in its metadata
(``layout``; absent means :data:`DEFAULT`), so a deployment changes layout at a period
boundary without moving any data, and a page that crosses the boundary merges answers of both.

Model: APScheduler 3's ``jobstores/base.py`` (``add_job(job)`` takes a ``Job``; each store
builds its own documents) and h11's ``_writers.py`` (a table picks the writer; the state
machine never sees the bytes). The table is :data:`router.core.layouts.LAYOUTS`. Query
helpers every layout may use (positions, steps, chunks) are in :mod:`.queries`; sibling
layouts never import each other.

What a layout must guarantee, whatever its shape: one stored copy per id however often a
batch is sent (a second send of the same copy is a duplicate, code 11000, or a no-op);
newest-first answers by ``(event_time, id)`` strictly after a position; every copy of a
``data_key`` reachable for delete and update; its indexes listed by :meth:`Layout.indexes`
(created when a period is added, the only place a period's feed indexes come from).
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, ClassVar, Generic, TypeVar

import attrs
from bson import ObjectId

from ...cursor import Position
from ...model import FeedItem
from ..nogc import PROMOTE_AT, cyclic_gc_paused
from ..policy import RetryPolicy
from ..steps import Collection, Failure, Program, Request
from ...layout_names import DEFAULT
from .values import Copy, CopyBatch, FanBatch

__all__ = ["DEFAULT", "EditSettings", "Inbox", "IndexSpec", "Landed", "Layout", "Writer"]

B = TypeVar("B")


class Writer(abc.ABC, Generic[B]):
    """How one kind of document is stored by the insert loop (:func:`router.core.writes.insert.insert_program`): from a
    batch of values *B* to documents, and back when a duplicate must be sorted out.

    A layout is the writer of copies; :mod:`.outbox` has the writer of posts; other collections (the edit
    fence) store their own records as they are.
    """

    #: The collection this writer stores into (what retries and errors are reported under).
    collection: ClassVar[Collection]
    #: Whether a duplicate-key answer to :meth:`store` proves the document is stored. When False, a duplicate may
    #: also mean that the document the writer chose for it was taken by a concurrent writer: the core reads every
    #: such copy back (:meth:`stored`) and stores the ones not found again, with ``again=True``.
    duplicates_prove_stored: ClassVar[bool] = True

    @abc.abstractmethod
    def documents(self, batch: B) -> list[Any]:
        """What :meth:`store` sends for each position of *batch* (opaque to the core, which only picks positions)."""

    @abc.abstractmethod
    def store(self, cluster: str, documents: Sequence[Any], deadline: float, *, again: bool = False) -> Request:
        """The request that stores *documents* (an unordered batch answered with an ``InsertOutcome``: one stored
        already under its id is a duplicate-key write error at its position). *again*: these were answered with a
        duplicate before and not found stored (see :attr:`duplicates_prove_stored`)."""

    def stored(self, cluster: str, batch: B, positions: Sequence[int],
               deadline: float) -> Program[dict[int, bool] | Failure]:
        """Which of *positions* are stored under their ids, each with whether what is stored is the same item."""
        raise NotImplementedError(f"{type(self).__name__} stores ids derived from what they identify: a duplicate "
                                  "is present, never read back")

    def renamed(self, batch: B, position: int, oid: ObjectId) -> Any:
        """Give *position* the fresh id *oid* (after a collision with another item); its new document."""
        raise NotImplementedError(f"{type(self).__name__} never renames")

    def id_at(self, batch: B, position: int) -> Any:
        """The id of *position* (for messages)."""
        raise NotImplementedError(f"{type(self).__name__} names no ids")


@attrs.frozen
class IndexSpec:
    """One index a layout's collection needs: its name, keys, and options (``unique``, and ``partial``: the
    ``partialFilterExpression`` of a partial index, as ``(field, condition)`` pairs)."""

    name: str
    keys: tuple[tuple[str, int], ...]
    unique: bool = False
    partial: tuple[tuple[str, Any], ...] = ()

    def to_command(self, collection: str) -> dict[str, Any]:
        """The ``createIndexes`` command document that creates this index on *collection*."""
        spec: dict[str, Any] = {"key": dict(self.keys), "name": self.name}
        if self.unique:
            spec["unique"] = True
        if self.partial:
            spec["partialFilterExpression"] = dict(self.partial)
        return {"createIndexes": collection, "indexes": [spec]}


@attrs.frozen
class Inbox:
    """What one cluster gave towards a page: ``(event_time, key, item)`` newest first, strictly after the
    position asked from, and whether the cluster may hold more past the last of them (``full``)."""

    entries: list[tuple[datetime, ObjectId, FeedItem]]
    full: bool


@attrs.frozen
class EditSettings:
    """How an edit by key runs: documents per step (a target), ids sampled to place each step, the timeout
    (seconds) of each request, and the retries of the edit's fence record (an insert)."""

    step: int = 10_000
    sample: int = 10_000
    timeout: float = 10.0
    policy: RetryPolicy = RetryPolicy()


#: How many copies an edit changed in one cluster, and the error that stopped it (None: finished).
Edited = tuple[int, Any]
#: What an edit that writes copies anew (a ``buckets`` update moving a copy to another bucket) does right after writing
#: them, given the cluster, the ``data_key`` and the copies: bring them up to the edit fence and the erasure records,
#: as every writer does (:func:`router.core.writes.fence.settle`); None, or the failure that left them in doubt.
Landed = Callable[[str, str, Sequence[Copy]], Program[Failure | None]]


class Layout(Writer[CopyBatch]):
    """The stored shape of one period's copies. Subclasses are stateless; one instance serves every cluster.

    Example (what the core does with a layout)::

        layout = layout_for(timemap, "cluster_3")
        docs = layout.documents(FanBatch(ids, receivers, sender, t, kind, data, key))
        request = layout.store("cluster_3", docs, deadline)                 # Insert or Upserts
        inbox = yield from layout.inbox("cluster_3", 7, position, 50, (), deadline)

    A new layout is a subclass and a row of :data:`router.core.layouts.LAYOUTS`: the contract
    suite (``tests/integration``, parametrized over that table) then runs against it.
    """

    collection: ClassVar[Collection] = "feed"
    #: The name recorded in a period's metadata.
    name: ClassVar[str]
    #: Whether appending a copy updates a document other writers also append to (needs atomic updates).
    needs_atomic_updates: ClassVar[bool] = False

    # -- writes ---------------------------------------------------------------------------------
    def documents(self, batch: CopyBatch) -> list[Any]:
        with cyclic_gc_paused(promote=len(batch) >= PROMOTE_AT):  # a dict per copy, no cycles (see router.core.nogc)
            return batch.documents(self)

    @abc.abstractmethod
    def copy_documents(self, copies: Sequence[Copy]) -> list[Any]:
        """What :meth:`store` sends for each of *copies*."""

    def item_documents(self, items: Sequence[FeedItem], ids: Sequence[ObjectId]) -> list[Any]:
        """:meth:`copy_documents` of ``write_many``'s *items*, each under the id of its position (a layout builds
        them in one comprehension: this is the write path's per-item cost)."""
        return self.copy_documents([Copy(oid, i.receiver_id, i.sender_id, i.event_time, i.type, i.data, i.data_key)
                                    for i, oid in zip(items, ids)])

    def fan_documents(self, batch: FanBatch) -> list[Any]:
        """:meth:`copy_documents` of one post's copies (a fan-out batch; its copies share one data object)."""
        return self.copy_documents([batch.copy(i) for i in range(len(batch.ids))])

    @abc.abstractmethod
    def copies_of(self, documents: Iterable[Mapping[str, Any]]) -> list[Copy]:
        """The copies stored *documents* of this layout hold (``data`` None where a projection left it out): the
        mirror of :meth:`copy_documents`, for read-backs and for tools that look at what is stored."""

    @abc.abstractmethod
    def find_copies(self, cluster: str, copies: Sequence[Copy], deadline: float) -> Program[list[Copy] | Failure]:
        """The copies among *copies* stored under their ids (``data`` may be left None: only the identity,
        :meth:`~.values.Copy.same_as`, is compared)."""

    @abc.abstractmethod
    def copies_by_id(self, cluster: str, receiver_id: int | str, ids: Sequence[ObjectId],
                     deadline: float) -> Program[list[Copy] | Failure]:
        """*receiver_id*'s copies stored under *ids*, whole (a page of groups' newest items): an exact find, whatever
        their size (:mod:`router.storage.finds` continues a batch the server cut at 16 MiB)."""

    def stored(self, cluster: str, batch: CopyBatch, positions: Sequence[int],
               deadline: float) -> Program[dict[int, bool] | Failure]:
        ours = {batch.ids[p]: p for p in positions}
        found = yield from self.find_copies(cluster, [batch.copy(p) for p in positions], deadline)
        if isinstance(found, Failure):
            return found
        return {ours[c.id]: c.same_as(batch.copy(ours[c.id])) for c in found if c.id in ours}

    def renamed(self, batch: CopyBatch, position: int, oid: ObjectId) -> Any:
        batch.ids[position] = oid
        return self.copy_documents([batch.copy(position)])[0]

    def id_at(self, batch: CopyBatch, position: int) -> ObjectId:
        return batch.ids[position]

    @abc.abstractmethod
    def fix(self, cluster: str, data_key: str, ids: Sequence[ObjectId], data: Mapping[str, Any] | None,
            deadline: float) -> list[Request]:
        """Requests that remove (*data* None) or re-data the copies of *data_key* among *ids* just written."""

    # -- reads ----------------------------------------------------------------------------------
    @abc.abstractmethod
    def inbox(self, cluster: str, receiver_id: int | str, position: Position | None, need: int,
              types: tuple[int | str, ...], deadline: float) -> Program[Inbox | Failure]:
        """The *need* newest copies of *receiver_id* strictly after *position* (of *types*, when given)."""

    @abc.abstractmethod
    def newer(self, cluster: str, receiver_id: int | str, bound: Position | None, need: int,
              deadline: float) -> Program[list[tuple[datetime, ObjectId]] | Failure]:
        """The keys of up to *need* copies newer than *bound* (all, when None), newest first."""

    @abc.abstractmethod
    def count_newer(self, cluster: str, receiver_id: int | str, bound: Position | None, limit: int,
                    deadline: float) -> Program[int | Failure]:
        """How many copies are newer than *bound*, counting no further than *limit*."""

    @abc.abstractmethod
    def copy_stream(self, receiver_id: int | str, start: datetime, end: datetime | None,
                    match: Mapping[str, Any]) -> list[dict[str, Any]]:
        """The first stages of an ``aggregate`` on ``feed`` that yield *receiver_id*'s copies dated in ``[start, end)``
        (*end* None: no upper bound) and matching *match*, each as a document with the fields of a
        :class:`~.values.Copy` but ``receiver_id`` (``_id`` its id; *match* filters on those fields): what grouped
        reads count and group on the server (:mod:`.grouping`, the one reader of these documents)."""

    # -- edits ----------------------------------------------------------------------------------
    @abc.abstractmethod
    def edit_key(self, cluster: str, data_key: str, data: Mapping[str, Any] | None, steps: EditSettings, *,
                 what: str, landed: Landed | None = None) -> Program[Edited]:
        """Remove (*data* None) or re-data every copy of *data_key* in *cluster*, in bounded steps. A layout that
        writes a copy anew to re-data it (``buckets``, moving it to a bucket with room) calls *landed* on it."""

    @abc.abstractmethod
    def remove_sender(self, cluster: str, receiver_id: int | str, sender_id: int | str, steps: EditSettings) -> Program[Edited]:
        """Remove every copy from *sender_id* in *receiver_id*'s feed (unfollow)."""

    # -- a user's data: erasure and export (router.core.privacy.erasure, router.core.privacy.export) ------------------
    @abc.abstractmethod
    def remove_sent(self, cluster: str, sender_id: int | str, keys: Sequence[str], steps: EditSettings) -> Program[Edited]:
        """Remove every copy of the posts *keys* that *sender_id* sent, in bounded steps; count the copies."""

    @abc.abstractmethod
    def remove_received(self, cluster: str, receiver_id: int | str, steps: EditSettings) -> Program[Edited]:
        """Remove every copy in *receiver_id*'s feed, in bounded steps; count the copies."""

    @abc.abstractmethod
    def oldest_first(self, cluster: str, receiver_id: int | str, after: Position | None, need: int,
                     deadline: float) -> Program[Inbox | Failure]:
        """The *need* oldest copies of *receiver_id* strictly after *after* in ``(event_time, _id)`` order, oldest
        first (``full``: more may follow)."""

    @abc.abstractmethod
    def sent_copy(self, cluster: str, sender_id: int | str, data_key: str, deadline: float, *,
                  at: datetime | None = None) -> Program[FeedItem | None | Failure]:
        """One stored copy of *sender_id*'s post *data_key*, of time *at* when given (None: none here)."""

    # -- operators ------------------------------------------------------------------------------
    @abc.abstractmethod
    def indexes(self, *, sharded: bool = False) -> list[IndexSpec]:
        """The indexes the period's feed collection needs (created before the period is opened). *sharded*: the
        collection is sharded on hashed ``receiver_id`` (migration 0001, on a mongos), so every unique index must
        start with ``receiver_id``."""

    @abc.abstractmethod
    def outside(self, start: datetime | None, end: datetime | None) -> tuple[dict[str, Any], str]:
        """The filter of stored documents holding copies outside ``[start, end)``, and the field that gives such a
        document's latest time."""
