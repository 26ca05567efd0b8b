"""Capabilities: which servers apply one document's filter and update atomically."""

from __future__ import annotations

import pytest

from router.storage.clusters import Capabilities


@pytest.mark.parametrize(
    ("server", "atomic"), [("mongodb", True), ("mongo-java-server", True), ("ferretdb", False)]
)
def test_atomic_updates_follow_the_server(server: str, atomic: bool) -> None:
    """MongoDB and mongo-java-server apply a filter and its update as one step; FerretDB does not."""
    assert Capabilities(sharded=False, server=server, version="1").atomic_updates is atomic


def test_atomic_updates_can_be_given() -> None:
    """An explicit value beats the rule (a test can describe a server that is not running)."""
    assert Capabilities(sharded=False, server="mongodb", version="7.0", atomic_updates=False).atomic_updates is False
