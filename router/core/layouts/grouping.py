"""The requests and answers of grouped reads: the one place that names a copy's fields for them.

:mod:`router.core.notify.group_reads` walks windows and merges counts; what it asks a cluster is
built here, on the stream of copies each layout supplies
(:meth:`~router.core.layouts.base.Layout.copy_stream`) and the stream of posts the outbox
supplies (:func:`.outbox.stream`), and what comes back is read here, as values (a streamed
copy as a :class:`~.values.Copy`; posts are read by :mod:`.outbox`, as :class:`~.values.Post`):

* :func:`summaries`: a window's groups (the newest ones, for a page's rank; or the page's
  groups), one row each from one ``$group`` by the key's values: the newest item's position,
  items, first time, the newest items by position and sender, and the distinct actors of a
  sample of its items (their ids too, to count a group that spans periods as one set);
* :func:`newest_actors`: the newest item of each of a group's newest actors, for a group
  whose newest items repeat an actor (a ``$group`` per (group, actor));
* :func:`unseen`: the groups (and windows) of the items newer than a marker;
* :func:`pulled_copies` and :func:`pulled_posts`: the pulled senders' copies and posts of a
  window, read whole (a few authors' posts) and counted by the caller, each post once.

A missing key field groups as ``None`` (``$ifNull``), as :meth:`GroupBy.values_of
<router.core.notify.groups.GroupBy.values_of>` reads it from an item.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import attrs
from bson import Decimal128, ObjectId

from ...cursor import Position
from ...model import FeedItem
from ..steps import Aggregate, Failure, Program
from . import outbox
from .base import Layout
from .queries import newer_than
from .values import Copy, Post

__all__ = ["Newest", "Summary", "at_or_below", "canonical", "copy_match", "through", "newest_actor_rows", "newest_actors", "pulled_copies",
           "pulled_items", "pulled_posts", "summaries", "summary_rows", "unseen", "unseen_outbox", "unseen_rows"]

EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
Values = tuple[Any, ...]
#: The copies' fields a key may name that the router checks on writing: an int or a text, never a list.
_ROUTER_FIELDS = ("type", "sender_id", "data_key")


_INT64 = 2**63


def canonical(value: Any) -> Any:
    """A key field's value as it names its group, whatever BSON type carried it.

    The servers group numbers by value (``5``, ``5.0``, ``Int64(5)`` and ``Decimal128("5.0")`` are
    one group), booleans apart from numbers, lists and documents element by element. So a whole
    number that fits 64 bits is an ``int``, another number a ``float`` when one holds it exactly
    (else a normalised ``Decimal128``), and lists and documents hold canonical elements: a group's
    ``values`` and ``key`` do not depend on which of its items the server read first.
    """
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):  # int and Int64
        return int(value)
    if isinstance(value, float):
        return int(value) if value.is_integer() and -_INT64 <= value < _INT64 else value
    if isinstance(value, Decimal128):
        number = value.to_decimal()
        if number.is_nan():
            return math.nan
        if number.is_infinite():
            return math.inf if number > 0 else -math.inf
        if number == number.to_integral_value() and -_INT64 <= number < _INT64:
            return int(number)
        if Decimal(float(number)) == number:
            return float(number)
        return Decimal128(number.normalize())
    if isinstance(value, list):
        return [canonical(v) for v in value]
    if isinstance(value, Mapping):
        return {k: canonical(v) for k, v in value.items()}
    return value


def _key(fields: Sequence[str]) -> dict[str, Any]:
    """The ``_id`` expression of ``$group``: the key's values in object form, a missing one as ``None``."""
    return {f"k{i}": {"$ifNull": [f"${f}", None]} for i, f in enumerate(fields)}


def _values(row_id: Mapping[str, Any], fields: Sequence[str]) -> Values:
    """A group's values as a row names them, :func:`canonical` (the server shows one of the
    values it grouped together: 5 or 5.0)."""
    return tuple(canonical(row_id.get(f"k{i}")) for i in range(len(fields)))


def _item(row: Mapping[str, Any], receiver_id: int | str) -> FeedItem:
    """A copy as a stream gives it (:meth:`Layout.copy_stream`: a copy's fields but ``receiver_id``), as a page
    shows it."""
    return Copy(row["_id"], receiver_id, row["sender_id"], row["event_time"], row["type"], row["data"],
                row["data_key"]).item()


def _selector(fields: Sequence[str], values: Values) -> dict[str, Any]:
    """The items whose key fields hold *values*, compared as :func:`_key` groups them (``None`` matches a missing
    field too). A query's ``{field: value}`` would also match a list holding the value: the router's own fields
    (``type``, ``sender_id``, ``data_key``: an id or a text, never a list) are matched so, a ``data`` path with
    ``$expr``, the grouping's own equality (numbers by value, ``true`` apart from ``1``, lists and documents
    whole)."""
    plain: dict[str, Any] = {}
    same: list[dict[str, Any]] = []
    for f, v in zip(fields, values):
        if f in _ROUTER_FIELDS and isinstance(v, (int, str)) and not isinstance(v, bool):
            plain[f] = v
        else:
            same.append({"$eq": [{"$ifNull": [f"${f}", None]}, {"$literal": v}]})
    if same:
        plain["$expr"] = same[0] if len(same) == 1 else {"$and": same}
    return plain


def at_or_below(ceiling: Position) -> dict[str, Any]:
    """The clause of items at or below *ceiling* in newest-first ``(event_time, _id)`` order, given a stream that ends
    after the ceiling's millisecond (:func:`through`): it leaves out the items of that millisecond above it. (One
    ``$or`` of the two halves cost FerretDB 2 about a plain page more per window of 100,000 items than this.)"""
    return {"$nor": [{"event_time": ceiling.event_time, "_id": {"$gt": ceiling.id}}]}


def through(end: datetime, ceiling: Position) -> datetime:
    """Where a stream of the items at or below *ceiling* in a window ending at *end* ends: the page index's range then
    leaves out the items after the ceiling's millisecond."""
    return min(end, ceiling.event_time + timedelta(milliseconds=1))


def copy_match(*, types: Sequence[int | str] = (), not_from: Sequence[int | str] = (), ceiling: Position | None = None,
               groups: tuple[Sequence[str], Sequence[Values]] | None = None) -> dict[str, Any]:
    """The copies a grouped read counts: of *types*, not from the senders *not_from* (pulled: counted apart), at or
    below *ceiling* (in a stream that ends :func:`through` it), of the groups ``(fields, [values, ...])``."""
    match: dict[str, Any] = {}
    if types:
        match["type"] = {"$in": list(types)}
    if not_from:
        match["sender_id"] = {"$nin": list(not_from)}
    clauses = [at_or_below(ceiling)] if ceiling is not None else []
    if groups is not None:
        fields, values = groups
        clauses.append({"$or": [_selector(fields, v) for v in values]})
    if len(clauses) == 1:
        match.update(clauses[0])
    elif clauses:
        match["$and"] = clauses
    return match


def _stream(layout: Layout, cluster: str, receiver_id: int | str, start: datetime, end: datetime | None,
            match: Mapping[str, Any], stages: list[dict[str, Any]], deadline: float) -> Aggregate:
    return Aggregate(cluster, "feed", layout.copy_stream(receiver_id, start, end, match) + stages, deadline)


@attrs.frozen
class Newest:
    """One of a group's newest items, by position and sender: the item itself is read by id afterwards
    (:meth:`Layout.copies_by_id <router.core.layouts.base.Layout.copies_by_id>`), because a row of whole items could
    pass 16 MiB, which the server refuses."""

    event_time: datetime
    id: ObjectId
    sender_id: int | str


@attrs.frozen
class Summary:
    """One cluster's part of a group, as :func:`summaries` counts it: its values, its newest item's position, its
    items, its first time, its newest items (``newest``, newest first), and the distinct actors among the
    ``sampled`` of its items it looked at (``sampled == count``: every one of them; ``ids``: those actors, where asked).
    """

    values: Values
    last: Position
    count: int
    first: datetime
    newest: tuple[Newest, ...]
    actors: int
    sampled: int
    ids: tuple[Any, ...] | None


def _newest(t: str, i: str, s: str) -> dict[str, str]:
    return {"t": t, "i": i, "s": s}


def summaries(layout: Layout, cluster: str, receiver_id: int | str, start: datetime, end: datetime,
              match: Mapping[str, Any], fields: Sequence[str], *, newest: int, sample: int, limit: int | None, ids: bool,
              fast: bool, deadline: float) -> Aggregate:
    """One row per group of *match* in ``[start, end)`` (:class:`Summary`), from one ``$group`` by key whose every
    accumulator costs about the same per item: the newest item's position (``$max``), items (``$sum``), first time
    (``$min``), the *newest* newest items (``$topN``; none with 0: it costs FerretDB 2 as much as the rest together)
    and the senders of the first *sample* items (``$firstN``, whose distinct ones are counted on the server; listed
    with *ids*). With *limit*, only the *limit* groups with the newest
    items (a page's rank). Without *fast* (a server with no ``$topN`` and ``$firstN``): ``$push`` after a ``$sort``,
    then ``$slice``."""
    key = _key(fields)
    last = {"$max": {"t": "$event_time", "i": "$_id"}}
    counts = {"n": {"$sum": 1}, "f": {"$min": "$event_time"}}
    item = _newest("$event_time", "$_id", "$sender_id")
    top: dict[str, Any] = {}
    if fast:
        if newest:
            top["top"] = {"$topN": {"n": newest, "sortBy": {"event_time": -1, "_id": -1}, "output": item}}
        stages: list[dict[str, Any]] = [{"$group": {"_id": key, "last": last, **counts, **top,
                                                    "ids": {"$firstN": {"n": sample, "input": "$sender_id"}}}}]
    else:
        if newest:
            top["top"] = {"$push": item}
        stages = [{"$sort": {"event_time": -1, "_id": -1}},
                  {"$group": {"_id": key, "last": last, **counts, **top, "ids": {"$push": "$sender_id"}}}]
    if limit is not None:
        stages += [{"$sort": {"last.t": -1, "last.i": -1}}, {"$limit": limit}]
    sampled = {"$slice": ["$ids", sample]}  # (what $firstN kept already; the $push of a server without it)
    shown: dict[str, Any] = {"last": 1, "n": 1, "f": 1, "m": {"$size": sampled},
                             "a": {"$size": {"$setUnion": [sampled, []]}}}
    if newest:
        shown["top"] = {"$slice": ["$top", newest]}
    if ids:
        shown["ids"] = {"$setUnion": [sampled, []]}
    return _stream(layout, cluster, receiver_id, start, end, match, [*stages, {"$project": shown}], deadline)


def summary_rows(rows: Sequence[Mapping[str, Any]], fields: Sequence[str]) -> list[Summary]:
    """The answer to :func:`summaries`."""
    return [Summary(_values(r["_id"], fields), Position(r["last"]["t"], r["last"]["i"]), r["n"], r["f"],
                    tuple(Newest(x["t"], x["i"], x["s"]) for x in r.get("top", ())), r["a"], r["m"],
                    tuple(r["ids"]) if "ids" in r else None) for r in rows]


def newest_actors(layout: Layout, cluster: str, receiver_id: int | str, start: datetime, end: datetime,
                  match: Mapping[str, Any], fields: Sequence[str], newest: int, *, fast: bool,
                  deadline: float) -> Aggregate:
    """Of each group of *match*, the newest item of each of its *newest* newest actors (a group whose newest items
    repeat an actor: :func:`summaries` shows its newest items, not its newest actors' items)."""
    per_actor: dict[str, Any] = {"$group": {"_id": {"k": _key(fields), "s": "$sender_id"},
                                            "last": {"$max": {"t": "$event_time", "i": "$_id"}}}}
    item = _newest("$last.t", "$last.i", "$_id.s")
    stages: list[dict[str, Any]]
    if fast:
        stages = [per_actor, {"$group": {"_id": "$_id.k", "top": {"$topN": {
            "n": newest, "sortBy": {"last.t": -1, "last.i": -1}, "output": item}}}}]
    else:
        stages = [per_actor, {"$sort": {"last.t": -1, "last.i": -1}},
                  {"$group": {"_id": "$_id.k", "top": {"$push": item}}},
                  {"$project": {"top": {"$slice": ["$top", newest]}}}]
    return _stream(layout, cluster, receiver_id, start, end, match, stages, deadline)


def newest_actor_rows(rows: Sequence[Mapping[str, Any]], fields: Sequence[str]) -> list[tuple[Values, tuple[Newest, ...]]]:
    """The answer to :func:`newest_actors`: each group's values and its newest actors' newest items."""
    return [(_values(r["_id"], fields), tuple(Newest(x["t"], x["i"], x["s"]) for x in r["top"])) for r in rows]


def _unseen_stages(fields: Sequence[str], span_ms: int, limit: int) -> list[dict[str, Any]]:
    window = {"$floor": {"$divide": [{"$subtract": ["$event_time", EPOCH]}, span_ms]}}
    return [{"$group": {"_id": {**_key(fields), "w": window}}}, {"$limit": limit}]


def unseen(layout: Layout, cluster: str, receiver_id: int | str, start: datetime, bound: Position | None,
           types: Sequence[int | str], fields: Sequence[str], span_ms: int, limit: int, deadline: float) -> Aggregate:
    """Up to *limit* groups (with their window) of the copies newer than *bound* (all, when None) in *cluster*."""
    match = {**({"type": {"$in": list(types)}} if types else {}), **newer_than(bound)}
    return _stream(layout, cluster, receiver_id, start, None, match, _unseen_stages(fields, span_ms, limit), deadline)


def unseen_outbox(cluster: str, senders: Sequence[int | str], after: datetime | None, types: Sequence[int | str],
                  fields: Sequence[str], span_ms: int, limit: int, deadline: float) -> Aggregate:
    """Up to *limit* groups (with their window) of the pulled senders' posts after *after* in *cluster*."""
    return Aggregate(cluster, "outbox", outbox.stream(senders, types=types, after=after)
                     + _unseen_stages(fields, span_ms, limit), deadline)


def unseen_rows(rows: Sequence[Mapping[str, Any]], fields: Sequence[str]) -> list[tuple[Any, ...]]:
    """The answer to :func:`unseen` or :func:`unseen_outbox`: each group's values, then its window."""
    return [(*_values(r["_id"], fields), int(r["_id"]["w"])) for r in rows]


def pulled_copies(layout: Layout, cluster: str, receiver_id: int | str, start: datetime, end: datetime,
                  senders: Sequence[int | str], types: Sequence[int | str], ceiling: Position, deadline: float) -> Aggregate:
    """The receiver's copies from the pulled *senders* in ``[start, end)`` at or below *ceiling*, whole (sorted: a
    ``$sort`` makes the server hold the answer, so one past a batch is read on exactly, see
    :data:`~router.core.steps.HOLDING_STAGES`)."""
    match = {"sender_id": {"$in": list(senders)}, **copy_match(types=types, ceiling=ceiling)}
    return _stream(layout, cluster, receiver_id, start, through(end, ceiling), match,
                   [{"$sort": {"event_time": -1, "_id": -1}}], deadline)


def pulled_posts(cluster: str, senders: Sequence[int | str], types: Sequence[int | str], start: datetime, end: datetime,
                 ceiling: Position, deadline: float) -> Program[list[Post] | Failure]:
    """The pulled *senders*' posts in ``[start, end)`` up to *ceiling*'s millisecond, whole."""
    return outbox.find(cluster, senders, deadline, types=types, at_or_after=start, before=end,
                       at_or_before=ceiling.event_time)


def pulled_items(copies: Sequence[Mapping[str, Any]], posts: Sequence[Post], receiver_id: int | str,
                 ceiling: Position) -> list[tuple[tuple[datetime, bytes], FeedItem, bool]]:
    """The answers to :func:`pulled_copies` and :func:`pulled_posts` as ``(position, item, is the receiver's own
    copy)``, each post under the key the receiver's copy has (or would have), at or below *ceiling*."""
    out = [((d["event_time"], d["_id"].binary), _item(d, receiver_id), True) for d in copies]
    bound = (ceiling.event_time, ceiling.id.binary)
    for post in posts:
        entry = outbox.pulled_item(post, receiver_id)
        if entry is not None and (entry[0], entry[1].binary) <= bound:
            out.append(((entry[0], entry[1].binary), entry[2], False))
    return out
