"""Aggregated notifications against real servers, on both doors, in every layout the servers hold (a contract file).

Groups are checked against a model (the plain pages' items, grouped in Python) after every
step of a seeded random history of likes, follows and mentions, pushed and pulled, marks
seen and read, over three periods (in each layout, and across a boundary between layouts);
walks with writes between pages serve every group once; the requests of a page of 20 groups
are counted per server; two processes mark at once.
"""

from __future__ import annotations

import itertools
import json
import random
import subprocess
import sys
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from pymongo import MongoClient

from router import (
    Activity,
    ClusterConfig,
    FeedItem,
    FeedRouter,
    GroupBy,
    GroupsUnsupported,
    InvalidCursor,
    InvalidItem,
    Position,
    RouterConfig,
    data_key,
)
from router.cli import main
from router.core.notify.groups import group_key, key_hash
from harness.commands import CommandLog
from harness.localservers import LocalClusters, LocalServer
from harness.process import checkout_env

from .conftest import NAMES, NOW, P0, P1, P2, register
from .layouts import buckets_config, page_all

#: A storage contract file: every test here that uses the layout fixture (through router, make_router or its own
#: register) runs once per layout the servers hold (see conftest.py).
pytestmark = pytest.mark.contract

REPO = Path(__file__).resolve().parents[2]
_ids = itertools.count(3_000_000)
TOP = (NOW, b"\xff" * 12)


def fresh() -> int:
    return next(_ids)


def like(r: int, when: datetime, actor: int, target: int | None, n: int, kind: str = "like") -> FeedItem:
    return FeedItem(receiver_id=r, sender_id=actor, event_time=when, type=kind,
                    data={} if target is None else {"target": target}, data_key=data_key("n", f"{r}-{n}"))


def key_of(item: FeedItem) -> tuple[datetime, bytes]:
    assert item.id is not None
    return item.event_time, item.id.binary


def expected(router: Any, r: int, by: GroupBy, *, pull: Sequence[int] = (), newest: int = 3,
             marker: tuple[datetime, bytes] | None = None, marks: dict[str, tuple[datetime, bytes]] | None = None,
             types: Sequence[str] | None = None) -> list[tuple[Any, ...]]:
    """The model: the plain pages' items (each once, as pages serve them), grouped in Python, newest group first."""
    groups: dict[tuple[Any, ...], list[FeedItem]] = {}
    for item in page_all(router, r, 100, pull=list(pull) or None, types=types):
        groups.setdefault((by.values_of(item), by.window_of(item.event_time)), []).append(item)
    out = []
    marks = marks or {}
    for (values, window), items in groups.items():
        items.sort(key=key_of, reverse=True)
        newest_by_actor: dict[Any, FeedItem] = {}
        for i in items:
            newest_by_actor.setdefault(i.sender_id, i)
        top = sorted(newest_by_actor.values(), key=key_of, reverse=True)[:newest]
        k = group_key(by, values, window)
        best = max([m for m in (marks.get(k), marks.get("*")) if m is not None], default=None)
        out.append((values, len(items), len(newest_by_actor), items[-1].event_time, items[0].event_time,
                    [key_of(i) for i in top], marker is not None and key_of(items[0]) <= marker,
                    best is not None and best >= key_of(items[0])))
    out.sort(key=lambda g: (g[4], g[5][0][1]), reverse=True)
    return out


def walk(router: Any, r: int, by: GroupBy, limit: int, **kw: Any) -> list[Any]:
    groups, cursor = [], None
    while True:
        page = router.read_groups(r, key=by, limit=limit, cursor=cursor, **kw)
        groups += page.groups
        cursor = page.next_cursor
        if cursor is None:
            return groups


def shown(groups: Sequence[Any]) -> list[tuple[Any, ...]]:
    return [(g.values, g.count, g.actor_count, g.first_time, g.last_time, [key_of(i) for i in g.items], g.seen, g.read)
            for g in groups]


def test_groups_match_a_model(router: FeedRouter) -> None:
    """A seeded random history of likes, follows and mentions (pushed copies, pulled posts, posts both copied and
    pulled), seen marks and read marks over three periods: after every step a walk of groups (a 7-day key, so groups
    span period boundaries) equals the model, counts, actors, times, newest items, seen and read, and the badge too."""
    follow_the_model(router)


def test_groups_across_a_layout_boundary_match_the_model(servers: LocalClusters, open_router: Callable[..., Any]) -> None:
    """The same history over a copies period then two buckets periods (one server, a database each, given their
    layouts by the operator path): groups that span the boundary between layouts count each item once."""
    follow_the_model(open_router(buckets_config(servers.uris[0]), clock=lambda: NOW))


def follow_the_model(router: Any) -> None:
    """The model test's history, checked after every step."""
    rng = random.Random(31)
    r, celeb = fresh(), fresh()
    fans = [fresh() for _ in range(6)]
    by = GroupBy(fields=("type", "data.target"), span=timedelta(days=7))
    marker: tuple[datetime, bytes] | None = None
    marks: dict[str, tuple[datetime, bytes]] = {}
    days = [P1 - timedelta(days=2), P1 + timedelta(days=1), P2 - timedelta(days=1), P2 + timedelta(days=3),
            P0 + timedelta(days=10)]
    last: list[Any] = []
    for n in range(40):
        step = rng.choice(["likes", "likes", "follow", "mention", "pulled", "both", "seen", "read", "read_all"])
        when = rng.choice(days) + timedelta(minutes=rng.randrange(600), milliseconds=rng.randrange(3))
        if step in ("likes", "follow", "mention"):
            target = None if step == "follow" else rng.randrange(3)
            kind = {"likes": "like"}.get(step, step)
            router.write_many([like(r, when + timedelta(seconds=i), rng.choice(fans), target, n * 10 + i, kind)
                               for i in range(rng.randrange(1, 4))])
        elif step in ("pulled", "both"):
            post = Activity(sender_id=celeb, event_time=when, type="post", data={"target": rng.randrange(2)},
                            data_key=data_key("post", f"{celeb}-{n}"))
            router.publish(post, [r] if step == "both" else [], pull=step == "pulled")
        elif step == "seen" and last:
            item = rng.choice(last).items[0]
            router.mark_seen(r, item)
            marker = max(marker or key_of(item), key_of(item))
        elif step == "read" and last:
            chosen = rng.sample(last, min(2, len(last)))
            by_key = rng.random() < 0.5
            router.mark_read(r, [g.key for g in chosen] if by_key else chosen)
            for g in chosen:
                through = TOP if by_key else (g.newest.event_time, g.newest.id.binary)
                marks[g.key] = max(marks.get(g.key, through), through)
        elif step == "read_all" and rng.random() < 0.5:
            router.mark_read(r, "all")
            marks["*"] = TOP
        last = walk(router, r, by, rng.randrange(1, 5), pull=[celeb])
        assert shown(last) == expected(router, r, by, pull=[celeb], marker=marker, marks=marks), (n, step)
        unseen = sum(1 for g in last if not g.seen)
        cap = rng.randrange(1, 6)
        badge = router.unseen_groups(r, key=by, cap=cap, pull=[celeb])
        assert (badge.count, badge.capped) == (min(unseen, cap), unseen > cap), (n, step)
        if n % 4 == 3:  # a type filter and fewer actors shown, on the same history
            types, newest = rng.choice([["like", "post"], ["mention"], ["follow", "like"]]), rng.randrange(1, 3)
            some = walk(router, r, by, rng.randrange(1, 5), pull=[celeb], types=types, newest=newest)
            assert shown(some) == expected(router, r, by, pull=[celeb], marker=marker, marks=marks, types=types,
                                           newest=newest), (n, step, types)
            unseen = sum(1 for g in some if not g.seen)
            badge = router.unseen_groups(r, key=by, cap=cap, pull=[celeb], types=types)
            assert (badge.count, badge.capped) == (min(unseen, cap), unseen > cap), (n, step, types)


def test_paging_with_writes_between_pages(router: FeedRouter) -> None:
    """A walk of groups 2 at a time while items arrive: a group already served that gets a new item is not served
    again; one not yet served is served once (also when a late item lifts it above the cursor); a group born after the
    walk began waits for the next walk, which shows the changed groups on top with their new counts."""
    r = fresh()
    day = P2 + timedelta(days=5)
    for target in range(6):  # six groups on one day, target 5 the newest
        router.write_many([like(r, day + timedelta(hours=target, minutes=m), 100 + m, target, target * 10 + m)
                           for m in range(3)])
    router.write_many([like(r, day - timedelta(hours=12 + h), 200 + h, None, 90 + h, "follow") for h in range(2)])
    before = {g.key: g for g in walk(router, r, GroupBy(), 50)}
    assert len(before) == 7
    page = router.read_groups(r, limit=2)
    served = [g.key for g in page.groups]
    assert [g.values for g in page.groups] == [("like", 5), ("like", 4)]
    router.write(like(r, day + timedelta(hours=12), 300, 5, 500))           # served group, newer item
    router.write(like(r, day + timedelta(hours=13), 301, 0, 501))           # not yet served, newer item
    router.write(like(r, day + timedelta(hours=4, minutes=30), 302, 1, 502))  # late item lifts target 1 above target 3
    router.write(like(r, day + timedelta(hours=14), 303, 7, 503))           # a new group
    cursor = page.next_cursor
    while cursor is not None:
        page = router.read_groups(r, limit=2, cursor=cursor)
        served += [g.key for g in page.groups]
        cursor = page.next_cursor
    assert sorted(served) == sorted(before) and len(served) == len(set(served))
    again = router.read_groups(r, limit=3).groups
    assert [g.values for g in again] == [("like", 7), ("like", 0), ("like", 5)]
    assert (again[1].count, again[2].count) == (4, 4)


def test_invalid_arguments_name_what_was_wrong(router: FeedRouter) -> None:
    """Bad keys, limits, cursors and marks raise InvalidItem or InvalidCursor naming the argument."""
    r = fresh()
    router.write(like(r, P2 + timedelta(days=1), 1, 1, 1))
    with pytest.raises(InvalidItem, match=r"key\.fields\[0\]"):
        router.read_groups(r, key=GroupBy(fields=("$where",)))
    with pytest.raises(InvalidItem, match="key.span"):
        router.read_groups(r, key=GroupBy(span=timedelta(days=30)))
    with pytest.raises(InvalidItem, match="limit"):
        router.read_groups(r, limit=0)
    with pytest.raises(InvalidCursor, match="another key"):
        router.read_groups(r, key="type/1h", cursor=router.read_groups(r, limit=1).next_cursor or
                           _cursor_of(router, r))
    with pytest.raises(InvalidItem, match=r"groups\[0\]"):
        router.mark_read(r, ["not a key"])
    with pytest.raises(InvalidItem, match="groups"):
        router.mark_read(r, "some")
    with pytest.raises(InvalidItem, match="groups: at most 1000 groups per call"):
        router.mark_read(r, [group_key(GroupBy(), ("like", 1), 0)] * 1001)


def _cursor_of(router: Any, r: int) -> str:
    router.write(like(r, P2 + timedelta(days=2), 1, 2, 2))
    cursor = router.read_groups(r, limit=1).next_cursor
    assert cursor is not None
    return cursor


def test_a_page_of_20_groups_costs_a_bounded_number_of_requests(servers: LocalClusters, make_config: Callable[..., Any],
                                                                  layout: str) -> None:
    """A page of 20 groups, one of them of 1,500 likes, in the newest cluster: 4 commands there (seen marker, the
    walk's first 120 items, the groups ranked and counted, read marks; the newest items shown are in those 120; one
    more on a server without $topN, and two more in buckets, whose page of 120 reads two finds of two buckets of 50
    and counts the buckets it did not read) and one (the seen marker) in each older cluster; one aggregate of the feed, and the finds return at most those 120
    items and 2 more: never the big group's 1,500. The next page (no sample: the newest items by $topN, read by id)
    costs 5. The big group's actors are counted among 1,000 of its items (actors_capped: 1,500 is more). (A generous
    timeout: 1,500 appends to one receiver's buckets on a loaded machine may outlast the default.)"""
    config = make_config(timeout=timedelta(seconds=60))
    register(config, layout=layout)
    log = CommandLog()
    r = fresh()
    day = P2 + timedelta(days=20)
    with FeedRouter(config, clock=lambda: NOW, event_listeners=[log]) as router:
        for chunk in range(0, 1500, 500):  # (batches a loaded machine appends to one receiver's buckets in time)
            router.write_many([like(r, day + timedelta(seconds=i), 10_000 + i, 0, i) for i in range(chunk, chunk + 500)])
        router.write_many([like(r, day + timedelta(hours=2, minutes=t), 7, t + 1, 5000 + t) for t in range(25)])
        log.on = True
        page = router.read_groups(r, limit=20)
        log.on = False
        assert len(page.groups) == 20 and page.next_cursor is not None
        first = (list(log.commands), log.documents)
        log.clear()
        log.on = True
        rest = router.read_groups(r, limit=20, cursor=page.next_cursor).groups
        log.on = False
    big = rest[-1]
    assert (big.values, big.count, big.actor_count, big.actors_capped, len(big.items)) == (("like", 0), 1500, 1000, True, 3)
    assert [i.sender_id for i in big.items] == [11_499, 11_498, 11_497]
    ports = {int(s.uri.rsplit(":", 1)[1].split("/")[0]): s.name for s in servers.servers}
    retry = 1 if servers.backend == "javaserver" else 0  # no $topN there: the groups are asked again with $push
    buckets = layout == "buckets"  # a page of 120 items there: two finds of two buckets of 50, and a count of the rest
    # The first page: marker, the walk's first 120 items, the groups, read marks. The next: marker, the groups, their
    # newest items by id, the one-item page that finds no older window (in each cluster: none holds one), read marks.
    for (commands, documents), base, counted, older, most in [
            (first, 4, 2 if buckets else 0, 1, 120 + 2),
            ((log.commands, log.documents), 5, 0, 2, 2 + sum(len(g.items) for g in rest))]:
        named: dict[str, int] = {}
        for c in commands:
            named[ports[c.port]] = named.get(ports[c.port], 0) + 1
        shown = " ".join(f"{ports[c.port]}:{c.name}.{c.collection}" for c in commands)
        assert named["cluster_3"] == base + retry + counted, (named, shown)
        assert named.get("cluster_2", 0) <= older and named.get("cluster_1", 0) <= older, (named, shown)
        assert sum(c.name == "aggregate" for c in commands) == 1 + retry + (buckets and counted > 0) and documents <= most, (
            shown, documents)


def test_groups_across_a_boundary_count_each_item_and_actor_once(router: FeedRouter) -> None:
    """A 7-day group with items on both sides of a period boundary, an actor on both sides: its counts are exact."""
    r = fresh()
    by = GroupBy(span=timedelta(days=7))
    items = [like(r, P2 - timedelta(hours=h + 1), 1 + h % 3, 4, h) for h in range(5)]
    items += [like(r, P2 + timedelta(hours=h), 1 + h % 4, 4, 10 + h) for h in range(5)]
    router.write_many(items)
    (group,) = router.read_groups(r, key=by).groups
    assert (group.count, group.actor_count) == (10, 4)
    assert group.first_time == min(i.event_time for i in items) and group.last_time == max(i.event_time for i in items)


def test_read_marks_leave_the_seen_marker_alone(router: FeedRouter) -> None:
    """Read marks share the seen markers' collection: a cluster holding read marks but no marker is passed over for
    the older cluster's marker, a receiver with read marks and no marker has none, and a new marker's cleanup keeps
    every read mark."""
    r, lone = fresh(), fresh()
    old, new = P2 - timedelta(days=3), P2 + timedelta(days=3)  # cluster_2, cluster_3
    router.write_many([like(x, old + timedelta(minutes=m), 10 + m, 1, m) for x in (r, lone) for m in range(3)])
    router.write_many([like(x, new + timedelta(minutes=m), 20 + m, 2, 10 + m) for x in (r, lone) for m in range(2)])
    marked = router.read(r, limit=5).items[3]  # cluster_2's second newest
    router.mark_seen(r, marked)
    groups = router.read_groups(r).groups
    router.mark_read(r, [groups[0]])  # through its newest item, and by key through now: both in cluster_3
    router.mark_read(r, [groups[1].key])
    router.mark_read(lone, [groups[1].key])
    router.mark_read(lone, "all")
    assert router.seen_position(r) == Position(marked.event_time, marked.id)
    assert router.seen_position(lone) is None
    assert [router.unseen_count(x).count for x in (r, lone)] == [3, 5]
    assert [(g.seen, g.read) for g in router.read_groups(r).groups] == [(False, True), (False, True)]
    assert [router.unseen_groups(x).count for x in (r, lone)] == [2, 2]
    router.mark_seen(r, router.read(r, limit=1).items[0])  # in cluster_3, beside the read marks: none of them goes
    assert [(g.seen, g.read) for g in router.read_groups(r).groups] == [(True, True), (True, True)]
    router.write(like(r, new + timedelta(hours=1), 30, 2, 99))
    assert [(g.seen, g.read) for g in router.read_groups(r).groups] == [(False, False), (True, True)]
    assert (router.unseen_count(r).count, router.unseen_groups(r).count) == (1, 1)
    assert [(g.seen, g.read) for g in router.read_groups(lone).groups] == [(False, True), (False, True)]


def test_aggregates_are_read_in_their_first_batch(make_config: Callable[..., RouterConfig], raw_clients: dict[str, Any],
                                                  db_name: str, layout: str) -> None:
    """A pulled sender's 300 copies in one group (its copies come back whole, 300 rows) and a walk of 150 one-item
    groups (its rank asks for up to 151 rows), ten copies updated before the reads (what makes FerretDB 2's getMore
    repeat and skip, docs/ferretdb2-cursor-bug.md): every aggregate comes back whole in its first batch, never by a
    getMore, and each item counts once."""
    config = make_config()
    register(config, layout=layout)
    log = CommandLog()
    r, celeb = fresh(), fresh()
    day = P2 + timedelta(days=12)
    with FeedRouter(config, clock=lambda: NOW, event_listeners=[log]) as router:
        router.write_many([FeedItem(receiver_id=r, sender_id=celeb, event_time=day + timedelta(seconds=i), type="post",
                                    data={"target": i % 2}, data_key=data_key("post", f"{celeb}-{i}"))
                           for i in range(300)])
        router.write_many([like(r, day - timedelta(hours=1, seconds=t), 7, t, 1000 + t) for t in range(150)])
        feed = raw_clients["cluster_3"][db_name].feed
        for doc in list(feed.find({}, {"_id": 1}, batch_size=1000))[:70:7]:
            feed.update_one({"_id": doc["_id"]}, {"$inc": {"churned": 1}})
        log.on = True
        posts = router.read_groups(r, pull=[celeb], limit=2).groups
        walked = walk(router, r, GroupBy(), 100)
        log.on = False
    assert [(g.values, g.count, g.actor_count) for g in posts] == [(("post", 1), 150, 1), (("post", 0), 150, 1)]
    assert len(walked) == 152 and len({g.key for g in walked}) == 152
    assert log.total("aggregate") >= 4 and log.total("getMore") == 0, log.commands


def race_marks(config: RouterConfig, r: int, marks: Sequence[tuple[str, Position]], tmp_path: Path) -> None:
    """Two groups_child processes mark *marks* read at once, each all of them in its own order: the first by value
    (through each group's newest item), the second by key (through now, higher)."""
    path = tmp_path / "clusters.yaml"
    path.write_text(yaml.safe_dump({"database": config.database, "clusters": [
        {"name": c.name, "uri": c.uri} for c in config.clusters]}))
    children = []
    for number in range(2):
        mine = list(marks[number::2]) + list(marks[1 - number::2])
        payload = [{"key": k, "t": p.event_time.isoformat(), "id": str(p.id), "value": number == 0} for k, p in mine]
        children.append(subprocess.Popen(
            [sys.executable, "-m", "tests.integration.groups_child", str(path), str(r), NOW.isoformat()],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
            env=checkout_env()))
        assert children[-1].stdin is not None
        children[-1].stdin.write(json.dumps(payload))
        children[-1].stdin.close()
    for c in children:
        assert c.wait(timeout=120) == 0, c.stderr.read() if c.stderr else ""


def test_mark_read_from_two_processes_keeps_every_mark(router: FeedRouter, make_config: Callable[..., RouterConfig],
                                                      tmp_path: Path) -> None:
    """Two processes mark 30 groups of one receiver read at once, by value and by key, in shuffled orders: every
    group ends read (no mark lost), and none that was not marked is read."""
    r = fresh()
    day = P2 + timedelta(days=9)
    router.write_many([like(r, day + timedelta(minutes=t), 5, t, t) for t in range(32)])
    groups = walk(router, r, GroupBy(), 40)
    assert len(groups) == 32
    marked, spared = groups[:30], groups[30:]
    race_marks(make_config(), r, [(g.key, g.newest) for g in marked], tmp_path)
    after = {g.key: g.read for g in walk(router, r, GroupBy(), 40)}
    assert all(after[g.key] for g in marked) and not any(after[g.key] for g in spared)
    assert len({key_hash(k) for k in after}) == 32


def test_on_ferretdb1_marks_race_safely_and_grouped_reads_say_why_not(ferretdb1: LocalClusters, tmp_path: Path) -> None:
    """On FerretDB 1 (which loses concurrent updates of one document) two processes' read marks all survive, each
    group's highest mark at or above its newest item; read_groups and unseen_groups raise GroupsUnsupported naming the
    cluster (the server implements no $max, $ifNull, $push or $topN)."""
    config = RouterConfig(database=f"t_{fresh()}", clusters=tuple(
        ClusterConfig(name=n, uri=u, options={}) for n, u in zip(NAMES, ferretdb1.uris)))
    register(config)  # copies: FerretDB 1 cannot hold buckets
    r, by = fresh(), GroupBy()
    day = P2 + timedelta(days=9)
    with FeedRouter(config, clock=lambda: NOW) as router:
        items = [like(r, day + timedelta(minutes=t), 5, t, t) for t in range(24)]
        ids = router.write_many(items)
        marks = [(group_key(by, by.values_of(i), by.window_of(i.event_time)), Position(i.event_time, oid))
                 for i, oid in zip(items, ids)]
        race_marks(config, r, marks, tmp_path)
        assert router.seen_position(r) is None and router.unseen_count(r).count == 24  # the read marks are no marker
        with pytest.raises(GroupsUnsupported, match="cluster 'cluster_3': grouped reads need a server"):
            router.read_groups(r)
        with pytest.raises(GroupsUnsupported, match="cluster 'cluster_3'"):
            router.unseen_groups(r)
    with MongoClient(ferretdb1.uris[2], tz_aware=True) as raw:
        stored = list(raw[config.database].seen.find({"receiver_id": r, "group": {"$exists": True}}))
        highest: dict[str, tuple[datetime, bytes]] = {}
        for doc in stored:
            mine = (doc["read_time"], doc["read_key"].binary)
            highest[doc["group"]] = max(highest.get(doc["group"], mine), mine)
        assert {k: highest.get(k) for k, _ in marks} == {k: TOP for k, _ in marks}  # the key marks, through now, all kept
        raw.drop_database(config.database)


def test_cli_groups(sync_router: FeedRouter, make_config: Callable[..., RouterConfig], tmp_path: Path,
                    capsys: pytest.CaptureFixture[str]) -> None:
    """`feedrouter groups RECEIVER`: a line per group and the unseen badge, --json with the same groups; a bad --key,
    --limit or --cursor is a usage error (exit 2, no traceback). (The usage errors through ``router.cli.main`` in this
    process: test_cli.py runs the command's exit codes as a process.)"""
    from .test_cli import feedrouter, write_yaml
    r, router = fresh(), sync_router
    day = P2 + timedelta(days=11)
    router.write_many([like(r, day + timedelta(minutes=m), 40 + m % 3, m % 2, m) for m in range(6)])
    path = str(write_yaml(tmp_path / "clusters.yaml", make_config()))
    text = feedrouter("-c", path, "groups", str(r), "--limit", "1")
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[0].startswith(f"receiver {r}: 1 groups (more: --cursor gc1.") and lines[0].endswith("; 2 unseen groups")
    assert "type='like', data.target=1 from 2024-07-12T00:00:00+00:00: 3 items from 3 actors" in lines[1]
    assert lines[1].endswith("unseen, unread")
    as_json = json.loads(feedrouter("-c", path, "groups", str(r), "--json").stdout)
    assert [(g["values"], g["count"], g["actor_count"], g["read"]) for g in as_json["groups"]] == [
        (["like", 1], 3, 3, False), (["like", 0], 3, 3, False)]
    assert (as_json["unseen_groups"], as_json["next_cursor"]) == (2, None)
    for args, message in [(["--key", "type/5y"], "--key: key: span must be a number and m, h or d"),
                          (["--key", "$where/1d"], "--key: key.fields[0]: must be"),
                          (["--limit", "0"], "--limit: must be an int from 1 to 100 (got 0)"),
                          (["--cursor", "c1.nope"], "--cursor: cursor: not a cursor of grouped reads")]:
        code: int | str | None
        try:
            code = main(["-c", path, "groups", str(r), *args])
        except SystemExit as usage:  # argparse's own exit for a bad argument
            code = usage.code
        err = capsys.readouterr().err
        assert code == 2 and message in err and "Traceback" not in err, (args, err)


def test_a_cluster_down_raises_even_with_partial_reads(make_config: Callable[..., RouterConfig],
                                                       raw_clients: dict[str, Any], layout: str,
                                                       spare: LocalServer) -> None:
    """With read.on_unavailable 'partial', a page of groups that needs a cluster that is down (on the file's spare
    server) raises ClusterUnavailable naming it (a partial group would be wrong, not short); the pages before it are
    served."""
    import attrs

    from router import ClusterUnavailable

    uris = [f"mongodb://{raw_clients[n].address[0]}:{raw_clients[n].address[1]}" for n in ("cluster_1",)]
    uris += [spare.uri, f"mongodb://{raw_clients['cluster_3'].address[0]}:{raw_clients['cluster_3'].address[1]}"]
    config = attrs.evolve(make_config(uris=uris, serverSelectionTimeoutMS=500), on_unavailable="partial")
    register(config, layout=layout)
    r = fresh()
    with FeedRouter(config, clock=lambda: NOW) as router:
        router.write_many([like(r, P2 + timedelta(days=2), 1, 1, 1), like(r, P1 + timedelta(days=2), 2, 2, 2)])
        router.mark_seen(r, router.read(r, limit=1).items[0])  # the marker is in cluster_3: cluster_2 is not asked
        spare.kill()
        page = router.read_groups(r, limit=1)
        assert [g.values for g in page.groups] == [("like", 1)] and page.next_cursor is not None
        with pytest.raises(ClusterUnavailable, match="cluster 'cluster_2'"):
            router.read_groups(r, limit=1, cursor=page.next_cursor)
        assert router.read(r, limit=5).partial  # a plain page serves what it can
