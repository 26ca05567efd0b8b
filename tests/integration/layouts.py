"""Shared setup of the buckets tests: three periods (copies, buckets, buckets) on one mongo-java-server."""

from __future__ import annotations

import uuid
from typing import Any

from pymongo import MongoClient

from router import ClusterConfig, RouterConfig
from router.admin.migrate import discover
from router.admin.periods import apply_period, plan_period
from router.storage.clusters import Clusters

from .conftest import NAMES, PERIODS

#: The layout of each standard period in these tests.
LAYOUTS = ("copies", "buckets", "buckets")


def buckets_config(uri: str) -> RouterConfig:
    """Three periods, a database each on the server at *uri*, given their layouts by the operator path."""
    prefix = f"t_{uuid.uuid4().hex[:10]}"
    config = RouterConfig(
        database=prefix,
        clusters=tuple(ClusterConfig(name=n, uri=uri, options={}, database=f"{prefix}_{i}") for i, n in enumerate(NAMES)),
    )
    with Clusters(config) as clusters:
        for name, (start, end), layout in zip(NAMES, PERIODS, LAYOUTS):
            change = plan_period(clusters, name=name, start=start, end=end, creator="tests", now=start, layout=layout)
            apply_period(clusters, change, migrations=discover())
    return config


def feed(raw: MongoClient[dict[str, Any]], config: RouterConfig, i: int) -> Any:
    """Period *i*'s feed collection, through plain pymongo."""
    return raw[config.database_for(config.clusters[i])].feed


def copies_per_receiver(raw: MongoClient[dict[str, Any]], config: RouterConfig, i: int) -> dict[Any, int]:
    """How many copies each receiver has in the buckets of period *i*, counted in the documents themselves."""
    counts: dict[Any, int] = {}
    for doc in feed(raw, config, i).find({}):
        counts[doc["receiver_id"]] = counts.get(doc["receiver_id"], 0) + len(doc["items"])
    return counts
