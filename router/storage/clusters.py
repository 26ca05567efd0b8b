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
import time
from collections.abc import Callable, Iterator, Sequence
from collections.abc import Collection as AnyCollection
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

import attrs
import pymongo
from pymongo import MongoClient
from pymongo.collection import Collection
from pymongo.errors import ConfigurationError, OperationFailure, PyMongoError

from ..config import ClusterConfig, RouterConfig
from ..core.metadata import inspect_metadata, load_timemap, read_metadata
from ..core.policy import deadline_in
from ..core.steps import Concurrently, Delete, Find, Insert, Program, Refresh, Report, Request, Sleep, Update
from ..errors import ClusterUnavailable, InvalidItem, RouterError
from ..model import ClusterMeta
from ..observe import NO_METRICS, Event, Metrics
from ..observe.tracing import NO_TRACING, Tracing
from ..timemap import TimeMap
from ..uris import uri_password
from .errors import driver_error
from .requests import IORequest, call_for, failed, late, observed, request_op, time_left, unknown

__all__ = ["COMMAND_NOT_FOUND", "DEFAULT_OPTIONS", "Capabilities", "Cluster", "Clusters", "client_options", "collection_names"]

log = logging.getLogger(__name__)
T = TypeVar("T")

#: The server's error code for a command it does not know.
COMMAND_NOT_FOUND = 59
#: Driver defaults, overridden by a cluster's ``options`` in clusters.yaml. Every wait is
#: bounded: finding a server, opening a connection, each socket read; and every request
#: of a call by the call's deadline (``timeout`` in clusters.yaml). pymongo's own retry of
#: reads is off: under a deadline it retries a read until the deadline, so one dead
#: cluster would take a page's whole time; a page serves the others and owes that one.
DEFAULT_OPTIONS: dict[str, Any] = {
    "serverSelectionTimeoutMS": 5000,
    "connectTimeoutMS": 5000,
    "socketTimeoutMS": 10000,
    "retryReads": False,
    "appname": "feed-router",
}


def client_options(spec: ClusterConfig, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The keyword arguments for this cluster's client (sync or async): defaults, then its options."""
    return {**DEFAULT_OPTIONS, **spec.options, **(extra or {}), "tz_aware": True}


def collection_names(config: RouterConfig) -> dict[str, str]:
    """The configured name of each collection role the core uses."""
    return {
        "feed": config.feed_collection, "metadata": config.metadata_collection, "outbox": "outbox", "fanouts": "fanouts",
        "fanout_batches": "fanout_batches", "edits": "edits",
    }


@attrs.frozen
class Capabilities:
    """What a server can do; MongoDB-only steps check these instead of failing at random.

    ``sharded`` is true for a mongos (``hello`` answers ``msg: "isdbgrid"``);
    ``server`` is ``"ferretdb"`` or ``"mongodb"``.
    """

    sharded: bool
    server: str
    version: str


class Cluster:
    """One configured cluster: its name, client and collections.

    Example::

        cluster = Cluster(config.clusters[0], config)
        cluster.ping()
        cluster.feed.count_documents({})
    """

    def __init__(self, spec: ClusterConfig, config: RouterConfig, *, extra_options: dict[str, Any] | None = None) -> None:
        self.name = spec.name
        self.spec = spec
        #: The password of this cluster (from the URI or the options), masked in every message.
        self.secrets: tuple[str, ...] = tuple(x for x in (uri_password(spec.uri), spec.options.get("password")) if x)
        try:
            self.client: MongoClient[dict[str, Any]] = MongoClient(spec.uri, **client_options(spec, extra_options))
        except (ConfigurationError, ValueError, TypeError) as exc:
            raise self.error(exc, doing="configuring the client") from exc
        db = self.client[config.database]
        self._collections = {role: db[name] for role, name in collection_names(config).items()}
        self.feed: Collection[dict[str, Any]] = self._collections["feed"]
        self.metadata: Collection[dict[str, Any]] = self._collections["metadata"]

    def __repr__(self) -> str:
        return f"Cluster({self.name!r}, {self.spec.display_uri!r})"

    def error(self, exc: BaseException, *, doing: str) -> ClusterUnavailable:
        """:func:`driver_error` for this cluster, with its configured password masked too."""
        return driver_error(self.name, exc, doing=doing, secrets=self.secrets)

    def call(self, doing: str, fn: Callable[[], T]) -> T:
        """Run *fn*, turning any driver error into :class:`ClusterUnavailable` naming this cluster."""
        try:
            return fn()
        except PyMongoError as exc:
            raise self.error(exc, doing=doing) from exc

    def execute(self, request: IORequest) -> Any:
        """Carry out one core request within what is left of its deadline; answer with a value, never raise."""
        left = time_left(request, self.client)
        if left <= 0:
            return late(request, self.name)
        call, answer = call_for(request, self._collections[request.collection])
        try:
            with pymongo.timeout(left):
                return answer(call())
        except Exception as exc:  # driver errors become answers; anything else is re-raised by failed()
            return failed(request, exc, self.name, self.secrets)

    def ping(self) -> None:
        """Round-trip to the server; raise :class:`ClusterUnavailable` if it does not answer."""
        self.call("ping", lambda: self.client.admin.command("ping"))

    def capabilities(self) -> Capabilities:
        """Ask the server what it is (``hello``, or ``isMaster`` where ``hello`` is unknown, and ``buildInfo``)."""
        try:
            hello = self.client.admin.command("hello")
        except OperationFailure as exc:
            if exc.code != COMMAND_NOT_FOUND:  # servers before MongoDB 4.4, mongo-java-server: no `hello`
                raise self.error(exc, doing="hello") from exc
            hello = self.call("isMaster", lambda: self.client.admin.command("isMaster"))
        except PyMongoError as exc:
            raise self.error(exc, doing="hello") from exc
        info = self.call("buildInfo", lambda: self.client.admin.command("buildInfo"))
        ferret = "ferretdbVersion" in info
        return Capabilities(
            sharded=hello.get("msg") == "isdbgrid",
            server="ferretdb" if ferret else "mongodb",
            version=str(info.get("ferretdbVersion") if ferret else info.get("version")),
        )

    def metadata_documents(self) -> list[dict[str, Any]]:
        """Every document in this cluster's metadata collection (a valid cluster has one)."""
        return self.call("reading metadata", lambda: list(self.metadata.find({}, limit=10)))

    def write_meta(self, meta: ClusterMeta) -> None:
        """Store *meta* as this cluster's metadata document (upsert on ``_id``)."""
        if meta.name != self.name:
            raise InvalidItem("name", f"must be the cluster's name {self.name!r} (got {meta.name!r})")
        doc = meta.to_document()
        self.call("writing metadata", lambda: self.metadata.replace_one({"_id": doc["_id"]}, doc, upsert=True))

    def close(self) -> None:
        """Close the client's connections."""
        self.client.close()


class Clusters:
    """Every configured cluster, with one small thread pool each; runs core programs.

    Example::

        with Clusters(load_config("clusters.yaml")) as clusters:
            timemap = clusters.load_timemap()
    """

    #: Threads per cluster for concurrent calls (writes, deletes, metadata reads).
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
        self._pools: dict[str, ThreadPoolExecutor] = {}
        try:
            for spec in config.clusters:
                self._by_name[spec.name] = Cluster(spec, config, extra_options=extra_options)
        except ClusterUnavailable:
            self.close()
            raise
        self._pools = {
            name: ThreadPoolExecutor(max_workers=self.WORKERS_PER_CLUSTER, thread_name_prefix=f"feed-router-{name}")
            for name in self._by_name
        }

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
        if isinstance(request, (Find, Insert, Delete, Update)):
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
        raise TypeError(f"not a request: {request!r}")

    def _concurrently(self, request: Concurrently) -> list[Any]:
        programs, lanes = request.programs, request.lanes
        if len(programs) == 1:
            return [self.run(programs[0])]
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

    def _submit(self, lane: str, program: Program[Any]) -> Future[Any]:
        """Run *program* on *lane*'s pool, in a copy of this context (spans and timeouts carry over)."""
        pool = self._pools.get(lane)
        if pool is None:
            return _failed_future(lane)
        context = contextvars.copy_context()
        try:
            return pool.submit(context.run, self.run, program)
        except RuntimeError:  # the pool is shut down (close() raced this call): run it here; its requests fail
            future: Future[Any] = Future()
            try:
                future.set_result(context.run(self.run, program))
            except BaseException as exc:
                future.set_exception(exc)
            return future

    # -- helpers for the operator tools --------------------------------------------------

    def each(
        self, fn: Callable[[Cluster], T], names: Sequence[str] | None = None, *, on_done: Callable[[str], None] | None = None
    ) -> dict[str, T | ClusterUnavailable]:
        """Run *fn* on each named cluster concurrently; a :class:`ClusterUnavailable` is returned, not raised.

        *on_done* is called with each cluster's name as its call finishes (progress).
        Errors other than :class:`ClusterUnavailable` propagate (they are bugs or bad input).
        """
        targets = [self._by_name[n] for n in (self._by_name if names is None else names)]
        futures = [self._pools[c.name].submit(fn, c) for c in targets]
        if on_done is not None:
            done = on_done
            for cluster, future in zip(targets, futures):

                def report(_future: Future[T], name: str = cluster.name) -> None:
                    done(name)

                future.add_done_callback(report)
        results: dict[str, T | ClusterUnavailable] = {}
        for cluster, future in zip(targets, futures):
            error = future.exception()
            if error is None:
                results[cluster.name] = future.result()
            elif isinstance(error, ClusterUnavailable):
                results[cluster.name] = error
            else:
                raise error
        return results

    def submit(self, name: str, fn: Callable[..., T], *args: Any) -> Future[T]:
        """Run ``fn(*args)`` on cluster *name*'s own thread pool; returns a Future."""
        return self._pools[name].submit(fn, *args)

    def _deadline(self) -> float:
        return deadline_in(self.config.timeout.total_seconds())

    def inspect_metadata(
        self, *, allow_missing: AnyCollection[str] = ()
    ) -> tuple[list[ClusterMeta], list[str], dict[str, ClusterUnavailable]]:
        """Read every cluster's metadata: the valid documents, every problem, and the unreachable clusters
        (see :func:`router.core.metadata.inspect_metadata`)."""
        answers = self.run(read_metadata(self.names, deadline=self._deadline()))
        return inspect_metadata(answers, self.config, allow_missing=allow_missing)

    def load_timemap(self, *, allow_missing: AnyCollection[str] = (), previous: TimeMap | None = None) -> TimeMap:
        """Read every cluster's metadata and build the time map (see :func:`router.core.metadata.load_timemap`)."""
        return self.run(
            load_timemap(self.names, self.config, deadline=self._deadline(), allow_missing=allow_missing, previous=previous)
        )

    def close(self) -> None:
        """Close every client and the thread pools."""
        for pool in self._pools.values():
            pool.shutdown(wait=True, cancel_futures=True)
        for c in self._by_name.values():
            c.close()

    def __enter__(self) -> Clusters:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _failed_future(lane: str) -> Future[Any]:
    future: Future[Any] = Future()
    future.set_exception(ClusterUnavailable(lane, "is not in the configuration"))
    return future
