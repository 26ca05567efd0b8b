"""The layout contract: everything that knows how a period stores its receivers' copies.

A *layout* is the one place that names a field of a stored copy. The rest of the core
speaks in :class:`Entry` values (one copy, as a plain dict with the fields of
:data:`ENTRY_FIELDS`) and in positions, and asks the cluster's layout for the requests
that store, find, fix, edit and count them. Each period records its layout in its
metadata (``layout``; absent means :data:`DEFAULT`), so a deployment changes layout
at a period boundary without moving any data, and a page that crosses the boundary
merges answers of both.

Model: APScheduler 3's ``jobstores/base.py`` (one abstract store, each store builds its
own documents) and h11's ``_writers.py`` (a table picks the writer; the state machine
never sees the bytes). The table is :data:`router.core.layouts.LAYOUTS`.

What a layout must guarantee, whatever its shape: one stored copy per ``_id`` however
often a batch is sent (a second send of the same entry is a duplicate, code 11000, or
a no-op); newest-first answers by ``(event_time, _id)`` strictly after a position;
every copy of a ``data_key`` reachable for delete and update.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, ClassVar

import attrs
from bson import ObjectId

from ...cursor import Position
from ...model import FeedItem, to_millis
from ..policy import RetryPolicy
from ..steps import Failure, Find, Program, Request

__all__ = ["DEFAULT", "ENTRY_FIELDS", "EditSettings", "Entry", "Inbox", "IndexSpec", "Layout", "copy_entries", "entry_of", "item_entries",
           "outside_clause", "same_entry"]

#: The layout of a period whose metadata names none.
DEFAULT = "copies"
#: The fields of one copy as the core hands it to a layout (an *entry*), in storage order.
ENTRY_FIELDS = ("_id", "data_key", "receiver_id", "sender_id", "event_time", "type", "data")
#: One copy as the core builds it: a dict with exactly :data:`ENTRY_FIELDS`.
Entry = dict[str, Any]


def entry_of(oid: ObjectId, receiver: int | str, sender: int | str, event_time: datetime, kind: int | str,
             data: Any, data_key: str) -> Entry:
    """The entry of one copy."""
    return {"_id": oid, "data_key": data_key, "receiver_id": receiver, "sender_id": sender, "event_time": event_time,
            "type": kind, "data": data}


# The two bulk builders below are the hot paths' (write_many, fan-out): one call a batch, the dict literal inline
# (a call per item cost about 0.12 us of the write path's 4.7 us an item in two paired runs; the bulk form is back
# at the old cost, within noise).


def item_entries(items: Sequence[FeedItem], ids: Iterable[ObjectId]) -> list[Entry]:
    """The entries of *items*, each under its id from *ids*."""
    return [{"_id": oid, "data_key": item.data_key, "receiver_id": item.receiver_id, "sender_id": item.sender_id,
             "event_time": item.event_time, "type": item.type, "data": item.data} for item, oid in zip(items, ids)]


def copy_entries(ids: Iterable[ObjectId], receivers: Iterable[int | str], sender: int | str, event_time: datetime,
                 kind: int | str, data: Any, data_key: str) -> list[Entry]:
    """The entries of one post's copies, receiver by receiver (*data* shared by every copy)."""
    return [{"_id": oid, "data_key": data_key, "receiver_id": receiver, "sender_id": sender, "event_time": event_time,
             "type": kind, "data": data} for oid, receiver in zip(ids, receivers)]


def outside_clause(start: datetime | None, end: datetime | None, *, earliest: str, latest: str) -> dict[str, Any]:
    """Documents whose *earliest* field is before *start* or whose *latest* field is at or after *end*."""
    clauses = ([{earliest: {"$lt": start}}] if start is not None else []) + ([{latest: {"$gte": end}}] if end is not None else [])
    return {} if not clauses else clauses[0] if len(clauses) == 1 else {"$or": clauses}


_IDENTITY = ("data_key", "receiver_id", "sender_id", "type")


def same_entry(stored: Mapping[str, Any], ours: Mapping[str, Any]) -> bool:
    """Is the entry *stored* (as a layout's :meth:`Layout.looked_up` gives it) *ours* from an earlier attempt, and not
    another item under the same ``_id``? Same key, receiver, sender, type and millisecond."""
    if any(stored.get(f) != ours.get(f) for f in _IDENTITY):
        return False
    a, b = stored.get("event_time"), ours.get("event_time")
    return isinstance(a, datetime) and isinstance(b, datetime) and to_millis(a) == to_millis(b)


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


class Layout(abc.ABC):
    """The stored shape of one period's copies. Subclasses are stateless; one instance serves every cluster.

    Example (what the core does with a layout)::

        layout = layout_for(timemap, "cluster_3")
        request = layout.store("cluster_3", entries, deadline)     # Insert or Upserts
        inbox = yield from layout.inbox("cluster_3", 7, position, 50, (), deadline)
    """

    #: The name recorded in a period's metadata.
    name: ClassVar[str]
    #: Whether appending a copy updates a document other writers also append to (needs atomic updates).
    needs_atomic_updates: ClassVar[bool] = False
    #: Whether a duplicate-key answer to :meth:`store` proves the copy is stored. When False, a duplicate may also
    #: mean that the document the layout chose for it was taken by a concurrent writer: the core reads every such
    #: copy back (:meth:`lookup`) and stores the ones not found again, with ``again=True``.
    duplicates_prove_stored: ClassVar[bool] = True

    # -- writes ---------------------------------------------------------------------------------
    @abc.abstractmethod
    def store(self, cluster: str, entries: Sequence[Entry], deadline: float, *, again: bool = False) -> Request:
        """The request that stores *entries* (an unordered batch answered with an ``InsertOutcome``: a copy already
        stored under its ``_id`` is a duplicate-key write error at its position). *again*: these entries were
        answered with a duplicate before and not found stored (see :attr:`duplicates_prove_stored`)."""

    @abc.abstractmethod
    def lookup(self, cluster: str, entries: Sequence[Entry], deadline: float) -> Find:
        """The find that returns the stored copies among *entries*, by ``_id`` (for :meth:`looked_up`)."""

    @abc.abstractmethod
    def looked_up(self, docs: Sequence[Mapping[str, Any]], ids: Sequence[ObjectId]) -> list[Entry]:
        """The entries among *ids* found in the answer *docs* to :meth:`lookup` (``data`` may be left out: the
        core compares what :func:`same_entry` compares)."""

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

    # -- edits ----------------------------------------------------------------------------------
    @abc.abstractmethod
    def edit_key(self, cluster: str, data_key: str, data: Mapping[str, Any] | None, steps: EditSettings, *,
                 what: str) -> Program[Edited]:
        """Remove (*data* None) or re-data every copy of *data_key* in *cluster*, in bounded steps."""

    @abc.abstractmethod
    def remove_sender(self, cluster: str, receiver_id: int | str, sender_id: int | str, steps: EditSettings) -> Program[Edited]:
        """Remove every copy from *sender_id* in *receiver_id*'s feed (unfollow)."""

    # -- a user's data: erasure and export (router.core.erasure, router.core.export) ------------------
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
    def sent_copy(self, cluster: str, sender_id: int | str, data_key: str,
                  deadline: float) -> Program[FeedItem | None | Failure]:
        """One stored copy of *sender_id*'s post *data_key* (None: none here)."""

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
