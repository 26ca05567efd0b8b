"""The edit fence: once ``delete`` returns, no copy of the post outlives it; once ``update`` returns, no copy keeps old data.

An edit first leaves a record in the ``edits`` collection of every cluster, *then*
edits the copies (:mod:`router.core.writes.edits`). Every writer that may race an edit (fan-out
batches on every engine, backfill, the outbox entry of ``publish``) writes first and
then reads the fence (:func:`settle`): a tombstone there, and it removes what it just
wrote; an update newer than the data it wrote, and it applies that update to what it
just wrote, then reads again.

**Why that is enough, at any interleaving.** Take a writer's insert ``I``, its fence
read ``F`` (sent after ``I`` was acknowledged) and an edit's record ``R`` (inserted
before the edit's first sweep step). Either ``F`` sees ``R``, and the writer edits its
own copies; or ``F`` was served before ``R`` was stored, so ``I`` was stored before
``R`` and the edit's sweep, which starts after ``R``, finds ``I``'s copies. An update
the writer applies (``A``) is followed by another read: one that misses a newer update
``R'`` proves ``A`` came before ``R'``'s sweep, which then overwrites ``A``. Only
single-document inserts with distinct ``_id``\\ s decide anything, which are atomic on
every server (FerretDB loses concurrent updates of one document, so none is relied on).
``tests/unit/test_fence.py`` runs every interleaving of a batch and an edit.

**Records**, in the owning cluster's ``edits`` (every cluster: an edit knows only the
``data_key``, and asks every cluster anyway)::

    {_id: "<data_key>#<seq>",    data_key, seq, kind: "update", data, at}
    {_id: "<data_key>#deleted",  data_key, seq: DELETED, kind: "deleted", at}

The newest record wins. An update takes ``seq`` = newest + 1 by inserting it (a
duplicate ``_id``: another update took that number; read again and take the next), then
removes the records it supersedes. A tombstone sorts above every update and is final:
``fan_out``/``publish`` of a deleted ``data_key`` raise :class:`~router.errors.ItemDeleted`.

**Erasures** (:mod:`router.core.privacy.erasure`) ride on the same rule. An erasure first leaves a
record in every cluster's ``erasures``, holding the user's pseudonym
(:mod:`router.core.pseudonyms`), then removes what names the user. A writer that says whom
its documents name (:class:`Parties`: each key's sender, each copy's receiver) reads those
records in the same step as the fence (two ``find``\\ s at once), and removes its documents
of an erased sender (the key's fence becomes :data:`ERASED`, final like a tombstone: the run
stops) and its copies for erased receivers (:attr:`Settled.erased`). The proof is the one
above, with the erasure's record for ``R``.

**Cost.** A batch of a post that was never edited pays one ``find`` after its insert (an
index lookup that finds nothing), and one more at the same time on ``erasures`` (a lookup
of the sender's and receivers' pseudonyms). Engines pass the newest fence they know to later
batches (:class:`FenceMemo`), so a run stops at the first batch that finds a tombstone
and writes the new data once it has seen an update.

Example::

    settled = driver.run(settle("cluster_3", layout.fix, {key: copy_ids}, seqs={key: 0}, timeout=10.0,
                                parties=Parties({key: sender}, {key: receivers}), pseudonyms=Pseudonyms()))
    if settled.fences[key].deleted: ...   # the copies just written are gone again
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timezone
from typing import Any, ClassVar

import attrs

from ...errors import ClusterError, ItemDeleted, RequestRefused, SenderErased
from ..policy import RetryPolicy, deadline_in
from ..layouts import Writer
from ..pseudonyms import Pseudonyms
from ..steps import Collection, Concurrently, Delete, Failure, Find, Insert, Program, Request
from .insert import insert_program


__all__ = [
    "DELETED", "EDITS_COLLECTION", "ERASED", "ERASURES_COLLECTION", "Fence", "FenceMemo", "Fixer", "NEVER", "Parties",
    "Settled", "drop_superseded", "forget", "mark_deleted", "mark_updated", "read_erasures", "read_fences",
    "refuse_deleted", "settle",
]

log = logging.getLogger(__name__)
UTC = timezone.utc
#: The collection, in every cluster, that holds the edit records.
EDITS_COLLECTION: Collection = "edits"
#: The collection, in every cluster, that holds the erasure records (:mod:`router.core.privacy.erasure`).
ERASURES_COLLECTION: Collection = "erasures"
#: A tombstone's ``seq``: above every update's.
DELETED = 2**62
#: The ``seq`` of the fence of a post whose sender was erased: above a tombstone's, and as final.
ERASED = DELETED + 1
_SORT = [("seq", -1)]
_PROJECTION = {"_id": 0, "data_key": 1, "seq": 1, "data": 1}


@attrs.frozen
class Fence:
    """What the edit records say of one ``data_key``: the newest edit's ``seq`` (0: never edited) and, for an
    update, its ``data``. Frozen, so engines share it between batches."""

    seq: int = 0
    data: Mapping[str, Any] | None = None

    @property
    def deleted(self) -> bool:
        """True once the ``data_key`` was deleted, or its sender erased (final)."""
        return self.seq >= DELETED

    @property
    def erased(self) -> bool:
        """True once the post's sender was erased (final; :attr:`deleted` is true too)."""
        return self.seq >= ERASED

    @property
    def updated(self) -> bool:
        """True when the newest edit is an update: copies must carry :attr:`data`."""
        return 0 < self.seq < DELETED

    def newer(self, other: Fence | None) -> Fence:
        """The newer of this fence and *other* (a tombstone is newer than every update)."""
        return other if other is not None and other.seq > self.seq else self


#: The fence of a ``data_key`` that was never edited.
NEVER = Fence()
#: The fence of a post whose sender was erased.
SENDER_ERASED = Fence(ERASED)


@attrs.frozen
class Parties:
    """Whom documents just written name, for the erasure check: each ``data_key``'s sender, and for copies the
    receiver of each ``_id`` (``receivers[key][i]`` is the receiver of the key's ``i``-th id; absent: no receiver,
    as an outbox entry has)."""

    senders: Mapping[str, int | str]
    receivers: Mapping[str, Sequence[int | str]] = attrs.field(factory=dict)
    #: What removes everything a cluster's feed holds for an erased receiver (``(cluster, receiver)``: the layout's
    #: :meth:`~router.core.layouts.Layout.remove_received`): a bucket is its receiver's document, so removing the copies
    #: just written would leave it naming them. Without it, only the copies just written are removed.
    forget: Callable[[str, int | str], Program[tuple[int, Any]]] | None = None


@attrs.frozen
class Settled:
    """What :func:`settle` found: each key's fence, and the receivers found erased (their copies just written were
    removed again; none of them gets a copy)."""

    fences: dict[str, Fence]
    erased: frozenset[int | str] = frozenset()


def fence_of(records: Sequence[Mapping[str, Any]]) -> dict[str, Fence]:
    """The newest fence per ``data_key`` among edit *records* (malformed ones are ignored)."""
    fences: dict[str, Fence] = {}
    for record in records:
        key, seq = record.get("data_key"), record.get("seq")
        if not isinstance(key, str) or not isinstance(seq, int) or isinstance(seq, bool) or seq <= 0:
            continue  # (a tombstone's seq comes back as bson.Int64, an int)
        seq = int(seq)
        data = record.get("data") if seq < DELETED else None
        fence = Fence(seq, data if isinstance(data, Mapping) else None)
        fences[key] = fences.get(key, NEVER).newer(fence)
    return fences


def read_fences(cluster: str, keys: Sequence[str], deadline: float) -> Program[dict[str, Fence] | Failure]:
    """The fence of each of *keys* in *cluster* (one ``find``); keys never edited are absent."""
    if len(keys) == 1:
        query: Mapping[str, Any] = {"data_key": keys[0]}
        found = yield Find(cluster, EDITS_COLLECTION, query, deadline, sort=_SORT, limit=1, projection=_PROJECTION)
    else:
        query = {"data_key": {"$in": list(keys)}}
        found = yield Find(cluster, EDITS_COLLECTION, query, deadline, projection=_PROJECTION)
    if isinstance(found, Failure):
        return found
    return fence_of(found)


def read_erasures(cluster: str, pseudonyms: Sequence[bytes], deadline: float) -> Program[set[bytes] | Failure]:
    """Which of *pseudonyms* have an erasure record in *cluster* (one ``find``, by the index ``user``)."""
    found = yield Find(cluster, ERASURES_COLLECTION, {"user": {"$in": list(pseudonyms)}}, deadline,
                       projection={"_id": 0, "user": 1})
    if isinstance(found, Failure):
        return found
    return {bytes(d["user"]) for d in found if isinstance(d.get("user"), bytes)}


def _fences_and_erasures(
    cluster: str, keys: Sequence[str], people: Mapping[bytes, int | str], deadline: float
) -> Program[tuple[dict[str, Fence], set[int | str]] | Failure]:
    """The fences of *keys* and which of *people* (by pseudonym) were erased, read at the same time."""
    if not people:
        only = yield from read_fences(cluster, keys, deadline)
        return only if isinstance(only, Failure) else (only, set())
    fences, erased = yield Concurrently([read_fences(cluster, keys, deadline),
                                         read_erasures(cluster, list(people), deadline)], [cluster, cluster])
    for answer in (fences, erased):
        if isinstance(answer, Failure):
            return answer
    return fences, {people[p] for p in erased}


def refuse_deleted(
    cluster: str, data_key: str, *, timeout: float, sender: int | str | None = None,
    pseudonyms: Pseudonyms | None = None,
) -> Program[Fence]:
    """The fence of *data_key* in *cluster*; raises :class:`ItemDeleted` for a deleted one (:class:`SenderErased`
    when *sender*, given with *pseudonyms*, was erased), the cluster's error if it cannot be read."""
    people = pseudonyms.many([sender]) if sender is not None and pseudonyms is not None else {}
    found = yield from _fences_and_erasures(cluster, [data_key], people, deadline_in(timeout))
    if isinstance(found, Failure):
        raise found.error
    fences, erased = found
    if erased:
        raise SenderErased(data_key)
    fence = fences.get(data_key, NEVER)
    if fence.deleted:
        raise ItemDeleted(data_key)
    return fence


#: What removes (data None) or re-datas the just-written documents of a key: a layout's ``fix``, or the outbox's.
Fixer = Callable[[str, str, Sequence[Any], "Mapping[str, Any] | None", float], list[Request]]


def settle(
    cluster: str, fix: Fixer, written: Mapping[str, Sequence[Any]], *, seqs: Mapping[str, int] | None = None,
    timeout: float, parties: Parties | None = None, pseudonyms: Pseudonyms | None = None,
) -> Program[Settled | Failure]:
    """Bring documents just written up to the fence: remove those of deleted keys, re-apply newer updates, and (with
    *parties* and *pseudonyms*) remove those of erased senders and the copies of erased receivers.

    *written* maps each ``data_key`` to the ``_id``\\ s just written (copies, by the cluster's
    layout, or an entry in ``outbox``), and *fix* gives the requests that remove or re-data
    them; *seqs* gives the edit each key's data came from (0, the default: the data as
    published). Reads the fence again after every update it applies, until nothing newer
    is found. Returns each key's fence (:data:`ERASED` for an erased sender's) and the
    erased receivers, or the :class:`Failure` that stopped it (the documents are then in
    doubt: report them not written).
    """
    deadline = deadline_in(timeout)
    pending = {key: (seqs or {}).get(key, 0) for key in written}
    fences: dict[str, Fence] = {}
    people: dict[bytes, int | str] = {}
    if parties is not None and pseudonyms is not None:
        people = pseudonyms.many(itertools.chain(parties.senders.values(), *parties.receivers.values()))
    found_erased: set[int | str] = set()
    receivers: set[int | str] = set()
    first = True
    while pending:
        if first:
            first = False
            both = yield from _fences_and_erasures(cluster, list(pending), people, deadline)
            if isinstance(both, Failure):
                return both
            found, found_erased = both
            if found_erased:
                assert parties is not None
                outcome = yield from _drop_erased(cluster, fix, written, parties, found_erased, deadline)
                if isinstance(outcome, Failure):
                    return outcome
                gone, receivers = outcome
                fences.update({key: SENDER_ERASED for key in gone})
                pending = {key: seq for key, seq in pending.items() if key not in gone}
        else:
            again = yield from read_fences(cluster, list(pending), deadline)
            if isinstance(again, Failure):
                return again
            found = again
        doomed = [key for key in pending if found.get(key, NEVER).deleted]
        newer = {key: found[key].seq for key, seq in pending.items() if key in found and seq < found[key].seq < DELETED}
        fences.update({key: found.get(key, NEVER) for key in pending})
        for key in doomed + list(newer):
            data = fences[key].data if key in newer else None
            for request in fix(cluster, key, written[key], data, deadline):
                answer = yield request
                if isinstance(answer, Failure):
                    return answer
        if doomed or newer:
            log.info("cluster %s: documents written under an edit: %d keys' documents removed, %d keys' updated again",
                     cluster, len(doomed), len(newer), extra={"cluster": cluster})
        pending = newer
    return Settled(fences, frozenset(receivers))


def _drop_erased(
    cluster: str, fix: Fixer, written: Mapping[str, Sequence[Any]], parties: Parties, erased: set[int | str],
    deadline: float,
) -> Program[tuple[set[str], set[int | str]] | Failure]:
    """Remove the documents just written of erased senders (whole keys) and for erased receivers (their ids);
    return the keys removed whole and the receivers whose copies were removed."""
    gone = {key for key, sender in parties.senders.items() if key in written and sender in erased}
    receivers: set[int | str] = set()
    for key, ids in written.items():
        if key in gone:
            chosen = list(ids)
        else:
            names = parties.receivers.get(key, ())
            chosen = [oid for oid, receiver in zip(ids, names) if receiver in erased]
            receivers.update(receiver for receiver in names if receiver in erased)
            if parties.forget is not None:  # the receivers' documents go whole, below
                continue
        for request in fix(cluster, key, chosen, None, deadline) if chosen else ():
            answer = yield request
            if isinstance(answer, Failure):
                return answer
    forget = parties.forget
    if forget is not None:
        for receiver in sorted(receivers, key=str):
            _removed, error = yield from forget(cluster, receiver)
            if error is not None:
                trouble = _cluster_error(cluster, error)
                return Failure("refused" if isinstance(trouble, RequestRefused) else "unavailable", trouble)
    log.info("cluster %s: documents written for erased users removed again: %d keys whole, copies of %d receivers",
             cluster, len(gone), len(receivers), extra={"cluster": cluster})
    return gone, receivers


class _Records(Writer[list[dict[str, Any]]]):
    """Fence records, stored as they are (their ids, ``<data_key>#<seq>``, say what they are: a duplicate is the
    same record)."""

    collection: ClassVar[Collection] = "edits"

    def documents(self, batch: list[dict[str, Any]]) -> list[Any]:
        return batch

    def store(self, cluster: str, documents: Sequence[Any], deadline: float, *, again: bool = False) -> Request:
        return Insert(cluster, EDITS_COLLECTION, documents, deadline)


_RECORDS = _Records()


def _record(data_key: str, seq: int, data: Mapping[str, Any] | None) -> dict[str, Any]:
    deleted = seq >= DELETED
    return {"_id": f"{data_key}#{'deleted' if deleted else seq}", "data_key": data_key, "seq": seq,
            "kind": "deleted" if deleted else "update", "data": None if deleted else dict(data or {}),
            "at": datetime.now(UTC)}


def _cluster_error(cluster: str, error: BaseException) -> ClusterError:
    """What stopped a fence record: the cluster's error, or (a record refused for itself, an ItemRefused) the refusal
    of the request."""
    if isinstance(error, ClusterError):
        return error
    code = getattr(error, "code", None)
    return RequestRefused(cluster, f"the fence record was refused: {error}", code=code if isinstance(code, int) else None)


def mark_deleted(cluster: str, data_key: str, *, policy: RetryPolicy, timeout: float) -> Program[ClusterError | None]:
    """Leave *data_key*'s tombstone in *cluster* (before any copy is deleted); the error that stopped it, or None.

    The update records it supersedes are :func:`drop_superseded`'s, once it is stored.
    """
    result = yield from insert_program(cluster, _RECORDS, [_record(data_key, DELETED, None)], policy=policy,
                                       deadline=deadline_in(timeout), duplicates="present")
    if result.failed:
        return _cluster_error(cluster, result.failed[0])
    return None


def drop_superseded(cluster: str, data_key: str, *, timeout: float) -> Program[None]:
    """Remove *data_key*'s update records from *cluster*, once its tombstone is stored (never before: until then the
    newest update is what a writer must apply). They decide nothing any more (the tombstone wins), but hold the
    post's data; a failure leaves them to the next ``delete`` or the post's erasure."""
    answer = yield Delete(cluster, EDITS_COLLECTION, {"data_key": data_key, "seq": {"$lt": DELETED}}, deadline_in(timeout))
    if isinstance(answer, Failure):
        log.info("cluster %s: the edit records a tombstone supersedes were not removed: %s", cluster, answer.error,
                 extra={"cluster": cluster})


def mark_updated(
    cluster: str, data_key: str, data: Mapping[str, Any], *, policy: RetryPolicy, timeout: float
) -> Program[ClusterError | None]:
    """Record an update of *data_key* in *cluster* under the next ``seq`` (before any copy is updated).

    Records nothing for a deleted key (its copies are gone and stay gone). Returns the
    error that stopped it, or None.
    """
    deadline = deadline_in(timeout)
    while True:
        found = yield from read_fences(cluster, [data_key], deadline)
        if isinstance(found, Failure):
            return found.error
        newest = found.get(data_key, NEVER)
        if newest.deleted:
            return None
        seq = newest.seq + 1
        result = yield from insert_program(cluster, _RECORDS, [_record(data_key, seq, data)], policy=policy,
                                           deadline=deadline, duplicates="present")
        if result.failed:
            error = result.failed[0]
            return _cluster_error(cluster, error)
        if result.written:  # this seq is ours; the older records are superseded
            yield Delete(cluster, EDITS_COLLECTION, {"data_key": data_key, "seq": {"$lt": seq}}, deadline)
            return None
        # another update took this seq first: read again and take the next one


def forget(cluster: str, keys: Sequence[str], deadline: float) -> Delete:
    """The request that removes every edit record of *keys* in *cluster* (an erasure: an update's record holds the
    post's data)."""
    return Delete(cluster, EDITS_COLLECTION, {"data_key": {"$in": list(keys)}}, deadline)


class FenceMemo:
    """The newest fence this process has seen per ``data_key`` (at most *size* keys, an update's with its
    ``data``): what a Celery worker passes to its next batch of the same post, so a deleted post's queued
    batches write nothing and an updated one's write the new data."""

    def __init__(self, size: int = 1024) -> None:
        self._size = size
        self._lock = threading.Lock()
        self._fences: OrderedDict[str, Fence] = OrderedDict()

    def known(self, data_key: str) -> Fence:
        """The newest fence seen for *data_key* (:data:`NEVER` if none)."""
        with self._lock:
            return self._fences.get(data_key, NEVER)

    def learn(self, data_key: str, fence: Fence | None) -> None:
        """Remember *fence* for *data_key* if it is newer than what is known."""
        if fence is None or fence.seq == 0:
            return
        with self._lock:
            self._fences[data_key] = self._fences.get(data_key, NEVER).newer(fence)
            self._fences.move_to_end(data_key)
            while len(self._fences) > self._size:
                self._fences.popitem(last=False)
