"""Clients per deployment: made on first use, shared by every period on the deployment, closed when idle.

A deployment is a URI with its driver options (:attr:`ClusterConfig.deployment`); the
periods stored on one deployment (a database each) share one client. The sync and the
async storage keep their clients here; only how a client is made and closed differs.

Every client is made with ``connect=False``: no thread, socket or task until its first
command. There are two kinds:

* **hot**, made by the first request for a feed, outbox or checkpoint on the deployment
  (the periods in use): the driver's full monitoring. It is closed once no such request
  has used it for ``clients.idle_close``, counted from the end of the last one (looked at
  whenever a client is asked for, so at least at every metadata refresh), and made again
  by the next request. Counting from the end matters when a deployment is down: each
  request then waits for a server as long as it may, and a client counted idle from the
  request's start was closed, and made again, between one failed request and the next.
* **cold**, for metadata reads on a deployment without a hot client (start-up, and the
  refresh of periods nobody reads or writes): cheap monitoring (:data:`COLD_OPTIONS`:
  one polling monitor, a heartbeat a minute), closed when the metadata load that used it
  ends (:meth:`Deployments.release_cold`).

A client in use (between :meth:`Deployments.acquire` and :meth:`Deployments.release`) is
never closed. Metadata reads do not keep a hot client alive: a refresh every minute would
otherwise hold every deployment's client forever.

Example::

    clients = Deployments(make, closed, idle_close=600.0)
    client = clients.acquire(spec, data=True)
    try:
        client[database].feed.find_one()
    finally:
        clients.release(spec, client)
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Generic, TypeVar

import attrs
from pymongo.errors import ConfigurationError

from ..config import ClusterConfig, Deployment, RouterConfig
from ..uris import uri_password
from .errors import driver_error

__all__ = [
    "COLD_OPTIONS", "DEFAULT_OPTIONS", "Collections", "Deployments", "OpenClient", "client_maker", "client_options",
    "collection_names", "secrets_of",
]

C = TypeVar("C")

#: Driver options of a cold client: one polling monitor thread (no streaming or RTT
#: monitor) checking once a minute; it lives for one metadata load.
COLD_OPTIONS: Mapping[str, Any] = {"serverMonitoringMode": "poll", "heartbeatFrequencyMS": 60_000}


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


def client_options(spec: ClusterConfig, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The keyword arguments for this cluster's client (sync or async): defaults, its options, then *extra*.

    Clients connect on their first command (``connect=False``).
    """
    return {**DEFAULT_OPTIONS, **spec.options, **(extra or {}), "tz_aware": True, "connect": False}


def collection_names(config: RouterConfig) -> dict[str, str]:
    """The configured name of each collection role the core uses."""
    return {
        "feed": config.feed_collection, "metadata": config.metadata_collection, "outbox": "outbox", "fanouts": "fanouts",
        "fanout_batches": "fanout_batches", "fanout_sent": "fanout_sent", "seen": "seen", "edits": "edits",
        "posts": "posts", "erasures": "erasures",
    }



def secrets_of(spec: ClusterConfig) -> tuple[str, ...]:
    """The passwords of *spec* (from the URI or the options), masked in every message about it."""
    return tuple(x for x in (uri_password(spec.uri), spec.options.get("password")) if x)


def client_maker(factory: Callable[..., C], extra_options: Mapping[str, Any] | None) -> Callable[[ClusterConfig, Mapping[str, Any]], C]:
    """``make(spec, mode)`` for :class:`Deployments`: ``factory`` (``MongoClient`` or ``AsyncMongoClient``) with
    :func:`client_options`; a bad option raises :class:`~router.errors.ClusterUnavailable` naming the cluster."""

    def make(spec: ClusterConfig, mode: Mapping[str, Any]) -> C:
        try:
            return factory(spec.uri, **client_options(spec, {**(extra_options or {}), **mode}))
        except (ConfigurationError, ValueError, TypeError) as exc:
            raise driver_error(spec.name, exc, doing="configuring the client", secrets=secrets_of(spec)) from exc

    return make


class Collections:
    """One cluster's collections (by role) on whichever client serves its deployment now, kept per client.

    Each collection object is made when its role is first asked for: start-up reads only
    ``metadata``, and making all seven roles for each of a thousand periods was 8% of the
    async router's start-up CPU (measured with py-spy).
    """

    def __init__(self, database: str, config: RouterConfig) -> None:
        self.database = database
        self._names = collection_names(config)
        self._cached: tuple[Any, _Roles] = (None, _Roles(None, self._names))

    def on(self, client: Any) -> dict[str, Any]:
        """The collections on *client* (``MongoClient`` or ``AsyncMongoClient``), by role, each made on first use."""
        cached_client, collections = self._cached
        if cached_client is not client:
            collections = _Roles(client[self.database], self._names)
            self._cached = (client, collections)
        return collections


class _Roles(dict[str, Any]):
    """Collections by role on one database, each made when first looked up."""

    def __init__(self, db: Any, names: Mapping[str, str]) -> None:
        super().__init__()
        self._db = db
        self._names = names

    def __missing__(self, role: str) -> Any:
        collection = self[role] = self._db[self._names[role]]
        return collection


@attrs.frozen
class OpenClient:
    """One client that is open now: its deployment (URI shown without password), its kind, whether in use."""

    uri: str
    kind: str
    in_use: bool


@attrs.define
class _Slot(Generic[C]):
    spec: ClusterConfig
    hot: C | None = None
    cold: C | None = None
    hot_users: int = 0
    cold_users: int = 0
    hot_used_at: float = 0.0
    cold_used_at: float = 0.0


class Deployments(Generic[C]):
    """The clients of every deployment, made on demand with ``make(spec, extra_options)``.

    *closed* receives the clients let go (to close them: the caller decides how and where)
    and the deployments left with no client at all (the sync storage ends their threads).
    """

    def __init__(
        self, make: Callable[[ClusterConfig, Mapping[str, Any]], C],
        closed: Callable[[list[C], list[Deployment]], None], *, idle_close: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._make = make
        self._closed = closed
        self.idle_close = idle_close
        self._clock = clock
        self._lock = threading.Lock()
        self._slots: dict[Deployment, _Slot[C]] = {}
        self._deployments: dict[str, tuple[ClusterConfig, Deployment]] = {}
        self._next_look = 0.0

    def prepare(self, spec: ClusterConfig) -> None:
        """Make *spec*'s deployment's cold client now (still unconnected), so a bad option fails here."""
        with self._lock:
            slot = self._slot(spec)
            if slot.hot is None and slot.cold is None:
                slot.cold = self._make(spec, COLD_OPTIONS)
                slot.cold_used_at = self._clock()

    def acquire(self, spec: ClusterConfig, *, data: bool) -> C:
        """The client to send one request with; pair it with :meth:`release`.

        *data* requests (feed, outbox, checkpoints) get the hot client, made if needed;
        metadata reads get the hot client if there is one, else the cold one.
        """
        gone: list[C] = []
        emptied: list[Deployment] = []
        with self._lock:
            now = self._clock()
            slot = self._slot(spec)
            client: C
            if data or slot.hot is not None:
                if slot.hot is None:
                    slot.hot = self._make(spec, {})
                client = slot.hot
                slot.hot_users += 1
                if data:
                    slot.hot_used_at = now
            else:
                if slot.cold is None:
                    slot.cold = self._make(spec, COLD_OPTIONS)
                client = slot.cold
                slot.cold_users += 1
                slot.cold_used_at = now
            if now >= self._next_look:
                self._next_look = now + min(self.idle_close / 4, 1.0)
                gone, emptied = self._let_go(lambda s: (
                    s.hot_users == 0 and now - s.hot_used_at > self.idle_close,
                    s.cold_users == 0 and now - s.cold_used_at > self.idle_close,
                ))
        if gone:
            self._closed(gone, emptied)
        return client

    @contextlib.contextmanager
    def using(self, spec: ClusterConfig, collection: str) -> Iterator[C]:
        """The client for one request on *collection* (a data request unless it is the metadata), held while in use."""
        data = collection != "metadata"
        client = self.acquire(spec, data=data)
        try:
            yield client
        finally:
            self.release(spec, client, data=data)

    def release(self, spec: ClusterConfig, client: C, *, data: bool = True) -> None:
        """*client* is no longer used by the request that acquired it (a *data* request, as for :meth:`acquire`):
        its idle time starts now."""
        with self._lock:
            slot = self._slots.get(self._deployment(spec))
            if slot is None:
                return
            if client is slot.hot:
                slot.hot_users -= 1
                if data:
                    slot.hot_used_at = self._clock()
            elif client is slot.cold:
                slot.cold_users -= 1
                slot.cold_used_at = self._clock()

    def release_cold(self) -> None:
        """Let every cold client not in use go (a metadata load has ended)."""
        with self._lock:
            gone, emptied = self._let_go(lambda s: (False, s.cold_users == 0))
        if gone:
            self._closed(gone, emptied)

    def drain(self) -> list[C]:
        """Forget every client and return them (to close them all: the storage is closing)."""
        with self._lock:
            out = [c for s in self._slots.values() for c in (s.hot, s.cold) if c is not None]
            self._slots.clear()
        return out

    def has_client(self, deployment: Deployment) -> bool:
        """Whether *deployment* has a client now (hot or cold)."""
        with self._lock:
            slot = self._slots.get(deployment)
            return slot is not None and (slot.hot is not None or slot.cold is not None)

    def open(self) -> list[OpenClient]:
        """The clients open now, hot ones first (for tests, the benchmark and ``status``)."""
        with self._lock:
            hot = [OpenClient(s.spec.display_uri, "hot", s.hot_users > 0) for s in self._slots.values() if s.hot is not None]
            cold = [OpenClient(s.spec.display_uri, "cold", s.cold_users > 0) for s in self._slots.values() if s.cold is not None]
        return hot + cold

    def _slot(self, spec: ClusterConfig) -> _Slot[C]:
        deployment = self._deployment(spec)
        slot = self._slots.get(deployment)
        if slot is None:
            slot = self._slots[deployment] = _Slot(spec)
        return slot

    def _deployment(self, spec: ClusterConfig) -> Deployment:
        """``spec.deployment``, worked out once per spec (it sorts the options: twice a request adds up)."""
        known = self._deployments.get(spec.name)
        if known is None or known[0] is not spec:
            known = self._deployments[spec.name] = (spec, spec.deployment)
        return known[1]

    def _let_go(self, which: Callable[[_Slot[C]], tuple[bool, bool]]) -> tuple[list[C], list[Deployment]]:
        """Take out the hot and cold clients *which* picks (called under the lock)."""
        gone: list[C] = []
        emptied: list[Deployment] = []
        for deployment, slot in self._slots.items():
            hot, cold = which(slot)
            if hot and slot.hot is not None:
                gone.append(slot.hot)
                slot.hot = None
            if cold and slot.cold is not None:
                gone.append(slot.cold)
                slot.cold = None
            if (hot or cold) and slot.hot is None and slot.cold is None:
                emptied.append(deployment)
        return gone, emptied
