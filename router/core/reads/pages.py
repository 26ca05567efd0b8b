"""Reads: which clusters a page asks, with what filter and limit, and how the answers become a page and a cursor.

A page is one receiver's feed, newest first by ``(event_time, key)``. Periods do not
overlap, so walking the clusters newest first yields items in order: the newest
cluster in the read window is asked first, an older one only while the page is not
full, and only for the items still missing.

**Pulled senders** (``pull=[...]``, authors whose posts are not copied into every
follower's feed) are merged in from the same clusters' ``outbox``: each cluster is
asked once for the inbox and once for the pulled outboxes (``sender_id: {$in: ...}``),
concurrently (in a wave too: an answer with more than the page still needs is cut, see
:meth:`_Fetched.first`). An outbox entry sorts where the receiver's copy of it would: under the
key :func:`~router.ids.copy_id` gives that copy. So a post present both as a copy (an
author who was pushed before crossing the pull threshold, or a backfill) and in a
pulled outbox has the same key twice and is served once. The store sorts outbox entries
by their own ``_id``, not by that key, so within the one millisecond of the cursor the
outbox query asks for ``skip`` more entries (recorded in the cursor) and drops the ones
already served. It asks for one entry more than the page can take: every millisecond
above the answer's last one is then complete, and only entries of that last millisecond
might sort (by key) below ones the answer left out. Pages stay full: when a page would be
short because of that millisecond, it is fetched whole with a second query (and, while
still short, the entries below it with a third, and so on until the outbox is exhausted).
"""

from __future__ import annotations

import logging
from collections.abc import Hashable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Literal

import attrs
from bson import ObjectId

from ...cursor import CursorState, Position, encode_state
from ...errors import ClusterUnavailable, RequestRefused
from ...model import FeedItem, Page
from ...observe import Event
from ...timemap import ReadWindow, TimeMap
from ..layouts import Inbox, Layout, Post, layout_for, outbox
from ..policy import turn_deadline
from ..steps import Concurrently, Failure, Program, Report

__all__ = ["MAX_WAVE", "ReadPlan", "read_program"]

log = logging.getLogger(__name__)

#: The most clusters one wave of a page asks at once (see :meth:`_Walk.main`).
MAX_WAVE = 16


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
    #: Each cluster's deployment, as an opaque key (clusters on one deployment share it); a cluster not named here
    #: is a deployment of its own.
    deployments: Mapping[str, Hashable] = attrs.field(factory=dict)
    #: The most periods the main walk asks in one page (``read.max_periods``); None: every period it needs.
    max_periods: int | None = None


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
    whether the cluster may hold more past it, and the sort keys of every pulled outbox entry its outbox answers
    held (what a position's ``skip`` counts)."""

    entries: list[_Entry]
    last: Position | None
    more: bool
    pulled: tuple[tuple[datetime, bytes], ...] = ()

    def first(self, need: int, *, more: bool = True) -> _Fetched:
        """The first *need* entries (at least one), the position after them, and *more*: what asking for *need*
        would have given, of an answer that holds more. Every entry here is one whose millisecond the answer holds
        whole (pulled entries included), so the position's ``skip``, the pulled entries of the last one's
        millisecond that sort at or before it, counts the same as in that answer."""
        entries = self.entries[:need]
        last = entries[-1]
        skip = sum(1 for t, key in self.pulled if t == last.event_time and key >= last.key.binary)
        return _Fetched(entries, Position(last.event_time, last.key, skip), more, self.pulled)


def _layout(plan: ReadPlan, cluster: str) -> Layout:
    return layout_for(plan.timemap, cluster)


def _inbox(plan: ReadPlan, cluster: str, position: Position | None, need: int, deadline: float) -> Program[Inbox | Failure]:
    """The receiver's own feed after *position*: the *need* newest entries of the asked-for types."""
    return (yield from _layout(plan, cluster).inbox(cluster, plan.receiver_id, position, need, plan.types, deadline))


def _fetched(inbox: Inbox) -> _Fetched:
    """An inbox answer as the walk takes it: its entries, the position after the last, and whether more may follow."""
    entries = [_Entry(t, key, item, False) for t, key, item in inbox.entries]
    last = Position(entries[-1].event_time, entries[-1].key) if entries else None
    return _Fetched(entries, last, inbox.full)


def _inbox_only(
    plan: ReadPlan, cluster: str, position: Position | None, need: int, deadline: float
) -> Program[_Fetched | Failure]:
    inbox = yield from _inbox(plan, cluster, position, need, deadline)
    return inbox if isinstance(inbox, Failure) else _fetched(inbox)


def _pulled_entries(plan: ReadPlan, posts: list[Post]) -> list[_Entry]:
    """Pulled posts as page entries, each under the key the receiver's copy has (or would have)."""
    entries = []
    for post in posts:
        pulled = outbox.pulled_item(post, plan.receiver_id)
        if pulled is not None:
            entries.append(_Entry(*pulled, True))
    return entries


def _with_pull(
    plan: ReadPlan, cluster: str, position: Position | None, need: int, deadline: float
) -> Program[_Fetched | Failure]:
    skip = position.skip if position is not None else 0

    def pulled(limit: int = 0, *, at_or_before: datetime | None = None, at: datetime | None = None,
               before: datetime | None = None) -> Program[list[Post] | Failure]:
        return outbox.find(cluster, plan.pull, deadline, types=plan.types, limit=limit, at_or_before=at_or_before, at=at,
                           before=before)

    # One entry more than the page can take: the store orders the answer by (event_time, _id), so every
    # millisecond above the last entry's is complete, and only that last millisecond is in doubt.
    ask_for = need + skip + 1
    outbox_request = pulled(ask_for, at_or_before=position.event_time if position is not None else None)
    inbox, found = yield Concurrently([_inbox(plan, cluster, position, need, deadline), outbox_request],
                                     [cluster, cluster])
    for answer in (inbox, found):
        if isinstance(answer, Failure):
            return answer
    docs: list[Post] = found
    inbox_entries = [_Entry(t, key, item, False) for t, key, item in inbox.entries]
    inbox_full = inbox.full
    inbox_front = (inbox_entries[-1].event_time, inbox_entries[-1].key.binary) if inbox_full and inbox_entries else None
    outbox_full = len(docs) == ask_for  # the store may hold more pulled entries at or below the last one
    whole_group = False  # True once every pulled entry of the last answer's millisecond is known
    while True:
        pulled_entries = _pulled_entries(plan, docs)
        entries = _merge(inbox_entries, pulled_entries, position)
        outbox_floor = outbox.sort_key(docs[-1])[0] if outbox_full and docs else None
        safe = [
            e for e in entries
            if (inbox_front is None or (e.event_time, e.key.binary) >= inbox_front)
            and (outbox_floor is None or e.event_time > outbox_floor or (whole_group and e.event_time == outbox_floor))
        ]
        # Short of a page only while pulled entries at or below the floor are unknown: the inbox answer alone
        # gives a full page above its front, and with no floor everything asked for is here.
        if len(safe) >= need or outbox_floor is None:
            break
        if not whole_group:
            # The floor's millisecond may hold entries the answer left out, sorting anywhere in it by their keys
            # here (more than a page of them, or entries published there after the cursor was made, under keys it
            # had passed): fetch all of it.
            group = yield from pulled(at=outbox_floor)
            if isinstance(group, Failure):
                return group
            known = {outbox.sort_key(d) for d in docs}
            docs = docs + [d for d in group if outbox.sort_key(d) not in known]
            whole_group = True
            continue
        # Still short with the whole millisecond known: go on below it (each round moves the floor down, so the
        # outbox, which is finite, ends the loop).
        lower = yield from pulled(need + 1, before=outbox_floor)
        if isinstance(lower, Failure):
            return lower
        docs, outbox_full, whole_group = docs + lower, len(lower) == need + 1, False
    more_here = len(safe) > need or inbox_full or outbox_full
    fetched = _Fetched(safe, None, more_here, tuple((e.event_time, e.key.binary) for e in pulled_entries))
    return fetched.first(need, more=more_here) if safe else fetched


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


def _fetch(plan: ReadPlan, cluster: str, position: Position | None, need: int, deadline: float) -> Program[_Fetched | Failure]:
    """What *cluster* gives towards the page: its *need* newest entries after *position*."""
    if plan.pull:
        return (yield from _with_pull(plan, cluster, position, need, deadline))
    return (yield from _inbox_only(plan, cluster, position, need, deadline))


def _below(start: datetime) -> Position:
    """The position just below a period that starts at *start*: every entry of it and of newer periods is behind it
    (entries are stored to the millisecond; no id is twelve 0xff bytes), and the next page's walk begins with the
    period before it."""
    return Position(start - timedelta(milliseconds=1), ObjectId(b"\xff" * 12))


def _next_wave(wave: int, *, asked: int, got: int, missing: int) -> int:
    """How many clusters the next wave asks at once: as many as the clusters asked so far suggest the missing
    entries need (*got* entries from *asked* clusters), at most twice the last wave and :data:`MAX_WAVE`."""
    if got == 0:
        return min(MAX_WAVE, 2 * wave)
    return max(1, min(MAX_WAVE, 2 * wave, -(-missing * asked // got)))


class _Walk:
    """One page's walk over the clusters: what it took, what it owes, and which deployments did not answer."""

    def __init__(self, plan: ReadPlan) -> None:
        self.plan = plan
        self.entries: list[_Entry] = []
        self.sources: list[str] = []
        self.queried: list[str] = []
        self.unavailable: list[str] = []
        self.owed: list[tuple[str, Position | None]] = []
        self.down: dict[Hashable, str] = {}  # deployment -> the cluster that found it down in this call

    @property
    def missing(self) -> int:
        return self.plan.limit - len(self.entries)

    def deployment(self, cluster: str) -> Hashable:
        return self.plan.deployments.get(cluster, cluster)

    def asking(self, clusters: Sequence[str]) -> int:
        """How many of *clusters* may still be asked: those whose deployment is not known down."""
        return sum(1 for c in clusters if self.deployment(c) not in self.down)

    def deadline(self, *, others: int) -> float:
        """A turn's deadline: a partial page's turn shares the time with the *others* asked after it
        (:func:`~router.core.policy.turn_deadline`); a page that raises gives each the whole deadline."""
        if self.plan.on_unavailable == "partial":
            return turn_deadline(self.plan.deadline, others=others)
        return self.plan.deadline

    def ask(self, cluster: str, position: Position | None, need: int, deadline: float) -> Program[_Fetched | Failure]:
        """*cluster*'s answer, or a Failure without asking when another period of its deployment gave no answer in
        this call (a dead deployment costs one turn, not one per period on it)."""
        deployment = self.deployment(cluster)
        found = self.down.get(deployment)
        if found is not None:
            return Failure("unavailable", ClusterUnavailable(
                cluster, f"not asked: its deployment gave no answer for cluster {found!r} in this call"))
        answer = yield from _fetch(self.plan, cluster, position, need, deadline)
        return self.noted(cluster, answer)

    def noted(self, cluster: str, answer: _Fetched | Failure) -> _Fetched | Failure:
        """*answer*, its deployment noted down when it gave none."""
        if isinstance(answer, Failure) and answer.cluster_down:
            self.down.setdefault(self.deployment(cluster), cluster)
        return answer

    def take(self, cluster: str, fetched: _Fetched) -> None:
        self.queried.append(cluster)
        self.entries.extend(fetched.entries)
        self.sources.extend([cluster] * len(fetched.entries))

    def failed(self, cluster: str, failure: Failure, position: Position | None) -> None:
        if self.plan.on_unavailable == "raise" or isinstance(failure.error, RequestRefused):
            raise failure.error  # (a refusal is no cluster unavailable: a partial page would owe it for ever)
        log.warning("%s; serving a partial page", failure.error, extra={"cluster": cluster})
        self.unavailable.append(cluster)
        self.owed.append((cluster, position))

    def pending(self, pending: Sequence[tuple[str, Position | None]], names: Sequence[str]) -> Program[None]:
        """The clusters an earlier partial page owes, one after another, each from where its items begin."""
        for i, (cluster, position) in enumerate(pending):
            if self.missing <= 0:
                self.owed.append((cluster, position))
                continue
            deadline = self.deadline(others=self.asking([c for c, _ in pending[i + 1:]]) + self.asking(names))
            answer = yield from self.ask(cluster, position, self.missing, deadline)
            if isinstance(answer, Failure):
                self.failed(cluster, answer, position)
                continue
            self.take(cluster, answer)
            if answer.more:
                self.owed.append((cluster, answer.last))

    def main(self, names: Sequence[str], main: Position | None,
             first: Inbox | Failure | None = None) -> Program[tuple[Position | None, bool]]:
        """The walk from *main* over *names*, newest first, in waves; returns the next main position and whether the
        walk is done. *first*: the newest cluster's answer, when it was asked already (:func:`read_program`).

        The newest cluster is asked alone. With ``max_periods``, a page that has asked that many and is still not
        full ends there, its cursor just below the last of them (a short page, exact: the walk goes on from there).
        While the page is not full the next clusters are asked in a wave, at
        once, each for all the entries still missing (:func:`_next_wave` says how many); their answers are then
        taken in period order, as one after another would have been, and those after the page filled are dropped.
        An answer with more than the page still needs is cut (:meth:`_Fetched.first`; with pulled senders too,
        not asked again), so the page and its cursor are exactly those of the walk one cluster at a time, and each
        cluster is asked once.
        """
        last: Position | None = None
        wave, asked, got, i = 1, 0, 0, 0
        budget = len(names) if self.plan.max_periods is None else min(len(names), self.plan.max_periods)
        while i < len(names):
            if self.missing <= 0:
                return last or main, False
            if i >= budget:  # every period asked so far is exhausted: go on below the last one next page
                return _below(self.plan.timemap.start_of(names[i - 1])), False
            batch = names[i:min(i + wave, budget)]
            i += len(batch)
            deadline = self.deadline(others=self.asking(names[i:]))
            need = self.missing
            if first is not None:
                answers = [self.noted(batch[0], first if isinstance(first, Failure) else _fetched(first))]
                first = None
            elif len(batch) == 1:
                answers = [(yield from self.ask(batch[0], main, need, deadline))]
            else:
                answers = yield Concurrently([self.ask(c, main, need, deadline) for c in batch], list(batch))
            before = len(self.entries)
            for cluster, answer in zip(batch, answers):
                if self.missing <= 0:
                    return last or main, False
                if isinstance(answer, Failure):
                    self.failed(cluster, answer, main)
                    continue
                if len(answer.entries) > self.missing:
                    answer = answer.first(self.missing)
                self.take(cluster, answer)
                last = answer.last or last
                if answer.more:
                    return last or main, False
            asked += len(batch)
            got += len(self.entries) - before
            wave = _next_wave(wave, asked=asked, got=got, missing=self.missing)
        return last or main, True


def read_program(plan: ReadPlan) -> Program[Page]:
    """One page: clusters owed by an earlier partial page first, then the main walk, newest cluster first.

    With ``on_unavailable="partial"`` each turn gets its share of the deadline, so a hung cluster leaves time for
    the ones after it (see :mod:`router.core.policy`); a deployment that gave no answer is not asked again in the
    call, for any of its periods. Older clusters are asked in waves (see :meth:`_Walk.main`).

    The common page takes a short path: nothing owed, no pulled senders, and the newest cluster the walk would ask
    first fills it (:func:`_filled`). Any other answer is handed to the walk, which goes on from there as if it had
    asked (the same requests, the same page).
    """
    walk = _Walk(plan)
    main, done = plan.state.position, plan.state.done
    names = [] if done else plan.timemap.clusters_for_read(
        now=plan.now, window=plan.window, before=main.event_time if main is not None else None
    )
    first: Inbox | Failure | None = None
    if names and not plan.state.pending and not plan.pull:
        first = yield from _inbox(plan, names[0], main, plan.limit, walk.deadline(others=walk.asking(names[1:])))
        if not isinstance(first, Failure) and first.full and len(first.entries) == plan.limit:
            return (yield from _filled(names[0], first))
    yield from walk.pending(plan.state.pending, names)
    if not done:
        main, done = yield from walk.main(names, main, first)
    yield Report(Event("read_clusters", len(set(walk.queried))))
    for cluster in walk.unavailable:
        yield Report(Event("partial_read", cluster=cluster))
    owed = walk.owed
    next_cursor = None if done and not owed else encode_state(CursorState(position=main, pending=tuple(owed), done=done))
    entries = walk.entries
    return Page(
        items=tuple(e.item for e in entries), next_cursor=next_cursor, sources=tuple(walk.sources),
        queried=tuple(walk.queried), partial=bool(walk.unavailable), unavailable=tuple(walk.unavailable),
        pulled=tuple(e.pulled for e in entries),
    )


def _filled(cluster: str, inbox: Inbox) -> Program[Page]:
    """The page *cluster* filled, the newest the walk asks, alone: what the walk makes of it (its entries, the
    cursor after the last of them), made from the inbox answer without the walk's objects per item."""
    entries = inbox.entries
    event_time, key, _ = entries[-1]
    yield Report(Event("read_clusters", 1))
    n = len(entries)
    return Page(items=tuple([item for _t, _key, item in entries]),
                next_cursor=encode_state(CursorState(position=Position(event_time, key))),
                sources=(cluster,) * n, queried=(cluster,), pulled=(False,) * n)
