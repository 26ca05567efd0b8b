"""Reads: which clusters a page asks, with what filter and limit, and how the answers become a page and a cursor.

A page is one receiver's feed, newest first by ``(event_time, key)``. Periods do not
overlap, so walking the clusters newest first yields items in order: the newest
cluster in the read window is asked first, an older one only while the page is not
full, and only for the items still missing.

**Pulled senders** (``pull=[...]``, authors whose posts are not copied into every
follower's feed) are merged in from the same clusters' ``outbox``: each cluster is
asked once for the inbox and once for the pulled outboxes (``sender_id: {$in: ...}``),
concurrently. An outbox entry sorts where the receiver's copy of it would: under the
key :func:`~router.ids.copy_id` gives that copy. So a post present both as a copy (an
author who was pushed before crossing the pull threshold, or a backfill) and in a
pulled outbox has the same key twice and is served once. The store sorts outbox entries
by their own ``_id``, not by that key, so within the one millisecond of the cursor the
outbox query asks for ``skip`` more entries (recorded in the cursor) and drops the ones
already served; and when more than a whole page of pulled entries share one
millisecond, that millisecond is fetched whole, with a second query (and, if all of it
lies behind the cursor, the entries below it with a third).
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any, Literal

import attrs
from bson import ObjectId

from ..cursor import CursorState, Position, encode_state
from ..ids import copy_ids
from ..model import FeedItem, Page
from ..observe import Event
from ..timemap import ReadWindow, TimeMap
from .policy import turn_deadline
from .steps import Concurrently, Failure, Find, Program, Report

__all__ = ["PAGE_SORT", "ReadPlan", "read_program"]

log = logging.getLogger(__name__)
#: The order of a page, and of the index every page query uses.
PAGE_SORT = (("event_time", -1), ("_id", -1))


@attrs.frozen
class ReadPlan:
    """Everything a page needs to know besides the storage: the request and the map at the time of the call."""

    receiver_id: int | str
    limit: int
    state: CursorState
    timemap: TimeMap
    now: datetime
    window: ReadWindow | None
    on_unavailable: Literal["raise", "partial"]
    deadline: float
    pull: tuple[int | str, ...] = ()
    types: tuple[int | str, ...] = ()

    def only(self) -> dict[str, Any]:
        """The clause that keeps only the asked-for types (nothing when every type is wanted)."""
        return {"type": {"$in": list(self.types)}} if self.types else {}


@attrs.frozen
class _Entry:
    """One candidate for the page: its sort key, the item, and whether it came from a pulled outbox."""

    event_time: datetime
    key: ObjectId
    item: FeedItem
    pulled: bool

    def sort_key(self) -> tuple[datetime, bytes, int]:
        # Inbox copy first among equals, so the receiver's own copy is the one kept.
        return (self.event_time, self.key.binary, 0 if self.pulled else 1)


@attrs.frozen
class _Fetched:
    """What one cluster gave towards the page: entries in page order, the position after the last of them,
    and whether the cluster may hold more past it."""

    entries: list[_Entry]
    last: Position | None
    more: bool


def _older(position: Position | None) -> dict[str, Any]:
    return position.older_filter() if position is not None else {}


def _find(request: Find) -> Program[list[dict[str, Any]] | Failure]:
    answer: list[dict[str, Any]] | Failure = yield request
    return answer


def _inbox_request(plan: ReadPlan, cluster: str, position: Position | None, need: int, deadline: float) -> Find:
    """The receiver's own feed after *position*: the *need* newest entries of the asked-for types."""
    return Find(cluster, "feed", {"receiver_id": plan.receiver_id, **plan.only(), **_older(position)}, deadline,
                sort=PAGE_SORT, limit=need)


def _inbox_only(
    plan: ReadPlan, cluster: str, position: Position | None, need: int, deadline: float
) -> Program[_Fetched | Failure]:
    docs = yield _inbox_request(plan, cluster, position, need, deadline)
    if isinstance(docs, Failure):
        return docs
    entries = [_Entry(d["event_time"], d["_id"], FeedItem.from_document(d), False) for d in docs]
    last = Position(entries[-1].event_time, entries[-1].key) if entries else None
    return _Fetched(entries, last, len(docs) == need)


def _pulled_entries(plan: ReadPlan, docs: list[dict[str, Any]]) -> list[_Entry]:
    """Outbox documents as page entries, each under the key the receiver's copy has (or would have)."""
    entries = []
    receiver = plan.receiver_id
    for doc in docs:
        t: datetime = doc["event_time"]
        try:
            (key,) = copy_ids(int(t.timestamp()), doc["data_key"], [receiver])
        except (KeyError, TypeError, ValueError, UnicodeEncodeError) as exc:
            log.warning("outbox entry %r skipped: %s", doc.get("_id"), exc)
            continue
        item = FeedItem(
            receiver_id=receiver, sender_id=doc["sender_id"], event_time=t, type=doc["type"], data=doc["data"],
            data_key=doc["data_key"], id=key,
        )
        entries.append(_Entry(t, key, item, True))
    return entries


def _with_pull(
    plan: ReadPlan, cluster: str, position: Position | None, need: int, deadline: float
) -> Program[_Fetched | Failure]:
    skip = position.skip if position is not None else 0
    senders: dict[str, Any] = {"sender_id": {"$in": list(plan.pull)}, **plan.only()}
    outbox_filter: dict[str, Any] = dict(senders)
    if position is not None:
        outbox_filter["event_time"] = {"$lte": position.event_time}
    inbox_request = _inbox_request(plan, cluster, position, need, deadline)
    outbox_request = Find(cluster, "outbox", outbox_filter, deadline, sort=PAGE_SORT, limit=need + skip)
    inbox, outbox = yield Concurrently([_find(inbox_request), _find(outbox_request)], [cluster, cluster])
    for answer in (inbox, outbox):
        if isinstance(answer, Failure):
            return answer
    inbox_entries = [_Entry(d["event_time"], d["_id"], FeedItem.from_document(d), False) for d in inbox]
    inbox_full = len(inbox) == need
    inbox_front = (inbox[-1]["event_time"], inbox[-1]["_id"].binary) if inbox_full and inbox else None
    outbox_full = len(outbox) == need + skip  # the store may hold more pulled entries at or below the last one
    whole_group = False  # True once every pulled entry of the last answer's millisecond is known
    for _attempt in range(4):
        pulled = _pulled_entries(plan, outbox)
        entries = _merge(inbox_entries, pulled, position)
        outbox_floor = outbox[-1]["event_time"] if outbox_full and outbox else None
        safe = [
            e for e in entries
            if (inbox_front is None or (e.event_time, e.key.binary) >= inbox_front)
            and (outbox_floor is None or e.event_time > outbox_floor or (whole_group and e.event_time == outbox_floor))
        ]
        if safe or not (inbox_full or outbox_full) or outbox_floor is None:
            break
        if not whole_group:
            # More than a page of pulled entries share the millisecond outbox_floor: fetch all of it.
            group = yield Find(cluster, "outbox", {**senders, "event_time": outbox_floor}, deadline, sort=PAGE_SORT)
            if isinstance(group, Failure):
                return group
            known = {d["_id"] for d in outbox}
            outbox = outbox + [d for d in group if d["_id"] not in known]
            whole_group = True
            continue
        # That whole millisecond was served already (entries published there after the cursor was made, under keys
        # it had passed, pushed the rest out of the answer): go on below it.
        lower = yield Find(cluster, "outbox", {**senders, "event_time": {"$lt": outbox_floor}}, deadline,
                           sort=PAGE_SORT, limit=need)
        if isinstance(lower, Failure):
            return lower
        outbox, outbox_full, whole_group = outbox + lower, len(lower) == need, False
    else:  # pragma: no cover - each fetch above ends with something safe to serve or nothing left
        raise RuntimeError(f"read of cluster {cluster!r}: no progress after fetching the outbox 4 times")
    taken = safe[:need]
    more_here = len(safe) > need or inbox_full or outbox_full
    if not taken:
        return _Fetched([], None, more_here)
    last = taken[-1]
    boundary = sum(1 for e in pulled if e.event_time == last.event_time and e.key.binary >= last.key.binary)
    return _Fetched(taken, Position(last.event_time, last.key, boundary), more_here)


def _merge(inbox: list[_Entry], pulled: list[_Entry], position: Position | None) -> list[_Entry]:
    """Inbox and pulled entries strictly after *position*, newest first, each key once (the inbox copy kept)."""
    if position is not None:
        bound = (position.event_time, position.id.binary)
        pulled = [e for e in pulled if (e.event_time, e.key.binary) < bound]
    merged = sorted(inbox + pulled, key=_Entry.sort_key, reverse=True)
    out: list[_Entry] = []
    for entry in merged:
        if out and out[-1].key == entry.key and out[-1].event_time == entry.event_time:
            continue
        out.append(entry)
    return out


def _fetch(plan: ReadPlan, cluster: str, position: Position | None, need: int, *, others: int) -> Program[_Fetched | Failure]:
    """What *cluster* gives towards the page, in its turn: while *others* clusters may still be asked after it,
    a partial page gives it only its share of the deadline (:func:`~router.core.policy.turn_deadline`)."""
    deadline = turn_deadline(plan.deadline, others=others) if plan.on_unavailable == "partial" else plan.deadline
    if plan.pull:
        return (yield from _with_pull(plan, cluster, position, need, deadline))
    return (yield from _inbox_only(plan, cluster, position, need, deadline))


def read_program(plan: ReadPlan) -> Program[Page]:
    """One page: clusters owed by an earlier partial page first, then the main walk, newest cluster first.

    With ``on_unavailable="partial"`` each cluster asked gets its turn's share of the
    deadline, so a hung cluster leaves time for the ones after it (see :mod:`router.core.policy`).
    """
    limit = plan.limit
    entries: list[_Entry] = []
    sources: list[str] = []
    queried: list[str] = []
    unavailable: list[str] = []
    owed: list[tuple[str, Position | None]] = []

    def take(cluster: str, fetched: _Fetched) -> None:
        queried.append(cluster)
        entries.extend(fetched.entries)
        sources.extend([cluster] * len(fetched.entries))

    def failed(cluster: str, failure: Failure, position: Position | None) -> None:
        if plan.on_unavailable == "raise":
            raise failure.error
        log.warning("%s; serving a partial page", failure.error, extra={"cluster": cluster})
        unavailable.append(cluster)
        owed.append((cluster, position))

    main, done = plan.state.position, plan.state.done
    names = [] if done else plan.timemap.clusters_for_read(
        now=plan.now, window=plan.window, before=main.event_time if main is not None else None
    )
    pending = plan.state.pending
    for i, (cluster, position) in enumerate(pending):  # clusters skipped earlier while down
        if len(entries) >= limit:
            owed.append((cluster, position))
            continue
        answer = yield from _fetch(plan, cluster, position, limit - len(entries), others=len(pending) - i - 1 + len(names))
        if isinstance(answer, Failure):
            failed(cluster, answer, position)
            continue
        take(cluster, answer)
        if answer.more:
            owed.append((cluster, answer.last))
    if not done:
        done = True
        last: Position | None = None
        for j, cluster in enumerate(names):
            if len(entries) >= limit:
                done = False
                break
            answer = yield from _fetch(plan, cluster, main, limit - len(entries), others=len(names) - j - 1)
            if isinstance(answer, Failure):
                failed(cluster, answer, main)
                continue
            take(cluster, answer)
            last = answer.last or last
            if answer.more:
                done = False
                break
        if last is not None and not done:
            main = last
    yield Report(Event("read_clusters", len(set(queried))))
    for cluster in unavailable:
        yield Report(Event("partial_read", cluster=cluster))
    next_cursor = None if done and not owed else encode_state(CursorState(position=main, pending=tuple(owed), done=done))
    return Page(
        items=tuple(e.item for e in entries), next_cursor=next_cursor, sources=tuple(sources), queried=tuple(queried),
        partial=bool(unavailable), unavailable=tuple(unavailable), pulled=tuple(e.pulled for e in entries),
    )
