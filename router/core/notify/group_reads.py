"""Grouped reads as programs: a page of groups, the unseen-groups badge, and marking groups read.

**A page** (:func:`groups_program`): the seen marker (one ``find`` per cluster, newest first,
until one has it); on the walk's first page, the walk's first items (a page of
:func:`~router.core.reads.pages.read_program` in the newest period: twice the groups asked times the
newest actors shown, which costs FerretDB 2 about what one item does) give the ceiling (the
newest item), name the first window, and show most groups' newest actors (in each group, its
newest items come first). For each
window the page takes, every cluster whose period meets the window (and has started) is asked
once to *rank and count* the window's groups (one ``aggregate``, one ``$group`` by key: of the
groups served so far in that window plus the ones still missing plus one, their newest items,
items, first times, the distinct actors of up to :data:`~router.core.notify.groups.ACTORS_COUNTED` of
their items and, past a walk's first page, their newest items by position and sender; a server
without ``$topN`` and ``$firstN`` is asked again with ``$push``). Where the window meets
several periods, each is asked once more for the groups taken, with their actors' ids, so a
group's actors are counted as one set (and where one period's rank stopped short of a group
taken, for its part there); on a walk's first page, once more for the newest items of the
groups its first items do not show; where a group's newest items repeat an actor, once more
for its newest actors. With
pulled senders, each such cluster also returns the pulled senders' entries in that window (an
outbox ``find`` and an ``aggregate`` of their copies): those are a few authors' posts, counted
here, each post once as a page serves it once. A window used up before the page is full costs
a one-item page to find the next window (a page that fills as its window is used up leaves
that to the next page). Last, at once: one ``find`` per cluster holding some of the page's
newest items reads them whole (by id: a group row carries positions, never items, which
together could pass 16 MiB), and one ``find`` per cluster from the newest down to the oldest
group's newest item reads the read marks.

Read marks and the unseen-groups badge are :mod:`router.core.notify.group_marks`'s.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

import attrs
from bson import ObjectId

from ...cursor import CursorState, Position
from ...errors import GroupsUnsupported
from ...model import FeedItem
from ...timemap import ReadWindow, TimeMap
from .groups import (
    ACTORS_COUNTED,
    Group,
    GroupBy,
    GroupCursor,
    GroupPage,
    encode_group_cursor,
    group_key,
    ident,
    key_hash,
    newest_actors,
    position_key,
)
from ..layouts import grouping, layout_for
from ..reads import ReadPlan, read_program
from ..settings import MAX_PAGE
from .seen import ALL_GROUPS as ALL
from .seen import highest_read_marks, marker_program, read_marks_find
from ..steps import Aggregate, Concurrently, Failure, InsertOutcome, Program, Request

__all__ = ["GroupPlan", "answer_of", "groups_program", "one"]

log = logging.getLogger(__name__)
_TOP = ObjectId(b"\xff" * 12)


@attrs.frozen
class GroupPlan:
    """A grouped read's inputs besides the storage: the request and the map at the time of the call."""

    receiver_id: int | str
    by: GroupBy
    limit: int
    newest: int
    cursor: GroupCursor | None
    timemap: TimeMap
    now: datetime
    window: ReadWindow | None
    deadline: float
    pull: tuple[int | str, ...] = ()
    types: tuple[int | str, ...] = ()
    deployments: Mapping[str, Hashable] = attrs.field(factory=dict)

    def names(self) -> list[str]:
        """The read window's clusters, newest first."""
        return self.timemap.clusters_for_read(now=self.now, window=self.window)

    def meeting(self, start: datetime, end: datetime, ceiling: datetime | None = None) -> list[str]:
        """The read window's clusters whose periods meet ``[start, end)`` (and start by *ceiling*), newest first."""
        ends = {m.name: m.end_date for m in self.timemap.periods}
        top = end - timedelta(milliseconds=1) if ceiling is None else min(end - timedelta(milliseconds=1), ceiling)
        names = self.timemap.clusters_for_read(now=self.now, window=self.window, before=top)
        return [n for n in names if ends.get(n) is None or ends[n] > start]  # type: ignore[operator]


def answer_of(answer: Any) -> Any:
    """*answer* as a value: a failure raised (a server that cannot group as :class:`GroupsUnsupported`)."""
    if isinstance(answer, Failure):
        if answer.kind == "unsupported":
            raise GroupsUnsupported(answer.error.cluster, str(answer.error).split(": ", 1)[-1]) from answer.error
        raise answer.error
    if isinstance(answer, InsertOutcome):
        if answer.failure is not None:
            raise answer.failure.error
    return answer


def _locate(plan: GroupPlan, below: datetime | None, limit: int = 1, periods: int | None = None) -> Program[list[FeedItem]]:
    """The newest item of the receiver's feed (below *below*, when given), or its *limit* newest in at most *periods*
    periods: a page with the same pull and types."""
    state = CursorState() if below is None else CursorState(position=Position(below - timedelta(milliseconds=1), _TOP))
    page = yield from read_program(ReadPlan(
        receiver_id=plan.receiver_id, limit=limit, state=state, timemap=plan.timemap, now=plan.now, window=plan.window,
        on_unavailable="raise", deadline=plan.deadline, pull=plan.pull, types=plan.types, deployments=plan.deployments,
        max_periods=periods))
    return list(page.items)


def _sample_size(plan: GroupPlan) -> int:
    """How many of the receiver's newest items a walk's first page reads (in the newest period only): about as costly
    as one item on a server that sorts a receiver's items for any page (FerretDB 2), and enough to show most groups'
    newest actors."""
    return min(MAX_PAGE, 2 * plan.limit * plan.newest)


def _copies(plan: GroupPlan, ceiling: Position | None,
            groups: Sequence[tuple[Any, ...]] | None = None) -> dict[str, Any]:
    """The copies a group counts: of the types asked, at or below *ceiling*, not from a pulled sender (those are
    counted with the pulled posts, each post once), of *groups* when given."""
    return grouping.copy_match(types=plan.types, not_from=plan.pull, ceiling=ceiling,
                               groups=(plan.by.fields, groups) if groups is not None else None)


def _pulled(plan: GroupPlan, clusters: Sequence[str], start: datetime, end: datetime,
            ceiling: Position) -> Program[dict[Hashable, list[FeedItem]]]:
    """The pulled senders' items in ``[start, end)`` at or below *ceiling*, each post once, by group (the
    :func:`~router.core.notify.groups.ident` of its values)."""
    programs: list[Program[Any]] = []
    for name in clusters:
        layout = layout_for(plan.timemap, name)
        programs += [one(grouping.pulled_copies(layout, name, plan.receiver_id, start, end, plan.pull, plan.types,
                                                 ceiling, plan.deadline)),
                     grouping.pulled_posts(name, plan.pull, plan.types, start, end, ceiling, plan.deadline)]
    answers = yield Concurrently(programs, [n for n in clusters for _ in range(2)])
    found: dict[tuple[datetime, bytes], FeedItem] = {}
    for i in range(0, len(answers), 2):
        for where, item, own in grouping.pulled_items(answer_of(answers[i]), answer_of(answers[i + 1]), plan.receiver_id,
                                                      ceiling):
            if own:
                found[where] = item  # the receiver's own copy wins, as on a page
            else:
                found.setdefault(where, item)
    by_group: dict[Hashable, list[FeedItem]] = {}
    for item in found.values():
        by_group.setdefault(ident(plan.by.values_of(item)), []).append(item)
    return by_group


def one(request: Request) -> Program[Any]:
    """A program of one request, answered with its answer."""
    answer = yield request
    return answer


@attrs.frozen
class _Ranked:
    values: tuple[Any, ...]
    key: str
    last: Position

    @property
    def group(self) -> Hashable:
        """What tells this group from another in the router's dicts (:func:`~router.core.notify.groups.ident`)."""
        return ident(self.values)


@attrs.frozen
class _Counted:
    """A group of the page before its newest items are read: its counts, and its newest actors' newest items, by
    position (copies, read whole at the end of the page, from the clusters :attr:`where` names) or whole (pulled)."""

    count: int
    actors: int
    capped: bool
    first: datetime
    newest: tuple[grouping.Newest | FeedItem, ...]
    where: Mapping[ObjectId, str]


def _fast_or_slow(request: Callable[[bool], Aggregate]) -> Program[Any]:
    """*request* with ``$topN`` and ``$firstN``, or (on a server that does not know them) without."""
    answer = yield request(True)
    if isinstance(answer, Failure) and answer.kind == "unsupported":
        answer = yield request(False)
    return answer_of(answer)


def _summarise(plan: GroupPlan, clusters: Sequence[str], start: datetime, end: datetime, ceiling: Position,
               taken: Sequence[_Ranked] | None, limit: int | None, *, tops: bool) -> Program[list[list[grouping.Summary]]]:
    """Each cluster's summaries of its groups in ``[start, end)`` at or below *ceiling*, one aggregate each: of the
    *limit* groups with the newest items (a rank), or of the groups *taken*, with their actors' ids (to count a group
    that spans periods as one set); with *tops*, their newest items too (the costliest part on FerretDB 2: a walk's
    first page reads them from its sample instead)."""
    match = _copies(plan, ceiling, [t.values for t in taken] if taken is not None else None)

    def summarised(cluster: str) -> Program[list[grouping.Summary]]:
        layout = layout_for(plan.timemap, cluster)
        rows = yield from _fast_or_slow(lambda fast: grouping.summaries(
            layout, cluster, plan.receiver_id, start, grouping.through(end, ceiling), match, plan.by.fields, newest=plan.newest if tops else 0,
            sample=ACTORS_COUNTED, limit=limit, ids=taken is not None, fast=fast, deadline=plan.deadline))
        return grouping.summary_rows(rows, plan.by.fields)

    answers = yield Concurrently([summarised(c) for c in clusters], list(clusters))
    return list(answers)


def _rank(plan: GroupPlan, summaries: Sequence[Sequence[grouping.Summary]], pulled: Mapping[Hashable, list[FeedItem]],
          window: int) -> list[_Ranked]:
    """The window's groups newest first by their newest item, from each cluster's rank and the pulled items."""
    last: dict[Hashable, tuple[tuple[Any, ...], tuple[datetime, bytes]]] = {}

    def newer(values: tuple[Any, ...], mine: tuple[datetime, bytes]) -> None:
        group = ident(values)
        if group not in last or last[group][1] < mine:
            last[group] = (values, mine)

    for rows in summaries:
        for row in rows:
            newer(row.values, position_key(row.last))
    for items in pulled.values():
        newer(plan.by.values_of(items[0]), max((i.event_time, i.id.binary) for i in items))  # type: ignore[union-attr]
    ranked = [_Ranked(v, group_key(plan.by, v, window), Position(t, ObjectId(b))) for v, (t, b) in last.values()]
    ranked.sort(key=lambda r: position_key(r.last), reverse=True)
    return ranked


def _count(plan: GroupPlan, clusters: Sequence[str], start: datetime, end: datetime, ceiling: Position,
           taken: Sequence[_Ranked], parts: Sequence[Sequence[grouping.Summary]],
           pulled: Mapping[Hashable, list[FeedItem]], sample: Sequence[FeedItem] | None) -> Program[list[_Counted]]:
    """The counts of each group *taken* from its clusters' summaries and its pulled items, each item counted once,
    and its newest actors' items: from the *sample* (the walk's first items, newest first: in each group, its newest
    ones) where it shows enough actors or all the group's items, else from its newest items in each cluster (the
    summaries', or on a walk's first page one more aggregate's); where those repeat an actor and the group holds
    more, one more aggregate for its newest actors."""
    by_group: dict[Hashable, list[tuple[str, grouping.Summary]]] = {}
    for cluster, rows in zip(clusters, parts):
        for row in rows:
            by_group.setdefault(ident(row.values), []).append((cluster, row))
    shown: dict[Hashable, list[FeedItem]] = {}
    newest: dict[tuple[str, Hashable], tuple[grouping.Newest, ...]] = {
        (c, g): row.newest for g, mine in by_group.items() for c, row in mine}
    if sample is not None:
        shown, unsampled = _from_sample(plan, start, taken, by_group, pulled, sample)
        holders = [c for c in clusters if any(h == c for t in unsampled for h, _ in by_group.get(t.group, ()))]
        if holders:  # their newest items, by $topN in each cluster that holds some
            tops = yield from _summarise(plan, holders, start, end, ceiling, unsampled, None, tops=True)
            newest.update({(c, ident(row.values)): row.newest for c, rows in zip(holders, tops) for row in rows})
    again: dict[str, list[_Ranked]] = {}
    for t in taken:
        for cluster, row in () if t.group in shown else by_group.get(t.group, ()):
            tops_here = newest[(cluster, t.group)]
            if row.count > len(tops_here) and len({ident(n.sender_id) for n in tops_here}) < plan.newest:
                again.setdefault(cluster, []).append(t)
    if again:
        names = list(again)
        answers = yield Concurrently([_newest_actors(plan, c, start, end, ceiling, again[c]) for c in names], names)
        newest.update({(c, ident(values)): items for c, rows in zip(names, answers) for values, items in rows})
    spans = len(clusters) > 1  # a group may then hold items in several periods: count its actors as one set
    out = []
    for t in taken:
        mine = by_group.get(t.group, [])
        count = sum(row.count for _, row in mine)
        if spans:
            actors = len({ident(a) for _, row in mine for a in row.ids or ()})
        else:
            actors = sum(row.actors for _, row in mine)
        firsts = [row.first for _, row in mine]
        where = {n.id: cluster for cluster, _ in mine for n in newest[(cluster, t.group)]}
        candidates: list[grouping.Newest | FeedItem] = [n for cluster, _ in mine for n in newest[(cluster, t.group)]]
        pulled_items = pulled.get(t.group, [])
        if pulled_items:  # pulled senders are not among the copies counted above: their actors are others
            count += len(pulled_items)
            actors += len({ident(i.sender_id) for i in pulled_items})
            firsts.append(min(i.event_time for i in pulled_items))
            candidates += pulled_items
        if t.group in shown:  # (the sample holds pulled items as a page serves them)
            candidates = list(shown[t.group])
        out.append(_Counted(count, actors, any(row.sampled < row.count for _, row in mine),
                            min(firsts, default=t.last.event_time), newest_actors(candidates, plan.newest), where))
    return out


def _from_sample(plan: GroupPlan, start: datetime, taken: Sequence[_Ranked],
                 by_group: Mapping[Hashable, Sequence[tuple[str, grouping.Summary]]],
                 pulled: Mapping[Hashable, list[FeedItem]],
                 sample: Sequence[FeedItem]) -> tuple[dict[Hashable, list[FeedItem]], list[_Ranked]]:
    """Of the groups *taken*, those whose newest actors the *sample* shows (it holds their newest items: as many
    actors as a group shows, or every item of it), with their items in it; and the others."""
    window = plan.by.window_of(start)
    sampled: dict[Hashable, list[FeedItem]] = {}
    for item in sample:
        if plan.by.window_of(item.event_time) == window:
            sampled.setdefault(ident(plan.by.values_of(item)), []).append(item)
    shown: dict[Hashable, list[FeedItem]] = {}
    others: list[_Ranked] = []
    for t in taken:
        mine = sampled.get(t.group, [])
        total = sum(row.count for _, row in by_group.get(t.group, ())) + len(pulled.get(t.group, ()))
        if len(mine) == total or len({ident(i.sender_id) for i in mine}) >= plan.newest:
            shown[t.group] = mine
        else:
            others.append(t)
    return shown, others


def _newest_actors(plan: GroupPlan, cluster: str, start: datetime, end: datetime, ceiling: Position,
                   groups: Sequence[_Ranked]) -> Program[list[tuple[tuple[Any, ...], tuple[grouping.Newest, ...]]]]:
    layout = layout_for(plan.timemap, cluster)
    match = _copies(plan, ceiling, [g.values for g in groups])
    rows = yield from _fast_or_slow(lambda fast: grouping.newest_actors(
        layout, cluster, plan.receiver_id, start, grouping.through(end, ceiling), match, plan.by.fields, plan.newest, fast=fast,
        deadline=plan.deadline))
    return grouping.newest_actor_rows(rows, plan.by.fields)


def _items(plan: GroupPlan, cluster: str, ids: Sequence[ObjectId]) -> Program[dict[ObjectId, FeedItem]]:
    """The copies *ids* of *cluster*, whole, by id."""
    copies = yield from layout_for(plan.timemap, cluster).copies_by_id(cluster, plan.receiver_id, ids, plan.deadline)
    return {c.id: c.item() for c in answer_of(copies)}


def _ends_after(timemap: TimeMap, name: str, t: datetime) -> bool:
    end = next((m.end_date for m in timemap.periods if m.name == name), None)
    return end is None or end > t


def groups_program(plan: GroupPlan) -> Program[GroupPage]:
    """One page of groups newest first (see the module docstring for what it asks)."""
    marker, _at = yield from marker_program(plan.receiver_id, plan.names(), deadline=plan.deadline)
    cursor = plan.cursor
    sample: list[FeedItem] | None = None  # the walk's first items, on its first page
    if cursor is None:
        sample = yield from _locate(plan, None, _sample_size(plan), periods=1)
        if not sample:  # nothing in the newest period: the newest item is older (a prefix, too: of one item)
            sample = yield from _locate(plan, None)
        if not sample:
            return GroupPage((), None)
        top = sample[0]
        assert top.id is not None
        cursor = GroupCursor(plan.by.fingerprint(plan.types), Position(top.event_time, top.id),
                             plan.by.window_of(top.event_time))
    ceiling, window, served = cursor.ceiling, cursor.window, set(cursor.served)
    chosen: list[tuple[_Ranked, _Counted, datetime]] = []
    queried: list[str] = []
    next_cursor: GroupCursor | None = None
    if cursor.below:  # the last page used its window up: the walk goes on in the next window that holds an item
        below = yield from _locate(plan, plan.by.window_bounds(window)[0])
        if not below:
            return GroupPage((), None)
        window = plan.by.window_of(below[0].event_time)
    while True:
        need = plan.limit - len(chosen)
        start, end = plan.by.window_bounds(window)
        clusters = plan.meeting(start, end, ceiling.event_time)
        queried += [c for c in clusters if c not in queried]
        pulled = (yield from _pulled(plan, clusters, start, end, ceiling)) if plan.pull else {}
        want = len(served) + need + 1
        summaries = yield from _summarise(plan, clusters, start, end, ceiling, None, want, tops=sample is None)
        ranked = _rank(plan, summaries, pulled, window)
        fresh = [r for r in ranked if key_hash(r.key) not in served]
        taken = fresh[:need]
        if taken:
            ranks = {ident(row.values) for row in summaries[0]}
            whole = len(summaries[0]) < want or all(t.group in ranks for t in taken)
            # One period's rank that holds every group taken (or every group of the window) counted them already;
            # over several periods, a group's parts are counted together, their actors as one set.
            parts = summaries if len(clusters) == 1 and whole else (
                yield from _summarise(plan, clusters, start, end, ceiling, taken, None, tops=sample is None))
            counted = yield from _count(plan, clusters, start, end, ceiling, taken, parts, pulled, sample)
            chosen += [(t, c, start) for t, c in zip(taken, counted)]
            served.update(key_hash(t.key) for t in taken)
        if len(fresh) > len(taken):  # the window holds more: the next page goes on in it
            next_cursor = GroupCursor(cursor.fingerprint, ceiling, window, frozenset(served))
            break
        if len(chosen) == plan.limit:  # full, and the window used up: the next page looks below it (a full page
            next_cursor = GroupCursor(cursor.fingerprint, ceiling, window, below=True)  # carries a cursor)
            break
        below = yield from _locate(plan, start)
        if not below:
            break
        window, served = plan.by.window_of(below[0].event_time), set()
    items, marks = (yield from _finish(plan, [(t, c) for t, c, _ in chosen])) if chosen else ({}, {})
    everything = marks.get(ALL)
    groups = []
    for t, c, start in chosen:
        newest = position_key(t.last)
        best = max([m for m in (marks.get(t.key), everything) if m is not None], default=None)
        read = best is not None and best >= newest
        seen = marker is not None and newest <= position_key(marker)
        shown = tuple(n if isinstance(n, FeedItem) else items[n.id] for n in c.newest
                      if isinstance(n, FeedItem) or n.id in items)  # (a copy deleted meanwhile is not shown)
        groups.append(Group(key=t.key, values=t.values, window_start=start, count=c.count, actor_count=c.actors,
                            items=shown, first_time=c.first, last_time=t.last.event_time, newest=t.last,
                            seen=seen, read=read, actors_capped=c.capped))
    return GroupPage(tuple(groups), encode_group_cursor(next_cursor) if next_cursor else None, tuple(queried))


def _finish(plan: GroupPlan, chosen: Sequence[tuple[_Ranked, _Counted]]) -> Program[
        tuple[dict[ObjectId, FeedItem], dict[str, tuple[datetime, bytes]]]]:
    """The page's newest items, whole (one find per cluster that holds some), and the highest read mark of each of
    its groups and of every group (one find per cluster from the newest down to the oldest group's newest item),
    asked at once."""
    wanted: dict[str, list[ObjectId]] = {}
    for _t, c in chosen:
        for n in c.newest:
            if isinstance(n, grouping.Newest):
                wanted.setdefault(c.where[n.id], []).append(n.id)
    oldest = min(t.last.event_time for t, _ in chosen)
    names = [n for n in plan.names() if _ends_after(plan.timemap, n, oldest)]
    keys = [t.key for t, _ in chosen]
    holders = list(wanted)
    answers = yield Concurrently(
        [_items(plan, c, wanted[c]) for c in holders]
        + [one(read_marks_find(n, plan.receiver_id, keys, oldest, plan.deadline)) for n in names], holders + names)
    items: dict[ObjectId, FeedItem] = {}
    for found in answers[:len(holders)]:
        items.update(found)
    marks: dict[str, tuple[datetime, bytes]] = {}
    for answer in answers[len(holders):]:
        for group, mark in highest_read_marks(answer_of(answer)).items():
            marks[group] = max(marks.get(group, mark), mark)
    return items, marks
