"""The asynchronous storage: one ``AsyncMongoClient`` per deployment in use, and the driver that runs core programs on them.

The twin of :mod:`router.storage.clusters` for asyncio: the same requests, mapped to the
same pymongo calls (:mod:`router.storage.requests`), awaited instead of called; at-once
sub-programs run as ``asyncio.gather``. Reads are bounded with ``asyncio.timeout`` and
``maxTimeMS`` instead of ``pymongo.timeout`` (see :meth:`AsyncCluster._execute`). Make one inside the running event loop (its
clients belong to that loop).

Example::

    clusters = AsyncClusters(config)
    timemap = await clusters.load_timemap()
    await clusters.close()
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from collections.abc import Collection as AnyCollection
from typing import Any, TypeVar

import pymongo
from pymongo import AsyncMongoClient

from ..config import ClusterConfig, Deployment, RouterConfig
from ..core.periods import load_timemap
from ..core.policy import deadline_in
from ..core.steps import Concurrently, Program, Push, Refresh, Report, Request, Sleep
from ..errors import RouterError
from ..observe import NO_METRICS, Event, Metrics
from ..observe.tracing import NO_TRACING, Tracing
from ..timemap import TimeMap
from .clients import Collections, Deployments, client_maker, secrets_of
from .clusters import Clusters
from .push import AsyncPublisher
from .requests import (
    IO_REQUESTS, READS, IORequest, calls_for, expired, failed, late, observed, request_op, server_deadline, unknown,
)

__all__ = ["AsyncCluster", "AsyncClusters"]

log = logging.getLogger(__name__)

T = TypeVar("T")
AsyncClient = AsyncMongoClient[dict[str, Any]]


#: Calls given up by :func:`_within` and still running: kept referenced until they end.
_ABANDONED: set[asyncio.Task[Any]] = set()


def _abandoned(task: asyncio.Task[Any]) -> None:
    _ABANDONED.discard(task)
    if not task.cancelled():
        task.exception()  # retrieved: the call was given up, its outcome is nobody's


async def _within(call: Awaitable[T], seconds: float) -> tuple[bool, T | None]:
    """``(True, what *call* gave)``, or ``(False, None)`` once *seconds* have passed: then *call* is left to end by
    itself, not cancelled.

    pymongo waits for a server in ``asyncio.wait_for``, which on Python 3.11 can swallow the
    cancellation ``asyncio.timeout`` sends (when the wait ends in the same turn of the loop:
    CPython gh-86296); the wait then went on to ``serverSelectionTimeoutMS``, past the call's
    deadline. And a cancellation there can leave the client's lock held, so that the next
    request on that client waited for ever (seen once, a write after such a read). So the call
    runs in a task of its own, watched from outside, and is never cancelled: it ends by
    itself, within ``serverSelectionTimeoutMS``. A task per call: used only while the client
    knows no server the read may use.
    """
    task = asyncio.ensure_future(call)
    done, _ = await asyncio.wait((task,), timeout=seconds)
    if done:
        return True, task.result()
    _ABANDONED.add(task)
    task.add_done_callback(_abandoned)
    return False, None


class AsyncCluster:
    """One configured cluster on its deployment's shared ``AsyncMongoClient``: carries out core requests."""

    def __init__(
        self, spec: ClusterConfig, config: RouterConfig, *, clients: Deployments[AsyncClient], metadata_reads: asyncio.Semaphore,
    ) -> None:
        self.name = spec.name
        self.spec = spec
        self.secrets = secrets_of(spec)
        self.database = config.database_for(spec)
        self.clients = clients
        clients.prepare(spec)
        self._collections = Collections(self.database, config)
        #: Shared by the clusters on this deployment: how many metadata reads may be in flight on it at once.
        self._metadata_reads = metadata_reads

    def __repr__(self) -> str:
        return f"AsyncCluster({self.name!r}, {self.spec.display_uri!r})"

    async def execute(self, request: IORequest) -> Any:
        """Carry out one core request within what is left of its deadline; answer with a value, never raise.

        Metadata reads wait for one of their deployment's slots first: start-up reads every
        period's metadata at once, and a thousand periods on one deployment must not ask a
        thousand connections of its pool (the sync storage's bound is its thread pool).
        """
        if request.collection == "metadata":
            async with self._metadata_reads:
                return await self._execute(request)
        return await self._execute(request)

    async def _execute(self, request: IORequest) -> Any:
        """One request within its time (:func:`~router.storage.requests.time_left`).

        A read is bounded by ``asyncio.timeout`` and carries its deadline to the server as
        ``maxTimeMS`` (:func:`~router.storage.requests.server_deadline`), not under
        ``pymongo.timeout``: under pymongo's deadline every wait of its async pool for a
        connection goes through ``asyncio.wait_for``, a task and a timer each, which with 200
        reads queued on 16 connections cost the loop 9,152 iterations per 1,000 reads against
        683 without. A read cut at its time fails as pymongo's deadline failed it
        (:func:`~router.storage.requests.expired`). The cut cancels pymongo mid-request; pymongo
        treats a cancellation as fatal to the connection in use (it closes it; a wait for one
        gives its place back), so no connection goes back to the pool half-read. A write runs
        under ``pymongo.timeout`` as before: pymongo's write methods take no ``maxTimeMS``, and
        the server must stop a write at its limit (edits split a step it stopped), so only
        pymongo's deadline can send one; a write is a batch, and one wait per batch costs
        nothing measurable. While the client knows no server the read may use, pymongo waits
        for one where a cancellation can be lost, so that read is watched from outside
        (:func:`_within`).
        """
        with self.clients.using(self.spec, request.collection) as client:
            result: Any = None
            for (call, answer), left, known in calls_for(request, client, self._collections.on(client)[request.collection]):
                if left <= 0:
                    return late(request, self.name, client)
                try:
                    if isinstance(request, READS):
                        until = server_deadline(client, left)
                        if until is None:
                            return late(request, self.name, client)
                        if not known:  # pymongo may wait for a server: watched from outside
                            done, reply = await _within(call(until), left)
                            if not done:
                                return expired(request, self.name, client, left)
                            result = answer(reply)
                            continue
                        bound = asyncio.timeout(left)
                        try:
                            async with bound:
                                result = answer(await call(until))
                        except TimeoutError:
                            if bound.expired():
                                return expired(request, self.name, client, left)
                            raise
                    else:
                        with pymongo.timeout(left):
                            result = answer(await call(None))
                except Exception as exc:  # driver errors become answers; anything else is re-raised by failed()
                    return failed(request, exc, self.name, self.secrets)
            return result


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
        self._closing: set[asyncio.Task[None]] = set()

        #: The clients, one per deployment, shared by its clusters (see :mod:`router.storage.clients`).
        self.clients: Deployments[AsyncClient] = Deployments(client_maker(AsyncMongoClient, extra_options), self._let_go, idle_close=config.client_idle_close.total_seconds())
        #: Where live pushes go (``push:`` in clusters.yaml), or None.
        self.push = AsyncPublisher(config.push, metrics=metrics, tracing=tracing) if config.push is not None else None
        self._by_name: dict[str, AsyncCluster] = {}
        slots: dict[Deployment, asyncio.Semaphore] = {}
        for spec in config.clusters:
            reads = slots.setdefault(spec.deployment, asyncio.Semaphore(Clusters.WORKERS_PER_CLUSTER))
            self._by_name[spec.name] = AsyncCluster(spec, config, clients=self.clients, metadata_reads=reads)

    def _let_go(self, clients: list[AsyncClient], _emptied: list[Any]) -> None:
        """Close idle clients in a task of their own (closing ends their sessions: a round trip)."""
        for client in clients:
            task = asyncio.get_running_loop().create_task(client.close())
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

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
        if isinstance(request, IO_REQUESTS):
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
        if isinstance(request, Push):
            return None if self.push is None else await self.push.send(request)
        raise TypeError(f"not a request: {request!r}")

    async def _concurrently(self, programs: Sequence[Program[Any]]) -> list[Any]:
        if len(programs) == 1:
            return [await self.run(programs[0])]
        # Every one runs to its end; then the first that raised raises, as in the sync driver. (A program may return
        # an exception as its value, as the fence's marks return a cluster's error: that is a value, never raised.)
        outcomes = await asyncio.gather(*(self._settled(p) for p in programs), return_exceptions=True)
        settled: list[tuple[bool, Any]] = []
        for outcome in outcomes:
            if isinstance(outcome, BaseException):  # cancelled, or an interrupt: not caught by _settled
                raise outcome
            settled.append(outcome)
        for raised, value in settled:
            if raised:
                raise value
        return [value for _, value in settled]

    async def _settled(self, program: Program[Any]) -> tuple[bool, Any]:
        """Run *program*: (False, its value), or (True, the exception it raised)."""
        try:
            return False, await self.run(program)
        except Exception as exc:  # (raised by _concurrently once every program has finished)
            return True, exc

    async def load_timemap(self, *, allow_missing: AnyCollection[str] = (), previous: TimeMap | None = None) -> TimeMap:
        """Read every cluster's metadata and build the time map (see :func:`router.core.periods.metadata.load_timemap`)."""
        deadline = deadline_in(self.config.timeout.total_seconds())
        try:
            return await self.run(
                load_timemap(self.names, self.config, deadline=deadline, allow_missing=allow_missing, previous=previous)
            )
        finally:
            self.clients.release_cold()

    async def close(self, *, within: float | None = None) -> None:
        """Close every client and the push channel; give up on any still closing after *within* seconds.

        A client's close ends its sessions on the server, through its connection pool. A test run saw that
        wait never end: after reads cut at their deadline against a stopped deployment, the pool's lock was
        never given back (a cancelled wait of the pool's condition still waited for it too). The router's
        close must not hang with it.
        """
        loop = asyncio.get_running_loop()
        for task in [t for t in _ABANDONED if t.get_loop() is loop]:  # reads given up on (_within): the clients go
            task.cancel()
        closing = [asyncio.ensure_future(c) for c in (*self._closing, *(c.close() for c in self.clients.drain()))]
        if self.push is not None:
            closing.append(asyncio.ensure_future(self.push.close()))
        if not closing:
            return
        done, pending = await asyncio.wait(closing, timeout=within)
        for task in done:
            if not task.cancelled():
                task.exception()  # (retrieved: a client that failed to close is closed as far as the router goes)
        if pending:
            log.warning("close(): %d of %d clients still closing after %.0f s; left unfinished", len(pending),
                        len(closing), within)
            for task in pending:
                task.cancel()
