"""The router's events as Prometheus instruments (``pip install 'feed-router[prometheus]'``).

It registers its instruments in the ``registry`` given (the default registry otherwise)
and never starts an HTTP server: expose the registry the way the service already does
(``prometheus_client.start_http_server``, an ASGI app, a multiprocess collector).

======================================================  ==============================  ========================
metric                                                  labels                          from
======================================================  ==============================  ========================
``feedrouter_requests_total``                           cluster, op, outcome            every request
``feedrouter_request_seconds`` (histogram)              cluster, op                     every request
``feedrouter_calls_total``                              op, outcome                     every public call
``feedrouter_call_seconds`` (histogram)                 op                              every public call
``feedrouter_items_total``                              cluster, outcome                write, write_many
``feedrouter_retries_total``                            cluster, op                     retried requests
``feedrouter_read_clusters`` (histogram)                                                clusters asked per page
``feedrouter_partial_reads_total``                      cluster                         pages served without it
``feedrouter_cluster_up`` (gauge)                       cluster                         the last request
``feedrouter_timemap_loaded_timestamp_seconds`` (gauge)                                 start-up and refresh
``feedrouter_timemap_age_seconds`` (gauge)                                              now minus the above
``feedrouter_stale_refusals_total``                                                     StaleMetadata raised
``feedrouter_fanout_jobs_in_progress`` (gauge)                                          fan-out runs
``feedrouter_fanout_copies_total``                      cluster, outcome                fan-out batches
``feedrouter_standby_ready`` (gauge)                                                    the rollover scheduler
``feedrouter_next_boundary_timestamp_seconds`` (gauge)                                  the rollover scheduler
======================================================  ==============================  ========================

A request's ``outcome`` is ``ok``, ``write_errors`` or the kind of its
:class:`~router.core.steps.Failure`; an insert whose only write errors are duplicate keys
(an idempotent rerun) is ``ok``. ``feedrouter_cluster_up`` is 0 after a request the cluster
gave no answer to (``transient``, ``timeout``, ``unavailable``) and 1 after any answer.

Example::

    registry = CollectorRegistry()
    feeds = FeedRouter.from_yaml("clusters.yaml", metrics=PrometheusMetrics(registry=registry))
    start_http_server(9108, registry=registry)          # the service's choice, not the router's
"""

from __future__ import annotations

import time
from typing import Any

from . import Event, Metrics

__all__ = ["PrometheusMetrics"]

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class PrometheusMetrics(Metrics):
    """Counts, latencies and gauges of the router in a Prometheus registry."""

    def __init__(self, *, registry: Any = None) -> None:
        from prometheus_client import REGISTRY, Counter, Gauge, Histogram

        reg = REGISTRY if registry is None else registry
        self.registry = reg
        self.requests = Counter("feedrouter_requests", "Requests to clusters, by outcome",
                                ["cluster", "op", "outcome"], registry=reg)
        self.request_seconds = Histogram("feedrouter_request_seconds", "Latency of one request to a cluster",
                                         ["cluster", "op"], buckets=_LATENCY_BUCKETS, registry=reg)
        self.calls = Counter("feedrouter_calls", "Public calls of the router, by outcome", ["op", "outcome"], registry=reg)
        self.call_seconds = Histogram("feedrouter_call_seconds", "Latency of one public call", ["op"],
                                      buckets=_LATENCY_BUCKETS, registry=reg)
        self.items = Counter("feedrouter_items", "Items written by write/write_many, by cluster and outcome",
                             ["cluster", "outcome"], registry=reg)
        self.retries = Counter("feedrouter_retries", "Requests retried after a transient error", ["cluster", "op"],
                               registry=reg)
        self.read_clusters = Histogram("feedrouter_read_clusters", "Clusters one page asked",
                                       buckets=(0, 1, 2, 3, 4, 6, 8, 12), registry=reg)
        self.partial_reads = Counter("feedrouter_partial_reads", "Pages served without a cluster that failed",
                                     ["cluster"], registry=reg)
        self.cluster_up = Gauge("feedrouter_cluster_up", "1 if the cluster's last answer came, 0 if not", ["cluster"],
                                registry=reg)
        self.timemap_loaded = Gauge("feedrouter_timemap_loaded_timestamp_seconds",
                                    "When the load of the time map in use began", registry=reg)
        self.timemap_age = Gauge("feedrouter_timemap_age_seconds", "Seconds since the time map in use was loaded",
                                 registry=reg)
        self._loaded_at = 0.0
        self.timemap_age.set_function(lambda: time.time() - self._loaded_at if self._loaded_at else 0.0)
        self.stale_refusals = Counter("feedrouter_stale_refusals", "Writes refused as past the time map's horizon",
                                      registry=reg)
        self.fanout_jobs = Gauge("feedrouter_fanout_jobs_in_progress", "Fan-out runs going on", registry=reg)
        self.fanout_copies = Counter("feedrouter_fanout_copies", "Fan-out receivers accounted for, by outcome",
                                     ["cluster", "outcome"], registry=reg)
        self.standby_ready = Gauge("feedrouter_standby_ready", "1 if a standby cluster is ready for the next boundary",
                                   registry=reg)
        self.next_boundary = Gauge("feedrouter_next_boundary_timestamp_seconds", "The next period boundary",
                                   registry=reg)
        self.pushes = Counter("feedrouter_pushes", "Live pushes to Redis, by outcome", ["op", "outcome"], registry=reg)
        self.push_seconds = Histogram("feedrouter_push_seconds", "Latency of one live push", ["op"],
                                      buckets=_LATENCY_BUCKETS, registry=reg)
        self.pushed = Counter("feedrouter_pushed_messages", "Messages Redis handed to subscriber processes",
                              registry=reg)
        self.live_subscribers = Gauge("feedrouter_live_subscribers", "Live subscriptions open", registry=reg)
        self.live_events = Counter("feedrouter_live_events", "Events handed to live subscribers, by kind",
                                   ["outcome"], registry=reg)

    def record(self, event: Event) -> None:
        """Update the instrument *event* belongs to."""
        name, value = event.name, event.value
        if name == "request":
            self.requests.labels(event.cluster, event.op, event.outcome).inc()
            self.request_seconds.labels(event.cluster, event.op).observe(value)
        elif name == "call":
            self.calls.labels(event.op, event.outcome).inc()
            self.call_seconds.labels(event.op).observe(value)
        elif name == "items":
            self.items.labels(event.cluster, event.outcome).inc(value)
        elif name == "retry":
            self.retries.labels(event.cluster, event.op).inc()
        elif name == "read_clusters":
            self.read_clusters.observe(value)
        elif name == "partial_read":
            self.partial_reads.labels(event.cluster).inc()
        elif name == "cluster_up":
            self.cluster_up.labels(event.cluster).set(value)
        elif name == "timemap_loaded":
            self._loaded_at = value
            self.timemap_loaded.set(value)
        elif name == "stale_refusal":
            self.stale_refusals.inc()
        elif name == "fanout_jobs":
            self.fanout_jobs.inc(value)
        elif name == "fanout_copies":
            self.fanout_copies.labels(event.cluster, event.outcome).inc(value)
        elif name == "standby_ready":
            self.standby_ready.set(value)
        elif name == "next_boundary":
            self.next_boundary.set(value)
        elif name == "push":
            self.pushes.labels(event.op, event.outcome).inc()
            self.push_seconds.labels(event.op).observe(value)
        elif name == "pushed":
            self.pushed.inc(value)
        elif name == "live_subscribers":
            self.live_subscribers.inc(value)
        elif name == "live_events":
            self.live_events.labels(event.outcome).inc(value)
