"""Notification feeds against real servers, on both doors: seen markers, unseen counts, type filters.

Counts are checked against a model of random writes, pulled posts and marks; a count's
requests are counted per server with a command listener; two processes race their marks.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import attrs
import pytest
import yaml
from bson import ObjectId
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from router import Activity, FeedItem, FeedRouter, InvalidItem, Position, RouterConfig, copy_id, data_key
from router.cli import main
from router.observe.prometheus import PrometheusMetrics
from harness.commands import CommandLog
from harness.localservers import LocalClusters
from harness.process import checkout_env

from .conftest import NOW, P0, P1, P2, register

#: A storage contract file: every test here runs once per layout the servers hold (see conftest.py).
pytestmark = pytest.mark.contract

REPO = Path(__file__).resolve().parents[2]
_ids = itertools.count(1_000_000)


def fresh() -> int:
    """An id no other example in this session uses (receivers and senders)."""
    return next(_ids)


def item(receiver: int, when: datetime, n: int, *, kind: int | str = 1, sender: int = 9) -> FeedItem:
    return FeedItem(receiver_id=receiver, sender_id=sender, event_time=when, type=kind, data={"n": n},
                    data_key=data_key("note", f"{receiver}-{n}"))


def spread(start: datetime, count: int, step: timedelta = timedelta(minutes=7)) -> list[datetime]:
    return [start + step * (i + 1) for i in range(count)]


def key(entry: FeedItem) -> tuple[datetime, bytes]:
    assert entry.id is not None
    return (entry.event_time, entry.id.binary)


def ports(servers: LocalClusters) -> dict[int, str]:
    return {int(s.uri.rsplit(":", 1)[1].split("/")[0]): s.name for s in servers.servers}


# -- markers ----------------------------------------------------------------------------


def test_marker_moves_forward_only_and_survives_period_boundaries(router: FeedRouter) -> None:
    """mark_seen keeps the highest position ever marked, across clusters; seen_position reads it back."""
    r = fresh()
    router.write_many([item(r, t, i) for i, t in enumerate(spread(P0, 3) + spread(P1, 3) + spread(P2, 3))])
    newest_first = list(router.read(r, limit=20))
    assert router.seen_position(r) is None
    assert router.mark_seen(r, newest_first[4]) == Position(newest_first[4].event_time, newest_first[4].id)
    assert router.seen_position(r) == Position(newest_first[4].event_time, newest_first[4].id)
    router.mark_seen(r, newest_first[7])  # older: ignored
    assert router.seen_position(r) == Position(newest_first[4].event_time, newest_first[4].id)
    router.mark_seen(r, Position(newest_first[0].event_time, newest_first[0].id))
    assert router.seen_position(r) == Position(newest_first[0].event_time, newest_first[0].id)
    assert router.unseen_count(r).count == 0
    router.write(item(r, P2 + timedelta(days=40), 99))
    assert (router.unseen_count(r).count, router.unseen_count(r).capped) == (1, False)


@pytest.mark.layouts("copies", reason="counts the copies layout's requests (a buckets count reads the buckets)")
def test_a_count_asks_only_clusters_down_to_the_marker(make_config: Callable[..., RouterConfig], open_router: Any,
                                                       servers: LocalClusters, layout: str) -> None:
    """Capped at 99 over three periods: the clusters newer than the marker get one marker find and one count each;
    the older cluster is never asked."""
    log = CommandLog()
    config = make_config()
    register(config, layout=layout)
    router = open_router(config, clock=lambda: NOW, event_listeners=[log])
    r = fresh()
    router.write_many([item(r, t, i) for i, t in enumerate(spread(P0, 60) + spread(P1, 60) + spread(P2, 60))])
    page = router.read(r, limit=120)
    mark = page.items[60 + 50]  # cluster_2's 51st newest: 60 + 50 newer items in all
    router.mark_seen(r, mark)
    by_port = ports(servers)

    log.on = True
    unseen = router.unseen_count(r)
    log.on = False
    assert (unseen.count, unseen.capped, unseen.queried) == (99, True, ("cluster_3", "cluster_2"))
    assert unseen.marker == Position(mark.event_time, mark.id)
    asked = sorted((by_port[c.port], c.name, c.collection) for c in log.commands)
    assert asked == [("cluster_2", "aggregate", "feed"), ("cluster_2", "find", "seen"),
                     ("cluster_3", "aggregate", "feed"), ("cluster_3", "find", "seen")]

    assert router.unseen_count(r, cap=200).count == 110  # exact when not capped
    router.mark_seen(r, page.items[3])
    log.commands.clear()
    log.on = True
    unseen = router.unseen_count(r)
    log.on = False
    assert (unseen.count, unseen.capped, unseen.queried) == (3, False, ("cluster_3",))
    assert {by_port[c.port] for c in log.commands} == {"cluster_3"} and len(log.commands) == 2


@st.composite
def histories(draw: st.DrawFn) -> list[tuple[str, int, int, int]]:
    """Operations: (kind, period, second, n) with kind write / pulled / both / mark."""
    ops = st.tuples(st.sampled_from(["write", "write", "pulled", "both", "mark"]), st.integers(0, 2),
                    st.integers(0, 40), st.integers(0, 30))
    return draw(st.lists(ops, min_size=1, max_size=14))


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(history=histories(), cap=st.integers(1, 8))
def test_counts_match_a_model(router: FeedRouter, history: list[tuple[str, int, int, int]], cap: int) -> None:
    """Random copies, pulled posts (some also copied) and marks, some going backwards: the count and the marker
    always equal the model's, each post once, in every period."""
    r, author = fresh(), fresh()
    starts = (P0, P1, P2)
    visible: dict[tuple[datetime, bytes], Position] = {}
    marker: tuple[datetime, bytes] | None = None
    for n, (kind, period, second, pick) in enumerate(history):
        when = starts[period] + timedelta(days=3, seconds=second, milliseconds=7 * (n % 3))
        when = when.replace(microsecond=when.microsecond // 1000 * 1000)
        if kind == "write":
            (oid,) = router.write_many([item(r, when, n)])
            visible[(when, oid.binary)] = Position(when, oid)
        elif kind in ("pulled", "both"):
            post = Activity(sender_id=author, event_time=when, type=2, data={"n": n}, data_key=data_key("p", f"{author}-{n}"))
            router.publish(post, [r] if kind == "both" else [], pull=kind == "pulled")
            oid = copy_id(int(post.event_time.timestamp()), post.data_key, r)
            visible[(when, oid.binary)] = Position(when, oid)
        elif visible:
            chosen = sorted(visible)[pick % len(visible)]
            router.mark_seen(r, visible[chosen])
            marker = chosen if marker is None else max(marker, chosen)
        newer = sum(1 for k in visible if marker is None or k > marker)
        unseen = router.unseen_count(r, cap=cap, pull=[author])
        assert (unseen.count, unseen.capped) == (min(newer, cap), newer > cap), (n, kind)
        assert router.seen_position(r) == (visible[marker] if marker else None)
    everything = router.unseen_count(r, cap=100, pull=[author])
    assert everything.count == sum(1 for k in visible if marker is None or k > marker)


def test_marks_racing_from_two_processes_never_go_backwards(router: FeedRouter, make_config: Callable[..., RouterConfig],
                                                             tmp_path: Path) -> None:
    """Two processes mark positions of one receiver at once, in shuffled orders; the marker read between and after
    is never lower than before, and ends at the highest position either marked."""
    r = fresh()
    router.write_many([item(r, t, i) for i, t in enumerate(spread(P1, 40) + spread(P2, 40))])
    positions = [(i.event_time, i.id) for i in router.read(r, limit=80)]
    config_path = tmp_path / "clusters.yaml"
    config = make_config()
    config_path.write_text(yaml.safe_dump({
        "database": config.database,
        "clusters": [{"name": c.name, "uri": c.uri} for c in config.clusters],
    }))
    halves = [positions[0::2], positions[1::2]]
    children = []
    for number, half in enumerate(halves):
        marks = [[t.isoformat(), str(oid)] for t, oid in half]
        marks = marks[number::2] + marks[1 - number::2]  # out of order: newer and older marks interleave
        children.append(subprocess.Popen(
            [sys.executable, "-m", "tests.integration.seen_child", str(config_path), str(r), NOW.isoformat()],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
            env=checkout_env(),
        ))
        assert children[-1].stdin is not None
        children[-1].stdin.write(json.dumps(marks))
        children[-1].stdin.close()
    readings = []
    while any(c.poll() is None for c in children):
        seen = router.seen_position(r)
        if seen is not None:
            readings.append((seen.event_time, seen.id.binary))
        else:  # no mark yet (the children still starting): read again a little later
            time.sleep(0.01)
    for c in children:
        assert c.wait(timeout=120) == 0, c.stderr.read() if c.stderr else ""
        assert c.stdout is not None and json.loads(c.stdout.read())["marked"] == 40
    assert readings == sorted(readings)  # never backwards, while both were marking
    final = router.seen_position(r)
    assert final == Position(positions[0][0], positions[0][1])


# -- type filters -----------------------------------------------------------------------


def test_type_filtered_paging_to_the_end_while_writing(router: FeedRouter) -> None:
    """types=[...] pages return only those types, newest first, every one exactly once while writes go on,
    with and without pulled senders."""
    r, author = fresh(), fresh()
    kinds: list[int | str] = [1, 2, "like"]
    start = [item(r, t, i, kind=kinds[i % 3]) for i, t in enumerate(spread(P0, 30) + spread(P1, 30) + spread(P2, 30))]
    router.write_many(start)
    for i, t in enumerate(spread(P1 + timedelta(days=1), 12, timedelta(hours=5))):
        router.publish(Activity(sender_id=author, event_time=t, type=kinds[i % 3], data={"i": i},
                                data_key=data_key("typed", f"{author}-{i}")), [], pull=True)
    for pull in (None, [author]):
        served: list[FeedItem] = []
        cursor = None
        for n in range(100):
            page = router.read(r, limit=7, cursor=cursor, types=[2, "like"], pull=pull)
            served += page.items
            # writes between pages: newer ones (behind the cursor) and late ones (ahead of it)
            router.write_many([item(r, NOW - timedelta(minutes=n + 1), 1000 + n, kind="like"),
                               item(r, P0 + timedelta(seconds=n + 1), 2000 + n, kind=2)])
            cursor = page.next_cursor
            if cursor is None:
                break
        assert all(i.type in (2, "like") for i in served)
        assert len({key(i) for i in served}) == len(served)  # each once
        assert [key(i) for i in served] == sorted((key(i) for i in served), reverse=True)
        expected = {(i.event_time, i.data_key) for i in start if i.type in (2, "like")}
        if pull:
            expected |= {(t, data_key("typed", f"{author}-{i}")) for i, t in
                         enumerate(spread(P1 + timedelta(days=1), 12, timedelta(hours=5))) if kinds[i % 3] != 1}
        assert expected <= {(i.event_time, i.data_key) for i in served}


def test_pulled_pages_stay_full(router: FeedRouter) -> None:
    """Five pulled posts paged 3 at a time, type-filtered or not, with or without a pushed copy among them, come back
    as [3, 2]: an outbox answer that fills the request still serves its last millisecond's entries."""
    r, celeb = fresh(), fresh()
    posts = [Activity(sender_id=celeb, event_time=t, type="mention", data={"i": i}, data_key=data_key("full", f"{celeb}-{i}"))
             for i, t in enumerate(spread(P2 + timedelta(days=3), 5, timedelta(hours=9)))]
    for act in posts:
        router.publish(act, [], pull=True)
    newest_first = [a.data_key for a in reversed(posts)]
    for types in (None, ["mention"]):
        sizes, served, cursor = [], [], None
        while True:
            page = router.read(r, limit=3, cursor=cursor, pull=[celeb], types=types)
            sizes.append(len(page.items))
            served += [i.data_key for i in page.items]
            cursor = page.next_cursor
            if cursor is None:
                break
        assert (sizes, served) == ([3, 2], newest_first), types
    router.publish(attrs.evolve(posts[2], data={"i": 2}), [r], pull=False)  # one also copied: still served once
    pages = [len(p.items) for p in _pages(router, r, limit=2, pull=[celeb])]
    assert pages == [2, 2, 1]


def _pages(router: FeedRouter, receiver: int, *, limit: int, pull: list[int]) -> list[Any]:
    pages, cursor = [], None
    while True:
        page = router.read(receiver, limit=limit, cursor=cursor, pull=pull)
        pages.append(page)
        cursor = page.next_cursor
        if cursor is None:
            return pages


def test_an_item_of_another_receivers_page_is_refused(router: FeedRouter) -> None:
    """mark_seen(alice, an item of bob's page) is InvalidItem naming both receivers, and moves no marker; an int
    receiver and the str of the same digits are different receivers."""
    alice, bob, celeb = fresh(), fresh(), fresh()
    router.write_many([item(alice, t, i) for i, t in enumerate(spread(P2, 3))] + [item(bob, P2 + timedelta(days=2), 9)])
    router.publish(Activity(sender_id=celeb, event_time=P2 + timedelta(days=3), type=1, data={}, data_key=data_key("c", celeb)),
                   [], pull=True)
    own = router.read(alice, limit=1).items[0]
    router.mark_seen(alice, own)
    theirs = router.read(bob, limit=5, pull=[celeb]).items
    assert [i.receiver_id for i in theirs] == [bob, bob]  # the pulled post as bob's page shows it, and bob's own item
    for foreign in [*theirs, attrs.evolve(own, receiver_id=str(alice))]:
        with pytest.raises(InvalidItem) as info:
            router.mark_seen(alice, foreign)
        assert str(info.value).startswith(f"position: is an item of receiver {foreign.receiver_id!r}'s page, not of "
                                          f"{alice!r}'s"), str(info.value)
    assert router.seen_position(alice) == Position(own.event_time, own.id)
    assert router.unseen_count(alice).count == 0


def test_bad_arguments_name_themselves(router: FeedRouter) -> None:
    """Bad input to the new calls is InvalidItem naming the argument, before any I/O."""
    cases: list[tuple[Callable[[], Any], str]] = [
        (lambda: router.read(1, types=[]), "types: must be a non-empty list"),
        (lambda: router.read(1, types=[1, None]), "types[1]: "),
        (lambda: router.read(1, types="like"), "types: must be a non-empty list"),
        (lambda: router.read(1, types=list(range(101))), "types: at most 100 distinct types"),
        (lambda: router.mark_seen(1, "c1.abc"), "position: must be a Position or a FeedItem"),
        (lambda: router.mark_seen(1, item(1, P1, 1)), "position: must be a FeedItem read from a page"),
        (lambda: router.mark_seen(1, Position(datetime(2024, 5, 1), ObjectId())), "position: must hold a timezone-aware"),
        (lambda: router.mark_seen(None, Position(P1, ObjectId())), "receiver_id: "),
        (lambda: router.unseen_count(1, cap=0), "cap: must be an int from 1 to 10000"),
        (lambda: router.unseen_count(1, cap=True), "cap: must be an int"),
        (lambda: router.seen_position([1]), "receiver_id: "),
    ]
    for call, message in cases:
        with pytest.raises(InvalidItem) as info:
            call()
        assert str(info.value).startswith(message), str(info.value)


# -- observability and the CLI ------------------------------------------------------------


@pytest.mark.layouts("copies", reason="counts the copies layout's request (count.feed)")
def test_calls_are_counted_and_the_cli_shows_the_badge(make_config: Callable[..., RouterConfig], tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str], layout: str) -> None:
    """mark_seen, seen_position and unseen_count are calls in the metrics; `feedrouter unseen` prints the badge."""
    registry = CollectorRegistry()
    config = make_config()
    register(config, layout=layout)
    r = fresh()
    with FeedRouter(config, clock=lambda: NOW, metrics=PrometheusMetrics(registry=registry)) as router:
        router.write_many([item(r, t, i) for i, t in enumerate(spread(P2, 120))])
        newest = router.read(r, limit=5).items
        router.mark_seen(r, newest[2])
        router.seen_position(r)
        router.unseen_count(r)
    for op in ("mark_seen", "seen_position", "unseen_count"):
        assert registry.get_sample_value("feedrouter_calls_total", {"op": op, "outcome": "ok"}) == 1, op
    assert registry.get_sample_value("feedrouter_requests_total",
                                     {"cluster": "cluster_3", "op": "count.feed", "outcome": "ok"}) == 1
    path = tmp_path / "clusters.yaml"
    path.write_text(yaml.safe_dump({"database": config.database,
                                    "clusters": [{"name": c.name, "uri": c.uri} for c in config.clusters]}))
    assert main(["-c", str(path), "unseen", str(r)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"receiver {r}: 2 unseen; marked seen up to {newest[2].event_time.isoformat()}")
    assert main(["-c", str(path), "--json", "unseen", str(r), "--cap", "1"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["unseen"] == 1 and shown["capped"] is True and shown["marker"]["id"] == str(newest[2].id)
    assert main(["-c", str(path), "unseen", "nobody"]) == 0
    assert capsys.readouterr().out.startswith("receiver 'nobody': 0 unseen; nothing marked seen")

