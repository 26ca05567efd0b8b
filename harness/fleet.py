"""Many periods on a few servers: a database per period, for the scale test and benchmark.

Period *i* is ``[first + i * length, first + (i + 1) * length)`` (the last one open-ended),
stored in database ``{prefix}_{i:04d}`` on server ``i % len(uris)``, as cluster
``p{i:04d}``. Only metadata is written: reads of a period with no collection find
nothing, and the first write creates its feed.

Example::

    config = fleet_config(uris, 1000, prefix="scale")
    register_fleet(config)
    with FeedRouter(config) as feeds: ...
    drop_fleet(config)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone
from typing import Any

import attrs
from pymongo import MongoClient

from router.config import ClusterConfig, RouterConfig
from router.model import ClusterMeta

__all__ = ["fleet_config", "register_fleet", "drop_fleet"]

#: Where the first period starts unless told otherwise.
FIRST = datetime(2005, 7, 4, tzinfo=timezone.utc)


def fleet_config(
    uris: Sequence[str], count: int, *, prefix: str, first: datetime = FIRST, length: timedelta = timedelta(weeks=1),
    options: dict[str, Any] | None = None, **settings: Any,
) -> RouterConfig:
    """A config of *count* periods of *length* from *first*, spread over *uris* a database each."""
    clusters = tuple(
        ClusterConfig(name=f"p{i:04d}", uri=uris[i % len(uris)], options=dict(options or {}), database=f"{prefix}_{i:04d}")
        for i in range(count)
    )
    config = RouterConfig(clusters=clusters, database=f"{prefix}_top", **settings)
    return attrs.evolve(config, source=f"<fleet {prefix}: {count} periods of {length} from {first.date()}>")


def period_of(config: RouterConfig, index: int, *, first: datetime = FIRST, length: timedelta = timedelta(weeks=1)) -> ClusterMeta:
    """The metadata of period *index* of *config* (the last is open-ended)."""
    spec = config.clusters[index]
    end = None if index == len(config.clusters) - 1 else first + length * (index + 1)
    return ClusterMeta(name=spec.name, start_date=first + length * index, end_date=end, creator_name="fleet")


def _each_server(config: RouterConfig, work: Callable[[MongoClient[dict[str, Any]], int, ClusterConfig], None]) -> None:
    """Run *work(client, index, spec)* for every period, each server's periods on a thread of its own."""
    by_uri: dict[str, list[int]] = {}
    for i, spec in enumerate(config.clusters):
        by_uri.setdefault(spec.uri, []).append(i)

    def one_server(uri: str) -> None:
        client: MongoClient[dict[str, Any]]
        with MongoClient(uri, tz_aware=True) as client:
            for i in by_uri[uri]:
                work(client, i, config.clusters[i])

    with ThreadPoolExecutor(max_workers=len(by_uri)) as pool:
        list(pool.map(one_server, by_uri))


def register_fleet(config: RouterConfig, *, first: datetime = FIRST, length: timedelta = timedelta(weeks=1)) -> None:
    """Write every period's metadata document into its own database."""

    def write(client: MongoClient[dict[str, Any]], i: int, spec: ClusterConfig) -> None:
        doc = period_of(config, i, first=first, length=length).to_document()
        client[config.database_for(spec)][config.metadata_collection].replace_one({"_id": doc["_id"]}, doc, upsert=True)

    _each_server(config, write)


def drop_fleet(config: RouterConfig) -> None:
    """Drop every period's database."""
    _each_server(config, lambda client, _i, spec: client.drop_database(config.database_for(spec)))
