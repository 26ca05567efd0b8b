"""Per-cluster figures from a running service's Prometheus endpoint, for ``feedrouter status --metrics URL``.

The router never serves metrics itself; a service that uses
:class:`~router.observe.prometheus.PrometheusMetrics` exposes them. ``status`` can read that
endpoint and show, per cluster, the requests the service's router sent, how many failed,
their mean latency, and whether the cluster answered last.

Example::

    stats = scrape("http://feed-service:9108/metrics", timeout=5)
    stats["cluster_1"].errors, stats["cluster_1"].mean_ms
"""

from __future__ import annotations

import urllib.error
import urllib.request

import attrs

from ..errors import RouterError
from ..uris import redact_uri

__all__ = ["ClusterStats", "scrape", "parse"]


@attrs.frozen
class ClusterStats:
    """One cluster's requests as a router saw them: count, failures (any outcome but ok), latency, up."""

    requests: int = 0
    errors: int = 0
    seconds: float = 0.0
    up: bool | None = None

    @property
    def mean_ms(self) -> float | None:
        """Mean latency of a request in milliseconds (None before the first)."""
        return self.seconds / self.requests * 1000 if self.requests else None

    def to_json(self) -> dict[str, object]:
        return {"requests": self.requests, "errors": self.errors, "mean_ms": None if self.mean_ms is None else round(self.mean_ms, 2),
                "up": self.up}


def parse(text: str) -> dict[str, ClusterStats]:
    """The per-cluster figures in a Prometheus text exposition (``feedrouter_*`` series only)."""
    from prometheus_client.parser import text_string_to_metric_families

    counts: dict[str, list[float]] = {}
    up: dict[str, bool] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            cluster = sample.labels.get("cluster")
            if cluster is None:
                continue
            row = counts.setdefault(cluster, [0.0, 0.0, 0.0])
            if sample.name == "feedrouter_requests_total":
                row[0] += sample.value
                if sample.labels.get("outcome") != "ok":
                    row[1] += sample.value
            elif sample.name == "feedrouter_request_seconds_sum":
                row[2] += sample.value
            elif sample.name == "feedrouter_cluster_up":
                up[cluster] = sample.value >= 1
    return {c: ClusterStats(int(r[0]), int(r[1]), r[2], up.get(c)) for c, r in counts.items()}


def scrape(url: str, *, timeout: float = 5.0) -> dict[str, ClusterStats]:
    """Read *url* (a Prometheus endpoint) and return its per-cluster figures; :class:`RouterError` if it cannot be read."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as reply:  # noqa: S310 - an operator's own URL
            text = reply.read().decode("utf-8", "replace")
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise RouterError(f"metrics endpoint {redact_uri(url)}: cannot be read ({exc})") from None
    return parse(text)
