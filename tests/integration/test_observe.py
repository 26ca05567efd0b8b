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
from prometheus_client import CollectorRegistry, generate_latest
from pymongo import MongoClient

from router import Activity, FeedItem, FeedRouter, RouterConfig, StaleMetadata, WriteFailed, data_key
from router.admin.scrape import parse
from router.config import RolloverConfig
from router.observe.prometheus import PrometheusMetrics
from harness.localservers import LocalServer
from harness.proxy import BlipProxy

from .conftest import NOW, P0, P1, P2, register

#: A storage contract file: every test here runs once per layout the servers hold (see conftest.py).
pytestmark = pytest.mark.contract

Clients = dict[str, MongoClient[dict[str, Any]]]
#: A killed cluster fails at once (no server to select within 800 ms); a live one may take its time (a fan-out batch of
#: 1,000 copies took over a second under the full suite's load: pymongo's retryable writes get the socket timeout less
#: half a second).
FAST = {"serverSelectionTimeoutMS": 800, "connectTimeoutMS": 800, "socketTimeoutMS": 10_000}


def item(receiver: int, t: Any, n: int) -> FeedItem:
    return FeedItem(receiver_id=receiver, sender_id=1, event_time=t, type=1, data={"n": n}, data_key=data_key("o", n))


def ten_in_each(offset: int = 0) -> list[FeedItem]:
    """Ten items for receiver 1 in each of the three periods."""
    return [item(1, start + timedelta(days=1 + d), offset + 10 * k + d)
            for k, start in enumerate((P0, P1, P2)) for d in range(10)]


@pytest.fixture
def observed(
    make_config: Callable[..., RouterConfig], raw_clients: Clients, open_router: Callable[..., Any], spare: LocalServer,
) -> Iterator[tuple[FeedRouter, CollectorRegistry, LocalServer]]:
    """A router with Prometheus metrics whose cluster_2 runs on the file's spare server."""
    uris = [f"mongodb://{h}:{p}" for h, p in (raw_clients["cluster_1"].address, raw_clients["cluster_3"].address)]
    config = make_config(uris=[uris[0], spare.uri, uris[1]], timeout=timedelta(seconds=30), **FAST)
    register(config)
    registry = CollectorRegistry()
    router = open_router(config, clock=lambda: NOW, refresh=False, metrics=PrometheusMetrics(registry=registry))
    yield router, registry, spare


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
    result = router.fan_out(activity, range(250), batch_size=100)
    assert result.written == 250
    assert value("feedrouter_fanout_copies_total", cluster="cluster_1", outcome="written") == 250
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
    inserts = children["feedrouter.write_many"]  # each cluster's copies and its posts' registration by sender
    assert sorted(s.attributes["feedrouter.cluster"] for s in inserts) == sorted(["cluster_1", "cluster_2", "cluster_3"] * 2)
    assert sorted(s.name for s in inserts) == ["feedrouter.insert.feed"] * 3 + ["feedrouter.insert.posts"] * 3
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
    with caplog.at_level(logging.WARNING, logger="router.core.reads.pages"):
        router.read(1, limit=100, on_unavailable="partial")
    (record,) = [r for r in caplog.records if r.name == "router.core.reads.pages"]
    assert getattr(record, "cluster") == "cluster_2" and "serving a partial page" in record.getMessage()


@pytest.fixture
def proxied(
    make_config: Callable[..., RouterConfig], raw_clients: Clients, open_router: Callable[..., Any]
) -> Iterator[tuple[FeedRouter, CollectorRegistry, BlipProxy]]:
    """A router with Prometheus metrics whose cluster_2 is reached through a BlipProxy (a real server behind it)."""
    proxy = BlipProxy(raw_clients["cluster_2"].address[1])
    try:
        uris = [f"mongodb://{h}:{p}" for h, p in (c.address for c in raw_clients.values())]
        config = make_config(uris=[uris[0], proxy.uri, uris[2]], serverSelectionTimeoutMS=2000)
        register(config)
        registry = CollectorRegistry()
        yield open_router(config, clock=lambda: NOW, refresh=False, metrics=PrometheusMetrics(registry=registry)), registry, proxy
    finally:
        proxy.close()


def test_a_dropped_connection_shows_the_cluster_down_until_it_answers(
    proxied: tuple[FeedRouter, CollectorRegistry, BlipProxy],
) -> None:
    """A read whose connection to cluster_2 is dropped (outcome transient) sets its cluster_up to 0, in the registry
    and in what `status --metrics` reads from it; the next answer sets it back to 1."""
    router, registry, proxy = proxied

    def up(cluster: str) -> float | None:
        return registry.get_sample_value("feedrouter_cluster_up", {"cluster": cluster})

    router.write_many(ten_in_each())
    assert router.read(1, limit=100).queried == ("cluster_3", "cluster_2", "cluster_1")
    assert (up("cluster_1"), up("cluster_2"), up("cluster_3")) == (1, 1, 1)

    proxy.cut_next(b"find", 1)
    page = router.read(1, limit=100, on_unavailable="partial")
    assert proxy.cuts == 1 and page.unavailable == ("cluster_2",)
    assert registry.get_sample_value(
        "feedrouter_requests_total", {"cluster": "cluster_2", "op": "find.feed", "outcome": "transient"}) == 1
    assert (up("cluster_1"), up("cluster_2"), up("cluster_3")) == (1, 0, 1)
    assert parse(generate_latest(registry).decode())["cluster_2"].up is False

    assert not router.read(1, limit=100).partial
    assert up("cluster_2") == 1
    assert parse(generate_latest(registry).decode())["cluster_2"].up is True


def test_an_idempotent_rerun_counts_no_failed_requests(observed: tuple[FeedRouter, CollectorRegistry, LocalServer]) -> None:
    """Publishing a post twice and fanning it out again under another job id meets duplicate keys only: those requests
    are ok, the copies count as already present, and `status --metrics` shows no errors."""
    router, registry, _server = observed

    def value(name: str, **labels: str) -> float:
        return registry.get_sample_value(name, labels) or 0.0

    post = Activity(sender_id=9, event_time=P0 + timedelta(days=40), type=1, data={}, data_key=data_key("rerun", 1))
    first = router.publish(post, range(25), pull=False, batch_size=10)
    again = router.publish(post, range(25), pull=False, batch_size=10)
    other = router.fan_out(post, range(25), batch_size=10, job_id="rerun-under-another-id")
    assert first.outbox_new and not again.outbox_new
    assert first.fan_out is not None and first.fan_out.written == 25
    assert again.fan_out is not None and again.fan_out.resumed == 25
    assert (other.written, other.already_present) == (0, 25)

    assert value("feedrouter_requests_total", cluster="cluster_1", op="insert.outbox", outcome="ok") == 2
    assert value("feedrouter_requests_total", cluster="cluster_1", op="insert.feed", outcome="ok") == 6  # 3 batches, twice
    assert value("feedrouter_fanout_copies_total", cluster="cluster_1", outcome="written") == 25
    assert value("feedrouter_fanout_copies_total", cluster="cluster_1", outcome="already_present") == 25
    failed = {(s.labels["op"], s.labels["outcome"]): s.value for family in registry.collect() for s in family.samples
              if s.name == "feedrouter_requests_total" and s.labels["outcome"] != "ok"}
    assert failed == {}
    assert parse(generate_latest(registry).decode())["cluster_1"].errors == 0


def test_a_background_fan_out_is_traced_under_its_call(traced: tuple[FeedRouter, InMemorySpanExporter]) -> None:
    """The requests of a background fan-out are spans in the trace of the feedrouter.fan_out call that started it."""
    router, exporter = traced
    post = Activity(sender_id=7, event_time=P1 + timedelta(days=3), type=1, data={}, data_key=data_key("bg", 1))
    exporter.clear()
    handle = router.fan_out(post, range(25), batch_size=10, background=True)
    assert handle.result().written == 25
    spans = exporter.get_finished_spans()
    roots = [s for s in spans if s.parent is None]
    assert [s.name for s in roots] == ["feedrouter.fan_out"]
    inserts = [s for s in spans if s.name == "feedrouter.insert.feed"]
    assert len(inserts) == 3
    assert {s.context.trace_id for s in spans} == {roots[0].context.trace_id}


def test_fan_out_and_write_many_records_carry_job_and_cluster(
    observed: tuple[FeedRouter, CollectorRegistry, LocalServer], caplog: pytest.LogCaptureFixture,
) -> None:
    """A fan-out's start and done records carry job_id and cluster; write_many's error record carries the cluster."""
    router, _registry, server = observed
    post = Activity(sender_id=7, event_time=P1 + timedelta(days=3), type=1, data={}, data_key=data_key("logs", 1))
    with caplog.at_level(logging.INFO, logger="router"):
        result = router.fan_out(post, range(5), job_id="logged-job")
    fan_out = [r for r in caplog.records if r.getMessage().startswith("fan-out 'logged-job'")]
    assert len(fan_out) == 2, [r.getMessage() for r in fan_out]  # started, done
    assert all((getattr(r, "job_id", None), getattr(r, "cluster", None)) == ("logged-job", "cluster_2") for r in fan_out)
    assert result.cluster == "cluster_2"

    caplog.clear()
    server.kill()
    with caplog.at_level(logging.ERROR, logger="router"), pytest.raises(WriteFailed):
        router.write_many([item(1, P0 + timedelta(days=30), 100), item(1, P1 + timedelta(days=30), 101)])
    errors = [r for r in caplog.records if r.levelno == logging.ERROR and r.name.startswith("router")]
    assert [getattr(r, "cluster", None) for r in errors] == ["cluster_2"], [r.getMessage() for r in errors]
