"""Query helpers every layout may use: positions in the newest-first order, edits in bounded steps, id chunks.

Neutral ground between the layouts (:mod:`.copies`, :mod:`.buckets`, :mod:`.outbox`), which
never import each other. A helper here may name a stored field that several layouts store
alike (``event_time``, ``data_key``, ``data``); what only one layout stores stays in it.

**Edits in steps** (:func:`in_steps`). No single request grows with the number of copies
(a fan-out to millions): a step edits the matching documents up to an ``_id`` pivot,
chosen from a sample of matching ids (one cheap, unsorted ``find``) so that a step edits
about ``step`` documents. The share adapts from step to step to what was actually edited,
so it suits random ids (fan-out copies) and sequential ones alike. A step the server
refuses as too large (FerretDB's statement parameter limits: 32,766 on SQLite, 65,535 on
PostgreSQL) is retried at a quarter of the size. On MongoDB each step is an index scan; on
FerretDB, which filters ranges after fetching every match, a step costs time in proportion
to the matches left.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from ...cursor import Position
from ..policy import deadline_in
from ..steps import Collection, Delete, Failure, Find, Program, Request, Update, UpdateOutcome
from .base import EditSettings, Edited

__all__ = ["IDS_PER_STATEMENT", "PAGE_SORT", "chunks", "fix_requests", "in_steps", "key_edit", "newer_than", "older_than",
           "outside_clause"]

log = logging.getLogger(__name__)
#: The order of a page, and of the index every page query uses.
PAGE_SORT = (("event_time", -1), ("_id", -1))
#: The most ids one statement names (FerretDB turns each into a statement parameter).
IDS_PER_STATEMENT = 10_000
#: Steps between two progress lines in the log.
PROGRESS_EVERY = 10


def chunks(ids: Sequence[Any]) -> list[list[Any]]:
    """*ids* in lists of at most :data:`IDS_PER_STATEMENT`."""
    return [list(ids[i:i + IDS_PER_STATEMENT]) for i in range(0, len(ids), IDS_PER_STATEMENT)]


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
) -> Program[Edited]:
    """Delete (or, with *update*, update) every document matching *match*, about ``step`` at a time.

    *match* must stop matching a document once it is edited (an update excludes its own
    result), so the loop ends. Returns how many were changed, and the error that stopped it.
    When the first sample holds every match, that is one ``find`` and one edit; a copy
    written after the edit is a race every edit has, and calling it again removes it.
    """
    done = steps = 0
    size = settings.sample
    left: float = 10.0 * size  # matching documents left: a guess, then what each step suggests
    while True:
        sample = yield Find(cluster, collection, match, deadline_in(settings.timeout), projection={"_id": 1}, limit=size)
        if isinstance(sample, Failure):
            return done, sample.error
        if not sample:
            return done, None
        ids = sorted(d["_id"] for d in sample)
        position = len(ids)
        target: Mapping[str, Any] = match  # fewer than a sample left: every one of them, in one statement
        if len(ids) == size:
            position = min(len(ids), max(1, int(len(ids) * settings.step / max(left, 1.0))))
            target = {**match, "_id": {"$lte": ids[position - 1]}}
            if steps == 0:
                log.info("cluster %s: %s: more than %d documents, in steps of about %d", cluster, what, size, settings.step)
        deadline = deadline_in(settings.timeout)
        if update is None:
            answer = yield Delete(cluster, collection, target, deadline)
        else:
            answer = yield Update(cluster, collection, target, update, deadline, array_filters=array_filters)
        if isinstance(answer, Failure):
            if answer.kind == "too_large" and position > 1:
                left = max(left, 1.0) * 4 * max(1.0, len(ids) / position)  # the range held far more: narrow it
                continue
            return done, answer.error
        edited = answer.modified if isinstance(answer, UpdateOutcome) else answer
        done += edited
        steps += 1
        if target is match:  # every match was in the sample, and that statement edited them all
            return done, None
        if edited:  # the sample's share of the range, scaled to what the range really held
            left = max(edited * len(ids) / position - edited, 0.0)
        if steps % PROGRESS_EVERY == 0:
            log.info("cluster %s: %s: %d documents so far, about %d left, %d steps", cluster, what, done, left, steps)


def key_edit(data_key: str, data: Mapping[str, Any] | None) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The match and update (None: delete) of every document of *data_key* (copies and outbox entries alike)."""
    if data is None:
        return {"data_key": data_key}, None
    return {"data_key": data_key, "data": {"$ne": data}}, {"$set": {"data": data}}


def fix_requests(cluster: str, collection: Collection, data_key: str, ids: Sequence[Any],
                 data: Mapping[str, Any] | None, deadline: float) -> list[Request]:
    """Remove (or re-data) the documents of *data_key* among *ids*, a statement per :data:`IDS_PER_STATEMENT`."""
    match, update = key_edit(data_key, data)
    out: list[Request] = []
    for chunk in chunks(ids):
        # data_key first: FerretDB fetches only that key's documents, then filters the ids
        target = {**match, "_id": {"$in": chunk}}
        out.append(Delete(cluster, collection, target, deadline) if update is None
                   else Update(cluster, collection, target, update, deadline))
    return out


def outside_clause(start: datetime | None, end: datetime | None, *, earliest: str, latest: str) -> dict[str, Any]:
    """Documents whose *earliest* field is before *start* or whose *latest* field is at or after *end*."""
    clauses = ([{earliest: {"$lt": start}}] if start is not None else []) + ([{latest: {"$gte": end}}] if end is not None else [])
    return {} if not clauses else clauses[0] if len(clauses) == 1 else {"$or": clauses}
