"""Reading a router's figures back from a Prometheus exposition (what `feedrouter status --metrics` shows)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from router.admin.scrape import parse
from router.observe import Event
from router.observe.prometheus import PrometheusMetrics


def test_per_cluster_requests_errors_latency_and_up() -> None:
    """Counts and failures add up over ops and outcomes; latency is the mean; up is the last answer."""
    registry = CollectorRegistry()
    metrics = PrometheusMetrics(registry=registry)
    for seconds, outcome in ((0.010, "ok"), (0.030, "ok"), (2.0, "timeout")):
        metrics.record(Event("request", seconds, cluster="c1", op="find.feed", outcome=outcome))
    metrics.record(Event("request", 0.004, cluster="c2", op="insert.feed", outcome="ok"))
    metrics.record(Event("cluster_up", 0.0, cluster="c1"))
    metrics.record(Event("cluster_up", 1.0, cluster="c2"))
    stats = parse(generate_latest(registry).decode())
    assert (stats["c1"].requests, stats["c1"].errors, stats["c1"].up) == (3, 1, False)
    assert round(stats["c1"].mean_ms or 0, 1) == 680.0
    assert (stats["c2"].requests, stats["c2"].errors, stats["c2"].up) == (1, 0, True)
    assert stats["c2"].to_json() == {"requests": 1, "errors": 0, "mean_ms": 4.0, "up": True}
