"""What the router tells an operator: events for metrics, spans for traces. Optional, no-op by default.

The core reports what it decides (items written by outcome, retries, clusters a page
asked, stale refusals, fan-out copies) as :class:`Event` values; the drivers add each
request's latency and outcome, the doors each call's. A :class:`Metrics` object receives
them all through one method. The default does nothing and needs no dependency;
:class:`router.observe.prometheus.PrometheusMetrics` (``feed-router[prometheus]``) turns
them into Prometheus instruments; :mod:`router.observe.tracing` makes OpenTelemetry spans.

Labels are limited to ``cluster``, ``op`` and ``outcome``: never a receiver, a sender or a
data key, so the number of series stays bounded.

Example::

    from prometheus_client import CollectorRegistry
    from router.observe.prometheus import PrometheusMetrics

    registry = CollectorRegistry()
    feeds = FeedRouter.from_yaml("clusters.yaml", metrics=PrometheusMetrics(registry=registry))
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Literal, TypeAlias

import attrs

__all__ = ["EVENTS", "Event", "EventName", "Metrics", "NO_METRICS"]

#: Every event the router emits, and what its value is.
EventName: TypeAlias = Literal[
    "request",         # one request to a cluster: op, cluster, outcome; value = seconds
    "call",            # one public call: op, outcome; value = seconds
    "items",           # items or copies written by a write: cluster, outcome; value = count
    "retry",           # a retry about to happen: cluster, op
    "read_clusters",   # the clusters one page asked; value = count
    "partial_read",    # a page served without a cluster: cluster
    "cluster_up",      # a cluster answered (1) or not (0); value = 1.0 or 0.0
    "timemap_loaded",  # a time map was loaded; value = when its load began (epoch seconds)
    "stale_refusal",   # a write refused because the map could not vouch for its time
    "fanout_jobs",     # a fan-out run started (+1) or ended (-1)
    "fanout_copies",   # copies a fan-out batch accounted for: cluster, outcome; value = count
    "standby_ready",   # the scheduler found a standby ready (1) or not (0)
    "next_boundary",   # the scheduler's next period boundary; value = epoch seconds
    "push",            # one live push to Redis: op, outcome (ok, timeout, unavailable, failed, skipped); value = seconds
    "pushed",          # messages Redis handed to subscriber processes for pushes; value = count
    "live_subscribers",  # a subscription opened (+1) or closed (-1)
    "live_events",     # events handed to subscribers: outcome (item, updated, deleted, resync); value = count
]
EVENTS: tuple[str, ...] = EventName.__args__  # type: ignore[attr-defined]


@attrs.frozen(slots=True)
class Event:
    """One thing that happened, with its labels (any of ``cluster``, ``op``, ``outcome``) and a value."""

    name: EventName
    value: float = 1.0
    cluster: str | None = None
    op: str | None = None
    outcome: str | None = None


class Metrics:
    """Receives every :class:`Event`. This base class does nothing: subclass it, or use an adapter.

    ``record`` is called on the caller's thread or event loop, possibly from several
    threads at once, and must not block.
    """

    def record(self, event: Event) -> None:
        """Take one event."""


#: The default: every event is dropped.
NO_METRICS = Metrics()


class Observer:
    """A door's metrics and tracing together: one span and one ``call`` event per public call."""

    def __init__(self, metrics: Metrics | None = None, tracer_provider: object = None) -> None:
        from .tracing import Tracing

        self.metrics = metrics if metrics is not None else NO_METRICS
        self.tracing = Tracing(tracer_provider)

    @contextmanager
    def call(self, name: str) -> Iterator[None]:
        """Time the call *name* (and trace it): its latency and outcome, ``ok`` or the exception's class."""
        with self.tracing.span(f"feedrouter.{name}", op=name):
            began = time.perf_counter()
            outcome = "ok"
            try:
                yield
            except BaseException as exc:
                outcome = type(exc).__name__
                raise
            finally:
                self.metrics.record(Event("call", time.perf_counter() - began, op=name, outcome=outcome))


__all__ += ["Observer"]
