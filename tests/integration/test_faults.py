"""Faults against real server processes: a cluster killed (SIGKILL) or hung (SIGSTOP)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from pymongo import MongoClient

from router import ClusterUnavailable, FeedItem, FeedRouter, RouterConfig, WriteFailed, data_key
from router.testing.localservers import LocalClusters, LocalServer

from .conftest import NOW, P0, P1, P2, register

Clients = dict[str, MongoClient[dict[str, Any]]]
FAST = {"serverSelectionTimeoutMS": 800, "connectTimeoutMS": 800, "socketTimeoutMS": 1500}
#: A hang detector, not a speed target: every call must come back long before this.
HANG = 60.0


@pytest.fixture
def spare_router(make_config: Callable[..., RouterConfig], raw_clients: Clients) -> Iterator[tuple[FeedRouter, LocalServer]]:
    """A router whose cluster_2 (the middle period) runs on a server of the test's own."""
    with LocalClusters(1, names=["spare"]) as spare:
        uris = [f"mongodb://{h}:{p}" for h, p in (raw_clients["cluster_1"].address, raw_clients["cluster_3"].address)]
        config = make_config(uris=[uris[0], spare.uris[0], uris[1]], **FAST)
        register(config)
        router = FeedRouter(config, clock=lambda: NOW, refresh=False)
        try:
            yield router, spare.servers[0]
        finally:
            done = threading.Event()
            threading.Thread(target=lambda: (router.close(), done.set()), daemon=True).start()
            assert done.wait(HANG), "close() hung"


def in_thread(fn: Callable[[], Any]) -> Any:
    """Run fn in a thread and fail if it does not return (a hang), re-raising what it raised."""
    result: dict[str, Any] = {}

    def run() -> None:
        try:
            result["value"] = fn()
        except BaseException as exc:  # handed back to the test
            result["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(HANG)
    assert not t.is_alive(), "call did not return: a hang"
    if "error" in result:
        raise result["error"]
    return result.get("value")


def feed_items(receiver: int, n: int, offset: int = 0) -> list[FeedItem]:
    span = (NOW - P0) / n
    return [
        FeedItem(receiver_id=receiver, sender_id=1, event_time=P0 + span * i, type=1, data={"n": offset + i},
                 data_key=data_key("f", offset + i))
        for i in range(n)
    ]


def page_all(router: FeedRouter, receiver: int, limit: int, policy: str) -> tuple[list[FeedItem], list[Any]]:
    out: list[FeedItem] = []
    pages = []
    cursor = None
    for _ in range(1000):
        page = router.read(receiver, limit=limit, cursor=cursor, on_unavailable=policy)
        pages.append(page)
        out.extend(page.items)
        cursor = page.next_cursor
        if cursor is None or (page.partial and not page.items):
            return out, pages
    raise AssertionError("paging did not end")


def test_killed_cluster_partial_pages_then_recovery(spare_router: tuple[FeedRouter, LocalServer], raw_clients: Clients, db_name: str) -> None:
    """With cluster_2 killed: its writes fail by index, others land; reads are partial; after restart nothing is skipped."""
    router, server = spare_router
    items = feed_items(1, 300)
    router.write_many(items)
    server.kill()

    more = feed_items(1, 30, offset=1000)
    with pytest.raises(WriteFailed) as info:
        in_thread(lambda: router.write_many(more))
    expected_failed = [i for i, it in enumerate(more) if P1 <= it.event_time < P2]
    assert sorted(info.value.failed) == expected_failed
    assert {e.cluster for e in info.value.failed.values()} == {"cluster_2"}  # type: ignore[attr-defined]
    assert "cluster 'cluster_2'" in str(next(iter(info.value.failed.values())))
    written = [it for i, it in enumerate(more) if i not in info.value.failed]
    for it in written:  # nothing was written anywhere else instead
        owner = "cluster_1" if it.event_time < P1 else "cluster_3"
        assert raw_clients[owner][db_name].feed.count_documents({"data.n": it.data["n"]}) == 1

    with pytest.raises(ClusterUnavailable, match="cluster 'cluster_2'"):
        in_thread(lambda: page_all(router, 1, 40, "raise"))

    seen, pages = in_thread(lambda: page_all(router, 1, 40, "partial"))
    assert any(p.partial and p.unavailable == ("cluster_2",) for p in pages)
    assert all(src != "cluster_2" for p in pages for src in p.sources)
    cursor = pages[-1].next_cursor
    assert cursor is not None  # it still owes cluster_2's items

    server.restart()
    while cursor is not None:  # the same cursor, once the cluster is back
        page = router.read(1, limit=40, cursor=cursor, on_unavailable="partial")
        assert not page.partial
        seen.extend(page.items)
        cursor = page.next_cursor
    everything = items + written
    assert sorted(it.data["n"] for it in seen) == sorted(it.data["n"] for it in everything)
    assert len({it.id for it in seen}) == len(seen)
    router.write_many(more)  # recovered without a new router


def test_hung_cluster_every_call_returns(spare_router: tuple[FeedRouter, LocalServer], raw_clients: Clients, db_name: str) -> None:
    """With cluster_2 stopped (SIGSTOP), writes, reads, deletes and close all return; the others keep serving."""
    router, server = spare_router
    router.write_many(feed_items(2, 60))
    server.pause()
    try:
        with pytest.raises(WriteFailed) as info:
            in_thread(lambda: router.write_many(feed_items(2, 30, offset=500)))
        assert {e.cluster for e in info.value.failed.values()} == {"cluster_2"}  # type: ignore[attr-defined]
        page = in_thread(lambda: router.read(2, limit=100, on_unavailable="partial"))
        assert page.partial and "cluster_2" in page.unavailable and len(page.items) > 0
        with pytest.raises(ClusterUnavailable):
            in_thread(lambda: router.read(2, limit=100, on_unavailable="raise"))
        from router.errors import DeleteFailed

        with pytest.raises(DeleteFailed) as deleted:
            in_thread(lambda: router.delete(data_key("f", 0)))
        assert set(deleted.value.failed) == {"cluster_2"}
        # writes for the other periods still work while cluster_2 hangs
        ok = [it for it in feed_items(2, 30, offset=900) if not (P1 <= it.event_time < P2)]
        in_thread(lambda: router.write_many(ok))
        assert raw_clients["cluster_3"][db_name].feed.count_documents({"data.n": {"$gte": 900}}) > 0
    finally:
        server.resume()
    router.write(feed_items(2, 2, offset=700)[1])  # back to normal
