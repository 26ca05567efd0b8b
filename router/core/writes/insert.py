"""Writes: check, route and build every item, then insert each cluster's share, retrying what may be retried.

:func:`prepare` is the router's per-item hot path (about 1.7 µs an item): check the item,
ask the chooser (:meth:`~router.core.periods.routing.Routing.locate`) for its cluster, make its
``_id``; each cluster's layout then builds its share's documents in one comprehension. :func:`insert_program` is the one insert-and-retry loop of
the router: ``write_many``, fan-out batches, ``publish`` and backfill all use it, and it
reports every document's outcome, so callers never interpret driver errors.

**Duplicates.** What a duplicate ``_id`` (code 11000) means depends on where the id came from:

* ``"present"`` (derived ids: fan-out copies, outbox entries, backfill): the same id is
  the same copy, stored earlier. It counts as present, with no read-back.
* ``"check"`` (ids the router drew for ``write_many``, and ids the caller set): after a
  send that may have reached the server, or for a caller's id, the stored documents are
  read back; one identical to ours (same ``data_key``, receiver, sender, type and
  millisecond) is this item, stored by the earlier attempt. Otherwise a router-drawn id
  collided with an older item (event seconds recur, the 3-byte counter wraps): it gets a
  fresh id and is sent again; a caller's id that holds another item is refused.

A layout whose duplicates do not prove a copy stored (``buckets``: the duplicate may be the
receiver's first bucket, started at once by another writer) has every duplicate read back,
in both cases: a copy not found is stored again as it is (``store(..., again=True)``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime
from typing import Any, Literal, TypeVar

import attrs
from bson import ObjectId

from ...config import WRITE_BATCH_SIZE
from ...errors import ClusterUnavailable, InvalidItem, ItemRefused, RouterError, WriteFailed
from ...ids import make_ids
from ...model import FeedItem
from ...observe import Event
from .checks import check_item
from ..layouts import ItemBatch, Layout, Writer, layout_for, posts
from ..push import PushItems
from ..nogc import PROMOTE_AT, cyclic_gc_paused
from ..policy import RetryPolicy, code_kind, deadline_in
from ..periods import PastHorizon, Routing, routed
from ..steps import Concurrently, Failure, InsertOutcome, Program, Report, Sleep

__all__ = ["Built", "InsertResult", "Prepared", "WriteSettings", "insert_program", "prepare", "prepare_documents",
           "prepare_or_stale", "write_program"]

log = logging.getLogger(__name__)
B = TypeVar("B")


@attrs.frozen
class WriteSettings:
    """The write tunables from clusters.yaml: documents per insert, retry policy, per-call timeout (seconds)."""

    batch_size: int = WRITE_BATCH_SIZE
    policy: RetryPolicy = RetryPolicy()
    timeout: float = 10.0
    #: Register each batch's posts by sender (:mod:`router.core.layouts.posts`). False only to measure what that costs
    #: (the benchmark): an erasure would not find the copies written so.
    register: bool = True


@attrs.frozen
class Prepared:
    """Items checked, routed and given ids: ``ids`` in input order; per cluster, the input indexes and that
    cluster's copies (its items under their ids), in the same order; ``given``: indexes whose id the caller chose."""

    ids: list[ObjectId]
    batches: dict[str, tuple[list[int], ItemBatch]]
    given: frozenset[int] = frozenset()


def prepare(items: Sequence[FeedItem], routing: Routing, *, indexed: bool = True) -> Prepared:
    """Check, route and id every item, or raise before anything is written (each cluster's layout builds its
    documents: :meth:`~router.core.layouts.Layout.item_documents`).

    Raises :class:`InvalidItem`, :class:`NoClusterForTime` (naming the item's index when
    *indexed*), and :class:`PastHorizon` for an item past the map's horizon.
    """
    with cyclic_gc_paused():  # an id and a route per item, no cycles (see router.core.nogc)
        return _prepare(items, routing, indexed)


def _prepare(seq: Sequence[FeedItem], routing: Routing, indexed: bool) -> Prepared:
    locate = routing.locate
    routes: dict[str, list[int]] = {}
    seconds: list[int] = []
    add_second = seconds.append
    given: dict[int, ObjectId] = {}
    lo, hi = 1.0, 0.0  # the period of the previous item, as far as it is trusted
    indexes: list[int] = []
    for i, item in enumerate(seq):
        ts = check_item(item, i if indexed else None)
        if not lo <= ts < hi:
            name, lo, hi = locate(ts, index=i if indexed else None)
            indexes = routes.setdefault(name, [])
        indexes.append(i)
        sec = int(ts)
        add_second(sec)
        if item.id is not None:
            given[i] = _given_id(item.id, sec, i if indexed else None)
    ids = make_ids(seconds)
    for i, oid in given.items():
        ids[i] = oid
    batches = {name: (idx, _share(seq, ids, idx)) for name, idx in routes.items()}
    return Prepared(ids=ids, batches=batches, given=frozenset(given))


def _share(seq: Sequence[FeedItem], ids: list[ObjectId], indexes: list[int]) -> ItemBatch:
    """The items at *indexes* (ascending) under their ids: sliced when they are one run of the input (a write to one
    cluster, or items in time order), picked one by one otherwise."""
    first, n = indexes[0], len(indexes)
    if indexes[-1] - first + 1 == n:
        run = seq[first : first + n]
        return ItemBatch(run if isinstance(run, list) else list(run), ids[first : first + n])
    return ItemBatch([seq[i] for i in indexes], [ids[i] for i in indexes])


def _given_id(oid: object, seconds: int, index: int | None) -> ObjectId:
    """A caller-set ``_id``: an ObjectId stamped with the item's event second (as every feed ``_id`` is)."""
    if type(oid) is not ObjectId:
        raise InvalidItem("id", f"must be None or an ObjectId (got {type(oid).__name__})", index=index)
    stamp = int.from_bytes(oid.binary[:4], "big")
    if stamp != seconds:
        raise InvalidItem(
            "id", f"must carry event_time's second {seconds} in its timestamp, as the router's ids do (got {stamp})",
            index=index,
        )
    return oid


@attrs.frozen
class InsertResult:
    """Every document's outcome: stored now (``written``), there already (``present``), or not (``failed``).

    ``renamed`` maps positions given a fresh id after a collision to that id; ``stopped``
    is the failure that ended the insert early, when the cluster itself failed (callers
    send it nothing more in the same call).
    """

    written: int
    present: tuple[int, ...]
    failed: dict[int, RouterError]
    renamed: dict[int, ObjectId]
    stopped: Failure | None = None


def insert_program(
    cluster: str,
    writer: Writer[B],
    batch: B,
    *,
    policy: RetryPolicy,
    deadline: float,
    duplicates: Literal["present", "check"],
    given: frozenset[int] = frozenset(),
    documents: list[Any] | None = None,
) -> Program[InsertResult]:
    """Store *batch* (unordered) with *writer*, retrying what the policy allows; report each position's outcome.

    *writer* builds the documents and reads them back (a layout for copies, the outbox's writer for posts, or a
    collection's own records); this loop sees positions, outcomes and ids, never a document's fields.
    *given* lists the positions whose id the caller chose (checked, never renamed). *documents*: the writer's
    documents of *batch*, built already (``write_many`` builds every share's in one go: :func:`prepare_documents`).
    A send that fails as a whole and cannot be retried fails every position still pending
    with the cluster's error: their outcome is unknown, so none is reported written.
    """
    docs = writer.documents(batch) if documents is None else documents
    collection = writer.collection
    racy = not writer.duplicates_prove_stored
    pending = list(range(len(docs)))
    written = 0
    present: list[int] = []
    failed: dict[int, RouterError] = {}
    renamed: dict[int, ObjectId] = {}
    retries = resends = 0
    sent_before = False  # has a send of these documents possibly reached the server?
    while pending:
        outcome: InsertOutcome = yield writer.store(cluster, [docs[p] for p in pending], deadline, again=resends > 0)
        whole = outcome.failure
        if whole is not None:
            delay = policy.pause(retries + 1, deadline=deadline) if whole.retryable else None
            if delay is None:
                for p in pending:
                    failed[p] = whole.error
                return InsertResult(written, tuple(present), failed, renamed, stopped=whole)
            retries += 1
            sent_before = True
            log.debug("cluster %s: %d documents hit a transient error; retry %d of %d in %.3f s",
                      cluster, len(pending), retries, policy.attempts - 1, delay, extra={"cluster": cluster})
            yield Report(Event("retry", cluster=cluster, op=f"insert.{collection}"))
            yield Sleep(delay)
            continue
        if outcome.write_concern is not None:
            reason = f"write concern not satisfied, outcome unknown: {outcome.write_concern[:200]}"
            for p in pending:
                failed[p] = ClusterUnavailable(cluster, reason)
            return InsertResult(written, tuple(present), failed, renamed)
        errors = {pending[e.index]: e for e in outcome.write_errors}
        written += len(pending) - len(errors)
        duplicate: list[int] = []
        transient: list[int] = []
        for p, error in errors.items():
            kind = code_kind(error.code)
            if kind == "duplicate":
                duplicate.append(p)
            elif kind == "transient":
                transient.append(p)
            elif kind == "timeout":  # not retried: its time is spent; not refused for itself either
                failed[p] = ClusterUnavailable(cluster, f"insert timed out: {error.message[:200]}")
            else:
                failed[p] = ItemRefused(cluster, error.code, error.message[:200])
        again: list[int] = []
        if duplicate and duplicates == "present" and not racy:
            present.extend(duplicate)
        elif duplicate:
            again = yield from _sort_duplicates(
                cluster, writer, batch, docs, duplicate, sent_before=sent_before, given=given, deadline=deadline,
                present=present, failed=failed, renamed=renamed, derived=duplicates == "present",
            )
            if again and racy:
                resends += 1
                if resends > policy.attempts:  # never expected: each resend starts a bucket of its own
                    for p in again:
                        failed[p] = ClusterUnavailable(cluster, f"insert kept meeting a duplicate key after {resends} sends")
                    again = []
        sent_before = True
        if transient:
            delay = policy.pause(retries + 1, deadline=deadline)
            if delay is None:
                for p in transient:
                    failed[p] = ClusterUnavailable(cluster, f"insert failed with a transient error after {retries + 1} tries")
                transient = []
            else:
                retries += 1
                log.debug("cluster %s: %d documents refused with a transient code; retry %d of %d in %.3f s",
                          cluster, len(transient), retries, policy.attempts - 1, delay, extra={"cluster": cluster})
                yield Report(Event("retry", cluster=cluster, op=f"insert.{collection}"))
                yield Sleep(delay)
        pending = again + transient
    return InsertResult(written, tuple(present), failed, renamed)


def _sort_duplicates(
    cluster: str,
    writer: Writer[B],
    batch: B,
    docs: list[Any],
    duplicate: list[int],
    *,
    sent_before: bool,
    given: frozenset[int],
    deadline: float,
    present: list[int],
    failed: dict[int, RouterError],
    renamed: dict[int, ObjectId],
    derived: bool = False,
) -> Program[list[int]]:
    """Decide each duplicate: present (ours, stored earlier), refused (a caller's id taken), renamed, or (for a
    writer whose duplicates prove nothing) not stored and sent again as it is; return the positions to send again.
    *derived*: the ids are derived from what they identify, so a stored copy under one is ours."""
    racy = not writer.duplicates_prove_stored
    check = duplicate if racy else [p for p in duplicate if sent_before or p in given]
    same: set[int] = set()
    absent: set[int] = set()
    if check:
        found = yield from writer.stored(cluster, batch, check, deadline)
        if isinstance(found, Failure):
            for p in check:  # stored or not, we cannot tell: not reported written
                failed[p] = found.error
            unknown = set(check)
            duplicate = [p for p in duplicate if p not in unknown]
        else:
            same = {p for p, ours in found.items() if derived or ours}
            if racy:
                absent = set(check) - set(found)
    again: list[int] = []
    for p in duplicate:
        if p in same:
            present.append(p)
        elif p in absent:
            again.append(p)
        elif p in given:
            failed[p] = ItemRefused(cluster, 11000, f"_id {writer.id_at(batch, p)} already holds another item")
        else:
            old: ObjectId = writer.id_at(batch, p)
            renamed[p] = make_ids([int.from_bytes(old.binary[:4], "big")])[0]
            docs[p] = writer.renamed(batch, p, renamed[p])
            again.append(p)
    if again:
        log.debug("cluster %s: %d duplicates not stored (%d given fresh ids); sending them again", cluster, len(again),
                  len(set(again) - absent))
    return again


def _cluster_program(
    cluster: str, indexes: list[int], copies: ItemBatch, documents: list[Any], given: frozenset[int],
    settings: WriteSettings, deadline: float, layout: Layout,
) -> Program[tuple[dict[int, RouterError], dict[int, ObjectId]]]:
    """One cluster's share of a write (its *documents* built), in batches; after a cluster failure the rest is
    reported, not sent."""
    failed: dict[int, RouterError] = {}
    renamed: dict[int, ObjectId] = {}
    size = settings.batch_size
    for start in range(0, len(indexes), size):
        chunk = indexes[start : start + size]
        mine = frozenset(pos for pos, i in enumerate(chunk) if i in given) if given else frozenset()
        part = ItemBatch(copies.items[start : start + size], copies.ids[start : start + size])
        result = yield from insert_program(
            cluster, layout, part, policy=settings.policy, deadline=deadline, duplicates="check", given=mine,
            documents=documents[start : start + size],
        )
        failed.update((chunk[pos], error) for pos, error in result.failed.items())
        renamed.update((chunk[pos], oid) for pos, oid in result.renamed.items())
        if result.stopped is not None:
            failed.update((i, result.stopped.error) for i in indexes[start + size :])
            break
    return failed, renamed


def _register_program(
    cluster: str, indexes: list[int], items: Sequence[FeedItem], entries: list[posts.Entry], settings: WriteSettings,
    deadline: float,
) -> Program[dict[int, RouterError]]:
    """Register one cluster's share of a write in its posts registry (:mod:`router.core.layouts.posts`: *entries*,
    ``batch_size`` documents an insert); return the items whose post could not be registered, with the error."""
    unregistered: list[tuple[posts.Entry, RouterError]] = []
    size = settings.batch_size
    for start in range(0, len(entries), size):
        chunk = entries[start : start + size]
        result = yield from insert_program(cluster, posts.REGISTRY, chunk, policy=settings.policy, deadline=deadline,
                                           duplicates="present")
        unregistered += [(chunk[pos], error) for pos, error in result.failed.items()]
        if result.stopped is not None:
            unregistered += [(entry, result.stopped.error) for entry in entries[start + size :]]
            break
    if not unregistered:
        return {}
    errors = {(entry.sender_id, key): error for entry, error in unregistered for key in entry.keys}
    return {i: errors[pair] for i, item in zip(indexes, items) if (pair := (item.sender_id, item.data_key)) in errors}


@attrs.frozen
class Built:
    """A write ready to send: its items prepared, and per cluster the layout's documents of its share and the
    registry entries of its posts (none when not registering)."""

    prepared: Prepared
    documents: dict[str, list[Any]]
    entries: dict[str, list[posts.Entry]]


def prepare_documents(items: Sequence[FeedItem], routing: Routing, *, indexed: bool = True,
                      register: bool = True) -> Built:
    """:func:`prepare`, then every cluster's documents and registry entries, under one pause of the cyclic collector
    (see :mod:`router.core.nogc`): paused for each step alone, it ran in between over the batch's live ids."""
    with cyclic_gc_paused(promote=len(items) >= PROMOTE_AT):
        prepared = _prepare(items, routing, indexed)
        shares = prepared.batches.items()
        documents = {name: layout_for(routing.timemap, name).documents(batch) for name, (_, batch) in shares}
        entries = {name: posts.of_items(batch.items) for name, (_, batch) in shares} if register else {}
        return Built(prepared, documents, entries)


def prepare_or_stale(items: Sequence[FeedItem], routing: Routing) -> Prepared:
    """:func:`prepare` without I/O: an item past the map's horizon is :class:`StaleMetadata` (no refresh is tried)."""
    try:
        return prepare(items, routing)
    except PastHorizon as past:
        index = past.index or 0
        raise routing.stale(items[index].event_time, field=f"items[{index}].event_time") from None


def write_program(items: Sequence[FeedItem], routing: Routing, settings: WriteSettings, *, indexed: bool) -> Program[list[ObjectId]]:
    """Write *items*: prepare them all (refreshing once past the horizon), then insert each cluster's share
    concurrently. Returns the ids in input order, or raises :class:`WriteFailed` naming every unwritten index
    (after one error record per cluster with unwritten items, ``cluster`` on the record)."""
    def where(past: PastHorizon) -> tuple[datetime, str]:
        return items[past.index or 0].event_time, f"items[{past.index}].event_time" if indexed else "event_time"

    # The map the items were routed by (refreshed, past the horizon) also says each period's layout: a new period's
    # copies are stored in its own layout, not in the one an older map gave a cluster it did not know.
    built, routing = yield from routed(
        lambda r: (prepare_documents(items, r, indexed=indexed, register=settings.register), r), routing, where=where)
    deadline = deadline_in(settings.timeout)  # after any refresh, which has a deadline of its own
    prepared = built.prepared
    ids = prepared.ids
    if not prepared.batches:
        return ids
    names = list(prepared.batches)
    programs: list[Program[Any]] = [
        _cluster_program(name, idx, copies, built.documents[name], prepared.given, settings, deadline,
                         layout_for(routing.timemap, name))
        for name, (idx, copies) in prepared.batches.items()
    ]
    if settings.register:  # each cluster's posts registered by sender, at the same time as its copies are stored
        programs += [_register_program(name, idx, copies.items, built.entries[name], settings, deadline)
                     for name, (idx, copies) in prepared.batches.items()]
    outcomes = yield Concurrently(programs, names + names if settings.register else names)
    unregistered = outcomes[len(names):]
    failed: dict[int, RouterError] = {}
    for n, (name, (cluster_failed, renamed)) in enumerate(zip(names, outcomes)):
        if unregistered:  # stored but not findable by sender (an erasure would miss it): not confirmed written
            cluster_failed = {**unregistered[n], **cluster_failed}
        failed.update(cluster_failed)
        for i, oid in renamed.items():
            ids[i] = oid
        share = len(prepared.batches[name][0])
        yield Report(Event("items", share - len(cluster_failed), cluster=name, outcome="written"))
        if cluster_failed:
            yield Report(Event("items", len(cluster_failed), cluster=name, outcome="failed"))
            first = min(cluster_failed)
            log.error("%d of %d items for cluster %s not written; items[%d]: %s", len(cluster_failed), share, name, first,
                      cluster_failed[first], extra={"cluster": name})
    yield PushItems(items, ids, failed)  # live subscribers: what was stored (router.core.live)
    if failed:
        raise WriteFailed(failed, ids)
    return ids
