"""The edges of grouped notifications against real servers, on both doors, in every layout (a contract file).

Key values of every BSON type (booleans apart from numbers, numbers by value whatever their
type, lists and documents by value); read marks placed and checked one by one; groups whose
newest items are too large to travel together; groups of many actors across periods, with
the commands and documents a page costs counted.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

import attrs
import pytest
from bson import Int64

from router import FeedItem, FeedRouter, GroupBy, InvalidItem, Position, RouterConfig, data_key
from router.core.notify.groups import group_key
from harness.commands import CommandLog
from harness.localservers import LocalClusters

from .conftest import DOOR_PER_LAYOUT, MANY_COPIES, NAMES, NOW, P2, register

#: A storage contract file: every test here runs once per layout the servers hold, and on both doors.
pytestmark = pytest.mark.contract

_ids = itertools.count(5_000_000)


def fresh() -> int:
    return next(_ids)


def note(r: int, when: datetime, actor: int, target: Any, n: int, kind: str = "like", **data: Any) -> FeedItem:
    return FeedItem(receiver_id=r, sender_id=actor, event_time=when, type=kind, data={"target": target, **data},
                    data_key=data_key("edge", f"{r}-{n}"))


def tagged(value: Any) -> Any:
    """A BSON value as the servers compare it, as a hashable Python value: booleans apart from numbers, numbers by
    value whatever their type, lists and documents element by element (a document's fields in order)."""
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, (int, float)):
        return ("number", value)
    if isinstance(value, list):
        return ("array", tuple(tagged(v) for v in value))
    if isinstance(value, dict):
        return ("document", tuple((k, tagged(v)) for k, v in value.items()))
    return (type(value).__name__, value)


def model(items: Sequence[FeedItem], by: GroupBy) -> dict[Any, int]:
    """How many of *items* each group holds, by the group's values as the servers compare them."""
    counts: dict[Any, int] = {}
    for item in items:
        values = tuple(tagged(v) for v in (item.type, item.data.get("target")))
        counts[values] = counts.get(values, 0) + 1
    return counts


def grouped(router: Any, r: int, by: GroupBy = GroupBy()) -> list[Any]:
    groups, cursor = [], None
    while True:
        page = router.read_groups(r, key=by, limit=3, cursor=cursor)
        groups += page.groups
        cursor = page.next_cursor
        if cursor is None:
            return groups


def test_true_and_1_group_apart(router: FeedRouter) -> None:
    """Targets true and 1 in one window are two groups, on the server and in the router alike: every item is in
    exactly one group, the badge counts two, and marking one read leaves the other unread."""
    r = fresh()
    day = P2 + timedelta(days=3)
    items = [note(r, day + timedelta(minutes=m), 10 + m, target, m) for m, target in enumerate([True, 1, True, 1])]
    router.write_many(items)
    groups = grouped(router, r)
    assert sorted((tagged(g.values[1]), g.count, g.actor_count) for g in groups) == [
        (("bool", True), 2, 2), (("number", 1), 2, 2)]
    assert {tuple(tagged(v) for v in g.values): g.count for g in groups} == model(items, GroupBy())
    assert len({g.key for g in groups}) == 2
    assert router.unseen_groups(r).count == 2
    router.mark_read(r, [groups[0]])
    assert [g.read for g in router.read_groups(r).groups] == [True, False]


def test_list_and_document_targets_group_by_value(router: FeedRouter) -> None:
    """Lists and documents as data.target group by their value (numbers inside by value too), and never break a
    read or the badge. (Lists with distinct smallest elements: mongo-java-server groups lists by their smallest
    element, docs/notification-groups.md.)"""
    r = fresh()
    day = P2 + timedelta(days=4)
    targets: list[Any] = [[1, 2], [1.0, 2], [3, 4], {"a": 1}, {"a": 1.0}, {"b": [5]}, {"a": 1, "b": 2}, 7]
    items = [note(r, day + timedelta(minutes=m), 20 + m, target, m) for m, target in enumerate(targets)]
    router.write_many(items)
    groups = grouped(router, r)
    assert {tuple(tagged(v) for v in g.values): g.count for g in groups} == model(items, GroupBy())
    assert sum(g.count for g in groups) == len(items) and len(groups) == 6
    assert router.unseen_groups(r).count == 6
    router.mark_read(r, groups[:2])
    assert sum(g.read for g in grouped(router, r)) == 2


def test_a_group_of_5_and_5_0_keeps_its_key_when_either_goes(router: FeedRouter) -> None:
    """Targets 5.0, 5 and Int64(5) are one group, named by 5; deleting the item whose value the server happened to
    show keeps the key, and the group read."""
    r = fresh()
    day = P2 + timedelta(days=5)
    items = [note(r, day + timedelta(minutes=m), 30 + m, target, m) for m, target in enumerate([5.0, 5, Int64(5)])]
    router.write_many(items)
    (group,) = router.read_groups(r).groups
    assert (group.values, group.count) == (("like", 5), 3) and type(group.values[1]) is int
    router.mark_read(r, [group])
    for item in items[:2]:  # the 5.0 item, then the 5 one
        router.delete(item.data_key)
        (left,) = router.read_groups(r).groups
        assert (left.key, left.values, left.read) == (group.key, ("like", 5), True)
    assert router.read_groups(r).groups[0].count == 1


def test_each_mark_goes_to_the_cluster_of_its_own_position(router: FeedRouter, raw_clients: dict[str, Any],
                                                          db_name: str) -> None:
    """One group passed twice, as a newer and an older Group value (a 7-day window that spans two periods): each
    mark is stored in the cluster owning its own position, and the group reads as read."""
    r = fresh()
    by = GroupBy(span=timedelta(days=7))
    router.write(note(r, P2 - timedelta(hours=1), 40, 9, 0))
    (stale,) = router.read_groups(r, key=by).groups
    router.write(note(r, P2 + timedelta(hours=1), 41, 9, 1))
    (fresh_group,) = router.read_groups(r, key=by).groups
    assert stale.key == fresh_group.key and stale.newest != fresh_group.newest
    assert router.mark_read(r, [fresh_group, stale]) == 2
    placed = {name: sorted(d["read_time"] for d in raw_clients[name][db_name].seen.find({"receiver_id": r}))
              for name in NAMES}
    assert placed == {"cluster_1": [], "cluster_2": [stale.newest.event_time],
                      "cluster_3": [fresh_group.newest.event_time]}
    assert router.read_groups(r, key=by).groups[0].read


def test_mark_read_refuses_a_group_no_page_returned(router: FeedRouter, raw_clients: dict[str, Any],
                                                    db_name: str) -> None:
    """A Group value with an altered key or values, no newest item, a naive time or a newest item outside its window
    is refused with InvalidItem naming groups[i]; nothing is stored."""
    r = fresh()
    router.write_many([note(r, P2 + timedelta(days=6, minutes=m), 50 + m, 1, m) for m in range(2)])
    (group,) = router.read_groups(r).groups
    by = GroupBy()
    window = by.window_of(group.newest.event_time)
    naive = Position(group.newest.event_time.replace(tzinfo=None), group.newest.id)
    outside = Position(group.newest.event_time + timedelta(days=1), group.newest.id)
    for bad in [attrs.evolve(group, key=group_key(by, group.values, window - 1)),
                attrs.evolve(group, key=group_key(by, ("like", 2), window)),
                attrs.evolve(group, key="g1.not-a-key"),
                attrs.evolve(group, values=("like", 2)),
                attrs.evolve(group, newest=None),
                attrs.evolve(group, newest=naive),
                attrs.evolve(group, newest=outside),
                attrs.evolve(group, newest=Position(group.newest.event_time, "not an id"))]:
        with pytest.raises(InvalidItem, match=r"^groups\[1\]: "):
            router.mark_read(r, [group, bad])
    assert sum(raw_clients[n][db_name].seen.count_documents({"receiver_id": r}) for n in NAMES) == 0
    assert router.mark_read(r, [group]) == 1 and router.read_groups(r).groups[0].read


def test_a_group_of_items_too_large_to_travel_together(router: FeedRouter) -> None:
    """Three actors' items of 6 MiB each in one group (a row carrying them whole would pass 16 MiB, which the server
    refuses): the page shows the group with its three newest items whole, and the badge counts it."""
    r = fresh()
    day = P2 + timedelta(days=7)
    blob = "x" * (6 * 1024 * 1024)
    router.write_many([note(r, day + timedelta(minutes=m), 60 + m, 1, m, blob=blob) for m in range(3)])
    (group,) = router.read_groups(r).groups
    assert (group.count, group.actor_count, [i.sender_id for i in group.items]) == (3, 3, [62, 61, 60])
    assert all(i.data == {"target": 1, "blob": blob} for i in group.items)
    assert router.unseen_groups(r).count == 1


def test_newest_actors_when_the_newest_items_repeat_an_actor(router: FeedRouter) -> None:
    """A group whose five newest items are one actor's: its items are the newest item of each of its three newest
    actors all the same, newest first."""
    r = fresh()
    day = P2 + timedelta(days=8)
    actors = [70, 71, 72, 73] + [74] * 5  # oldest first: 74 liked five times last
    router.write_many([note(r, day + timedelta(minutes=m), a, 1, m) for m, a in enumerate(actors)])
    (group,) = router.read_groups(r).groups
    assert (group.count, group.actor_count, [i.sender_id for i in group.items]) == (9, 5, [74, 73, 72])
    assert group.items[0].event_time == day + timedelta(minutes=8)
    (one,) = router.read_groups(r, newest=1).groups
    assert [i.sender_id for i in one.items] == [74]


@MANY_COPIES
@DOOR_PER_LAYOUT
def test_a_group_of_many_actors_across_two_periods_is_one_row_per_period(
        make_config: Callable[..., RouterConfig], open_router: Callable[..., Any], layout: str, door: str,
        servers: LocalClusters) -> None:
    """Two groups of a 7-day window across a period boundary: 10,500 actors (5,250 on each side; in the other case,
    through the async door, which runs the same program, in buckets, whose writes of one receiver's 10,500 items took
    64 s of the suite, 2,600: more than 1,000 on each side still) and 60 (40 on each side, ten minutes apart, newer
    on the newer side than any of the big group's; 20 of them on both). A page asks each period to rank and count the
    window's groups, then to count the groups taken with their actors' ids (at most 1,000 a row), then for the newest
    items of the big group (the walk's first 12 items, all of the small one, do not show them), and never continues
    a cursor: the client receives a row per group and period for each, the first 12 items, the page's newest items
    and a few markers, not the actors (before: every (group, actor) pair, 11,000 rows). Counts are exact; the big
    group's actors are counted among 1,000 of its items on each side (actors_capped), the small one's as one set."""
    config = make_config(timeout=timedelta(seconds=60))
    register(config, layout=layout)
    log = CommandLog()
    r = fresh()
    by = GroupBy(span=timedelta(days=7))
    actors = 10_500 if (door, layout) == ("sync", "copies") else 2_600
    big = [note(r, P2 + timedelta(seconds=(i // 2) * (1 if i % 2 else -1) - (i % 2 == 0)), 100_000 + i, "big", i)
           for i in range(actors)]
    small = [note(r, P2 + timedelta(minutes=10 * m + 1), 200_000 + m, "small", 20_000 + m) for m in range(40)]
    small += [note(r, P2 - timedelta(minutes=10 * m + 1), 200_020 + m, "small", 21_000 + m) for m in range(40)]
    router = open_router(config, clock=lambda: NOW, event_listeners=[log])
    for chunk in range(0, len(big), 500):
        router.write_many(big[chunk:chunk + 500])
    router.write_many(small)
    log.on = True
    groups = router.read_groups(r, key=by, limit=2).groups  # (the walk's first 2 x 2 x 3 items come too: its sample)
    log.on = False
    items = sum(len(g.items) for g in groups)
    assert log.replied <= 2 * 2 * 2 + 2 + 12 + items + 4 and log.total("getMore") == 0, (log.replied, log.commands)
    retried = 2 if servers.backend == "javaserver" else 1  # (no $topN there: each asked again with $push)
    assert log.total("aggregate") <= 6 * retried + (2 if layout == "buckets" else 0), log.commands
    shown = {g.values[1]: (g.count, g.actor_count, g.actors_capped) for g in groups}
    assert shown == {"big": (actors, 2_000, True), "small": (80, 60, False)}, shown
