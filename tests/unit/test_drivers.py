"""The two drivers run sub-programs at once alike: a returned exception is a value, a raised one is raised after
every sub-program finished (no request reaches a server here: the programs send none)."""

from __future__ import annotations

import asyncio
from collections.abc import Generator
from typing import Any

import pytest

from router import ClusterUnavailable, RouterConfig
from router.config import ClusterConfig
from router.core.steps import Concurrently
from router.storage.aclusters import AsyncClusters
from router.storage.clusters import Clusters

CONFIG = RouterConfig(database="feeds", clusters=(ClusterConfig(name="p0", uri="mongodb://127.0.0.1:1"),
                                                  ClusterConfig(name="p1", uri="mongodb://127.0.0.1:2")))
finished: list[str] = []


def value(v: Any) -> Generator[Any, Any, Any]:
    finished.append(repr(v))
    return v
    yield  # (a program)


def raising(error: Exception) -> Generator[Any, Any, Any]:
    raise error
    yield  # (a program)


def both(*programs: Generator[Any, Any, Any]) -> Generator[Any, Any, Any]:
    return (yield Concurrently(list(programs), ["p0", "p1", "p0"][: len(programs)]))


def drive(door: str, program: Generator[Any, Any, Any]) -> Any:
    if door == "sync":
        clusters = Clusters(CONFIG)
        try:
            return clusters.run(program)
        finally:
            clusters.close()

    async def run() -> Any:
        return await AsyncClusters(CONFIG).run(program)

    return asyncio.run(run())


@pytest.mark.parametrize("door", ["sync", "async"])
def test_a_returned_exception_is_a_value(door: str) -> None:
    """As the fence's marks return a cluster's error: the other programs' values come back beside it."""
    error = ClusterUnavailable("p1", "down")
    assert drive(door, both(value(1), value(error))) == [1, error]


@pytest.mark.parametrize("door", ["sync", "async"])
def test_a_raised_exception_is_raised_once_every_program_finished(door: str) -> None:
    finished.clear()
    with pytest.raises(ClusterUnavailable, match="first"):
        drive(door, both(raising(ClusterUnavailable("p0", "first")), value(2), raising(ClusterUnavailable("p1", "second"))))
    assert finished == ["2"]
