"""A period's feed indexes are its layout's: created when the period is added, exactly Layout.indexes(), per layout."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from pymongo import MongoClient

from router import RouterConfig
from router.admin.migrate import discover, migrate_cluster
from router.admin.periods import apply_period, plan_period
from router.core.layouts import LAYOUTS, Layout
from router.storage.clusters import Cluster, Clusters

from .conftest import NOW, P0, held_layouts, register

Clients = dict[str, MongoClient[dict[str, Any]]]


def indexes_of(layout: Layout) -> dict[str, tuple[Any, ...]]:
    """What *layout* asks for (off a mongos), as list_indexes reports an index: keys, unique, partial filter."""
    return {i.name: (dict(i.keys), i.unique, dict(i.partial)) for i in layout.indexes(sharded=False)}


def indexes_on(clients: Clients, name: str, db: str) -> dict[str, tuple[Any, ...]]:
    """The feed indexes a server holds (the _id index aside)."""
    return {i["name"]: (dict(i["key"]), bool(i.get("unique")), dict(i.get("partialFilterExpression", {})))
            for i in clients[name][db].feed.list_indexes() if i["name"] != "_id_"}


@pytest.mark.parametrize("layout", held_layouts())
def test_a_new_period_has_exactly_its_layouts_indexes(layout: str, make_config: Callable[..., RouterConfig],
                                                      raw_clients: Clients, db_name: str) -> None:
    """add-cluster's path (plan_period, apply_period) on a fresh cluster: its feed has the indexes its layout lists,
    no more (no copies index in a buckets period), no fewer."""
    config = make_config()
    register(config, [(P0, None)])
    with Clusters(config) as clusters:
        change = plan_period(clusters, name="cluster_2", start=NOW + timedelta(days=30), close_previous=True,
                             creator="tests", now=NOW, layout=layout)
        apply_period(clusters, change, migrations=discover())
    assert indexes_on(raw_clients, "cluster_2", db_name) == indexes_of(LAYOUTS[layout])


def test_migrations_leave_the_feed_indexes_to_the_layout(make_config: Callable[..., RouterConfig], raw_clients: Clients,
                                                         db_name: str) -> None:
    """The shipped migrations' feed-index steps are superseded (noted, nothing created) on a cluster with no period
    yet; once it holds a period, migrate creates what its layout lists and is missing (an upgrade), and nothing when
    nothing is missing."""
    config = make_config()
    cluster = Cluster(config.clusters[0], config)
    try:
        report = migrate_cluster(cluster, config, discover())
        assert indexes_on(raw_clients, "cluster_1", db_name) == {}
        assert sum("superseded" in step for step in report.steps) == 3  # 0001's two, 0002's one
        assert "index data_key absent on feed: nothing to drop" in report.steps
        register(config, [(P0, None)])  # (writes the period, then its layout's indexes)
        raw_clients["cluster_1"][db_name].feed.drop_index("data_key_id")  # as a cluster migrated before this change
        again = migrate_cluster(cluster, config, discover())
        assert again.applied == () and again.steps == (
            "create index 'data_key_id' on cluster_1.feed (copies layout): {'data_key': 1, '_id': 1}",)
        assert indexes_on(raw_clients, "cluster_1", db_name) == indexes_of(LAYOUTS["copies"])
        assert migrate_cluster(cluster, config, discover()).steps == ()
    finally:
        cluster.close()
