"""Exact finds: every read of the router comes back in whole first batches, never through ``getMore``.

**Why.** FerretDB 2.7 on DocumentDB returns documents twice, and skips others, when a
result spans several batches and documents of the collection were updated (before the
find or between its batches; no concurrent writes needed): 300 documents, 10 updated,
then ``find({}, batch_size=50)`` never ends (``docs/ferretdb2-cursor-bug.md``). A first
batch is right; continuing it is what goes wrong. So no read here ever continues a cursor.

**How.** A find asks for its whole answer in the first batch: ``batchSize`` one more than
its ``limit`` (every server then closes the cursor once the limit is met, FerretDB 1 too,
which leaves it open after a batch of exactly ``batchSize``), or :data:`WHOLE` when it has
no limit (or a larger one). The server answers so unless the batch would pass 16 MiB (MongoDB and FerretDB 2
stop there; FerretDB 1 and mongo-java-server do not) or :data:`WHOLE` documents: it then
leaves its cursor open. That
cursor is killed, never continued, and the rest is asked by a new find for what comes
*after the last document received*, in the request's order (a keyset: ``{$or: [{a: {$gt:
a0}}, {a: a0, _id: {$gt: id0}}]}``), which is exact whatever the server's cursors do, as long as no document's sort fields
change between the finds. An
order that does not end in ``_id`` (or no order) cannot be continued that way: such a
request is asked again from its start, ordered by its sort and then ``_id``. Only a
result read in more than one find can hold a document twice (one whose sort fields
changed between the finds); it is kept once, by ``_id``.

**Orders that move.** A document whose sort fields change between two finds (a bucket's
``newest`` when an append lands in it) can leave the keyset's side for the side already
read: continued after the last document, such a read would lose it. A request that says
its order moves (``moving``) is continued instead by the documents *not among those
received* (``_id: {$nin: [...]}``), in the same order, for what its limit leaves: no
document is read twice, and one that matches at the last find and was not received is
among those that find could return, so an answer shorter than its limit holds every
document matching then. Its documents then come in each find's order, not in one order
over the whole answer (the buckets walk, which asks this, orders the items it serves
itself).

**Cost.** A result under 16 MiB is one ``find``, as before (no ``getMore``, and no
``killCursors``). A page of 50 one-MiB items: 4 finds instead of a find and 3 getMores.

The walk is a generator without I/O (:func:`walk`): it yields the fields of each ``find``
command and receives each first batch; :func:`read` and :func:`read_async` run it on a
pymongo collection (the core's :class:`~router.core.steps.Find` reaches them through
:mod:`router.storage.requests`; the operator commands call :func:`read` directly).

Example::

    docs = read(coll, {"receiver_id": 7}, sort=[("event_time", -1), ("_id", -1)], limit=200)
"""

from __future__ import annotations

import logging
import time
from collections.abc import Generator, Mapping, Sequence
from typing import Any

import attrs
from pymongo.errors import OperationFailure, PyMongoError

__all__ = ["WHOLE", "Batch", "CursorStuck", "Walk", "max_time_ms", "read", "read_async", "walk"]

log = logging.getLogger(__name__)

#: The most documents one find asks for (its ``batchSize``), with no limit or a larger one: a bigger result is read
#: in several finds. FerretDB 1 sets aside memory for ``batchSize`` documents before it reads any (measured on
#: v1.24.2: 10,000,000 took its RSS from 27 to 195 MB and a find of 5 documents from 5.5 to 11 ms; 2**31 - 1 had it
#: killed for lack of memory); 10,001 costs nothing measurable there.
WHOLE = 10_000

Document = dict[str, Any]
Order = list[tuple[str, int]]


@attrs.frozen
class Batch:
    """A find's first batch, and whether the server left its cursor open (the batch stopped short of the answer)."""

    documents: list[Document]
    more: bool


#: A walk: yields the fields of a ``find`` command (all but ``find`` itself), receives each :class:`Batch`,
#: returns the documents of the request.
Walk = Generator[dict[str, Any], Batch, list[Document]]


class CursorStuck(OperationFailure):
    """Raised when a server answers a find with no document yet leaves its cursor open: there is no last document
    to continue after (no server known to the router does this)."""


def _fields(filter: Mapping[str, Any], order: Order | None, projection: Mapping[str, Any] | None,
            limit: int) -> dict[str, Any]:
    fields: dict[str, Any] = {"filter": filter}
    if order:
        fields["sort"] = dict(order)
    if projection is not None:
        fields["projection"] = projection
    if limit:
        fields["limit"] = limit
    fields["batchSize"] = limit + 1 if 0 < limit <= WHOLE else WHOLE
    return fields


def _after(order: Order, last: Mapping[str, Any]) -> dict[str, Any]:
    """The clause for documents strictly after *last* in *order* (a total order: its last field is ``_id``)."""
    ors: list[dict[str, Any]] = []
    for i, (field, direction) in enumerate(order):
        clause = {f: last[f] for f, _ in order[:i]}
        clause[field] = {"$gt" if direction > 0 else "$lt": last[field]}
        ors.append(clause)
    return ors[0] if len(ors) == 1 else {"$or": ors}


def _total(order: Order) -> Order:
    """*order* as a total order: up to its ``_id`` (fields after it never decide), or with ``_id`` appended."""
    for i, (field, _) in enumerate(order):
        if field == "_id":
            return order[: i + 1]
    return [*order, ("_id", 1)]


def _with_keys(projection: Mapping[str, Any] | None, fields: Sequence[str]) -> tuple[Mapping[str, Any] | None, list[str]]:
    """*projection*, widened so that it returns every one of *fields*, and the fields it had to add."""
    if projection is None:
        return None, []
    widened = dict(projection)
    added: list[str] = []
    including = any(v and k != "_id" for k, v in projection.items())
    for field in fields:
        if field == "_id" or not including:
            if not widened.get(field, 1):
                del widened[field]
                added.append(field)
        elif not widened.get(field):
            widened[field] = 1
            added.append(field)
    return widened, added


def walk(filter: Mapping[str, Any], *, sort: Sequence[tuple[str, int]] | None = None, limit: int = 0,
         projection: Mapping[str, Any] | None = None, moving: bool = False) -> Walk:
    """The finds that read ``find(filter, projection, sort=sort, limit=limit)`` exactly, each answered by its first
    batch alone. Sort fields must be top-level fields. *moving*: the sort fields of a matching document may change
    between two finds, so the rest is read by ``_id`` not received (see the module docstring)."""
    order: Order = [(str(f), int(d)) for f, d in sort or ()]
    if any("." in f for f, _ in order):
        raise ValueError(f"sort: an exact find continues after top-level fields only (got {order})")
    added: list[str] = []
    if moving:  # every document must carry its _id, to be named among those received
        projection, added = _with_keys(projection, ["_id"])
    batch = yield _fields(filter, order, projection, limit)
    got = batch.documents
    if not batch.more and not added:
        return got
    if batch.more and not moving:
        total = _total(order)
        if "_id" not in (f for f, _ in order) or (got and any(f not in got[-1] for f, _ in total)):
            # No keyset to continue after: ask again from the start, in an order that has one.
            projection, added = _with_keys(projection, [f for f, _ in total])
            batch = yield _fields(filter, total, projection, limit)
            got = batch.documents
        order = total
    while batch.more:
        if not batch.documents:
            raise CursorStuck("the server answered a find with no document and left its cursor open")
        left = limit - len(got) if limit else 0
        if limit and left <= 0:
            break
        rest = {"_id": {"$nin": [d["_id"] for d in got]}} if moving else _after(order, batch.documents[-1])
        batch = yield _fields({"$and": [filter, rest]} if filter else rest, order, projection, left)
        got.extend(batch.documents)
        log.debug("a find read in several batches: %d documents so far", len(got))
    seen: set[Any] = set()
    once: list[Document] = []
    for doc in got:
        key = doc.get("_id")
        if key in seen:
            continue
        seen.add(key)
        for field in added:
            doc.pop(field, None)
        once.append(doc)
    return once[:limit] if limit else once


def max_time_ms(until: float) -> int:
    """``maxTimeMS`` for a server that must stop by *until* (a ``time.monotonic()``): at least 1 (0 means no limit)."""
    return max(1, int((until - time.monotonic()) * 1000))


def _command(coll: Any, fields: Mapping[str, Any], until: float | None) -> dict[str, Any]:
    command: dict[str, Any] = {"find": coll.name, **fields}
    concern = coll.read_concern.document
    if concern:
        command["readConcern"] = concern
    if until is not None:  # each find of the walk gets what is left
        command["maxTimeMS"] = max_time_ms(until)
    return command


def _batch(reply: Mapping[str, Any]) -> tuple[Batch, int]:
    cursor = reply["cursor"]
    cursor_id = int(cursor.get("id", 0))
    return Batch(list(cursor.get("firstBatch", [])), bool(cursor_id)), cursor_id


def read(coll: Any, filter: Mapping[str, Any], *, sort: Sequence[tuple[str, int]] | None = None, limit: int = 0,
         projection: Mapping[str, Any] | None = None, moving: bool = False,
         until: float | None = None) -> list[Document]:
    """``find(filter, projection, sort=sort, limit=limit)`` on the pymongo ``Collection`` *coll*, read exactly.

    *moving*: as :func:`walk`. *until*: the ``time.monotonic()`` by which the server must stop each find (sent as
    ``maxTimeMS``); None sends none (under ``pymongo.timeout``, pymongo sends one)."""
    steps = walk(filter, sort=sort, limit=limit, projection=projection, moving=moving)
    db = coll.database
    fields = next(steps)
    while True:
        reply = db.command(_command(coll, fields, until), codec_options=coll.codec_options, read_preference=coll.read_preference)
        batch, cursor_id = _batch(reply)
        if cursor_id:
            try:
                db.command("killCursors", coll.name, cursors=[cursor_id])
            except PyMongoError as exc:  # the server closes it when it times out
                log.debug("killCursors on %s failed: %s", coll.name, exc)
        try:
            fields = steps.send(batch)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]


async def read_async(coll: Any, filter: Mapping[str, Any], *, sort: Sequence[tuple[str, int]] | None = None,
                     limit: int = 0, projection: Mapping[str, Any] | None = None,
                     moving: bool = False, until: float | None = None) -> list[Document]:
    """:func:`read` on a pymongo ``AsyncCollection``."""
    steps = walk(filter, sort=sort, limit=limit, projection=projection, moving=moving)
    db = coll.database
    fields = next(steps)
    while True:
        reply = await db.command(_command(coll, fields, until), codec_options=coll.codec_options,
                                 read_preference=coll.read_preference)
        batch, cursor_id = _batch(reply)
        if cursor_id:
            try:
                await db.command("killCursors", coll.name, cursors=[cursor_id])
            except PyMongoError as exc:
                log.debug("killCursors on %s failed: %s", coll.name, exc)
        try:
            fields = steps.send(batch)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
