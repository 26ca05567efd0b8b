"""Metrics and traces against real servers, on both doors: exact Prometheus counts after a known sequence, one span
per call with a child per request, the cluster on log records."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry
from pymongo import MongoClient

from router import Activity, FeedItem, FeedRouter, RouterConfig, StaleMetadata, WriteFailed, data_key
from router.config import RolloverConfig
from router.observe.prometheus import PrometheusMetrics
from router.testing.localservers import LocalClusters, LocalServer

from .conftest import NOW, P0, P1, P2, register

Clients = dict[str, MongoClient[dict[str, Any]]]
FAST = {"serverSelectionTimeoutMS": 800, "connectTimeoutMS": 800, "socketTimeoutMS": 1500}


def item(receiver: int, t: Any, n: int) -> FeedItem:
    return FeedItem(receiver_id=receiver, sender_id=1, event_time=t, type=1, data={"n": n}, data_key=data_key("o", n))


def ten_in_each(offset: int = 0) -> list[FeedItem]:
    """Ten items for receiver 1 in each of the three periods."""
    return [item(1, start + timedelta(days=1 + d), offset + 10 * k + d)
            for k, start in enumerate((P0, P1, P2)) for d in range(10)]


@pytest.fixture
def observed(
    make_config: Callable[..., RouterConfig], raw_clients: Clients, open_router: Callable[..., Any]
) -> Iterator[tuple[FeedRouter, CollectorRegistry, LocalServer]]:
    """A router with Prometheus metrics whose cluster_2 runs on a server of the test's own."""
    with LocalClusters(1, names=["spare"]) as spare:
        uris = [f"mongodb://{h}:{p}" for h, p in (raw_clients["cluster_1"].address, raw_clients["cluster_3"].address)]
        config = make_config(uris=[uris[0], spare.uris[0], uris[1]], timeout=timedelta(seconds=2), **FAST)
        register(config)
        registry = CollectorRegistry()
        router = open_router(config, clock=lambda: NOW, refresh=False, metrics=PrometheusMetrics(registry=registry))
        yield router, registry, spare.servers[0]


def test_metrics_count_exactly_what_happened(observed: tuple[FeedRouter, CollectorRegistry, LocalServer]) -> None:
    """Writes, reads, a killed cluster, a fan-out: every counter holds exactly what the sequence did."""
    router, registry, server = observed

    def value(name: str, **labels: str) -> float:
        return registry.get_sample_value(name, labels) or 0.0

    assert value("feedrouter_timemap_loaded_timestamp_seconds") == NOW.timestamp()
    assert all(value("feedrouter_requests_total", cluster=c, op="find.metadata", outcome="ok") == 1
               for c in ("cluster_1", "cluster_2", "cluster_3"))

    router.write_many(ten_in_each())
    for cluster in ("cluster_1", "cluster_2", "cluster_3"):
        assert value("feedrouter_items_total", cluster=cluster, outcome="written") == 10
        assert value("feedrouter_requests_total", cluster=cluster, op="insert.feed", outcome="ok") == 1
        assert value("feedrouter_cluster_up", cluster=cluster) == 1
    assert value("feedrouter_calls_total", op="write_many", outcome="ok") == 1
    assert value("feedrouter_call_seconds_count", op="write_many") == 1

    page = router.read(1, limit=100)
    assert len(page.items) == 30 and page.queried == ("cluster_3", "cluster_2", "cluster_1")
    assert value("feedrouter_read_clusters_count") == 1 and value("feedrouter_read_clusters_sum") == 3
    assert value("feedrouter_calls_total", op="read", outcome="ok") == 1

    server.kill()
    with pytest.raises(WriteFailed):
        router.write_many([item(1, P0 + timedelta(days=30), 100), item(1, P1 + timedelta(days=30), 101),
                           item(1, P2 + timedelta(days=30), 102)])
    assert value("feedrouter_items_total", cluster="cluster_1", outcome="written") == 11
    assert value("feedrouter_items_total", cluster="cluster_3", outcome="written") == 11
    assert value("feedrouter_items_total", cluster="cluster_2", outcome="failed") == 1
    assert value("feedrouter_requests_total", cluster="cluster_2", op="insert.feed", outcome="unavailable") == 1
    assert value("feedrouter_cluster_up", cluster="cluster_2") == 0
    assert value("feedrouter_calls_total", op="write_many", outcome="WriteFailed") == 1

    partial = router.read(1, limit=100, on_unavailable="partial")
    assert partial.partial and partial.unavailable == ("cluster_2",)
    assert value("feedrouter_partial_reads_total", cluster="cluster_2") == 1
    assert value("feedrouter_read_clusters_count") == 2 and value("feedrouter_read_clusters_sum") == 5  # 3, then 2

    activity = Activity(sender_id=9, event_time=P0 + timedelta(days=40), type=1, data={}, data_key=data_key("fo", 1))
    result = router.fan_out(activity, range(2500), batch_size=1000)
    assert result.written == 2500
    assert value("feedrouter_fanout_copies_total", cluster="cluster_1", outcome="written") == 2500
    assert value("feedrouter_requests_total", cluster="cluster_1", op="insert.fanout_batches", outcome="ok") == 3
    assert value("feedrouter_fanout_jobs_in_progress") == 0
    assert value("feedrouter_calls_total", op="fan_out", outcome="ok") == 1
    assert value("feedrouter_retries_total", cluster="cluster_1", op="insert.feed") == 0
    assert value("feedrouter_stale_refusals_total") == 0
    assert value("feedrouter_timemap_age_seconds") > 0


def test_stale_refusals_are_counted(make_config: Callable[..., RouterConfig], open_router: Callable[..., Any]) -> None:
    """A write past the map's horizon that a refresh cannot vouch for either is refused and counted once."""
    config = make_config(rollover=RolloverConfig(lead_time=timedelta(days=7)))
    register(config)
    registry = CollectorRegistry()
    router = open_router(config, clock=lambda: NOW, refresh=False, metrics=PrometheusMetrics(registry=registry))
    with pytest.raises(StaleMetadata):
        router.write(item(1, NOW + timedelta(days=30), 1))  # the map was loaded "now": 30 days is past its horizon
    assert registry.get_sample_value("feedrouter_stale_refusals_total") == 1
    assert registry.get_sample_value("feedrouter_calls_total", {"op": "refresh", "outcome": "ok"}) is None  # in-call refresh


@pytest.fixture
def traced(make_config: Callable[..., RouterConfig], open_router: Callable[..., Any]) -> tuple[FeedRouter, InMemorySpanExporter]:
    """A router (through the test's door) whose spans go to an in-memory exporter."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    config = make_config()
    register(config)
    return open_router(config, clock=lambda: NOW, refresh=False, tracer_provider=provider), exporter


def test_a_span_per_call_and_per_request(traced: tuple[FeedRouter, InMemorySpanExporter]) -> None:
    """Each public call is a span; each request it sends is a child span carrying its cluster."""
    router, exporter = traced
    exporter.clear()
    router.write_many(ten_in_each())
    router.read(1, limit=5)
    router.delete(data_key("o", 3))
    spans = exporter.get_finished_spans()
    calls = {s.name: s for s in spans if s.parent is None}
    assert set(calls) == {"feedrouter.write_many", "feedrouter.read", "feedrouter.delete"}
    children = {name: [s for s in spans if s.parent is not None and s.parent.span_id == call.context.span_id]
                for name, call in calls.items()}
    inserts = children["feedrouter.write_many"]
    assert sorted(s.attributes["feedrouter.cluster"] for s in inserts) == ["cluster_1", "cluster_2", "cluster_3"]
    assert {s.name for s in inserts} == {"feedrouter.insert.feed"}
    assert [s.attributes["feedrouter.cluster"] for s in children["feedrouter.read"]] == ["cluster_3"]
    assert {s.attributes["feedrouter.cluster"] for s in children["feedrouter.delete"]} == {"cluster_1", "cluster_2", "cluster_3"}
    assert all(s.attributes["feedrouter.op"] == s.name.removeprefix("feedrouter.") for s in spans if s.parent is not None)


def test_every_public_call_is_a_span_over_its_requests(traced: tuple[FeedRouter, InMemorySpanExporter]) -> None:
    """Every public operation is one root span, and the requests it sends are spans under it naming their cluster."""
    router, exporter = traced
    post = Activity(sender_id=7, event_time=P1 + timedelta(days=3), type=1, data={"n": 1}, data_key=data_key("s", 1))
    exporter.clear()
    router.write(item(1, P2 + timedelta(days=1), 500))
    router.publish(post, [1, 2], pull=False)
    fanned = router.fan_out(post, [3, 4])
    router.fan_out_status(fanned.job_id)
    router.backfill(5, [7])
    router.follow(6, 7)
    router.unfollow(1, 7)
    router.update(post.data_key, {"n": 2})
    router.read(2, limit=5, pull=[7])
    router.delete(post.data_key)
    router.refresh()
    spans = exporter.get_finished_spans()
    roots = [s for s in spans if s.parent is None]
    assert [s.name.removeprefix("feedrouter.") for s in roots] == [
        "write", "publish", "fan_out", "fan_out_status", "backfill", "backfill", "unfollow", "update", "read", "delete",
        "refresh"]
    parent = {s.context.span_id: s.parent.span_id for s in spans if s.parent is not None}

    def root_of(span_id: int) -> int:
        while span_id in parent:
            span_id = parent[span_id]
        return span_id

    for root in roots:
        requests = [s for s in spans if s.parent is not None and root_of(s.context.span_id) == root.context.span_id
                    and "feedrouter.cluster" in (s.attributes or {})]
        assert requests, f"{root.name}: no request span under it"
        assert {s.attributes["feedrouter.cluster"] for s in requests} <= {"cluster_1", "cluster_2", "cluster_3"}


def test_log_records_carry_the_cluster(observed: tuple[FeedRouter, CollectorRegistry, LocalServer],
                                       caplog: pytest.LogCaptureFixture) -> None:
    """A partial page's warning names its cluster on the record (extra)."""
    router, _registry, server = observed
    router.write_many(ten_in_each())
    server.kill()
    with caplog.at_level(logging.WARNING, logger="router.core.reads"):
        router.read(1, limit=100, on_unavailable="partial")
    (record,) = [r for r in caplog.records if r.name == "router.core.reads"]
    assert getattr(record, "cluster") == "cluster_2" and "serving a partial page" in record.getMessage()
