"""Transient network errors on insert are retried, boundedly, and never double a document."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from pymongo import MongoClient

from router import ClusterUnavailable, FeedItem, FeedRouter, RouterConfig, WriteFailed, data_key
from router.observe.prometheus import PrometheusMetrics
from harness.proxy import BlipProxy

from .conftest import NOW, P1, register

Clients = dict[str, MongoClient[dict[str, Any]]]

#: The bytes of an insert into the feed (the ``insert: "feed"`` field of its command), so a cut misses the insert that
#: registers a write's posts by sender (``posts``), which comes first.
FEED_INSERT = b"\x02insert\x00\x05\x00\x00\x00feed\x00"


@pytest.fixture
def proxied(
    make_config: Callable[..., RouterConfig], raw_clients: Clients, open_router: Callable[..., Any]
) -> Iterator[Callable[..., tuple[FeedRouter, BlipProxy]]]:
    """A router (through the test's door) whose cluster_2 is reached through a BlipProxy."""
    made: list[tuple[FeedRouter, BlipProxy]] = []

    def make(*, metrics: Any = None, **kwargs: Any) -> tuple[FeedRouter, BlipProxy]:
        host, port = raw_clients["cluster_2"].address
        proxy = BlipProxy(port)
        uris = [f"mongodb://{h}:{p}" for h, p in (c.address for c in raw_clients.values())]
        config = make_config(uris=[uris[0], proxy.uri, uris[2]], serverSelectionTimeoutMS=2000)
        from attrs import evolve

        config = evolve(config, **kwargs)
        register(config)
        router = open_router(config, clock=lambda: NOW, refresh=False, metrics=metrics)
        made.append((router, proxy))
        return router, proxy

    yield make
    for _router, proxy in made:
        proxy.close()


def batch(n: int, offset: int = 0) -> list[FeedItem]:
    return [FeedItem(receiver_id=i % 3, sender_id=1, event_time=P1 + timedelta(hours=i), type=1, data={"n": offset + i},
                     data_key=data_key("f", offset + i)) for i in range(n)]


def test_blip_is_retried_and_logged(proxied: Callable[..., tuple[FeedRouter, BlipProxy]], raw_clients: Clients,
                                    db_name: str, caplog: pytest.LogCaptureFixture) -> None:
    """The connection carrying the insert is cut once: the write still succeeds, once, and debug logs the retry."""
    router, proxy = proxied()
    router.write_many(batch(5))
    proxy.cut_next(FEED_INSERT, 1)
    with caplog.at_level(logging.DEBUG, logger="router.core.writes.insert"):
        router.write_many(batch(20, offset=100))
    assert proxy.cuts == 1
    assert "cluster cluster_2: 20 documents hit a transient error; retry 1 of 2" in caplog.text
    feed = raw_clients["cluster_2"][db_name].feed
    assert feed.count_documents({}) == 25
    assert len(feed.distinct("data.n")) == 25


def test_a_retry_is_counted(proxied: Callable[..., tuple[FeedRouter, BlipProxy]]) -> None:
    """One cut insert: one retry and one transient request in the metrics, every item counted written once."""
    registry = CollectorRegistry()
    router, proxy = proxied(metrics=PrometheusMetrics(registry=registry))
    router.write_many(batch(5))
    proxy.cut_next(FEED_INSERT, 1)
    router.write_many(batch(20, offset=100))
    assert proxy.cuts == 1

    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, labels)

    assert value("feedrouter_retries_total", cluster="cluster_2", op="insert.feed") == 1
    assert value("feedrouter_requests_total", cluster="cluster_2", op="insert.feed", outcome="transient") == 1
    assert value("feedrouter_items_total", cluster="cluster_2", outcome="written") == 25
    assert value("feedrouter_calls_total", op="write_many", outcome="ok") == 2


def test_retries_are_bounded(proxied: Callable[..., tuple[FeedRouter, BlipProxy]], raw_clients: Clients, db_name: str) -> None:
    """More blips than retries: every item of that cluster is reported not written, by index."""
    router, proxy = proxied(write_retries=1, retry_backoff=timedelta(milliseconds=10))
    proxy.cut_next(FEED_INSERT, 5)
    with pytest.raises(WriteFailed) as info:
        router.write_many(batch(10))
    assert proxy.cuts == 2  # the first attempt and one retry
    assert sorted(info.value.failed) == list(range(10))
    assert all(isinstance(e, ClusterUnavailable) and e.cluster == "cluster_2" for e in info.value.failed.values())
    assert raw_clients["cluster_2"][db_name].feed.count_documents({}) == 0
    proxy.cut_next(FEED_INSERT, 0)
    router.write_many(batch(10))  # and after the blips, the same items go in once
    assert raw_clients["cluster_2"][db_name].feed.count_documents({}) == 10


def test_lost_reply_retry_counts_stored_copies_once(proxied: Callable[..., tuple[FeedRouter, BlipProxy]], raw_clients: Clients,
                                                   db_name: str, caplog: pytest.LogCaptureFixture) -> None:
    """The insert reaches the server but its reply is cut: the retry's duplicates are read back, nothing doubles or goes missing."""
    router, proxy = proxied()
    proxy.cut_reply_next(FEED_INSERT, 1)
    with caplog.at_level(logging.DEBUG, logger="router.core.writes.insert"):
        ids = router.write_many(batch(15))
    assert proxy.cuts == 1 and "retry 1 of 2" in caplog.text
    feed = raw_clients["cluster_2"][db_name].feed
    assert feed.count_documents({}) == 15
    assert sorted(d["_id"] for d in feed.find({}, {"_id": 1})) == sorted(ids)  # the ids returned are the stored ones


def test_lost_reply_and_lost_read_back_give_every_id_and_outcome(
    proxied: Callable[..., tuple[FeedRouter, BlipProxy]], raw_clients: Clients, db_name: str
) -> None:
    """The insert's reply is cut and the read-back of its duplicates is cut too: WriteFailed with every id and a
    per-index outcome (this used to raise a bare ClusterUnavailable); writing the unwritten items again, with those
    ids, leaves one copy each."""
    router, proxy = proxied(retry_backoff=timedelta(milliseconds=10), timeout=timedelta(seconds=2))
    items = batch(12)  # all in cluster_2's period
    proxy.cut_reply_next(FEED_INSERT, 1)
    proxy.cut_next(b"find", 10_000)  # every read-back attempt (pymongo's own read retry is off: there is one)
    with pytest.raises(WriteFailed) as info:
        router.write_many(items)
    proxy.cut_next(b"find", 0)
    failed = info.value
    assert proxy.cuts == 2 and len(failed.ids) == 12 and len(set(failed.ids)) == 12
    assert sorted(failed.failed) == list(range(12))  # stored or not, unconfirmed: none is reported written
    assert all(isinstance(e, ClusterUnavailable) and e.cluster == "cluster_2" for e in failed.failed.values())
    again = failed.unwritten(items)
    assert [it.id for it in again] == failed.ids
    assert router.write_many(again) == failed.ids
    feed = raw_clients["cluster_2"][db_name].feed
    assert sorted(d["_id"] for d in feed.find({}, {"_id": 1})) == sorted(failed.ids)
