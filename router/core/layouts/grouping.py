"""The requests and answers of grouped reads: the one place that names a copy's fields for them.

:mod:`router.core.group_reads` walks windows and merges counts; what it asks a cluster is
built here, on the stream of copies each layout supplies
(:meth:`~router.core.layouts.base.Layout.copy_stream`) and the stream of posts the outbox
supplies (:func:`.outbox.stream`), and what comes back is read here, as values (a streamed
copy as a :class:`~.values.Copy`; posts are read by :mod:`.outbox`, as :class:`~.values.Post`):

* :func:`rank`: a window's groups, newest first by their newest item (``$group`` by the
  key's values, ``$max`` of ``(event_time, _id)``);
* :func:`details`: of the page's groups, items, distinct actors (a ``$group`` per (group,
  actor), then per group), first time and the newest item of each of the newest actors
  (``$topN``, or ``$push`` after ``$sort`` where the server has no ``$topN``);
* :func:`actors`: the page's groups' actors, to count a group that spans periods as one set;
* :func:`unseen`: the groups (and windows) of the items newer than a marker;
* :func:`pulled_copies` and :func:`pulled_posts`: the pulled senders' copies and posts of a
  window, read whole (a few authors' posts) and counted by the caller, each post once.

A missing key field groups as ``None`` (``$ifNull``), as :meth:`GroupBy.values_of
<router.core.groups.GroupBy.values_of>` reads it from an item.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

import attrs

from ...cursor import Position
from ...model import FeedItem
from ..steps import Aggregate, Failure, Program
from . import outbox
from .base import Layout
from .queries import newer_than
from .values import Copy, Post

__all__ = ["Detail", "actor_rows", "actors", "at_or_below", "copy_match", "detail_rows", "details", "pulled_copies",
           "pulled_items", "pulled_posts", "rank", "rank_rows", "unseen", "unseen_outbox", "unseen_rows"]

EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
Values = tuple[Any, ...]


def _key(fields: Sequence[str]) -> dict[str, Any]:
    """The ``_id`` expression of ``$group``: the key's values in object form, a missing one as ``None``."""
    return {f"k{i}": {"$ifNull": [f"${f}", None]} for i, f in enumerate(fields)}


def _values(row_id: Mapping[str, Any], fields: Sequence[str]) -> Values:
    return tuple(row_id.get(f"k{i}") for i in range(len(fields)))


def _item(row: Mapping[str, Any], receiver_id: int | str) -> FeedItem:
    """A copy as a stream gives it (:meth:`Layout.copy_stream`: a copy's fields but ``receiver_id``), as a page
    shows it."""
    return Copy(row["_id"], receiver_id, row["sender_id"], row["event_time"], row["type"], row["data"],
                row["data_key"]).item()


def _selector(fields: Sequence[str], values: Values) -> dict[str, Any]:
    """The items whose key fields hold *values* (``None`` matches a missing field too)."""
    return {f: v for f, v in zip(fields, values)}


def at_or_below(ceiling: Position) -> dict[str, Any]:
    """The clause of items at or below *ceiling* in newest-first ``(event_time, _id)`` order."""
    return {"$or": [{"event_time": {"$lt": ceiling.event_time}},
                    {"event_time": ceiling.event_time, "_id": {"$lte": ceiling.id}}]}


def copy_match(*, types: Sequence[int | str] = (), not_from: Sequence[int | str] = (), ceiling: Position | None = None,
               groups: tuple[Sequence[str], Sequence[Values]] | None = None) -> dict[str, Any]:
    """The copies a grouped read counts: of *types*, not from the senders *not_from* (pulled: counted apart), at or
    below *ceiling*, of the groups ``(fields, [values, ...])``."""
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


def rank(layout: Layout, cluster: str, receiver_id: int | str, start: datetime, end: datetime, match: Mapping[str, Any],
         fields: Sequence[str], limit: int, deadline: float) -> Aggregate:
    """The *limit* newest groups of the window ``[start, end)``, each with its newest item's position."""
    return _stream(layout, cluster, receiver_id, start, end, match, [
        {"$group": {"_id": _key(fields), "last": {"$max": {"t": "$event_time", "i": "$_id"}}}},
        {"$sort": {"last.t": -1, "last.i": -1}},
        {"$limit": limit},
    ], deadline)


def rank_rows(rows: Sequence[Mapping[str, Any]], fields: Sequence[str]) -> list[tuple[Values, Position]]:
    """The answer to :func:`rank`: each group's values and the position of its newest item."""
    return [(_values(r["_id"], fields), Position(r["last"]["t"], r["last"]["i"])) for r in rows]


def details(layout: Layout, cluster: str, receiver_id: int | str, start: datetime, end: datetime,
            match: Mapping[str, Any], fields: Sequence[str], newest: int, *, top_n: bool, deadline: float) -> Aggregate:
    """One row per group of *match*: items, distinct actors, first time, the newest item of each of its *newest*
    newest actors (``$topN`` with *top_n*; else ``$push`` after ``$sort``, which keeps the order on the servers that
    have no ``$topN``, and ``$slice``)."""
    per_actor = {"$group": {"_id": {"k": _key(fields), "s": "$sender_id"}, "n": {"$sum": 1},
                            "f": {"$min": "$event_time"},
                            "last": {"$max": {"t": "$event_time", "i": "$_id", "d": "$$ROOT"}}}}
    sums = {"n": {"$sum": "$n"}, "a": {"$sum": 1}, "f": {"$min": "$f"}}
    if top_n:
        top = {"$topN": {"n": newest, "sortBy": {"last.t": -1, "last.i": -1}, "output": "$last"}}
        stages = [per_actor, {"$group": {"_id": "$_id.k", **sums, "top": top}}]
    else:
        stages = [per_actor, {"$sort": {"last.t": -1, "last.i": -1}},
                  {"$group": {"_id": "$_id.k", **sums, "top": {"$push": "$last"}}},
                  {"$project": {"n": 1, "a": 1, "f": 1, "top": {"$slice": ["$top", newest]}}}]
    return _stream(layout, cluster, receiver_id, start, end, match, stages, deadline)


@attrs.frozen
class Detail:
    """A group's (or one cluster's part of it): items, distinct actors, first time, the newest item of each of its
    newest actors."""

    count: int
    actors: int
    first: datetime
    items: tuple[FeedItem, ...]


def detail_rows(rows: Sequence[Mapping[str, Any]], fields: Sequence[str], receiver_id: int | str) -> dict[Values, Detail]:
    """The answer to :func:`details`, by group values."""
    return {_values(r["_id"], fields): Detail(r["n"], r["a"], r["f"], tuple(_item(x["d"], receiver_id) for x in r["top"]))
            for r in rows}


def actors(layout: Layout, cluster: str, receiver_id: int | str, start: datetime, end: datetime,
           match: Mapping[str, Any], fields: Sequence[str], deadline: float) -> Aggregate:
    """One row per (group, actor) of *match*."""
    return _stream(layout, cluster, receiver_id, start, end, match,
                   [{"$group": {"_id": {"k": _key(fields), "s": "$sender_id"}}}], deadline)


def actor_rows(rows: Sequence[Mapping[str, Any]], fields: Sequence[str]) -> list[tuple[Values, Any]]:
    """The answer to :func:`actors`: (group values, actor) pairs."""
    return [(_values(r["_id"]["k"], fields), r["_id"]["s"]) for r in rows]


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
    return _stream(layout, cluster, receiver_id, start, end, match, [{"$sort": {"event_time": -1, "_id": -1}}], deadline)


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
