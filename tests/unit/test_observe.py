"""Metrics and tracing without a server: the no-op default, the Prometheus adapter, the call observer."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from router.observe import EVENTS, NO_METRICS, Event, Metrics, Observer
from router.observe.prometheus import PrometheusMetrics


def test_the_default_takes_every_event_and_does_nothing() -> None:
    """NO_METRICS accepts all event names; a subclass sees them through one method."""
    seen: list[Event] = []

    class Keep(Metrics):
        def record(self, event: Event) -> None:
            seen.append(event)

    for name in EVENTS:
        NO_METRICS.record(Event(name))  # type: ignore[arg-type]
        Keep().record(Event(name))  # type: ignore[arg-type]
    assert [e.name for e in seen] == list(EVENTS)


def test_prometheus_instruments_hold_exact_values() -> None:
    """Each event lands in its instrument with only cluster/op/outcome labels; nothing is exposed by itself."""
    registry = CollectorRegistry()
    metrics = PrometheusMetrics(registry=registry)
    metrics.record(Event("request", 0.02, cluster="c1", op="find.feed", outcome="ok"))
    metrics.record(Event("request", 0.5, cluster="c1", op="find.feed", outcome="timeout"))
    metrics.record(Event("items", 7, cluster="c1", outcome="written"))
    metrics.record(Event("fanout_jobs", 1))
    metrics.record(Event("fanout_jobs", -1))
    metrics.record(Event("timemap_loaded", 1_700_000_000.0))
    value = registry.get_sample_value
    assert value("feedrouter_requests_total", {"cluster": "c1", "op": "find.feed", "outcome": "ok"}) == 1
    assert value("feedrouter_requests_total", {"cluster": "c1", "op": "find.feed", "outcome": "timeout"}) == 1
    assert value("feedrouter_request_seconds_count", {"cluster": "c1", "op": "find.feed"}) == 2
    assert value("feedrouter_request_seconds_sum", {"cluster": "c1", "op": "find.feed"}) == pytest.approx(0.52)
    assert value("feedrouter_items_total", {"cluster": "c1", "outcome": "written"}) == 7
    assert value("feedrouter_fanout_jobs_in_progress") == 0
    assert value("feedrouter_timemap_age_seconds") > 0
    exposition = generate_latest(registry).decode()
    labels = {part.split("=")[0] for line in exposition.splitlines() if "{" in line and not line.startswith("#")
              for part in line.split("{", 1)[1].split("}", 1)[0].split(",")}
    assert labels <= {"cluster", "op", "outcome", "le"}


def test_the_observer_times_calls_and_names_their_outcome() -> None:
    """A call event per call: ok, or the class of the exception that left it."""
    seen: list[Event] = []

    class Keep(Metrics):
        def record(self, event: Event) -> None:
            seen.append(event)

    observer = Observer(Keep())
    with observer.call("read"):
        pass
    with pytest.raises(KeyError), observer.call("write"):
        raise KeyError("x")
    assert [(e.name, e.op, e.outcome) for e in seen] == [("call", "read", "ok"), ("call", "write", "KeyError")]
    assert all(e.value >= 0 for e in seen) and not observer.tracing.enabled
