"""``copies``: one document per copy, the router's first layout (and the default).

A copy is stored as exactly ``{_id, data_key, receiver_id, sender_id, event_time, type,
data}`` in ``feed`` (the entry itself); an update adds ``data_digest`` (:func:`key_edit`). A page is one index-ordered ``find`` on
``{receiver_id: 1, event_time: -1, _id: -1}``; a delete or update by key walks the
``{data_key: 1}`` index in bounded steps.

**Edits in steps.** No single request grows with the number of copies (a fan-out to
millions): a step edits the matching documents up to an ``_id`` pivot, chosen from a
sample of matching ids (one cheap, unsorted ``find``) so that a step edits about
``step`` documents. The share adapts from step to step to what was actually edited, so
it suits random ids (fan-out copies) and sequential ones alike. A step the server
refuses as too large (FerretDB's statement parameter limits: 32,766 on SQLite, 65,535
on PostgreSQL), or that runs out of ``timeout``, is tried again at a quarter of
the size (:func:`in_steps`). On MongoDB and FerretDB 2 each step is an index range; on
FerretDB 1, which filters ranges after fetching every match, a step costs time in
proportion to the matches left (and FerretDB 1 finishes a statement whose client gave
up, so further calls find that work done).
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, ClassVar

import bson
from bson import ObjectId

from ...cursor import Position
from ...model import FeedItem
from ..policy import deadline_in
from ..steps import Collection, Count, Delete, Failure, Find, Insert, Program, Request, Update, UpdateOutcome
from .base import EditSettings, Edited, Entry, IndexSpec, Inbox, Layout, outside_clause

__all__ = ["Copies", "DIGEST", "IDS_PER_STATEMENT", "PAGE_SORT", "chunks", "digest", "older_than", "in_steps"]

log = logging.getLogger(__name__)
#: The order of a page, and of the index every page query uses.
PAGE_SORT = (("event_time", -1), ("_id", -1))
#: The order of an export (the page index, walked backwards).
OLDEST_FIRST = (("event_time", 1), ("_id", 1))
#: The most ids one statement names (FerretDB turns each into a statement parameter).
IDS_PER_STATEMENT = 10_000
#: Steps between two progress lines in the log.
PROGRESS_EVERY = 10
#: Times in a row a step that ran out of time is split in four and tried again, before the call gives up.
SPLITS = 3
#: The field an updated copy (or outbox entry) carries beside its ``data``: :func:`digest` of that data.
DIGEST = "data_digest"
#: What one statement may hold: MongoDB's 16 MiB document limit, less room for a key and the operators.
STATEMENT_BYTES = 16 * 1024 * 1024 - 16 * 1024
#: What one id takes in an ``$in`` list (an ObjectId, its type and its index key).
ID_BYTES = 20


def chunks(ids: Sequence[Any], *, beside: int = 0) -> list[list[Any]]:
    """*ids* in lists of at most :data:`IDS_PER_STATEMENT`, fewer when each statement also carries *beside* bytes
    (new data), so that it stays within :data:`STATEMENT_BYTES`."""
    size = max(1, min(IDS_PER_STATEMENT, (STATEMENT_BYTES - beside) // ID_BYTES))
    return [list(ids[i:i + size]) for i in range(0, len(ids), size)]


def digest(data: Mapping[str, Any]) -> str:
    """A digest of *data* as BSON (16 bytes of BLAKE2b, in hex): what an update matches on instead of the data."""
    return hashlib.blake2b(bson.encode(data), digest_size=16).hexdigest()


def older_than(position: Position | None, id_field: str = "_id") -> dict[str, Any]:
    """The clause for documents strictly after *position* in newest-first ``(event_time, id_field)`` order."""
    if position is None:
        return {}
    return {"$or": [{"event_time": {"$lt": position.event_time}},
                    {"event_time": position.event_time, id_field: {"$lt": position.id}}]}


def newer_than(position: Position | None, id_field: str = "_id") -> dict[str, Any]:
    """The clause for documents strictly before *position* in newest-first order (newer than it)."""
    if position is None:
        return {}
    return {"$or": [{"event_time": {"$gt": position.event_time}},
                    {"event_time": position.event_time, id_field: {"$gt": position.id}}]}


def item_of(doc: Mapping[str, Any], receiver_id: int | str | None = None) -> FeedItem:
    """The item of a stored copy or an entry (or of a copy inside a bucket, which has no ``receiver_id`` of its own:
    pass it)."""
    return FeedItem(receiver_id=doc["receiver_id"] if receiver_id is None else receiver_id, sender_id=doc["sender_id"],
                    event_time=doc["event_time"], type=doc["type"], data=doc["data"], data_key=doc["data_key"],
                    id=doc["_id"])


def in_steps(
    cluster: str, collection: Collection, match: Mapping[str, Any], settings: EditSettings, *,
    update: Mapping[str, Any] | None = None, array_filters: Sequence[Mapping[str, Any]] | None = None, what: str,
) -> Program[Edited]:
    """Delete (or, with *update*, update) every document matching *match*, about ``step`` at a time.

    *match* must stop matching a document once it is edited (an update excludes its own
    result), so the loop ends, and a further call goes on where this one stopped. Returns
    how many were changed, and the error that stopped it. When the first sample holds
    every match, that is one ``find`` and one edit; a copy written after the edit is a race
    every edit has, and calling it again removes it.

    **Steps that run out of time are split.** A step the server stops at its time limit
    (``cancelled``: the request's ``timeout``, sent as ``maxTimeMS``) or whose answer did not
    come in time (``timeout``) is tried again at a quarter of its size (re-sampled first:
    MongoDB may have done part of it), up to :data:`SPLITS` times in a row; after a quick
    step (under a quarter of ``timeout``) the next one doubles, back up to ``step``. So a
    slow server gets steps it can finish, and a call that must stop leaves every step it
    finished done. The two are alike here: pymongo gives the server the client's time less
    one round trip, so the server's "stopped" answer often arrives after the client gave
    up (measured on FerretDB 2 under load: every such step). FerretDB 1 ignores
    ``maxTimeMS`` and finishes a step the client gave up on; there the smaller steps wait
    behind it, and the call ends after its splits, the next call finding that work done.
    """
    done = steps = splits = 0
    size = settings.sample
    left: float = 10.0 * size  # matching documents left: a guess, then what each step suggests
    per_step = float(settings.step)  # documents a step should edit: less after a step the server stopped
    while True:
        sample = yield Find(cluster, collection, match, deadline_in(settings.timeout), projection={"_id": 1}, limit=size)
        if isinstance(sample, Failure):
            return done, sample.error
        if not sample:
            return done, None
        ids = sorted(d["_id"] for d in sample)
        whole = len(ids) < size  # the sample holds every match
        position = max(1, min(len(ids), int(len(ids) * per_step / (len(ids) if whole else max(left, 1.0)))))
        target: Mapping[str, Any] = match  # every match left, in one statement
        if not (whole and position == len(ids)):
            target = {**match, "_id": {"$lte": ids[position - 1]}}
            if steps == 0 and splits == 0 and not whole:
                log.info("cluster %s: %s: more than %d documents, in steps of about %d", cluster, what, size, settings.step)
        began = time.monotonic()
        deadline = began + settings.timeout
        if update is None:
            answer = yield Delete(cluster, collection, target, deadline)
        else:
            answer = yield Update(cluster, collection, target, update, deadline, array_filters=array_filters)
        if isinstance(answer, Failure):
            if answer.kind == "too_large" and position > 1:
                left = max(left, 1.0) * 4 * max(1.0, len(ids) / position)  # the range held far more: narrow it
                continue
            if answer.kind in ("cancelled", "timeout") and position > 1 and splits < SPLITS:
                splits += 1
                per_step = max(1.0, min(per_step, _docs_in(position, ids, whole, left)) / 4)
                log.info("cluster %s: %s: a step of about %d documents ran out of time (%.1f s); trying a quarter of it",
                         cluster, what, _docs_in(position, ids, whole, left), settings.timeout)
                continue
            return done, answer.error
        took = time.monotonic() - began
        edited = answer.modified if isinstance(answer, UpdateOutcome) else answer
        done += edited
        steps += 1
        splits = 0
        if target is match:  # every match was in the sample, and that statement edited them all
            return done, None
        if edited and not whole:  # the sample's share of the range, scaled to what the range really held
            left = max(edited * len(ids) / position - edited, 0.0)
        if took < settings.timeout / 4:  # grow back after a split, while steps stay quick
            per_step = min(float(settings.step), per_step * 2)
        if steps % PROGRESS_EVERY == 0:
            log.info("cluster %s: %s: %d documents so far, about %d left, %d steps", cluster, what, done, left, steps)


def _docs_in(position: int, ids: Sequence[Any], whole: bool, left: float) -> float:
    """About how many documents a step up to ``ids[position - 1]`` covers."""
    return float(position) if whole else position * max(left, 1.0) / len(ids)


def key_edit(data_key: str, data: Mapping[str, Any] | None) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The match and update (None: delete) of every document of *data_key* (copies and outbox entries alike).

    An update sets ``data`` and its :func:`digest`, and matches the documents whose digest
    differs (which excludes each document once updated, so a sweep ends and a further call
    goes on where the last stopped). Matching on the data itself would carry it twice in
    one statement: data over about 8 MiB would not fit in 16 MiB.
    """
    if data is None:
        return {"data_key": data_key}, None
    mark = digest(data)
    return {"data_key": data_key, DIGEST: {"$ne": mark}}, {"$set": {"data": data, DIGEST: mark}}


def fix_requests(cluster: str, collection: Collection, data_key: str, ids: Sequence[Any],
                 data: Mapping[str, Any] | None, deadline: float) -> list[Request]:
    """Remove (or re-data) the documents of *data_key* among *ids*, a statement per :data:`IDS_PER_STATEMENT` (fewer
    ids beside big data)."""
    match, update = key_edit(data_key, data)
    out: list[Request] = []
    for chunk in chunks(ids, beside=0 if data is None else len(bson.encode(data))):
        # data_key first: FerretDB fetches only that key's documents, then filters the ids
        target = {**match, "_id": {"$in": chunk}}
        out.append(Delete(cluster, collection, target, deadline) if update is None
                   else Update(cluster, collection, target, update, deadline))
    return out


class Copies(Layout):
    """One document per copy in ``feed``: the default layout."""

    name: ClassVar[str] = "copies"

    def store(self, cluster: str, entries: Sequence[Entry], deadline: float, *, again: bool = False) -> Request:
        return Insert(cluster, "feed", entries, deadline)

    def lookup(self, cluster: str, entries: Sequence[Entry], deadline: float) -> Find:
        return Find(cluster, "feed", {"_id": {"$in": [e["_id"] for e in entries]}}, deadline)

    def looked_up(self, docs: Sequence[Mapping[str, Any]], ids: Sequence[ObjectId]) -> list[Entry]:
        return [dict(d) for d in docs]

    def fix(self, cluster: str, data_key: str, ids: Sequence[ObjectId], data: Mapping[str, Any] | None,
            deadline: float) -> list[Request]:
        return fix_requests(cluster, "feed", data_key, ids, data, deadline)

    def inbox(self, cluster: str, receiver_id: int | str, position: Position | None, need: int,
              types: tuple[int | str, ...], deadline: float) -> Program[Inbox | Failure]:
        only = {"type": {"$in": list(types)}} if types else {}
        docs = yield Find(cluster, "feed", {"receiver_id": receiver_id, **only, **older_than(position)}, deadline,
                          sort=PAGE_SORT, limit=need)
        if isinstance(docs, Failure):
            return docs
        return Inbox([(d["event_time"], d["_id"], item_of(d)) for d in docs], len(docs) == need)

    def newer(self, cluster: str, receiver_id: int | str, bound: Position | None, need: int,
              deadline: float) -> Program[list[tuple[datetime, ObjectId]] | Failure]:
        docs = yield Find(cluster, "feed", {"receiver_id": receiver_id, **newer_than(bound)}, deadline, sort=PAGE_SORT,
                          limit=need, projection={"_id": 1, "event_time": 1})
        if isinstance(docs, Failure):
            return docs
        return [(d["event_time"], d["_id"]) for d in docs]

    def count_newer(self, cluster: str, receiver_id: int | str, bound: Position | None, limit: int,
                    deadline: float) -> Program[int | Failure]:
        answer = yield Count(cluster, "feed", {"receiver_id": receiver_id, **newer_than(bound)}, deadline, limit=limit)
        return answer if isinstance(answer, Failure) else int(answer)

    def edit_key(self, cluster: str, data_key: str, data: Mapping[str, Any] | None, steps: EditSettings, *,
                 what: str) -> Program[Edited]:
        match, update = key_edit(data_key, data)
        return (yield from in_steps(cluster, "feed", match, steps, update=update, what=what))

    def remove_sender(self, cluster: str, receiver_id: int | str, sender_id: int | str, steps: EditSettings) -> Program[Edited]:
        # The page index's receiver_id prefix serves this query (see migrations/0002).
        match = {"receiver_id": receiver_id, "sender_id": sender_id}
        return (yield from in_steps(cluster, "feed", match, steps, what="unfollow"))

    def remove_sent(self, cluster: str, sender_id: int | str, keys: Sequence[str], steps: EditSettings) -> Program[Edited]:
        # The data_key index finds the keys' copies; the sender is checked on those (a key is one sender's, mostly).
        match = {"data_key": {"$in": list(keys)}, "sender_id": sender_id}
        return (yield from in_steps(cluster, "feed", match, steps, what="erase (sent)"))

    def remove_received(self, cluster: str, receiver_id: int | str, steps: EditSettings) -> Program[Edited]:
        return (yield from in_steps(cluster, "feed", {"receiver_id": receiver_id}, steps, what="erase (received)"))

    def oldest_first(self, cluster: str, receiver_id: int | str, after: Position | None, need: int,
                     deadline: float) -> Program[Inbox | Failure]:
        docs = yield Find(cluster, "feed", {"receiver_id": receiver_id, **newer_than(after)}, deadline,
                          sort=OLDEST_FIRST, limit=need)
        if isinstance(docs, Failure):
            return docs
        return Inbox([(d["event_time"], d["_id"], item_of(d)) for d in docs], len(docs) == need)

    def sent_copy(self, cluster: str, sender_id: int | str, data_key: str,
                  deadline: float) -> Program[FeedItem | None | Failure]:
        docs = yield Find(cluster, "feed", {"data_key": data_key, "sender_id": sender_id}, deadline, limit=1)
        if isinstance(docs, Failure):
            return docs
        return item_of(docs[0]) if docs else None

    def indexes(self, *, sharded: bool = False) -> list[IndexSpec]:
        return [
            IndexSpec("receiver_time_id", (("receiver_id", 1), ("event_time", -1), ("_id", -1))),
            IndexSpec("data_key", (("data_key", 1),)),
        ]

    def outside(self, start: datetime | None, end: datetime | None) -> tuple[dict[str, Any], str]:
        return outside_clause(start, end, earliest="event_time", latest="event_time"), "event_time"
