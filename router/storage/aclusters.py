"""The asynchronous storage: one ``AsyncMongoClient`` per cluster, and the driver that runs core programs on them.

The twin of :mod:`router.storage.clusters` for asyncio: the same requests, mapped to the
same pymongo calls (:mod:`router.storage.requests`), awaited instead of called; at-once
sub-programs run as ``asyncio.gather``. Make one inside the running event loop (its
clients belong to that loop).

Example::

    clusters = AsyncClusters(config)
    timemap = await clusters.load_timemap()
    await clusters.close()
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from collections.abc import Collection as AnyCollection
from typing import Any, TypeVar

import pymongo
from pymongo import AsyncMongoClient
from pymongo.errors import ConfigurationError

from ..config import ClusterConfig, RouterConfig
from ..core.metadata import load_timemap
from ..core.policy import deadline_in
from ..core.steps import Concurrently, Delete, Find, Insert, Program, Refresh, Report, Request, Sleep, Update
from ..errors import RouterError
from ..observe import NO_METRICS, Event, Metrics
from ..observe.tracing import NO_TRACING, Tracing
from ..timemap import TimeMap
from ..uris import uri_password
from .clusters import client_options, collection_names
from .errors import driver_error
from .requests import IORequest, call_for, failed, late, observed, request_op, time_left, unknown

__all__ = ["AsyncCluster", "AsyncClusters"]

T = TypeVar("T")


class AsyncCluster:
    """One configured cluster on an ``AsyncMongoClient``: carries out core requests."""

    def __init__(self, spec: ClusterConfig, config: RouterConfig, *, extra_options: dict[str, Any] | None = None) -> None:
        self.name = spec.name
        self.spec = spec
        self.secrets: tuple[str, ...] = tuple(x for x in (uri_password(spec.uri), spec.options.get("password")) if x)
        try:
            self.client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(spec.uri, **client_options(spec, extra_options))
        except (ConfigurationError, ValueError, TypeError) as exc:
            raise driver_error(self.name, exc, doing="configuring the client", secrets=self.secrets) from exc
        db = self.client[config.database_for(spec)]
        self._collections = {role: db[name] for role, name in collection_names(config).items()}

    def __repr__(self) -> str:
        return f"AsyncCluster({self.name!r}, {self.spec.display_uri!r})"

    async def execute(self, request: IORequest) -> Any:
        """Carry out one core request within what is left of its deadline; answer with a value, never raise."""
        left = time_left(request, self.client)
        if left <= 0:
            return late(request, self.name)
        call, answer = call_for(request, self._collections[request.collection])
        try:
            with pymongo.timeout(left):
                return answer(await call())
        except Exception as exc:  # driver errors become answers; anything else is re-raised by failed()
            return failed(request, exc, self.name, self.secrets)

    async def close(self) -> None:
        """Close the client's connections."""
        await self.client.close()


class AsyncClusters:
    """Every configured cluster on asyncio; runs core programs, sub-programs at once with ``asyncio.gather``."""

    def __init__(
        self, config: RouterConfig, *, refresh: Callable[[], Awaitable[Any]] | None = None,
        extra_options: dict[str, Any] | None = None, metrics: Metrics = NO_METRICS, tracing: Tracing = NO_TRACING,
    ) -> None:
        self.config = config
        self._refresh = refresh
        self.metrics = metrics
        self.tracing = tracing
        self._by_name: dict[str, AsyncCluster] = {}
        for spec in config.clusters:
            self._by_name[spec.name] = AsyncCluster(spec, config, extra_options=extra_options)

    def __getitem__(self, name: str) -> AsyncCluster:
        return self._by_name[name]

    def __len__(self) -> int:
        return len(self._by_name)

    @property
    def names(self) -> list[str]:
        """The cluster names in configuration order."""
        return list(self._by_name)

    async def run(self, program: Program[T]) -> T:
        """Drive *program* to its end, awaiting each request's answer; return its value."""
        reply: Any = None
        while True:
            try:
                request = program.send(reply)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]
            reply = await self._answer(request)

    def record(self, event: Event) -> None:
        """Hand *event* to the metrics."""
        self.metrics.record(event)

    async def _answer(self, request: Request) -> Any:
        if isinstance(request, (Find, Insert, Delete, Update)):
            cluster = self._by_name.get(request.cluster)
            if cluster is None:
                return unknown(request)
            op = request_op(request)
            with self.tracing.span(f"feedrouter.{op}", cluster=request.cluster, op=op):
                began = time.perf_counter()
                answer = await cluster.execute(request)
            for event in observed(request, answer, time.perf_counter() - began):
                self.metrics.record(event)
            return answer
        if isinstance(request, Report):
            self.metrics.record(request.event)
            return None
        if isinstance(request, Sleep):
            await asyncio.sleep(request.seconds)
            return None
        if isinstance(request, Concurrently):
            return await self._concurrently(request.programs)
        if isinstance(request, Refresh):
            if self._refresh is None:
                return RouterError("no refresh is possible here")
            return await self._refresh()
        raise TypeError(f"not a request: {request!r}")

    async def _concurrently(self, programs: Sequence[Program[Any]]) -> list[Any]:
        if len(programs) == 1:
            return [await self.run(programs[0])]
        results = await asyncio.gather(*(self.run(p) for p in programs), return_exceptions=True)
        for result in results:  # every one has finished: raise the first failure, as the sync driver does
            if isinstance(result, BaseException):
                raise result
        return list(results)

    async def load_timemap(self, *, allow_missing: AnyCollection[str] = (), previous: TimeMap | None = None) -> TimeMap:
        """Read every cluster's metadata and build the time map (see :func:`router.core.metadata.load_timemap`)."""
        deadline = deadline_in(self.config.timeout.total_seconds())
        return await self.run(
            load_timemap(self.names, self.config, deadline=deadline, allow_missing=allow_missing, previous=previous)
        )

    async def close(self) -> None:
        """Close every client."""
        await asyncio.gather(*(c.close() for c in self._by_name.values()), return_exceptions=True)
