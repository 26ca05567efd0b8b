"""Clients per deployment: the pure parts of router.storage.clients (no server is asked anything)."""

from __future__ import annotations

from typing import Any

from pymongo import MongoClient

from router import ClusterConfig, RouterConfig
from router.storage.clients import Collections


def test_collections_are_made_only_for_the_roles_asked_for() -> None:
    """A cluster's collection objects are made on first use: start-up, which reads only metadata, makes one per period."""
    config = RouterConfig(database="feeds", clusters=(ClusterConfig(name="p0", uri="mongodb://127.0.0.1:1"),))
    client: MongoClient[dict[str, Any]] = MongoClient("mongodb://127.0.0.1:1", connect=False)
    try:
        roles = Collections("feeds_p0", config).on(client)
        assert roles["metadata"].full_name == "feeds_p0.metadata"
        assert list(roles) == ["metadata"]
        assert roles["feed"].full_name == f"feeds_p0.{config.feed_collection}"
        assert sorted(roles) == ["feed", "metadata"]
    finally:
        client.close()
