"""Query helpers every layout may use: positions in the newest-first order, edits in bounded steps, id chunks.

Neutral ground between the layouts (:mod:`.copies`, :mod:`.buckets`, :mod:`.outbox`), which
never import each other. A helper here may name a stored field that several layouts store
alike (``event_time``, ``data_key``, ``data``); what only one layout stores stays in it.

**Edits in steps** (:func:`in_steps`). No single request grows with the number of copies
(a fan-out to millions) beyond what finishes in time: a step edits the matching documents
up to an ``_id`` pivot, chosen from a sample of matching ids (one cheap, unsorted ``find``)
so that a step edits about ``step`` documents. The share adapts from step to step to what
was actually edited, so it suits random ids (fan-out copies) and sequential ones alike. A
step the server refuses as too large (FerretDB's statement parameter limits: 32,766 on
SQLite, 65,535 on PostgreSQL), or that runs out of ``timeout``, is tried again at a quarter
of the size. A ``delete`` first tries every match in one request, given a quarter of
``timeout``, and samples only when that does not finish: most deletes are one request. On
MongoDB and FerretDB 2 each step is an index range; on FerretDB 1, which filters ranges
after fetching every match, a step costs time in proportion to the matches left (and
FerretDB 1 finishes a statement whose client gave up, so further calls find that work done).

**Updates match a digest.** An update sets ``data`` and ``data_digest`` (:func:`digest`)
and matches documents whose digest differs: matching the data itself would carry it twice
in one statement, and data over about 8 MiB would not fit in 16 MiB.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import bson

from ...cursor import Position
from ..policy import deadline_in
from ..steps import Collection, Delete, Failure, Find, Program, Request, Update, UpdateOutcome
from .base import EditSettings, Edited

__all__ = ["DIGEST", "IDS_PER_STATEMENT", "QUICK_SHARE", "PAGE_SORT", "chunks", "digest", "fix_requests", "in_steps", "key_edit", "newer_than", "older_than",
           "outside_clause"]

log = logging.getLogger(__name__)
#: The order of a page, and of the index every page query uses.
PAGE_SORT = (("event_time", -1), ("_id", -1))
#: The most ids one statement names (FerretDB turns each into a statement parameter).
IDS_PER_STATEMENT = 10_000
#: Steps between two progress lines in the log.
PROGRESS_EVERY = 10
#: Times in a row a step that ran out of time is split in four and tried again, before the call gives up.
SPLITS = 3
#: The share of ``timeout`` a quick step takes: steps grow back after one, and an edit tried at once
#: (:func:`in_steps`' *at_once*) gets this much.
QUICK_SHARE = 0.25
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


def in_steps(
    cluster: str, collection: Collection, match: Mapping[str, Any], settings: EditSettings, *,
    update: Mapping[str, Any] | None = None, array_filters: Sequence[Mapping[str, Any]] | None = None, what: str,
    at_once: bool = False,
) -> Program[Edited]:
    """Delete (or, with *update*, update) every document matching *match*, about ``step`` at a time.

    *match* must stop matching a document once it is edited (an update excludes its own
    result), so the loop ends, and a further call goes on where this one stopped. Returns
    how many were changed, and the error that stopped it. When the first sample holds
    every match, that is one ``find`` and one edit; a copy written after the edit is a race
    every edit has, and calling it again removes it.

    **At once first** (*at_once*, what ``delete`` asks): one edit of every match, with no
    sample, given :data:`QUICK_SHARE` of ``timeout``; only when the server stops it at
    that limit, it is answered too late, or refused as too large, do the sample and the
    steps below follow. So an edit that fits in one step costs one request; a bigger one
    costs that share of ``timeout`` more (FerretDB 2 rolls a stopped statement back whole:
    nothing is counted twice or lost; MongoDB keeps what a stopped statement removed, so
    there the count misses those documents).

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
    if at_once:
        deadline = deadline_in(settings.timeout * QUICK_SHARE)
        first = yield (Delete(cluster, collection, match, deadline) if update is None
                       else Update(cluster, collection, match, update, deadline, array_filters=array_filters))
        if not isinstance(first, Failure):
            return (first.modified if isinstance(first, UpdateOutcome) else first), None
        if first.kind not in ("cancelled", "timeout", "too_large"):
            return 0, first.error
        log.info("cluster %s: %s: not done at once within %.1f s; in steps instead", cluster, what,
                 settings.timeout * QUICK_SHARE)
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
                if whole:  # a quarter of the matches the sample holds
                    per_step = max(1.0, position / 4)
                else:  # the range held far more: narrow it
                    left = max(left, 1.0) * 4 * max(1.0, len(ids) / position)
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
        if took < settings.timeout * QUICK_SHARE:  # grow back after a split, while steps stay quick
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



def outside_clause(start: datetime | None, end: datetime | None, *, earliest: str, latest: str) -> dict[str, Any]:
    """Documents whose *earliest* field is before *start* or whose *latest* field is at or after *end*."""
    clauses = ([{earliest: {"$lt": start}}] if start is not None else []) + ([{latest: {"$gte": end}}] if end is not None else [])
    return {} if not clauses else clauses[0] if len(clauses) == 1 else {"$or": clauses}
