"""Grouped reads as programs: a page of groups, the unseen-groups badge, and marking groups read.

**A page** (:func:`groups_program`): the seen marker (one ``find`` per cluster, newest first,
until one has it); on the walk's first page, the newest item (a one-item page of
:func:`~router.core.reads.read_program`) is the ceiling and names the first window. For each
window the page takes, every cluster whose period meets the window (and has started) is asked
once to *rank* the window's groups (one ``aggregate``: the groups' newest items, limited to
the groups served so far in that window plus the ones still missing plus one), and once for
the *details* of the groups taken (one ``aggregate``: items, distinct actors, first time and
newest actors of each, with ``$topN``; a server without it is asked again with ``$push``),
and once more for the groups' actors where the window meets several periods (to count them
as one set). With pulled senders, each such cluster also returns the pulled senders'
entries in that window (an outbox ``find`` and an ``aggregate`` of their copies): those are
a few authors' posts, counted here, each post once as a page serves it once. A window used up
before the page is full costs a one-item page to find the next window (a page that fills as
its window is used up leaves that to the next page). Last, one ``find`` per
cluster from the newest down to the oldest group's newest item reads the read marks.

**Read marks** (:func:`mark_read_program`) are inserted, never updated: ``{receiver_id,
group, read_time, read_key}`` in ``seen`` (:func:`~router.core.seen.read_mark_documents`: no
``event_time``, so the seen markers' queries never meet them), in the cluster owning the
marked position; ``group`` is the group's key, or ``"*"`` for every group. A group is read
when a mark of its key or ``"*"`` is at or above its newest item. A mark then deletes the
same receiver's marks below it for that key (``"*"``: for every key) in its cluster. Two
devices marking at once each insert their own; a cleanup removes only marks below its own,
so the highest survives, on servers that lose concurrent updates of one document too
(FerretDB v1).
"""

from __future__ import annotations

import logging
from collections.abc import Hashable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

import attrs
from bson import ObjectId

from ..cursor import CursorState, Position
from ..errors import GroupsUnsupported
from ..model import FeedItem
from ..timemap import ReadWindow, TimeMap
from .groups import (
    Group,
    GroupBy,
    GroupCursor,
    GroupPage,
    UnseenGroups,
    encode_group_cursor,
    group_key,
    ident,
    key_hash,
    newest_actors,
    position_key,
)
from .layouts import grouping, layout_for, outbox
from .reads import ReadPlan, read_program
from .seen import ALL_GROUPS as ALL
from .seen import highest_read_marks, marker_program, read_mark_documents, read_marks_below, read_marks_find
from .steps import Aggregate, Concurrently, Failure, Insert, InsertOutcome, Program, Request

__all__ = ["ALL", "GroupPlan", "Mark", "groups_program", "mark_read_program", "unseen_groups_program"]

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


def _answer(answer: Any) -> Any:
    if isinstance(answer, Failure):
        if answer.kind == "unsupported":
            raise GroupsUnsupported(answer.error.cluster, str(answer.error).split(": ", 1)[-1]) from answer.error
        raise answer.error
    if isinstance(answer, InsertOutcome):
        if answer.failure is not None:
            raise answer.failure.error
    return answer


def _locate(plan: GroupPlan, below: datetime | None) -> Program[FeedItem | None]:
    """The newest item of the receiver's feed (below *below*, when given): a one-item page with the same pull and types."""
    state = CursorState() if below is None else CursorState(position=Position(below - timedelta(milliseconds=1), _TOP))
    page = yield from read_program(ReadPlan(
        receiver_id=plan.receiver_id, limit=1, state=state, timemap=plan.timemap, now=plan.now, window=plan.window,
        on_unavailable="raise", deadline=plan.deadline, pull=plan.pull, types=plan.types, deployments=plan.deployments))
    return page.items[0] if page.items else None


def _copies(plan: GroupPlan, ceiling: Position | None,
            groups: Sequence[tuple[Any, ...]] | None = None) -> dict[str, Any]:
    """The copies a group counts: of the types asked, at or below *ceiling*, not from a pulled sender (those are
    counted with the pulled posts, each post once), of *groups* when given."""
    return grouping.copy_match(types=plan.types, not_from=plan.pull, ceiling=ceiling,
                               groups=(plan.by.fields, groups) if groups is not None else None)


def _pulled(plan: GroupPlan, clusters: Sequence[str], start: datetime, end: datetime,
            ceiling: Position) -> Program[dict[Hashable, list[FeedItem]]]:
    """The pulled senders' items in ``[start, end)`` at or below *ceiling*, each post once, by group (the
    :func:`~router.core.groups.ident` of its values)."""
    programs: list[Program[Any]] = []
    for name in clusters:
        layout = layout_for(plan.timemap, name)
        programs += [_one(grouping.pulled_copies(layout, name, plan.receiver_id, start, end, plan.pull, plan.types,
                                                 ceiling, plan.deadline)),
                     grouping.pulled_posts(name, plan.pull, plan.types, start, end, ceiling, plan.deadline)]
    answers = yield Concurrently(programs, [n for n in clusters for _ in range(2)])
    found: dict[tuple[datetime, bytes], FeedItem] = {}
    for i in range(0, len(answers), 2):
        for where, item, own in grouping.pulled_items(_answer(answers[i]), _answer(answers[i + 1]), plan.receiver_id,
                                                      ceiling):
            if own:
                found[where] = item  # the receiver's own copy wins, as on a page
            else:
                found.setdefault(where, item)
    by_group: dict[Hashable, list[FeedItem]] = {}
    for item in found.values():
        by_group.setdefault(ident(plan.by.values_of(item)), []).append(item)
    return by_group


def _one(request: Request) -> Program[Any]:
    answer = yield request
    return answer


@attrs.frozen
class _Ranked:
    values: tuple[Any, ...]
    key: str
    last: Position

    @property
    def group(self) -> Hashable:
        """What tells this group from another in the router's dicts (:func:`~router.core.groups.ident`)."""
        return ident(self.values)


def _rank(plan: GroupPlan, clusters: Sequence[str], start: datetime, end: datetime, ceiling: Position, limit: int,
          pulled: Mapping[Hashable, list[FeedItem]], window: int) -> Program[list[_Ranked]]:
    """The window's groups newest first by their newest item at or below *ceiling*: at least the *limit* newest."""
    match = _copies(plan, ceiling)
    programs = [_one(grouping.rank(layout_for(plan.timemap, c), c, plan.receiver_id, start, end, match, plan.by.fields,
                                   limit, plan.deadline)) for c in clusters]
    answers = yield Concurrently(programs, list(clusters))
    last: dict[Hashable, tuple[tuple[Any, ...], tuple[datetime, bytes]]] = {}

    def newer(values: tuple[Any, ...], mine: tuple[datetime, bytes]) -> None:
        group = ident(values)
        if group not in last or last[group][1] < mine:
            last[group] = (values, mine)

    for answer in answers:
        for values, newest in grouping.rank_rows(_answer(answer), plan.by.fields):
            newer(values, position_key(newest))
    for items in pulled.values():
        newer(plan.by.values_of(items[0]), max((i.event_time, i.id.binary) for i in items))  # type: ignore[union-attr]
    ranked = [_Ranked(v, group_key(plan.by, v, window), Position(t, ObjectId(b))) for v, (t, b) in last.values()]
    ranked.sort(key=lambda r: position_key(r.last), reverse=True)
    return ranked


def _details(plan: GroupPlan, clusters: Sequence[str], start: datetime, end: datetime, ceiling: Position,
             taken: Sequence[_Ranked], pulled: Mapping[Hashable, list[FeedItem]]) -> Program[list[grouping.Detail]]:
    """Counts, first time and newest actors of each group *taken*, each item counted once: one aggregate per cluster
    (two on a server without ``$topN``), and one more listing the actors where the window meets several periods."""
    spans = len(clusters) > 1  # a group may then hold items in several periods: count its actors as one set
    match = _copies(plan, ceiling, [t.values for t in taken])
    programs = [_counted(plan, c, start, end, match) for c in clusters]
    if spans:
        programs += [_one(grouping.actors(layout_for(plan.timemap, c), c, plan.receiver_id, start, end, match,
                                          plan.by.fields, plan.deadline)) for c in clusters]
    answers = yield Concurrently(programs, list(clusters) * (2 if spans else 1))
    parts: dict[Hashable, list[grouping.Detail]] = {}
    for answer in answers[:len(clusters)]:
        for values, detail in answer:
            parts.setdefault(ident(values), []).append(detail)
    actor_sets: dict[Hashable, set[Hashable]] = {}
    for answer in answers[len(clusters):]:
        for values, actor in grouping.actor_rows(_answer(answer), plan.by.fields):
            actor_sets.setdefault(ident(values), set()).add(ident(actor))
    out = []
    for t in taken:
        mine = parts.get(t.group, [])
        count = sum(d.count for d in mine)
        actors = len(actor_sets.get(t.group, ())) if spans else sum(d.actors for d in mine)
        firsts = [d.first for d in mine]
        items = [i for d in mine for i in d.items]
        pulled_items = pulled.get(t.group, [])
        if pulled_items:  # pulled senders are not among the copies counted above: their actors are others
            count += len(pulled_items)
            actors += len({ident(i.sender_id) for i in pulled_items})
            firsts.append(min(i.event_time for i in pulled_items))
        out.append(grouping.Detail(count, actors, min(firsts, default=t.last.event_time),
                                   newest_actors(items + pulled_items, plan.newest)))
    return out


def _counted(plan: GroupPlan, cluster: str, start: datetime, end: datetime,
             match: Mapping[str, Any]) -> Program[list[tuple[tuple[Any, ...], grouping.Detail]]]:
    """The details of one cluster: with ``$topN``, or (on a server that does not know it) with ``$push``."""
    layout = layout_for(plan.timemap, cluster)

    def request(top_n: bool) -> Aggregate:
        return grouping.details(layout, cluster, plan.receiver_id, start, end, match, plan.by.fields, plan.newest,
                                top_n=top_n, deadline=plan.deadline)

    answer = yield request(True)
    if isinstance(answer, Failure) and answer.kind == "unsupported":
        answer = yield request(False)
    return grouping.detail_rows(_answer(answer), plan.by.fields, plan.receiver_id)


def _read_marks(plan: GroupPlan, keys: Sequence[str], oldest: datetime) -> Program[dict[str, tuple[datetime, bytes]]]:
    """The highest read mark of each of *keys* (and of every group) at or above *oldest*."""
    names = [n for n in plan.names() if _ends_after(plan.timemap, n, oldest)]
    answers = yield Concurrently([_one(read_marks_find(n, plan.receiver_id, keys, oldest, plan.deadline)) for n in names],
                                 names)
    marks: dict[str, tuple[datetime, bytes]] = {}
    for answer in answers:
        for group, mark in highest_read_marks(_answer(answer)).items():
            marks[group] = max(marks.get(group, mark), mark)
    return marks


def _ends_after(timemap: TimeMap, name: str, t: datetime) -> bool:
    end = next((m.end_date for m in timemap.periods if m.name == name), None)
    return end is None or end > t


def groups_program(plan: GroupPlan) -> Program[GroupPage]:
    """One page of groups newest first (see the module docstring for what it asks)."""
    marker, _at = yield from marker_program(plan.receiver_id, plan.names(), deadline=plan.deadline)
    cursor = plan.cursor
    if cursor is None:
        top = yield from _locate(plan, None)
        if top is None:
            return GroupPage((), None)
        assert top.id is not None
        cursor = GroupCursor(plan.by.fingerprint(plan.types), Position(top.event_time, top.id),
                             plan.by.window_of(top.event_time))
    ceiling, window, served = cursor.ceiling, cursor.window, set(cursor.served)
    chosen: list[tuple[_Ranked, grouping.Detail, datetime]] = []
    queried: list[str] = []
    next_cursor: GroupCursor | None = None
    if cursor.below:  # the last page used its window up: the walk goes on in the next window that holds an item
        below = yield from _locate(plan, plan.by.window_bounds(window)[0])
        if below is None:
            return GroupPage((), None)
        window = plan.by.window_of(below.event_time)
    while True:
        need = plan.limit - len(chosen)
        start, end = plan.by.window_bounds(window)
        clusters = plan.meeting(start, end, ceiling.event_time)
        queried += [c for c in clusters if c not in queried]
        pulled = (yield from _pulled(plan, clusters, start, end, ceiling)) if plan.pull else {}
        ranked = yield from _rank(plan, clusters, start, end, ceiling, len(served) + need + 1, pulled, window)
        fresh = [r for r in ranked if key_hash(r.key) not in served]
        taken = fresh[:need]
        if taken:
            details = yield from _details(plan, clusters, start, end, ceiling, taken, pulled)
            chosen += [(t, d, start) for t, d in zip(taken, details)]
            served.update(key_hash(t.key) for t in taken)
        if len(fresh) > len(taken):  # the window holds more: the next page goes on in it
            next_cursor = GroupCursor(cursor.fingerprint, ceiling, window, frozenset(served))
            break
        if len(chosen) == plan.limit:  # full, and the window used up: the next page looks below it (a full page
            next_cursor = GroupCursor(cursor.fingerprint, ceiling, window, below=True)  # carries a cursor)
            break
        below = yield from _locate(plan, start)
        if below is None:
            break
        window, served = plan.by.window_of(below.event_time), set()
    marks: dict[str, tuple[datetime, bytes]] = {}
    if chosen:
        marks = yield from _read_marks(plan, [t.key for t, _, _ in chosen], min(t.last.event_time for t, _, _ in chosen))
    everything = marks.get(ALL)
    groups = []
    for t, d, start in chosen:
        newest = position_key(t.last)
        best = max([m for m in (marks.get(t.key), everything) if m is not None], default=None)
        read = best is not None and best >= newest
        seen = marker is not None and newest <= position_key(marker)
        groups.append(Group(key=t.key, values=t.values, window_start=start, count=d.count, actor_count=d.actors,
                            items=d.items, first_time=d.first, last_time=t.last.event_time, newest=t.last,
                            seen=seen, read=read))
    return GroupPage(tuple(groups), encode_group_cursor(next_cursor) if next_cursor else None, tuple(queried))


@attrs.frozen
class Mark:
    """One read mark to record: a group's key (or ``"*"``) read through *through*."""

    group: str
    through: Position


def mark_read_program(receiver_id: int | str, marks: Sequence[tuple[Mark, str]], *, deadline: float) -> Program[int]:
    """Insert *marks* (each in the cluster paired with it: the owner of its own position), then delete the marks they
    make redundant."""
    by_cluster: dict[str, list[Mark]] = {}
    for m, cluster in marks:
        by_cluster.setdefault(cluster, []).append(m)
    names = list(by_cluster)
    pairs = {n: [(m.group, m.through) for m in ms] for n, ms in by_cluster.items()}
    outcomes = yield Concurrently([_one(Insert(n, "seen", read_mark_documents(receiver_id, pairs[n]), deadline))
                                   for n in names], names)
    for outcome in outcomes:
        _answer(outcome)
        if outcome.write_errors:
            raise RuntimeError(f"a read mark was refused: {outcome.write_errors[0].message}")
    cleanups = yield Concurrently([_one(read_marks_below(n, receiver_id, pairs[n], deadline)) for n in names], names)
    for name, cleaned in zip(names, cleanups):
        if isinstance(cleaned, Failure):  # the marks are stored; lower ones left are harmless, and go next time
            log.warning("read marks below the new ones stay for now: %s", cleaned.error, extra={"cluster": name})
    return len(marks)


def unseen_groups_program(plan: GroupPlan, cap: int) -> Program[UnseenGroups]:
    """How many groups hold an item newer than the seen marker, up to *cap*: per cluster from the newest down to the
    marker's, one ``aggregate`` of the groups of the copies newer than it (with pulled senders, one of their outbox
    entries too, and a ``find`` of those in the marker's millisecond), stopping once past *cap*."""
    names = plan.names()
    marker, at = yield from marker_program(plan.receiver_id, names, deadline=plan.deadline)
    found: set[Hashable] = set()
    queried: list[str] = []
    for i, name in enumerate(names[: at + 1]):
        bound = marker if i == at else None
        fields, span = plan.by.fields, plan.by.span_ms
        programs = [_one(grouping.unseen(layout_for(plan.timemap, name), name, plan.receiver_id,
                                         plan.timemap.start_of(name), bound, plan.types, fields, span, cap + 1,
                                         plan.deadline))]
        if plan.pull:
            after = bound.event_time if bound is not None else None
            programs.append(_one(grouping.unseen_outbox(name, plan.pull, after, plan.types, fields, span, cap + 1,
                                                        plan.deadline)))
            if bound is not None:
                programs.append(outbox.find(name, plan.pull, plan.deadline, types=plan.types, at=bound.event_time))
        answers = yield Concurrently(programs, [name] * len(programs))
        queried.append(name)
        for answer in answers[:2]:
            found.update(ident(row) for row in grouping.unseen_rows(_answer(answer), plan.by.fields))
        if len(answers) == 3 and bound is not None:
            for post in _answer(answers[2]):
                entry = outbox.pulled_item(post, plan.receiver_id)
                if entry is not None and (entry[0], entry[1].binary) > position_key(bound):
                    found.add(ident((*plan.by.values_of(entry[2]), plan.by.window_of(entry[0]))))
        if len(found) > cap:
            break
    return UnseenGroups(min(len(found), cap), len(found) > cap, marker, tuple(queried))
