"""FeedRouter against three real servers: placement, paging, deletes, errors."""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from datetime import datetime, timedelta, timezone, tzinfo
from typing import Any

import pytest
from bson import ObjectId
from pymongo import MongoClient

from router import (
    ClusterUnavailable,
    FeedItem,
    FeedRouter,
    InvalidCursor,
    InvalidItem,
    NoClusterForTime,
    ReadWindow,
    RouterConfig,
    WriteFailed,
    data_key,
)
from router.core.policy import RetryPolicy, deadline_in
from router.core.layouts import LAYOUTS, Copy, CopyList
from router.core.writes.insert import insert_program
from router.cursor import CursorState, Position, encode_state
from harness.localservers import LocalServer

from . import stored as stored_copies
from .conftest import NAMES, NOW, P0, P1, P2, PERIODS

#: A storage contract file: every test here runs once per layout the servers hold (see conftest.py), through both
#: doors on the second server too: its calls send every kind of command, the async door's as well as the sync one's.
pytestmark = [pytest.mark.contract,
              pytest.mark.both_doors(reason="every kind of command, through each door's client, on every server")]

UTC = timezone.utc
Clients = dict[str, MongoClient[dict[str, Any]]]


def item(receiver: int | str, t: datetime, n: int, *, sender: int = 1, kind: str = "fabula") -> FeedItem:
    return FeedItem(receiver_id=receiver, sender_id=sender, event_time=t, type=1, data={"n": n}, data_key=data_key(kind, n))


def owner(t: datetime) -> str:
    for name, (start, end) in zip(NAMES, PERIODS):
        if start <= t and (end is None or t < end):
            return name
    raise AssertionError(t)


def stored(clients: Clients, db: str) -> dict[str, list[Copy]]:
    """Every feed document on every server, read with plain pymongo."""
    return {name: stored_copies.copies(c[db]) for name, c in clients.items()}


def page_all(router: FeedRouter, receiver: int | str, limit: int) -> list[FeedItem]:
    out: list[FeedItem] = []
    cursor = None
    for _ in range(10_000):
        page = router.read(receiver, limit=limit, cursor=cursor)
        out.extend(page.items)
        cursor = page.next_cursor
        if cursor is None:
            return out
    raise AssertionError("paging did not end")


def truth_order(items: list[tuple[datetime, ObjectId]]) -> list[ObjectId]:
    """The expected order: event_time (to the millisecond, as stored) desc, then _id desc."""
    def key(p: tuple[datetime, ObjectId]) -> tuple[datetime, bytes]:
        t, oid = p
        return (t.replace(microsecond=t.microsecond // 1000 * 1000), oid.binary)

    return [oid for _, oid in sorted(items, key=key, reverse=True)]


def test_every_document_sits_in_the_cluster_owning_its_time(make_router: Callable[..., FeedRouter], raw_clients: Clients,
                                                            db_name: str, layout: str) -> None:
    """Checked with pymongo directly (read through the layout): each copy is in its period's cluster, and only there;
    a copies period stores exactly the copy's fields. (600 items to 20 receivers, and the boundaries' items, which put
    some in every cluster: each document is checked on its own. Generous timeouts, for buckets on a loaded machine.)"""
    router = make_router(timeout=timedelta(seconds=60), connectTimeoutMS=30_000, socketTimeoutMS=60_000,
                         serverSelectionTimeoutMS=30_000)
    rng = random.Random(7)
    times = [P0 + timedelta(seconds=rng.randrange(int((NOW - P0).total_seconds()))) for _ in range(600)]
    times += [P1, P2, P1 - timedelta(milliseconds=1), P2 - timedelta(milliseconds=1)]  # the boundaries
    items = [item(rng.randrange(20), t, i) for i, t in enumerate(times)]
    ids = router.write_many(items)
    assert len(ids) == len(set(ids)) == len(items)
    docs = stored(raw_clients, db_name)
    assert sum(len(v) for v in docs.values()) == len(items)
    by_id = {oid: it for oid, it in zip(ids, items)}
    for name, cluster_docs in docs.items():
        for d in cluster_docs:
            it = by_id[d.id]
            assert owner(it.event_time) == name
            assert int.from_bytes(d.id.binary[:4], "big") == int(it.event_time.timestamp())
            assert d.data == it.data and d.receiver_id == it.receiver_id
        if layout == "copies":
            for raw in raw_clients[name][db_name].feed.find({}):
                assert set(raw) == {"_id", "data_key", "receiver_id", "sender_id", "event_time", "type", "data"}
    assert {n: len(v) > 0 for n, v in docs.items()} == {n: True for n in NAMES}


def test_write_returns_ids_in_input_order(router: FeedRouter, raw_clients: Clients, db_name: str) -> None:
    """write_many's ids line up with the input even when items go to different clusters."""
    items = [item(1, t, i) for i, t in enumerate([P2 + timedelta(days=1), P0 + timedelta(days=1), P1 + timedelta(days=1)] * 5)]
    ids = router.write_many(items)
    for oid, it in zip(ids, items):
        doc = stored_copies.one(raw_clients[owner(it.event_time)][db_name], id=oid)
        assert doc is not None and doc.data == it.data
    single = router.write(item(2, P1 + timedelta(hours=1), 99))
    assert stored_copies.count(raw_clients["cluster_2"][db_name], id=single) == 1


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_feeds_paged_to_the_end_equal_sorted_truth(make_router: Callable[..., FeedRouter], seed: int) -> None:
    """Across period boundaries, with ties on event_time: every item exactly once, in order."""
    router = make_router(batch_size=97)
    rng = random.Random(seed)
    receivers = ["alice", "bob", 3, 4]
    items: list[FeedItem] = []
    for i in range(800):
        if rng.random() < 0.15 and items:
            t = items[rng.randrange(len(items))].event_time  # same millisecond as another item
        else:
            t = P0 + timedelta(milliseconds=rng.randrange(int((NOW - P0).total_seconds() * 1000)))
        items.append(item(rng.choice(receivers), t, i))
    ids = router.write_many(items)
    for receiver in receivers:
        truth = truth_order([(it.event_time, oid) for it, oid in zip(items, ids) if it.receiver_id == receiver])
        for limit in (2 + rng.randrange(6), 50, 1000):
            got = [it.id for it in page_all(router, receiver, limit)]
            assert got == truth, f"receiver {receiver!r}, page size {limit}"


def test_reads_touch_as_few_clusters_as_possible(router: FeedRouter) -> None:
    """A page the newest cluster fills asks only it; an older one is asked only for what is missing."""
    router.write_many([item(9, P2 + timedelta(minutes=i), i) for i in range(30)])
    router.write_many([item(9, P1 + timedelta(minutes=i), 100 + i) for i in range(30)])
    first = router.read(9, limit=20)
    assert first.queried == ("cluster_3",) and set(first.sources) == {"cluster_3"}
    second = router.read(9, limit=20, cursor=first.next_cursor)
    assert second.queried == ("cluster_3", "cluster_2")
    assert second.sources == ("cluster_3",) * 10 + ("cluster_2",) * 10
    third = router.read(9, limit=20, cursor=second.next_cursor)
    # the cursor lies in cluster_2's period: cluster_3 is not asked again
    assert third.queried == ("cluster_2",) and len(third.items) == 20
    last = router.read(9, limit=20, cursor=third.next_cursor)
    assert last.queried == ("cluster_2", "cluster_1") and last.items == () and last.next_cursor is None


def test_read_window_stops_at_configured_depth(make_router: Callable[..., FeedRouter]) -> None:
    """With a window of two clusters, items of the oldest period are not read."""
    router = make_router(window=ReadWindow(clusters=2))
    router.write_many([item(5, t, i) for i, t in enumerate([P0 + timedelta(days=1), P1 + timedelta(days=1), P2 + timedelta(days=1)])])
    page = router.read(5, limit=10)
    assert [it.data["n"] for it in page.items] == [2, 1]
    assert page.queried == ("cluster_3", "cluster_2")


def test_periods_not_started_are_not_read(make_router: Callable[..., FeedRouter]) -> None:
    """Before cluster_3's period starts, reads begin at cluster_2."""
    router = make_router(clock=lambda: P2 - timedelta(days=1))
    router.write(item(5, P1 + timedelta(days=3), 1))
    page = router.read(5)
    assert page.queried == ("cluster_2", "cluster_1")


def test_paging_while_writing_loses_nothing(router: FeedRouter) -> None:
    """Items written during paging, newer or older than the cursor, never hide or repeat paged ones."""
    rng = random.Random(11)
    base = [item(1, P0 + timedelta(seconds=rng.randrange(int((NOW - P0).total_seconds()))), i) for i in range(600)]
    base_ids = router.write_many(base)
    expected = truth_order([(it.event_time, oid) for it, oid in zip(base, base_ids)])
    seen: list[ObjectId] = []
    extra_ids: set[ObjectId] = set()
    cursor = None
    n = 10_000
    while True:
        page = router.read(1, limit=37, cursor=cursor)
        seen.extend(it.id for it in page.items if it.id is not None)
        # between pages: new items, some newer than everything, some late events into older periods
        batch = [item(1, P0 + timedelta(seconds=rng.randrange(int((NOW - P0).total_seconds()))), n + k) for k in range(5)]
        batch.append(item(1, NOW + timedelta(days=1), n + 5))
        extra_ids.update(router.write_many(batch))
        n += 6
        cursor = page.next_cursor
        if cursor is None:
            break
    assert len(seen) == len(set(seen)), "an item was served twice"
    base_seen = [oid for oid in seen if oid not in extra_ids]
    assert base_seen == expected, "a pre-existing item was lost or misordered"


def test_delete_removes_every_copy_everywhere(router: FeedRouter, raw_clients: Clients, db_name: str) -> None:
    """Copies of one data_key in all three clusters, for many receivers, all go; others stay."""
    key = data_key("fabula", 4242)
    copies = [
        FeedItem(receiver_id=r, sender_id=1, event_time=t, type=1, data={"fabula_id": 4242}, data_key=key)
        for r in range(50)
        for t in (P0 + timedelta(days=2), P1 + timedelta(days=2), P2 + timedelta(days=2))
    ]
    router.write_many(copies)
    router.write_many([item(r, P1 + timedelta(days=3), 7) for r in range(10)])
    assert router.delete(key) == 150
    for c in raw_clients.values():
        assert stored_copies.count(c[db_name], data_key=key) == 0
    assert sum(stored_copies.count(c[db_name]) for c in raw_clients.values()) == 10
    assert router.delete(key) == 0


def test_no_cluster_for_time_writes_nothing(make_config: Callable[..., RouterConfig], raw_clients: Clients, db_name: str,
                                           layout: str) -> None:
    """A batch with one item before every period (or in a gap) is refused whole."""
    from .conftest import register

    config = make_config()
    gap_start = P1 + timedelta(days=10)
    register(config, [(P0, P1), (gap_start, P2), (P2, None)], layout=layout)  # a gap [P1, P1+10d)
    with FeedRouter(config) as router:
        assert router.timemap.gaps == ((P1, gap_start),)
        good = [item(1, P2 + timedelta(days=1), i) for i in range(5)]
        with pytest.raises(NoClusterForTime, match=r"items\[5\]\.event_time: no cluster owns event_time 2023"):
            router.write_many([*good, item(1, P0 - timedelta(days=1), 5)])
        with pytest.raises(NoClusterForTime, match="'cluster_1' .* ends before it; 'cluster_2' .* starts after it"):
            router.write(item(1, P1 + timedelta(days=1), 6))
    assert sum(stored_copies.count(c[db_name]) for c in raw_clients.values()) == 0


class _Offset(tzinfo):
    """A tzinfo with a fixed (possibly invalid) offset, or one whose utcoffset raises."""

    def __init__(self, offset: timedelta | None, error: Exception | None = None) -> None:
        self.offset, self.error = offset, error

    def utcoffset(self, dt: datetime | None) -> timedelta | None:
        if self.error is not None:
            raise self.error
        return self.offset


def _nested(depth: int) -> dict[str, Any]:
    top: dict[str, Any] = {}
    cur = top
    for _ in range(depth):
        cur["x"] = {}
        cur = cur["x"]
    return top


def _self_referencing() -> dict[str, Any]:
    me: dict[str, Any] = {}
    me["me"] = me
    return me


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("event_time", datetime(2024, 5, 1), "items[3].event_time: must be timezone-aware"),
        ("event_time", "2024-05-01", "items[3].event_time: must be a timezone-aware datetime"),
        ("receiver_id", None, "items[3].receiver_id: must be a 64-bit int or a non-empty UTF-8 str of at most 1024 characters (got None)"),
        ("receiver_id", True, "items[3].receiver_id: must be a 64-bit int or a non-empty UTF-8 str of at most 1024 characters (got True)"),
        ("receiver_id", 2**63, "items[3].receiver_id: must be a 64-bit int"),
        ("sender_id", 1.5, "items[3].sender_id: must be a 64-bit int or a non-empty UTF-8 str of at most 1024 characters (got 1.5)"),
        ("type", [1], "items[3].type: must be a 64-bit int or a non-empty UTF-8 str of at most 1024 characters (got [1])"),
        ("data", "x", "items[3].data: must be a mapping (got str)"),
        ("data", {1: "x"}, "items[3].data: keys must be str (got key 1)"),
        ("data", {"a": {1: "x"}}, "items[3].data.a: keys must be str (got key 1)"),
        ("data", {"a": [{1, 2}]}, "items[3].data: cannot be stored as BSON: "),
        ("data", {"a": 2**64}, "items[3].data: cannot be stored as BSON: "),
        ("data", {"a\x00b": 1}, "items[3].data.a\x00b: a key must not contain NUL"),
        ("data", {"blob": "x" * (17 * 1024 * 1024)}, "items[3].data: must encode to at most"),
        ("data_key", "", "items[3].data_key: must be a non-empty UTF-8 str"),
        ("data", {"x": "bad\ud800"}, "items[3].data: cannot be stored as BSON"),
        ("data", {f"k{i}": "x" * 60_000 for i in range(300)}, "items[3].data: must encode to at most"),
        ("receiver_id", "\ud800", "items[3].receiver_id: must be a 64-bit int or a non-empty UTF-8 str"),
        ("data_key", "k\ud800", "items[3].data_key: must be a non-empty UTF-8 str"),
        ("type", "t\udfff", "items[3].type: must be a 64-bit int or a non-empty"),
        # Oversized ids and keys: accepted before, and the receiver's reads then failed for ever.
        ("sender_id", "s" * (17 * 1024 * 1024), "items[3].sender_id: must be a 64-bit int or a non-empty UTF-8 str of at most 1024"),
        ("receiver_id", "r" * 1025, "items[3].receiver_id: must be a 64-bit int or a non-empty UTF-8 str of at most 1024"),
        ("type", "t" * 5000, "items[3].type: must be a 64-bit int or a non-empty UTF-8 str of at most 1024"),
        ("data_key", "k" * (17 * 1024 * 1024), "items[3].data_key: must be a non-empty UTF-8 str of at most 1024 characters"),
        # Times that overflow, and tzinfos that misbehave: OverflowError/ValueError/RuntimeError before.
        ("event_time", datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=5))), "items[3].event_time: is outside the range"),
        ("event_time", datetime(9999, 12, 31, 23, tzinfo=timezone(timedelta(hours=-5))), "items[3].event_time: is outside the range"),
        ("event_time", datetime(2024, 8, 1, tzinfo=_Offset(timedelta(hours=30))), "items[3].event_time: its tzinfo"),
        ("event_time", datetime(2024, 8, 1, tzinfo=_Offset(None, RuntimeError("boom"))), "items[3].event_time: its tzinfo"),
        # Nesting past the limit, or a value that contains itself: RecursionError before.
        ("data", _nested(2000), "items[3].data.x.x.x"),
        ("data", _self_referencing(), "items[3].data.me.me"),
        # Keys the server refuses: a partly applied batch and ClusterUnavailable before.
        ("data", {"$set": 1}, "items[3].data.$set: a key must not start with '$'"),
        ("data", {"a.b": 1}, "items[3].data.a.b: a key must not contain '.'"),
        ("data", {"ok": [{"deep": {"$x": 1}}]}, "items[3].data.ok[0].deep.$x: a key must not start with '$'"),
    ],
)
def test_invalid_item_rejects_the_whole_batch(
    router: FeedRouter, raw_clients: Clients, db_name: str, field: str, value: object, message: str
) -> None:
    """InvalidItem names the item and field, before any write (also for lone surrogates and data
    over the size limit, which used to fail mid-write); no cluster is changed."""
    fields: dict[str, Any] = dict(receiver_id=1, sender_id=2, event_time=P2 + timedelta(days=1), type=1, data={}, data_key="k")
    fields[field] = value
    bad = FeedItem(**fields)
    good = [item(1, P1 + timedelta(days=i), i) for i in range(3)]
    with pytest.raises(InvalidItem) as info:
        router.write_many([*good, bad])
    assert str(info.value).startswith(message)
    assert sum(stored_copies.count(c[db_name]) for c in raw_clients.values()) == 0


def test_not_a_feed_item(router: FeedRouter) -> None:
    """A dict instead of a FeedItem is InvalidItem, not AttributeError."""
    with pytest.raises(InvalidItem, match=r"item: must be a FeedItem \(got dict\)"):
        router.write({"receiver_id": 1})  # type: ignore[arg-type]
    with pytest.raises(InvalidItem, match=r"items: must be an iterable of FeedItem \(got NoneType\)"):
        router.write_many(None)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "kwargs, exc, message",
    [
        ({"receiver_id": None}, InvalidItem, "receiver_id: must be"),
        ({"receiver_id": 1, "limit": 0}, InvalidItem, "limit: must be an int from 1 to 1000 (got 0)"),
        ({"receiver_id": 1, "limit": "5"}, InvalidItem, "limit: must be"),
        ({"receiver_id": 1, "cursor": "nope"}, InvalidCursor, "cursor: not a feed-router cursor"),
    ],
)
def test_bad_read_arguments(router: FeedRouter, kwargs: dict[str, Any], exc: type[Exception], message: str) -> None:
    """Bad read arguments raise the matching RouterError."""
    with pytest.raises(exc, match=re.escape(message)):
        router.read(**kwargs)


def test_bad_delete_argument(router: FeedRouter) -> None:
    """delete needs a data_key string."""
    with pytest.raises(InvalidItem, match="data_key: must be a non-empty UTF-8 str"):
        router.delete(None)  # type: ignore[arg-type]


def test_id_collision_gets_a_fresh_id(sync_router: FeedRouter, raw_clients: Clients, db_name: str, layout: str) -> None:
    """A first send that hits another item's _id (event seconds recur, the counter wraps) is re-sent with a new id."""
    router = sync_router
    oid = router.write(item(1, P2 + timedelta(days=1), 1))
    newcomer = item(2, P2 + timedelta(days=1), 2)
    n = newcomer
    copies = CopyList([Copy(oid, n.receiver_id, n.sender_id, n.event_time, n.type, n.data, n.data_key)])  # the same id
    result = router.clusters.run(
        insert_program("cluster_3", LAYOUTS[layout], copies, policy=RetryPolicy(), deadline=deadline_in(10),
                       duplicates="check")
    )
    fresh = copies.ids[0]
    assert result.failed == {} and fresh != oid and result.renamed == {0: fresh} and result.written == 1
    assert fresh.generation_time == oid.generation_time  # same event second
    db = raw_clients["cluster_3"][db_name]
    found = stored_copies.one(db, id=fresh)
    assert stored_copies.count(db) == 2 and found is not None and found.receiver_id == 2


def test_unreachable_cluster_at_start_up_is_named(make_config: Callable[..., RouterConfig], servers: Any) -> None:
    """A cluster nobody listens for fails start-up with ClusterUnavailable naming it, not its URI."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"mongodb://feed:hunter2@127.0.0.1:{s.getsockname()[1]}"
    config = make_config(uris=[servers.uris[0], dead, servers.uris[2]], serverSelectionTimeoutMS=300)
    with pytest.raises(ClusterUnavailable) as info:
        FeedRouter(config)
    assert info.value.cluster == "cluster_2"
    assert "hunter2" not in str(info.value) and "hunter2" not in repr(config)


@pytest.mark.needs_durable_server  # the restarted server must come back as the same cluster
def test_cluster_down_fails_only_its_items(make_config: Callable[..., RouterConfig], raw_clients: Clients, db_name: str,
                                          layout: str, spare: LocalServer) -> None:
    """With one cluster (on the file's spare server) gone mid-life, its items are reported failed by index; the rest
    are stored."""
    from .conftest import register

    uris = [raw_clients["cluster_1"].address, spare.uri, raw_clients["cluster_3"].address]
    uri_list = [u if isinstance(u, str) else f"mongodb://{u[0]}:{u[1]}" for u in uris]
    config = make_config(uris=uri_list, serverSelectionTimeoutMS=500)
    register(config, layout=layout)
    with FeedRouter(config, clock=lambda: NOW) as router:
        spare.kill()
        items = [item(1, t, i) for i, t in enumerate([P0 + timedelta(days=1), P1 + timedelta(days=1), P2 + timedelta(days=1)] * 3)]
        with pytest.raises(WriteFailed) as info:
            router.write_many(items)
        assert sorted(info.value.failed) == [1, 4, 7]
        assert all(isinstance(e, ClusterUnavailable) and e.cluster == "cluster_2" for e in info.value.failed.values())
        assert stored_copies.count(raw_clients["cluster_1"][db_name]) == 3
        assert stored_copies.count(raw_clients["cluster_3"][db_name]) == 3
        with pytest.raises(ClusterUnavailable, match="cluster 'cluster_2'"):
            router.write(item(1, P1 + timedelta(days=2), 99))
        spare.restart()
        router.write(item(1, P1 + timedelta(days=2), 99))  # recovers without a new router


@pytest.mark.parametrize("call", ["read_surrogate", "read_huge", "delete_surrogate"])
def test_unencodable_read_and_delete_arguments(router: FeedRouter, call: str) -> None:
    """read and delete refuse values BSON cannot carry with InvalidItem, not a raw encoding error."""
    with pytest.raises(InvalidItem):
        if call == "read_surrogate":
            router.read("\ud800")
        elif call == "read_huge":
            router.read(2**70)
        else:
            router.delete("\ud800")


@pytest.mark.parametrize(
    "state, message",
    [
        (CursorState(pending=(("cluster_3", None), ("cluster_3", None)), done=True), "owes cluster 'cluster_3' twice"),
        (CursorState(pending=(("cluster_9", None),), done=True), "owes cluster 'cluster_9', which has no period"),
        (CursorState(pending=(("cluster_3", Position(P1, ObjectId())),), done=True), "precedes its period"),
    ],
)
def test_forged_cursor_is_refused(router: FeedRouter, state: CursorState, message: str) -> None:
    """A well-formed cursor the router could not have made is InvalidCursor (one owing a cluster twice used to
    serve that cluster's items twice)."""
    router.write_many([item(1, P2 + timedelta(days=i), i) for i in range(5)])
    with pytest.raises(InvalidCursor, match=re.escape(message)):
        router.read(1, limit=10, cursor=encode_state(state))
