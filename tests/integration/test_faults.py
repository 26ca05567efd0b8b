"""Faults against real server processes: a cluster killed (SIGKILL) or hung (SIGSTOP)."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import attrs
import pytest
from pymongo import MongoClient

from router import (
    Activity,
    AsyncFeedRouter,
    ClusterUnavailable,
    FeedItem,
    FeedRouter,
    InvalidItem,
    ItemRefused,
    RouterClosed,
    RouterConfig,
    RouterError,
    UpdateFailed,
    WriteFailed,
    data_key,
)
from harness.localservers import LocalServer

from .conftest import NOW, P0, P1, P2, register

Clients = dict[str, MongoClient[dict[str, Any]]]
FAST = {"serverSelectionTimeoutMS": 800, "connectTimeoutMS": 800, "socketTimeoutMS": 1500}
#: The calls' timeout (clusters.yaml ``timeout``) in these tests.
TIMEOUT = timedelta(seconds=2)
#: A hang detector, not a speed target: every call must come back long before this.
HANG = 60.0


@pytest.fixture
def spare_router(
    make_config: Callable[..., RouterConfig], raw_clients: Clients, open_router: Callable[..., Any], spare: LocalServer,
) -> Iterator[tuple[FeedRouter, LocalServer]]:
    """A router (through the test's door) whose cluster_2 (the middle period) runs on the file's spare server."""
    uris = [f"mongodb://{h}:{p}" for h, p in (raw_clients["cluster_1"].address, raw_clients["cluster_3"].address)]
    config = make_config(uris=[uris[0], spare.uri, uris[1]], timeout=TIMEOUT, **FAST)
    register(config)
    router = open_router(config, clock=lambda: NOW, refresh=False)
    try:
        yield router, spare
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


def wait_until_served(router: FeedRouter, receiver: int, cursor: str, *, within: float = 30.0) -> None:
    """Block until the page at *cursor* (which owes the restarted cluster) is whole: the router's client sees it back.

    A restarted server is not seen at once (the client rechecks it twice a second, and a loaded machine may take a
    few turns); a read before that is partial, as documented, and that is not what the test after it is about. A
    cursor is a value, so reading it again changes nothing.
    """
    deadline = time.monotonic() + within
    while router.read(receiver, limit=1, cursor=cursor, on_unavailable="partial").partial:
        assert time.monotonic() < deadline, f"the router did not see the restarted server within {within:.0f} s"
        time.sleep(0.2)


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
    wait_until_served(router, 1, cursor)
    while cursor is not None:  # the same cursor, once the router sees the cluster back
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


def test_an_update_with_a_cluster_hung_fails_then_finishes(spare_router: tuple[FeedRouter, LocalServer], raw_clients: Clients,
                                                            db_name: str) -> None:
    """One data_key published in all three periods, cluster_2 stopped (SIGSTOP): update raises UpdateFailed naming
    cluster_2 and counting exactly the copies it changed in the others; after SIGCONT the same update changes the
    rest, and every copy and every outbox entry holds the new data."""
    router, server = spare_router
    key = data_key("post", 1)
    copies = {"cluster_1": 30, "cluster_2": 40, "cluster_3": 50}
    for when, (cluster, n) in zip((P0, P1, P2), copies.items()):
        router.publish(Activity(sender_id=9, event_time=when + timedelta(days=3), type=1, data={"v": 1}, data_key=key),
                       range(n))
    router.publish(Activity(sender_id=9, event_time=P1 + timedelta(days=4), type=1, data={"v": 1},
                            data_key=data_key("post", 2)), range(5))  # another post: never changed
    spare: MongoClient[dict[str, Any]]
    with MongoClient(server.uri, tz_aware=True) as spare:
        dbs = {"cluster_1": raw_clients["cluster_1"][db_name], "cluster_2": spare[db_name],
               "cluster_3": raw_clients["cluster_3"][db_name]}

        def stored(cluster: str, collection: str) -> list[Any]:
            return [d["data"] for d in dbs[cluster][collection].find({"data_key": key})]

        server.pause()
        try:
            with pytest.raises(UpdateFailed) as info:
                in_thread(lambda: router.update(key, {"v": 2}))
        finally:
            server.resume()
        failed = info.value
        assert list(failed.failed) == ["cluster_2"] and failed.failed["cluster_2"].cluster == "cluster_2"
        assert "failed: cluster_2" in str(failed) and "cluster 'cluster_2'" in str(failed.failed["cluster_2"])
        # updated counts copies (as update's return value does), not the outbox entries edited with them
        assert failed.updated == copies["cluster_1"] + copies["cluster_3"]
        for cluster in ("cluster_1", "cluster_3"):
            assert stored(cluster, "feed") == [{"v": 2}] * copies[cluster] and stored(cluster, "outbox") == [{"v": 2}]
        assert stored("cluster_2", "feed") == [{"v": 1}] * copies["cluster_2"] and stored("cluster_2", "outbox") == [{"v": 1}]

        assert router.update(key, {"v": 2}) == copies["cluster_2"]  # run again: it changes what is left
        for cluster, n in copies.items():
            assert stored(cluster, "feed") == [{"v": 2}] * n and stored(cluster, "outbox") == [{"v": 2}]
        assert [d["data"] for d in dbs["cluster_2"].feed.find({"data_key": data_key("post", 2)})] == [{"v": 1}] * 5
        assert dbs["cluster_2"].outbox.find_one({"data_key": data_key("post", 2)})["data"] == {"v": 1}  # type: ignore[index]
        assert router.update(key, {"v": 2}) == 0


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    """Seconds *fn* took (in a thread, hang-checked) and what it returned or raised."""
    began = time.monotonic()
    try:
        value: Any = in_thread(fn)
    except Exception as exc:  # the outcome is checked by the caller
        value = exc
    return time.monotonic() - began, value


def test_every_call_returns_within_the_timeout(spare_router: tuple[FeedRouter, LocalServer]) -> None:
    """With timeout: 2s and cluster_2 hung (SIGSTOP), every public call returns within the timeout plus a margin.

    Before, a write with socketTimeoutMS 2000 took 6.1-6.4 s, and pymongo's "operation
    cancelled" was retried although the timeout was spent.
    """
    router, server = spare_router
    router.write_many(feed_items(3, 30))
    bound = TIMEOUT.total_seconds() + 2.0  # the documented bound, with room for a loaded machine
    in_p1 = feed_items(3, 30, offset=300)[12]
    assert P1 <= in_p1.event_time < P2
    server.pause()
    try:
        calls: dict[str, Callable[[], Any]] = {
            "write": lambda: router.write(in_p1),
            "write_many": lambda: router.write_many(feed_items(3, 30, offset=400)),
            "read raise": lambda: router.read(3, limit=100, on_unavailable="raise"),
            "read partial": lambda: router.read(3, limit=100, on_unavailable="partial"),
            "delete": lambda: router.delete(data_key("f", 1)),
            "update": lambda: router.update(data_key("f", 2), {"n": -2}),
            "unfollow": lambda: router.unfollow(3, 1),
            "refresh": lambda: router.refresh(),
        }
        for name, call in calls.items():
            elapsed, outcome = timed(call)
            assert elapsed < bound, f"{name} took {elapsed:.1f} s (bound {bound} s): {outcome!r}"
            assert not isinstance(outcome, Exception) or isinstance(outcome, RouterError), (name, outcome)
        elapsed, outcome = timed(router.close)
        assert elapsed < bound and outcome is None, (elapsed, outcome)
    finally:
        server.resume()


def test_a_write_repeated_with_its_ids_stores_one_copy(spare_router: tuple[FeedRouter, LocalServer], raw_clients: Clients,
                                                       db_name: str) -> None:
    """SIGSTOP -> WriteFailed (outcome unknown) -> SIGCONT -> the unwritten items again, with WriteFailed.ids:
    exactly one copy of each (it used to store two, as every write drew new ids)."""
    router, server = spare_router
    items = [it for it in feed_items(4, 90) if P1 <= it.event_time < P2]
    server.pause()
    try:
        with pytest.raises(WriteFailed) as info:
            in_thread(lambda: router.write_many(items))
    finally:
        server.resume()
    failed = info.value
    assert sorted(failed.failed) == list(range(len(items)))
    again = failed.unwritten(items)
    assert router.write_many(again) == failed.ids
    with MongoClient(server.uri) as spare:
        feed = spare[db_name].feed
        stored = list(feed.find({"receiver_id": 4}, {"_id": 1, "data": 1}))
        assert len(stored) == len(items) and sorted(d["_id"] for d in stored) == sorted(failed.ids)
        # Repeating it once more changes nothing either.
        assert router.write_many(again) == failed.ids and feed.count_documents({"receiver_id": 4}) == len(items)


def test_a_chosen_id_is_checked(spare_router: tuple[FeedRouter, LocalServer], raw_clients: Clients, db_name: str) -> None:
    """FeedItem.id must carry event_time's second; an id that already holds another item is refused, alone."""
    router, _server = spare_router
    first, second, third = feed_items(5, 3)
    oid = router.write(first)
    with pytest.raises(InvalidItem, match="items\\[0\\].id: must carry event_time's second"):
        router.write_many([attrs.evolve(second, id=oid)])
    taken = attrs.evolve(first, data_key=data_key("other", 1), id=oid)
    with pytest.raises(WriteFailed) as info:
        router.write_many([taken, third])
    assert list(info.value.failed) == [0] and isinstance(info.value.failed[0], ItemRefused)
    assert "already holds another item" in str(info.value.failed[0])
    assert info.value.unwritten([taken, third]) == []  # refused for itself: repeating it will not help


def test_calls_racing_close_complete_or_fail_truthfully(spare_router: tuple[FeedRouter, LocalServer], raw_clients: Clients,
                                                         db_name: str) -> None:
    """close() while another thread writes: each call completes, or raises WriteFailed whose unlisted items are
    stored, or RouterClosed having written nothing; every call after close() raises RouterClosed."""
    router, _server = spare_router
    outcomes: list[tuple[list[FeedItem], Any]] = []
    stop = threading.Event()

    def writer() -> None:
        k = 0
        while not stop.is_set():
            items = feed_items(6, 200, offset=10_000 * (k + 1))
            try:
                outcomes.append((items, router.write_many(items)))
            except RouterError as exc:
                outcomes.append((items, exc))
                if isinstance(exc, RouterClosed):
                    return
            k += 1

    thread = threading.Thread(target=writer)
    thread.start()
    deadline = time.monotonic() + HANG
    while len(outcomes) < 2:
        assert time.monotonic() < deadline and thread.is_alive(), outcomes
        time.sleep(0.01)
    in_thread(router.close)
    stop.set()
    thread.join(HANG)
    assert not thread.is_alive()
    with MongoClient(_server.uri) as spare:
        clients = [raw_clients["cluster_1"], spare, raw_clients["cluster_3"]]
        stored = {d["data"]["n"] for c in clients for d in c[db_name].feed.find({"receiver_id": 6}, {"data": 1})}
    for items, outcome in outcomes:
        numbers = [it.data["n"] for it in items]
        if isinstance(outcome, RouterClosed):
            assert not stored & set(numbers)
        elif isinstance(outcome, WriteFailed):
            assert {n for i, n in enumerate(numbers) if i not in outcome.failed} <= stored
        else:
            assert not isinstance(outcome, Exception), outcome
            assert set(numbers) <= stored
    assert isinstance(outcomes[-1][1], RouterClosed) or stop.is_set()
    for call in (lambda: router.write_many(feed_items(6, 2)), lambda: router.read(6), lambda: router.delete("k"),
                 lambda: router.refresh(), lambda: router.update("k", {}), lambda: router.fan_out_status("j")):
        with pytest.raises(RouterClosed):
            call()


def test_the_first_request_after_a_restart_gets_the_calls_time(
    make_config: Callable[..., RouterConfig], raw_clients: Clients, open_router: Callable[..., Any], db_name: str,
    spare: LocalServer,
) -> None:
    """``serverSelectionTimeoutMS`` bounds the wait for a restarted cluster, not the request sent once it is found.

    pymongo notices a restarted server on its next check, up to half a second after it is
    asked for one. The router used to give the whole first request ``serverSelectionTimeoutMS``
    from the start of that wait, so a batch that took longer than what the wait left failed
    although the cluster was up (the resume of a fan-out, with 500 ms, failed in CI).
    """
    uris = [f"mongodb://{h}:{p}" for h, p in (raw_clients["cluster_1"].address, raw_clients["cluster_3"].address)]
    # (The call's own timeout is a minute: the inserts one after another must not pass the default 10 s on a loaded
    # machine, which would test the call's deadline, not the selection's.)
    config = make_config(uris=[uris[0], spare.uri, uris[1]], serverSelectionTimeoutMS=300,  # < pymongo's 0.5 s step
                         timeout=timedelta(minutes=1))
    register(config)
    router = open_router(config, clock=lambda: NOW, refresh=False)
    # A client that has not reached its servers sends its first request capped at serverSelectionTimeoutMS (no
    # ping first: docs/guarantees.md); on a loaded machine connect + handshake + insert can pass 300 ms, so this
    # setup write is repeated until the client has found its servers (receiver 1's copies are not counted).
    for attempt in range(20):
        try:
            in_thread(lambda: router.write_many(feed_items(1, 10)))
            break
        except WriteFailed:
            if attempt == 19:
                raise
            time.sleep(0.1)
    spare.kill()
    with pytest.raises(WriteFailed):  # the router's client has now seen its server fail
        in_thread(lambda: router.write_many(feed_items(2, 10)))
    spare.restart()
    span = (P2 - P1) / 2_000
    batch = [FeedItem(receiver_id=3, sender_id=1, event_time=P1 + span * i, type=1, data={"n": i, "pad": "x" * 200},
                      data_key=data_key("r", i))
             for i in range(2_000)]
    # Two inserts of write.batch_size (1,000), one after the other: the first request after the restart is the first
    # of them, whatever the batch's total (the rest go to a server the client knows).
    in_thread(lambda: router.write_many(batch))
    client: MongoClient[dict[str, Any]] = MongoClient(spare.uri)
    try:
        assert client[db_name].feed.count_documents({"receiver_id": 3}) == 2_000
    finally:
        client.close()


def test_an_async_close_does_not_hang_on_a_client_that_never_closes(
        make_config: Callable[..., RouterConfig], caplog: pytest.LogCaptureFixture) -> None:
    """AsyncFeedRouter.close() returns within ``timeout`` + 5 s when a client's close never ends. The client's pool
    lock is held: in a fresh-clone run, close() waited for good in the client's endSessions for that lock (and so did a
    cancelled wait of the pool's condition), after reads cut at their deadline against a stopped deployment. The router
    logs that it left the client unfinished."""
    config = make_config(timeout=TIMEOUT)
    register(config)
    router = AsyncFeedRouter(config, clock=lambda: NOW, refresh=False)

    async def scenario() -> float:
        await router.start()
        await router.read(1)  # the data client is made, and its pool holds a connection and a session
        storage = router._clusters
        assert storage is not None
        spec = config.clusters[-1]
        with storage.clients.using(spec, "feed") as client:
            pools = [server.pool for server in client._topology._servers.values()]
        for pool in pools:
            await pool.lock.acquire()  # never released: every checkout and the pool's close wait on it
        began = time.monotonic()
        await asyncio.wait_for(router.close(), HANG)
        return time.monotonic() - began

    with caplog.at_level(logging.WARNING, logger="router.storage.aclusters"):
        elapsed = asyncio.run(scenario())
    assert elapsed < TIMEOUT.total_seconds() + 5 + 3, elapsed
    assert any("still closing after 7 s; left unfinished" in r.getMessage() for r in caplog.records), caplog.text
