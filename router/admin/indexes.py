"""A period's feed indexes: its layout's, created when the period is added, and by ``migrate`` where missing.

:meth:`router.core.layouts.Layout.indexes` is the one source of the indexes a period's
``feed`` collection has, whatever its layout. :func:`create_feed_indexes` creates those the
collection lacks; :func:`router.admin.periods.apply_period` calls it for every new period
before anything is closed, and :func:`router.admin.migrate.migrate_cluster` for the period a
cluster holds (so an upgrade adds what a layout asks for since). The shipped migrations'
own feed-index steps (0001, 0002) predate this and are superseded
(:class:`~router.admin.migrate.MigrationContext` notes them and creates nothing).

Example::

    for line in create_feed_indexes(clusters["cluster_4"], LAYOUTS["buckets"], dry_run=True):
        print(line)
"""

from __future__ import annotations

import logging
from typing import Any

from ..core.layouts import Layout
from ..storage.clusters import Cluster

__all__ = ["create_feed_indexes", "index_commands"]

log = logging.getLogger(__name__)


def index_commands(layout: Layout, *, collection: str, sharded: bool) -> list[dict[str, Any]]:
    """The ``createIndexes`` command documents that give *collection* (a period's feed) the indexes *layout* needs;
    *sharded*: on a mongos, where migration 0001 sharded the collection on hashed ``receiver_id``."""
    return [index.to_command(collection) for index in layout.indexes(sharded=sharded)]


def _create(cluster: Cluster, command: dict[str, Any]) -> None:
    cluster.call("creating indexes", lambda: cluster.db.command(command))


def create_feed_indexes(cluster: Cluster, layout: Layout, *, dry_run: bool = False) -> list[str]:
    """Create the indexes *layout* lists that *cluster*'s feed collection lacks (by name); what was (or, in a dry
    run, would be) created, line by line. Raises :class:`~router.errors.ClusterUnavailable` when the cluster fails."""
    feed = cluster.feed
    present = {i["name"] for i in cluster.call("listing indexes", lambda: list(feed.list_indexes()))}
    commands = index_commands(layout, collection=feed.name, sharded=cluster.capabilities().sharded)
    lines: list[str] = []
    for command in commands:
        spec = command["indexes"][0]
        if spec["name"] in present:
            continue
        lines.append(f"{'would ' if dry_run else ''}create index {spec['name']!r} on {cluster.name}.feed "
                     f"({layout.name} layout): {spec['key']}{' unique' if spec.get('unique') else ''}")
        if not dry_run:
            _create(cluster, command)
            log.info("cluster %s: created index %s on feed (%s layout)", cluster.name, spec["name"], layout.name)
    return lines
