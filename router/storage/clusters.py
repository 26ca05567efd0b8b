"""The synchronous storage: one ``MongoClient`` per cluster, and the driver that runs core programs on them.

:class:`Cluster` carries out one request of the core (:mod:`router.core.steps`) against its
client, under ``pymongo.timeout`` set to what is left of the request's deadline, and
answers with values: driver errors come back classified (:func:`~router.storage.errors.classify`),
never as exceptions. :class:`Clusters` runs whole programs: sub-programs that must run
at the same time go to each cluster's own small thread pool, so a hung cluster ties up
only its own threads.

Example::

    with Clusters(load_config("clusters.yaml")) as clusters:
        timemap = clusters.load_timemap()
        clusters.run(some_program)
"""

from __future__ import annotations

import contextvars
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from collections.abc import Collection as AnyCollection
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

import attrs
import pymongo
from pymongo import MongoClient
from pymongo.collection import Collection
from pymongo.database import Database
from pymongo.errors import OperationFailure, PyMongoError

from ..config import ClusterConfig, Deployment, RouterConfig
from ..core.periods import inspect_metadata, load_timemap, read_metadata
from ..core.policy import deadline_in
from ..core.steps import Concurrently, Program, Push, Refresh, Report, Request, Sleep
from ..errors import ClusterError, ClusterUnavailable, InvalidItem, RouterError
from ..model import ClusterMeta
from ..observe import NO_METRICS, Event, Metrics
from ..observe.tracing import NO_TRACING, Tracing
from ..timemap import TimeMap
from .capabilities import Capabilities
from .clients import DEFAULT_OPTIONS, Collections, Deployments, client_maker, client_options, collection_names, secrets_of
from . import finds
from .errors import driver_error
from .push import Publisher
from .requests import IO_REQUESTS, IORequest, calls_for, failed, late, observed, request_op, unknown

__all__ = [
    "COMMAND_NOT_FOUND", "DEFAULT_OPTIONS", "Capabilities", "Cluster", "Clusters", "client_options", "collection_names",
    "sync_deployments",
]

log = logging.getLogger(__name__)
T = TypeVar("T")

#: The server's error code for a command it does not know.
COMMAND_NOT_FOUND = 59
class Cluster:
    """One configured cluster: its name, database and collections, on its deployment's shared client.

    The client comes from *clients* (the :class:`Clusters`' shared
    :class:`~router.storage.clients.Deployments`); a cluster made on its own has a
    private one, closed by :meth:`close`.

    Example::

        cluster = Cluster(config.clusters[0], config)
        cluster.ping()
        cluster.feed.count_documents({})
    """

    def __init__(
        self, spec: ClusterConfig, config: RouterConfig, *, extra_options: dict[str, Any] | None = None,
        clients: Deployments[MongoClient[dict[str, Any]]] | None = None,
    ) -> None:
        self.name = spec.name
        self.spec = spec
        #: The password of this cluster (from the URI or the options), masked in every message.
        self.secrets = secrets_of(spec)
        #: The database holding this cluster's period (its own, else the top-level one).
        self.database = config.database_for(spec)
        self._collections = Collections(self.database, config)
        self._own = clients is None
        self.clients = clients or sync_deployments(config, extra_options, lambda _deployments: None)
        self.clients.prepare(spec)

    @property
    def client(self) -> MongoClient[dict[str, Any]]:
        """This cluster's deployment's hot client (made now if it has none), for operator tools."""
        client = self.clients.acquire(self.spec, data=True)
        self.clients.release(self.spec, client)
        return client

    @property
    def db(self) -> Database[dict[str, Any]]:
        """This cluster's database on its client (migrations, leases and other operator tools use it)."""
        return self.client[self.database]

    @property
    def feed(self) -> Collection[dict[str, Any]]:
        """This cluster's feed collection."""
        return self._collections.on(self.client)["feed"]  # type: ignore[no-any-return]

    @property
    def metadata(self) -> Collection[dict[str, Any]]:
        """This cluster's metadata collection."""
        return self._collections.on(self.client)["metadata"]  # type: ignore[no-any-return]

    def __repr__(self) -> str:
        return f"Cluster({self.name!r}, {self.spec.display_uri!r})"

    def error(self, exc: BaseException, *, doing: str) -> ClusterError:
        """:func:`driver_error` for this cluster, with its configured password masked too."""
        return driver_error(self.name, exc, doing=doing, secrets=self.secrets)

    def call(self, doing: str, fn: Callable[[], T]) -> T:
        """Run *fn*, turning any driver error into the :class:`ClusterError` naming this cluster (:class:`ClusterUnavailable`,
        or :class:`RequestRefused` when the server refused)."""
        try:
            return fn()
        except PyMongoError as exc:
            raise self.error(exc, doing=doing) from exc

    def execute(self, request: IORequest) -> Any:
        """Carry out one core request within what is left of its deadline; answer with a value, never raise."""
        with self.clients.using(self.spec, request.collection) as client:
            result: Any = None
            for (call, answer), left, _known in calls_for(request, client, self._collections.on(client)[request.collection]):
                if left <= 0:
                    return late(request, self.name, client)
                try:
                    with pymongo.timeout(left):
                        result = answer(call(None))
                except Exception as exc:  # driver errors become answers; anything else is re-raised by failed()
                    return failed(request, exc, self.name, self.secrets)
            return result

    def ping(self) -> None:
        """Round-trip to the server; raise :class:`ClusterUnavailable` if it does not answer."""
        client = self.client
        self.call("ping", lambda: client.admin.command("ping"))

    def capabilities(self) -> Capabilities:
        """Ask the server what it is and can do (``hello``, or ``isMaster`` where ``hello`` is unknown, and
        ``buildInfo``; ``serverStatus`` too when ``buildInfo`` lacks ``gitVersion``); see :class:`Capabilities`."""
        admin = self.client.admin
        try:
            hello = admin.command("hello")
        except OperationFailure as exc:
            if exc.code != COMMAND_NOT_FOUND:  # servers before MongoDB 4.4, mongo-java-server: no `hello`
                raise self.error(exc, doing="hello") from exc
            hello = self.call("isMaster", lambda: admin.command("isMaster"))
        except PyMongoError as exc:
            raise self.error(exc, doing="hello") from exc
        info = self.call("buildInfo", lambda: admin.command("buildInfo"))
        process = self._process_kind() if "gitVersion" not in info else None
        return Capabilities.from_replies(hello, info, process)

    def _process_kind(self) -> str | None:
        """``serverStatus``'s ``process`` (``mongod``, ``mongos``, ``java``), or None where it is refused."""
        try:
            status = self.client.admin.command("serverStatus")
        except OperationFailure:  # e.g. not authorised: then it is not mongo-java-server, which has no users
            return None
        except PyMongoError as exc:
            raise self.error(exc, doing="serverStatus") from exc
        return str(status.get("process"))

    def metadata_documents(self) -> list[dict[str, Any]]:
        """Every document in this cluster's metadata collection (a valid cluster has one)."""
        metadata = self.metadata
        return self.call("reading metadata", lambda: finds.read(metadata, {}, limit=10))

    def write_meta(self, meta: ClusterMeta) -> None:
        """Store *meta* as this cluster's metadata document (upsert on ``_id``)."""
        if meta.name != self.name:
            raise InvalidItem("name", f"must be the cluster's name {self.name!r} (got {meta.name!r})")
        doc = meta.to_document()
        metadata = self.metadata
        self.call("writing metadata", lambda: metadata.replace_one({"_id": doc["_id"]}, doc, upsert=True))

    def close(self) -> None:
        """Close the client, when this cluster has its own (a :class:`Clusters` closes the shared ones)."""
        if self._own:
            for client in self.clients.drain():
                client.close()


def sync_deployments(
    config: RouterConfig, extra_options: dict[str, Any] | None, emptied: Callable[[list[Deployment]], None]
) -> Deployments[MongoClient[dict[str, Any]]]:
    """The shared clients of a sync storage: lazy ``MongoClient``\\ s, closed off the caller's thread.

    *emptied* hears of deployments left with no client (their thread pool may go).
    """

    def closed(clients: list[MongoClient[dict[str, Any]]], deployments: list[Deployment]) -> None:
        emptied(deployments)
        # close() ends the client's sessions on the server: a round trip, up to a server
        # selection timeout when the deployment is down; not on a request's time.
        threading.Thread(target=_close_all, args=(clients,), name="feed-router-close", daemon=True).start()

    return Deployments(client_maker(MongoClient, extra_options), closed, idle_close=config.client_idle_close.total_seconds())


def _close_all(clients: list[MongoClient[dict[str, Any]]]) -> None:
    for client in clients:
        try:
            client.close()
        except PyMongoError as exc:  # the server is gone: nothing left to end
            log.debug("closing an idle client: %s", type(exc).__name__)


class Clusters:
    """Every configured cluster, with one small thread pool per deployment in use; runs core programs.

    Clusters on one deployment (same URI and options) share its client and its thread pool;
    both are made on first use and let go when idle (see :mod:`router.storage.clients`).

    Example::

        with Clusters(load_config("clusters.yaml")) as clusters:
            timemap = clusters.load_timemap()
    """

    #: Threads per deployment for concurrent calls (writes, deletes, metadata reads).
    WORKERS_PER_CLUSTER = 4

    def __init__(
        self, config: RouterConfig, *, refresh: Callable[[], Any] | None = None, extra_options: dict[str, Any] | None = None,
        metrics: Metrics = NO_METRICS, tracing: Tracing = NO_TRACING,
    ) -> None:
        self.config = config
        self._refresh = refresh
        #: Where events go, and how spans are made (both off by default).
        self.metrics = metrics
        self.tracing = tracing
        self._by_name: dict[str, Cluster] = {}
        self._pools: dict[Deployment, ThreadPoolExecutor] = {}
        self._pools_lock = threading.Lock()
        self._worker = threading.local()  # .busy: this thread is running a sub-program on a pool
        #: The clients, one per deployment, shared by its clusters.
        self.clients = sync_deployments(config, extra_options, self._end_pools)
        #: Where live pushes go (``push:`` in clusters.yaml), or None.
        self.push = Publisher(config.push, metrics=metrics, tracing=tracing) if config.push is not None else None
        try:
            for spec in config.clusters:
                self._by_name[spec.name] = Cluster(spec, config, clients=self.clients)
        except ClusterError:
            self.close()
            raise

    def __getitem__(self, name: str) -> Cluster:
        return self._by_name[name]

    def __iter__(self) -> Iterator[Cluster]:
        return iter(self._by_name.values())

    def __len__(self) -> int:
        return len(self._by_name)

    @property
    def names(self) -> list[str]:
        """The cluster names in configuration order."""
        return list(self._by_name)

    # -- running core programs ------------------------------------------------------------

    def run(self, program: Program[T]) -> T:
        """Drive *program* to its end in this thread, answering each request; return its value."""
        reply: Any = None
        while True:
            try:
                request = program.send(reply)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]
            reply = self._answer(request)

    def record(self, event: Event) -> None:
        """Hand *event* to the metrics."""
        self.metrics.record(event)

    def _answer(self, request: Request) -> Any:
        if isinstance(request, IO_REQUESTS):
            cluster = self._by_name.get(request.cluster)
            if cluster is None:
                return unknown(request)
            op = request_op(request)
            with self.tracing.span(f"feedrouter.{op}", cluster=request.cluster, op=op):
                began = time.perf_counter()
                answer = cluster.execute(request)
            for event in observed(request, answer, time.perf_counter() - began):
                self.metrics.record(event)
            return answer
        if isinstance(request, Report):
            self.metrics.record(request.event)
            return None
        if isinstance(request, Sleep):
            time.sleep(request.seconds)
            return None
        if isinstance(request, Concurrently):
            return self._concurrently(request)
        if isinstance(request, Refresh):
            if self._refresh is None:
                return RouterError("no refresh is possible here")
            return self._refresh()
        if isinstance(request, Push):
            return None if self.push is None else self.push.send(request)
        raise TypeError(f"not a request: {request!r}")

    def _concurrently(self, request: Concurrently) -> list[Any]:
        programs, lanes = request.programs, request.lanes
        if len(programs) == 1:
            return [self.run(programs[0])]
        if getattr(self._worker, "busy", False):
            # Already on a pool's thread (a sub-program of a wave asking inbox and outbox at once): waiting here for
            # threads of the same pools, all of which may be waiting the same way, could never end. Run them here.
            futures = [_run_here(self.run, p) for p in programs]
        else:
            futures = [self._submit(lane, p) for p, lane in zip(programs, lanes)]
        results, first_error = [], None
        for future in futures:
            try:
                results.append(future.result())
            except BaseException as exc:  # let the others finish, then raise the first
                first_error = first_error or exc
                results.append(None)
        if first_error is not None:
            raise first_error
        return results

    def _pool(self, name: str) -> ThreadPoolExecutor | None:
        """Cluster *name*'s deployment's thread pool, made now if it has none (None: no such cluster)."""
        cluster = self._by_name.get(name)
        if cluster is None:
            return None
        deployment = cluster.spec.deployment
        with self._pools_lock:
            pool = self._pools.get(deployment)
            if pool is None:
                pool = self._pools[deployment] = ThreadPoolExecutor(
                    max_workers=self.WORKERS_PER_CLUSTER, thread_name_prefix=f"feed-router-{name}"
                )
            return pool

    def _end_pools(self, deployments: list[Deployment]) -> None:
        """The deployments' clients are gone: let their idle threads end (work already queued still runs)."""
        with self._pools_lock:
            pools = [p for d in deployments if (p := self._pools.pop(d, None)) is not None]
        for pool in pools:
            pool.shutdown(wait=False)

    def _submit(self, lane: str, program: Program[Any]) -> Future[Any]:
        """Run *program* on *lane*'s pool, in a copy of this context (spans and timeouts carry over)."""
        pool = self._pool(lane)
        if pool is None:
            return _failed_future(lane)
        context = contextvars.copy_context()
        try:
            return pool.submit(context.run, self._run_on_worker, program)
        except RuntimeError:  # the pool is shut down (close() raced this call): run it here; its requests fail
            return _run_here(context.run, self.run, program)

    def _run_on_worker(self, program: Program[T]) -> T:
        """:meth:`run` on a pool's thread, marked so that a nested :class:`Concurrently` runs on it (see _concurrently)."""
        self._worker.busy = True
        try:
            return self.run(program)
        finally:
            self._worker.busy = False

    # -- helpers for the operator tools --------------------------------------------------

    def each(
        self, fn: Callable[[Cluster], T], names: Sequence[str] | None = None, *, on_done: Callable[[str], None] | None = None
    ) -> dict[str, T | ClusterError]:
        """Run *fn* on each named cluster concurrently; a :class:`ClusterError` is returned, not raised.

        *on_done* is called with each cluster's name as its call finishes (progress).
        Errors other than :class:`ClusterError` propagate (they are bugs or bad input).
        """
        targets = [self._by_name[n] for n in (self._by_name if names is None else names)]
        futures = [self._pool_of(c.name).submit(fn, c) for c in targets]
        if on_done is not None:
            done = on_done
            for cluster, future in zip(targets, futures):

                def report(_future: Future[T], name: str = cluster.name) -> None:
                    done(name)

                future.add_done_callback(report)
        results: dict[str, T | ClusterError] = {}
        for cluster, future in zip(targets, futures):
            error = future.exception()
            if error is None:
                results[cluster.name] = future.result()
            elif isinstance(error, ClusterError):
                results[cluster.name] = error
            else:
                raise error
        return results

    def submit(self, name: str, fn: Callable[..., T], *args: Any) -> Future[T]:
        """Run ``fn(*args)`` on cluster *name*'s deployment's thread pool; returns a Future."""
        return self._pool_of(name).submit(fn, *args)

    def _pool_of(self, name: str) -> ThreadPoolExecutor:
        pool = self._pool(name)
        if pool is None:
            raise KeyError(name)
        return pool

    def _deadline(self) -> float:
        return deadline_in(self.config.timeout.total_seconds())

    def inspect_metadata(
        self, *, allow_missing: AnyCollection[str] = ()
    ) -> tuple[list[ClusterMeta], list[str], dict[str, ClusterError]]:
        """Read every cluster's metadata: the valid documents, every problem, and the unreachable clusters
        (see :func:`router.core.periods.metadata.inspect_metadata`)."""
        try:
            answers = self.run(read_metadata(self.names, deadline=self._deadline()))
        finally:
            self.clients.release_cold()
        return inspect_metadata(answers, self.config, allow_missing=allow_missing)

    def load_timemap(self, *, allow_missing: AnyCollection[str] = (), previous: TimeMap | None = None) -> TimeMap:
        """Read every cluster's metadata and build the time map (see :func:`router.core.periods.metadata.load_timemap`)."""
        try:
            return self.run(
                load_timemap(self.names, self.config, deadline=self._deadline(), allow_missing=allow_missing, previous=previous)
            )
        finally:
            self.clients.release_cold()

    def close(self) -> None:
        """Close every client and the thread pools."""
        with self._pools_lock:
            pools = list(self._pools.values())
            self._pools.clear()
        for pool in pools:
            pool.shutdown(wait=True, cancel_futures=True)
        for client in self.clients.drain():
            client.close()
        if self.push is not None:
            self.push.close()

    def __enter__(self) -> Clusters:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _run_here(fn: Callable[..., Any], *args: Any) -> Future[Any]:
    """``fn(*args)`` run now, on this thread, as a completed Future."""
    future: Future[Any] = Future()
    try:
        future.set_result(fn(*args))
    except BaseException as exc:
        future.set_exception(exc)
    return future


def _failed_future(lane: str) -> Future[Any]:
    future: Future[Any] = Future()
    future.set_exception(ClusterUnavailable(lane, "is not in the configuration"))
    return future
