"""Sparse receivers over many periods: a page that must look into every period asks the older ones in waves, at once,
and stays exactly the page the walk one period at a time gives."""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from typing import Any

import attrs
import pytest

from router import Activity, FeedItem, RouterConfig, data_key
from harness.commands import CommandLog
from harness.fleet import FIRST, drop_fleet, fleet_config, register_fleet
from harness.localservers import LocalClusters

#: Periods in the fleet: weekly, a database each, spread over the session's three servers.
PERIODS = 200
NOW = FIRST + timedelta(weeks=PERIODS - 1, days=3)


@pytest.fixture(scope="module")
def fleet(servers: LocalClusters) -> Iterator[RouterConfig]:
    """200 weekly periods on the three servers (metadata only; a period's feed is made by its first write)."""
    config = fleet_config(servers.uris, PERIODS, prefix=f"s_{uuid.uuid4().hex[:8]}")
    register_fleet(config)
    yield config
    drop_fleet(config)


def item(receiver: int, n: int, when: datetime) -> FeedItem:
    return FeedItem(receiver_id=receiver, sender_id=1, event_time=when, type=1, data={"n": n},
                    data_key=data_key("sparse", receiver * 10_000 + n))


def test_a_sparse_receivers_page_asks_the_older_periods_in_waves(
    fleet: RouterConfig, open_router: Callable[..., Any], door: str
) -> None:
    """200 periods, one item in the newest: the page holds it, asks each period once (200 finds, as before) but in
    at most 30 round trips one after another (it was 200, one find per period in turn): 16 waves, and a find of a
    wave that starts after all the others of it finished counts as one more. A dense receiver's page is still one
    find."""
    sparse, dense = {"sync": (101, 102), "async": (103, 104)}[door]  # the fleet is shared by both doors' runs
    log = CommandLog()
    router = open_router(fleet, clock=lambda: NOW, refresh=False, event_listeners=[log])
    router.write_many([item(sparse, 0, NOW - timedelta(hours=1))] + [item(dense, n, NOW - timedelta(minutes=n)) for n in range(60)])
    log.on = True
    page = router.read(sparse, limit=50)
    log.on = False
    assert [i.data["n"] for i in page.items] == [0] and page.next_cursor is None
    assert log.total("find") == PERIODS
    assert log.rounds <= 30, f"{log.rounds} round trips one after another"
    dense_log = CommandLog()
    router = open_router(fleet, clock=lambda: NOW, refresh=False, event_listeners=[dense_log])
    dense_log.on = True
    assert len(router.read(dense, limit=50).items) == 50
    assert dense_log.total("find") == 1


@pytest.mark.parametrize("seed", [1, 2])
def test_scattered_receivers_page_exactly(fleet: RouterConfig, open_router: Callable[..., Any], door: str, seed: int) -> None:
    """Items scattered over the 200 periods (some periods dense, most empty), with and without pulled posts: paging
    to the end at several page sizes gives every item once, newest first (waves cut an answer that
    holds more than the page needs)."""
    rng = random.Random(seed)
    receiver = {"sync": 200, "async": 300}[door] + seed
    sender = receiver + 50
    router = open_router(fleet, clock=lambda: NOW, refresh=False)
    weeks = [rng.randrange(PERIODS) for _ in range(12)] + [PERIODS - 1]
    times = [FIRST + timedelta(weeks=w, hours=rng.randrange(160)) for w in weeks for _ in range(rng.choice((1, 1, 2, 9)))]
    router.write_many([item(receiver, n, t) for n, t in enumerate(times)])
    posts = [FIRST + timedelta(weeks=rng.randrange(PERIODS), hours=rng.randrange(160)) for _ in range(9)]
    for n, when in enumerate(posts):
        router.publish(Activity(sender_id=sender, event_time=when, type=1, data={"post": n},
                                data_key=data_key("sparse-post", sender * 100 + n)), [], pull=True)
    for limit in (1, 7, 50):
        for pull in ([], [sender]):
            got, cursor = [], None
            while True:
                page = router.read(receiver, limit=limit, cursor=cursor, pull=pull)
                got += [(i.event_time.timestamp(), i.data) for i in page.items]
                cursor = page.next_cursor
                if cursor is None:
                    break
            expected = [(t.timestamp(), {"n": n}) for n, t in enumerate(times)]
            if pull:
                expected += [(t.timestamp(), {"post": n}) for n, t in enumerate(posts)]
            expected.sort(key=lambda e: e[0], reverse=True)
            assert [t for t, _ in got] == [t for t, _ in expected], (limit, pull)
            assert sorted(map(repr, got)) == sorted(map(repr, expected)), (limit, pull)


@pytest.mark.parametrize("pull", [False, True])
def test_a_page_asks_at_most_max_periods_and_the_walk_stays_exact(
    fleet: RouterConfig, open_router: Callable[..., Any], door: str, pull: bool
) -> None:
    """read.max_periods 16 over 200 periods: each page asks at most 16 periods; a page short after them ends with a
    cursor below the last, and walking on gives the same items in the same order as a page without the budget
    (items in the newest, a middle and the oldest period, one exactly at a period's start, pulled posts too)."""
    receiver = {"sync": 400, "async": 500}[door] + pull
    sender = receiver + 50
    bounded = attrs.evolve(fleet, max_periods=16)
    log = CommandLog()
    router = open_router(bounded, clock=lambda: NOW, refresh=False, event_listeners=[log])
    times = [NOW - timedelta(hours=1), FIRST + timedelta(weeks=120), FIRST + timedelta(weeks=120, seconds=1),
             FIRST + timedelta(weeks=37, hours=5), FIRST + timedelta(hours=2)]
    router.write_many([item(receiver, n, t) for n, t in enumerate(times)])
    if pull:
        router.publish(Activity(sender_id=sender, event_time=FIRST + timedelta(weeks=80), type=1, data={"post": 0},
                                data_key=data_key("budget-post", receiver)), [], pull=True)
    pulled = [sender] if pull else []
    expected = [(i.event_time, i.data) for i in open_router(fleet, clock=lambda: NOW, refresh=False)
                .read(receiver, limit=10, pull=pulled).items]
    assert len(expected) == len(times) + pull  # the unbounded page: everything, in one call
    got, cursor, pages = [], None, 0
    while True:
        log.clear()
        log.on = True
        page = router.read(receiver, limit=10, cursor=cursor, pull=pulled)
        log.on = False
        pages += 1
        assert len({c.collection for c in log.commands if c.name == "find"}) <= 2  # feed, and outbox when pulling
        assert len(log.commands) <= 16 * (1 + pull), f"page {pages}: {len(log.commands)} commands"
        got += [(i.event_time, i.data) for i in page.items]
        cursor = page.next_cursor
        if cursor is None:
            break
    assert got == expected
    assert pages == -(-PERIODS // 16)  # a sparse walk: each page asked its 16 periods, the last the rest
