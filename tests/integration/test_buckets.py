"""The ``buckets`` layout, end to end, on mongo-java-server (a server that appends atomically).

Periods: ``cluster_1`` [P0, P1) in ``copies``, ``cluster_2`` [P1, P2) and ``cluster_3``
[P2, open) in ``buckets``, each a database of its own on one mongo-java-server, given their
periods and layouts by the operator path (:func:`plan_period`, :func:`apply_period`). Every
public operation runs through both doors; pages that cross the layout boundary merge both.
FerretDB 1, which loses concurrent updates of one document, is refused ``buckets``
(``test_buckets_refused.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from typing import Any

import attrs
import bson
import pytest
from pymongo import MongoClient

from router import Activity, FeedItem, FeedRouter, RouterConfig, data_key
from router.admin.periods import plan_period
from router.admin.status import check_report
from router.core.layouts.buckets import MAX_BYTES, MAX_ITEMS
from router.errors import PeriodChangeRefused
from router.model import ClusterMeta
from router.storage.clusters import Cluster, Clusters
from harness.javaserver import LocalJavaServer

from .buckets_child import BASE, activity
from .conftest import P0, P1, P2, register
from .layouts import buckets_config, fan_out_at_once, feed, page_all

NOW = datetime(2024, 9, 1, tzinfo=P0.tzinfo)


@pytest.fixture(scope="module")
def javaserver() -> Iterator[LocalJavaServer]:
    with LocalJavaServer() as server:
        yield server


@pytest.fixture
def config(javaserver: LocalJavaServer) -> RouterConfig:
    return buckets_config(javaserver.uri)


@pytest.fixture
def raw(javaserver: LocalJavaServer) -> Iterator[MongoClient[dict[str, Any]]]:
    client: MongoClient[dict[str, Any]] = MongoClient(javaserver.uri, tz_aware=True)
    yield client
    client.close()


def stored_copies(raw: MongoClient[dict[str, Any]], config: RouterConfig, i: int, query: dict[str, Any] | None = None) -> int:
    """Copies stored in period *i*, counted in the documents themselves."""
    return sum(len(d["items"]) for d in feed(raw, config, i).find(query or {}))


def items_over(n: int, start: datetime, end: datetime, receiver: int, sender: int = 1) -> list[FeedItem]:
    step = (end - start) / (n + 1)
    return [FeedItem(receiver_id=receiver, sender_id=sender, event_time=start + step * (k + 1), type=k % 3,
                     data={"n": k, "at": str(start)}, data_key=data_key("item", f"{start}-{receiver}-{k}"))
            for k in range(n)]


def newest_first(items: list[FeedItem]) -> bool:
    keys = [(x.event_time, x.id.binary) for x in items if x.id is not None]
    return keys == sorted(keys, reverse=True) and len(set(keys)) == len(keys)


def test_every_operation_across_a_layout_boundary(config: RouterConfig, open_router: Callable[..., Any],
                                                  raw: MongoClient[dict[str, Any]]) -> None:
    """Writes, pages, reruns, late events, fan-out, pull, backfill, unfollow, edits, unseen, status on buckets."""
    router = open_router(config, clock=lambda: NOW)
    written = items_over(60, P1, P2, receiver=7) + items_over(90, P2, NOW, receiver=7) + items_over(40, P0, P1, receiver=7)
    ids = router.write_many(written)
    assert len(ids) == 190
    # Buckets never pass the cap; the copies period is one document per copy.
    docs = list(feed(raw, config, 2).find({"receiver_id": 7}))
    assert sum(len(d["items"]) for d in docs) == 90 and all(len(d["items"]) <= MAX_ITEMS for d in docs)
    assert len(docs) == 2 and feed(raw, config, 0).count_documents({"receiver_id": 7}) == 40
    # A rerun with the same ids stores nothing twice.
    assert router.write_many([attrs.evolve(x, id=i) for x, i in zip(written, ids)]) == ids
    assert stored_copies(raw, config, 2) == 90 and stored_copies(raw, config, 1) == 60
    # Every item exactly once, newest first, across the boundary, at several page sizes.
    for limit in (1, 7, 50, 120):
        got = page_all(router, 7, limit)
        assert newest_first(got) and len(got) == 190
        assert {x.id for x in got} == set(ids)
    # Late events (older than the newest bucket) and items written between pages.
    first = router.read(7, limit=50)
    late = items_over(5, P2, P2 + timedelta(days=1), receiver=7, sender=2)
    router.write_many(late)
    cursor, seen = first.next_cursor, list(first.items)
    while cursor is not None:
        page = router.read(7, limit=50, cursor=cursor)
        seen.extend(page.items)
        cursor = page.next_cursor
    assert newest_first(seen) and len(seen) == 195
    assert [x.data["n"] for x in router.read(7, limit=200, types=[1]).items] == [
        x.data["n"] for x in page_all(router, 7, 200) if x.type == 1]
    # Fan-out into buckets: rerun stores each copy once; status says done.
    post = Activity(sender_id=50, event_time=P2 + timedelta(days=3), type=1, data={"v": 1}, data_key=data_key("post", 1))
    result = router.fan_out(post, range(100, 400), batch_size=64)
    again = router.fan_out(post, range(100, 400), batch_size=64, job_id="rerun")
    assert (result.written, again.written, again.already_present) == (300, 0, 300)
    assert stored_copies(raw, config, 2, {"items.data_key": post.data_key}) == 300
    assert router.fan_out_status(result.job_id).state == "done"
    # Update and delete reach every copy, in both layouts.
    assert router.update(post.data_key, {"v": 2}) == 300
    assert {x.data["v"] for r in (100, 250, 399) for x in router.read(r, limit=5).items} == {2}
    shared = written[0].data_key
    assert router.delete(shared) == 1 and router.delete(post.data_key) == 300
    assert stored_copies(raw, config, 2, {"items.data_key": post.data_key}) == 0
    assert all(x.data_key != post.data_key for x in router.read(100, limit=5).items)
    # Pull-merge reads and backfill, then unfollow.
    celebrity = Activity(sender_id=77, event_time=P2 + timedelta(days=4), type=2, data={"c": 1}, data_key=data_key("c", 1))
    router.publish(celebrity, [], pull=True)
    pulled = router.read(7, limit=300, pull=[77])
    assert len(pulled.items) == 195 and newest_first(list(pulled.items))  # 190 + 5 late - 1 deleted + 1 pulled
    assert [x.data_key for x, p in zip(pulled.items, pulled.pulled) if p] == [celebrity.data_key]
    assert router.backfill(7, [77]).written == 1
    again_pulled = router.read(7, limit=300, pull=[77])
    assert len(again_pulled.items) == 195 and not any(again_pulled.pulled)  # copied and pulled: served once, as the copy
    assert router.unfollow(7, 77) == 1 and router.unfollow(7, 2) == 5
    assert stored_copies(raw, config, 2, {"receiver_id": 7}) == 90  # the late ones (sender 2) and the backfill gone
    # Notification counts over both layouts.
    newest = router.read(7, limit=10).items
    router.mark_seen(7, newest[9])
    assert router.unseen_count(7).count == 9
    assert router.unseen_count(7, pull=[77]).count == 9  # the pulled post is older than the marker
    assert (router.unseen_count(7, cap=5).count, router.unseen_count(7, cap=5).capped) == (5, True)
    router.write_many(items_over(10, P0, P1, receiver=8) + items_over(10, P1, P2, receiver=8))
    router.mark_seen(8, router.read(8, limit=20).items[14])  # in the copies period: both layouts counted
    unseen = router.unseen_count(8, cap=50)
    assert unseen.count == 14 and unseen.queried == ("cluster_3", "cluster_2", "cluster_1")


def test_buckets_are_capped_by_bytes(config: RouterConfig, raw: MongoClient[dict[str, Any]]) -> None:
    """Copies of 3 MiB each: a bucket takes two (8 MiB cap), so five need three buckets; all five page back."""
    router = FeedRouter(config, clock=lambda: NOW)
    try:
        big = [FeedItem(receiver_id=9, sender_id=1, event_time=P2 + timedelta(hours=k + 1), type=1,
                        data={"blob": "x" * (3 * 1024 * 1024), "k": k}, data_key=data_key("big", k)) for k in range(5)]
        router.write_many(big)
        docs = list(feed(raw, config, 2).find({"receiver_id": 9}))
        assert sorted(len(d["items"]) for d in docs) == [1, 2, 2]
        assert all(d["bytes"] <= MAX_BYTES and len(bson.encode(d)) < 16 * 1024 * 1024 for d in docs)
        assert [x.data["k"] for x in page_all(router, 9, 2)] == [4, 3, 2, 1, 0]
    finally:
        router.close()


def test_concurrent_fan_outs_keep_every_copy(config: RouterConfig, raw: MongoClient[dict[str, Any]]) -> None:
    """Two processes fan different posts out to the same 300 receivers at once: 600 copies, 2 per receiver, none lost."""
    assert fan_out_at_once(config, [{"post": 1, "receivers": 300}, {"post": 2, "receivers": 300}]) == [300, 300]
    docs = list(feed(raw, config, 2).find({}))
    per_receiver: dict[int, int] = {}
    for doc in docs:
        assert len(doc["items"]) == doc["count"] <= MAX_ITEMS
        per_receiver[doc["receiver_id"]] = per_receiver.get(doc["receiver_id"], 0) + len(doc["items"])
    assert per_receiver == {r: 2 for r in range(1, 301)}
    assert {activity(1).data_key, activity(2).data_key} == {i["data_key"] for d in docs for i in d["items"]}
    assert BASE > P2
