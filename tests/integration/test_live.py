"""Live feeds against real servers (FerretDB 2 by default) and a real Redis, through both doors.

Every check that "nothing else came" waits for a *sentinel*: an item written after the ones
under test, whose push comes after theirs on the same channel, so the events before it are
all that was sent (no timed silence). Counts of messages come from the router's metrics.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import attrs
import pytest
import redis
from bson import ObjectId

from router import (
    Activity, DeletedItem, FeedRouter, InvalidCursor, InvalidItem, ItemDeleted, NewItem, PushNotConfigured, Resync,
    RouterConfig, UpdatedItem, data_key, live_cursor,
)
from router.cursor import CursorState, Position, encode_state
from harness.proxy import CutProxy
from harness.redis import LocalRedis

from .conftest import NOW, register
from .live import (  # noqa: F401 - fixtures too
    R, S, WHEN, Recorded, feeds, is_item, item, live_config, metrics, new_ids, opened, opened_or_not, push, redis_server,
    until, wait_for,
)


# -- the protocol ------------------------------------------------------------------------------


def test_nothing_falls_between_the_page_and_the_stream(feeds: Any) -> None:
    """Items written after the page was read come from the catch-up, oldest first; items written while a subscription
    subscribes and after come live; a writer runs throughout, and four subscriptions start at different moments of
    it, from the same page. Each hands out every item after the page's newest exactly once, in order."""
    ids = feeds.write_many([item(n) for n in range(20)])
    page = feeds.read(R, limit=5)
    assert [i.id for i in page.items] == ids[19:14:-1]
    written: list[ObjectId] = []
    moments = {30: threading.Event(), 50: threading.Event(), 70: threading.Event(), 90: threading.Event()}

    def writer() -> None:
        for n in range(20, 120):
            written.extend(feeds.write_many([item(n)]))
            if n in moments:
                moments[n].set()

    thread = threading.Thread(target=writer)
    thread.start()
    subs = []
    try:
        for moment in moments.values():
            assert moment.wait(60)
            subs.append(opened_or_not(feeds.subscribe(R, cursor=live_cursor(page))))
    finally:
        thread.join(120)
    for live, first in subs:  # (a subscription that caught up after the writer ended had every item at once)
        got = first if any(map(is_item(written[-1]), first)) else first + until(live, is_item(written[-1]))
        live.close()
        assert new_ids(got) == written  # each once, in the order written (times rise with n)
        assert all(isinstance(e, NewItem) for e in got)


def test_a_pushed_item_is_the_item_a_page_shows(feeds: Any) -> None:
    """A live item equals the FeedItem a read returns for it, and its cursor resumes after it."""
    page = feeds.read(R)
    with opened(feeds.subscribe(R, cursor=live_cursor(page))) as live:
        (oid,) = feeds.write_many([item(1, type="like")])
        (event,) = until(live, is_item(oid))
        assert isinstance(event, NewItem) and not event.pulled
        assert event.item == feeds.read(R).items[0]
        assert event.cursor == live.cursor
    with feeds.subscribe(R, cursor=event.cursor) as again:  # nothing after it: the next event is the next write
        (later,) = feeds.write_many([item(2)])
        assert new_ids(until(again, is_item(later))) == [later]


def test_no_cursor_starts_at_the_newest_item(feeds: Any) -> None:
    """Subscribing with no cursor hands out only what is stored after the subscription started."""
    feeds.write_many([item(n) for n in range(3)])
    with opened(feeds.subscribe(R)) as live:
        (oid,) = feeds.write_many([item(3)])
        assert new_ids(until(live, is_item(oid))) == [oid]


def test_types_keep_only_those_types(feeds: Any) -> None:
    """types filters live items as read filters pages."""
    with opened(feeds.subscribe(R, types=["like"])) as live:
        ids = feeds.write_many([item(1, type="comment"), item(2, type="like")])
        assert new_ids(until(live, is_item(ids[1]))) == [ids[1]]


def test_bad_arguments_get_the_errors_read_gives(feeds: Any) -> None:
    """Each bad receiver id, cursor, pull or types is refused by subscribe with read's own error, word for word."""
    forged = encode_state(CursorState(position=Position(WHEN, ObjectId()), pending=(("no_such_cluster", None),)))
    cases: list[dict[str, Any]] = [
        {"receiver_id": 1.5}, {"receiver_id": ""}, {"receiver_id": True},
        {"cursor": "not-a-cursor"}, {"cursor": forged}, {"cursor": 7},
        {"pull": [None]}, {"pull": "1000765"}, {"pull": list(range(1001))},
        {"types": []}, {"types": [1.5]},
    ]
    for case in cases:
        receiver = case.pop("receiver_id", R)
        with pytest.raises((InvalidItem, InvalidCursor)) as read_error:
            feeds.read(receiver, **case)
        with pytest.raises(type(read_error.value)) as live_error:
            feeds.subscribe(receiver, **case)
        assert str(live_error.value) == str(read_error.value), case


def test_without_push_subscribe_is_refused(open_router: Callable[..., Any], make_config: Callable[..., RouterConfig]) -> None:
    config = make_config()
    register(config)
    with pytest.raises(PushNotConfigured, match=r"^subscribe\(\): clusters.yaml has no push: section"):
        open_router(config, clock=lambda: NOW).subscribe(R)


# -- every writer pushes -----------------------------------------------------------------------


def test_a_fan_out_pushes_only_to_receivers_with_a_subscriber(feeds: Any, metrics: Recorded) -> None:
    """A fan-out to 1,000 receivers of whom 10 are connected sends 10 messages; each gets its copy as a page shows
    it. (Threads on the sync door, asyncio tasks on the async door.)"""
    watched = list(range(5000, 6000, 100))
    subs = [opened(feeds.subscribe(r)) for r in watched]
    before = metrics.total("pushed")
    post = Activity(sender_id=S, event_time=WHEN, type=1, data={"post": 1}, data_key=data_key("post", 1))
    result = feeds.fan_out(post, range(5000, 6000), batch_size=250)
    assert result.written == 1000
    for receiver, live in zip(watched, subs):
        (event,) = until(live, lambda e: isinstance(e, NewItem))
        assert isinstance(event, NewItem) and event.item == feeds.read(receiver).items[0]
        live.close()
    assert metrics.total("pushed") - before == 10
    assert metrics.outcomes("push")["ok"] >= 4  # one push per batch


def test_publish_of_a_pulled_author_reaches_subscribers_pulling_them(feeds: Any) -> None:
    """publish(pull=True) stores the post in its author's outbox only: a subscriber with pull=[author] gets it (as the
    pulled read shows it, under the id its copy would have); one without pull does not."""
    author = 77
    with opened(feeds.subscribe(R, pull=[author])) as pulling, opened(feeds.subscribe(R)) as plain:
        post = Activity(sender_id=author, event_time=WHEN, type=1, data={"p": 1}, data_key=data_key("pulled", 1))
        assert feeds.publish(post, [R], pull=True).path == "pull"
        (event,) = until(pulling, lambda e: isinstance(e, NewItem))
        assert isinstance(event, NewItem) and event.pulled
        assert event.item == feeds.read(R, pull=[author]).items[0]
        (sentinel,) = feeds.write_many([item(1)])
        assert new_ids(until(plain, is_item(sentinel))) == [sentinel]
        assert new_ids(until(pulling, is_item(sentinel))) == [sentinel]


def test_backfill_pushes_its_copies(feeds: Any) -> None:
    """Copies a backfill stores come as the page shows them."""
    author = 78
    posts = [Activity(sender_id=author, event_time=WHEN + timedelta(minutes=n), type=1, data={"b": n},
                      data_key=data_key("backfill", n)) for n in range(3)]
    for post in posts:
        feeds.publish(post, [], pull=True)
    with opened(feeds.subscribe(R)) as live:
        assert feeds.backfill(R, [author]).written == 3
        got = [live.get(timeout=60) for _ in range(3)]
    page = feeds.read(R)
    assert [e.item for e in sorted(got, key=lambda e: e.item.event_time, reverse=True)] == list(page.items)  # type: ignore[union-attr]


def test_update_and_delete_are_pushed(feeds: Any) -> None:
    """update and delete of a key reach every subscriber, after the item."""
    (oid,) = feeds.write_many([item(1)])
    key = data_key("live", 1)
    head = live_cursor(feeds.read(R))
    with opened(feeds.subscribe(R)) as live:
        feeds.update(key, {"n": 1, "edited": True})
        feeds.delete(key)
        got = until(live, lambda e: isinstance(e, DeletedItem))
        cursor = live.cursor
    assert got == [UpdatedItem(key, {"n": 1, "edited": True}, head), DeletedItem(key, head)] and cursor == head


def test_a_delete_during_a_fan_out_ends_with_the_item_deleted(feeds: Any) -> None:
    """A fan-out still running when its post is deleted: whatever copies a subscriber was pushed, the last word on the
    key is DeletedItem (the delete's, or a batch's clean-up after it met the tombstone)."""
    post = Activity(sender_id=S, event_time=WHEN, type=1, data={"x": 1}, data_key=data_key("raced", 1))
    watched = [0, 10_000, 19_999]
    subs = [opened(feeds.subscribe(r)) for r in watched]
    handle = feeds.fan_out(post, range(20_000), background=True, batch_size=500)
    while handle.progress.batches < 2 and not handle.done():
        handle.wait(0.05)
    feeds.delete(post.data_key)
    with pytest.raises(ItemDeleted):
        handle.result(120)
    for n, (receiver, live) in enumerate(zip(watched, subs)):
        (sentinel,) = feeds.write_many([item(n, receiver)])
        got = until(live, is_item(sentinel))
        about_post = [e for e in got if isinstance(e, (DeletedItem, Resync))
                      or (isinstance(e, NewItem) and e.item.data_key == post.data_key)]
        # the last word is the deletion, or a Resync (a break: the client reads again, and the read has no copy)
        assert about_post and isinstance(about_post[-1], (DeletedItem, Resync)), (receiver, got)
        assert [i.data_key for i in feeds.read(receiver).items] == [data_key("live", n)]
        live.close()


def test_an_erasure_pushes_the_deletion_of_the_users_posts(feeds: Any) -> None:
    """erase_user: a subscriber that was pushed a post of the user gets DeletedItem for it."""
    user = 4242
    post = Activity(sender_id=user, event_time=WHEN, type=1, data={"e": 1}, data_key=data_key("erased", 1))
    with opened(feeds.subscribe(R)) as live:
        feeds.fan_out(post, [R])
        until(live, lambda e: isinstance(e, NewItem))
        feeds.erase_user(user, requested_by="tests")
        got = until(live, lambda e: isinstance(e, DeletedItem))
    assert got == [DeletedItem(post.data_key, got[-1].cursor)]


# -- slow and broken consumers, Redis down -------------------------------------------------------


def test_a_full_backlog_is_dropped_and_the_stream_catches_up(open_router: Callable[..., Any], live_config: RouterConfig) -> None:
    """A subscriber that does not read while 30 items arrive, with a backlog of 5: Resync("overflow"), then every
    item exactly once from the catch-up, then what comes after."""
    config = attrs.evolve(live_config, push=attrs.evolve(live_config.push, queue=5))
    feeds = open_router(config, clock=lambda: NOW)
    with opened(feeds.subscribe(R)) as live:
        ids = [feeds.write_many([item(n)])[0] for n in range(30)]
        (sentinel,) = feeds.write_many([item(30)])
        got = until(live, is_item(sentinel))
    assert isinstance(got[0], Resync) and got[0].reason == "overflow"
    assert new_ids(got[1:]) == ids + [sentinel]


def test_redis_down_writes_go_on_subscribers_resync_and_catch_up(feeds: Any, redis_server: LocalRedis,
                                                                  metrics: Recorded) -> None:
    """Redis killed: writes succeed (the pushes fail, counted); the subscriber says Resync("disconnected"). Redis back
    on the same port: the subscriber reconnects by itself and hands out every item written meanwhile, once."""
    live = opened(feeds.subscribe(R))
    redis_server.kill()
    try:
        during = [feeds.write_many([item(n)])[0] for n in range(5)]
        assert until(live, lambda e: isinstance(e, Resync))[-1] == Resync("disconnected", live.cursor)
    finally:
        redis_server.restart()
    pushes = metrics.outcomes("push")
    assert pushes["unavailable"] >= 1 and pushes["unavailable"] + pushes["timeout"] + pushes["skipped"] == 5, pushes
    (sentinel,) = feeds.write_many([item(9)])
    got = until(live, is_item(sentinel))
    assert Counter(new_ids(got)) == Counter(during + [sentinel])
    live.close()


def test_a_writer_that_could_not_reach_redis_sends_the_gap(open_router: Callable[..., Any], live_config: RouterConfig,
                                                          metrics: Recorded) -> None:
    """A writer cut off from Redis while subscribers are not: its pushes fail; once it reaches Redis again it
    broadcasts the gap, and the subscriber says Resync("missed") and catches up the items it was not pushed."""
    assert live_config.push is not None
    port = int(live_config.push.redis.rsplit(":", 1)[1].split("/")[0])
    proxy = CutProxy(port)
    try:
        writer_config = attrs.evolve(live_config, push=attrs.evolve(live_config.push,
                                                                    redis=f"redis://127.0.0.1:{proxy.port}/0"))
        writer = open_router(writer_config, clock=lambda: NOW, metrics=metrics)
        reader = FeedRouter(live_config, clock=lambda: NOW)
        try:
            live = opened(reader.subscribe(R))
            writer.write_many([item(0)])  # connects through the proxy
            proxy.cut()
            (missed,) = writer.write_many([item(1)])
            assert metrics.outcomes("push")["ok"] == 1 and sum(metrics.outcomes("push").values()) == 2
            proxy.restore()  # no further write: the writer sends the gap by itself
            got = until(live, is_item(missed))
            assert [type(e) for e in got] == [NewItem, Resync, NewItem]
            assert isinstance(got[1], Resync) and got[1].reason == "missed"
            live.close()
        finally:
            reader.close()
    finally:
        proxy.close()


def test_a_paused_redis_costs_a_write_one_timeout(feeds: Any, redis_server: LocalRedis, metrics: Recorded) -> None:
    """Redis stopped (SIGSTOP): the write returns, its push is counted a timeout, the next ones within the pause are
    skipped; once Redis runs again the subscriber gets every item once."""
    live = opened(feeds.subscribe(R))
    redis_server.pause()
    try:
        during = [feeds.write_many([item(n)])[0] for n in range(3)]
    finally:
        redis_server.resume()
    pushes = metrics.outcomes("push")
    assert pushes["timeout"] >= 1 and pushes["timeout"] + pushes["skipped"] == 3, pushes
    (sentinel,) = feeds.write_many([item(9)])
    got = until(live, is_item(sentinel))
    assert Counter(new_ids(got)) == Counter(during + [sentinel])
    live.close()


def test_presence_ends_with_the_last_subscription(feeds: Any, live_config: RouterConfig, metrics: Recorded) -> None:
    """While subscribed, the receiver's member is in the presence set; once closed its channel is left and the
    member expires (push.presence_ttl): a write then sends no message."""
    assert live_config.push is not None
    client = redis.Redis.from_url(live_config.push.redis)
    key, member = f"{live_config.push.prefix}:here", f"r:i{R}"
    try:
        live = opened(feeds.subscribe(R))
        assert client.zscore(key, member) is not None
        live.close()
        channel = f"{live_config.push.prefix}:{member}"
        wait_for("the channel left", lambda: client.pubsub_numsub(channel) == [(channel.encode(), 0)])
        wait_for("the member expired", lambda: (client.zscore(key, member) or 0) < int(client.time()[0]))
        before = metrics.total("pushed")
        feeds.write_many([item(1)])
        assert metrics.total("pushed") == before and metrics.outcomes("push")["ok"] >= 1
    finally:
        client.close()


def test_closing_the_router_ends_the_iteration(open_router: Callable[..., Any], live_config: RouterConfig) -> None:
    feeds = open_router(live_config, clock=lambda: NOW)
    live = opened(feeds.subscribe(R))
    feeds.close()
    assert list(live) == []


def test_pushes_and_subscriptions_are_counted_and_traced(open_router: Callable[..., Any], live_config: RouterConfig) -> None:
    """Prometheus counts the pushes, the messages handed out, the subscriptions and their events; each push is a span
    inside its writer's call span, and a catch-up a subscribe call."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from prometheus_client import CollectorRegistry
    from router.observe.prometheus import PrometheusMetrics

    registry = CollectorRegistry()
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    feeds = open_router(live_config, clock=lambda: NOW, metrics=PrometheusMetrics(registry=registry),
                        tracer_provider=provider)
    live = opened(feeds.subscribe(R))
    assert registry.get_sample_value("feedrouter_live_subscribers") == 1
    (oid,) = feeds.write_many([item(1)])
    until(live, is_item(oid))
    feeds.delete(data_key("live", 1))
    until(live, lambda e: isinstance(e, DeletedItem))
    live.close()
    sample = registry.get_sample_value
    assert sample("feedrouter_pushes_total", {"op": "items", "outcome": "ok"}) == 1
    assert sample("feedrouter_pushes_total", {"op": "edit", "outcome": "ok"}) == 1
    assert sample("feedrouter_pushed_messages_total") == 2  # the item to its subscriber, the edit to its process
    assert sample("feedrouter_live_events_total", {"outcome": "item"}) == 1
    assert sample("feedrouter_live_events_total", {"outcome": "deleted"}) == 1
    assert sample("feedrouter_live_subscribers") == 0
    assert sample("feedrouter_calls_total", {"op": "subscribe", "outcome": "ok"}) == 1
    spans = {s.name: s for s in exporter.get_finished_spans()}
    push, write = spans["feedrouter.push.items"], spans["feedrouter.write_many"]
    assert push.parent is not None and push.parent.span_id == write.context.span_id
    assert spans["feedrouter.push.edit"].parent.span_id == spans["feedrouter.delete"].context.span_id  # type: ignore[union-attr]
    assert "feedrouter.subscribe" in spans and "feedrouter.find.feed" in {s.name for s in exporter.get_finished_spans()}
