"""Connections to the configured clusters, and what each one says about itself.

One :class:`pymongo.MongoClient` per cluster (clients are thread-safe and pool
their connections). :class:`Clusters` loads every cluster's ``metadata``
document concurrently and builds the :class:`~router.timemap.TimeMap`, reporting
every problem at once. Driver errors leave this module as
:class:`~router.errors.ClusterUnavailable` naming the cluster, never its URI.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from collections.abc import Collection as AnyCollection
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

import attrs
from pymongo import MongoClient
from pymongo.collection import Collection
from bson import ObjectId
from pymongo.errors import ConfigurationError, OperationFailure, PyMongoError

from .config import ClusterConfig, RouterConfig, redact_uri, uri_password
from .errors import ClusterUnavailable, InvalidItem, MetadataError
from .model import ClusterMeta
from .timemap import TimeMap

__all__ = ["Cluster", "Clusters", "Capabilities", "driver_error", "DUPLICATE_KEY", "TRANSIENT_WRITE_CODES"]

#: FerretDB (SQLite backend) error text for a statement with more than 32,766 parameters.
_TOO_MANY_VARIABLES = "too many SQL variables"
#: The server's duplicate key error code.
DUPLICATE_KEY = 11000
#: The server's error code for a command it does not know.
COMMAND_NOT_FOUND = 59
#: Write error codes that mean "try again": not primary, step-down, shutdown, interrupted.
TRANSIENT_WRITE_CODES = frozenset({91, 189, 10107, 11600, 11602, 13435, 13436})

log = logging.getLogger(__name__)
T = TypeVar("T")

#: Driver defaults, overridden by a cluster's ``options`` in clusters.yaml. Every
#: wait is bounded: finding a server, opening a connection, and each socket read.
DEFAULT_OPTIONS: dict[str, Any] = {
    "serverSelectionTimeoutMS": 5000,
    "connectTimeoutMS": 5000,
    "socketTimeoutMS": 10000,
    "appname": "feed-router",
}


def driver_error(cluster: str, exc: BaseException, *, doing: str, secrets: Sequence[str] = ()) -> ClusterUnavailable:
    """A :class:`ClusterUnavailable` for a driver error, with any URI password redacted.

    *secrets* (the cluster's configured password) are masked word for word as well.
    Raise it ``from exc`` so the driver's traceback stays attached.
    """
    text = redact_uri(str(exc).split("\n", 1)[0])
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    if len(text) > 300:
        text = text[:297] + "..."
    return ClusterUnavailable(cluster, f"{doing} failed: {type(exc).__name__}: {text}")


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

    def __init__(self, spec: ClusterConfig, config: RouterConfig) -> None:
        self.name = spec.name
        self.spec = spec
        #: The password of this cluster (from the URI or the options), masked in every message.
        self.secrets: tuple[str, ...] = tuple(x for x in (uri_password(spec.uri), spec.options.get("password")) if x)
        options = {**DEFAULT_OPTIONS, **spec.options, "tz_aware": True}
        try:
            self.client: MongoClient[dict[str, Any]] = MongoClient(spec.uri, **options)
        except (ConfigurationError, ValueError, TypeError) as exc:
            raise self.error(exc, doing="configuring the client") from exc
        db = self.client[config.database]
        self.feed: Collection[dict[str, Any]] = db[config.feed_collection]
        self.metadata: Collection[dict[str, Any]] = db[config.metadata_collection]

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

    def delete_copies(self, data_key: str) -> int:
        """Delete every feed document with *data_key*; return how many.

        FerretDB's SQLite backend refuses a delete matching more than 32,766 documents
        ("too many SQL variables"). On that error only, the copies are deleted in
        ``_id`` ranges, each range halved until it fits. MongoDB never takes this path.
        """
        try:
            return int(self.feed.delete_many({"data_key": data_key}).deleted_count)
        except OperationFailure as exc:
            if _TOO_MANY_VARIABLES not in str(exc):
                raise self.error(exc, doing="delete_many") from exc
        except PyMongoError as exc:
            raise self.error(exc, doing="delete_many") from exc
        log.info("cluster %s: too many copies of %s for one delete on this server; deleting in _id ranges", self.name, data_key)

        def bound(sort: int) -> int | None:
            doc = self.call("finding copies", lambda: self.feed.find_one({"data_key": data_key}, sort=[("_id", sort)], projection={"_id": 1}))
            return None if doc is None else int.from_bytes(doc["_id"].binary, "big")

        low, high = bound(1), bound(-1)
        if low is None or high is None:
            return 0
        deleted, ranges = 0, [(low, high)]
        while ranges:
            lo, hi = ranges.pop()
            query = {"data_key": data_key, "_id": {"$gte": ObjectId(lo.to_bytes(12, "big")), "$lte": ObjectId(hi.to_bytes(12, "big"))}}
            try:
                deleted += int(self.feed.delete_many(query).deleted_count)
            except OperationFailure as exc:
                if _TOO_MANY_VARIABLES not in str(exc) or lo >= hi:
                    raise self.error(exc, doing="delete_many by _id range") from exc
                mid = (lo + hi) // 2
                ranges += [(lo, mid), (mid + 1, hi)]
            except PyMongoError as exc:
                raise self.error(exc, doing="delete_many by _id range") from exc
        return deleted

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
    """Every configured cluster, with a thread pool to ask them all at once.

    Example::

        with Clusters(load_config("clusters.yaml")) as clusters:
            timemap = clusters.load_timemap()
    """

    #: Threads per cluster for concurrent calls (writes, deletes, metadata reads).
    WORKERS_PER_CLUSTER = 4

    def __init__(self, config: RouterConfig) -> None:
        self.config = config
        self._by_name: dict[str, Cluster] = {}
        self._pools: dict[str, ThreadPoolExecutor] = {}
        try:
            for spec in config.clusters:
                self._by_name[spec.name] = Cluster(spec, config)
        except ClusterUnavailable:
            self.close()
            raise
        # One small pool per cluster: a slow or hung cluster ties up only its own threads.
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

    def each(
        self, fn: Callable[[Cluster], T], names: Sequence[str] | None = None, *, on_done: Callable[[str], None] | None = None
    ) -> dict[str, T | ClusterUnavailable]:
        """Run *fn* on each named cluster concurrently; a failure is returned, not raised.

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

    def inspect_metadata(
        self, *, allow_missing: AnyCollection[str] = ()
    ) -> tuple[list[ClusterMeta], list[str], dict[str, ClusterUnavailable]]:
        """Read every cluster's metadata: the valid documents, every problem, and the unreachable clusters.

        Clusters named in *allow_missing* or listed as rollover standbys may have no
        metadata yet. Problems are: no or several metadata documents, an ``_id`` that
        is not the configured name, a malformed field, and (when every document is
        well-formed) overlapping periods or more than one open-ended period.
        """
        standby = set(self.config.rollover.standby) if self.config.rollover else set()
        optional = standby | set(allow_missing)
        answers = self.each(lambda c: c.metadata_documents())
        down = {n: r for n, r in answers.items() if isinstance(r, ClusterUnavailable)}
        problems: list[str] = []
        metas: list[ClusterMeta] = []
        coll = f"{self.config.database}.{self.config.metadata_collection}"
        for name, docs in answers.items():
            if isinstance(docs, ClusterUnavailable):
                continue
            if not docs:
                if name not in optional:
                    problems.append(f"cluster {name!r}: no metadata document in {coll}")
                continue
            if len(docs) > 1:
                ids = ", ".join(repr(d.get("_id")) for d in docs)
                problems.append(f"cluster {name!r}: {len(docs)} metadata documents in {coll} (expected one; _ids {ids})")
                continue
            doc = docs[0]
            if doc.get("_id") != name:
                problems.append(
                    f"cluster {name!r}: metadata _id {doc.get('_id')!r} does not match the configured name {name!r}"
                )
                continue
            try:
                metas.append(ClusterMeta.from_document(doc))
            except (InvalidItem, TypeError, ValueError) as exc:
                problems.append(f"cluster {name!r}: metadata.{exc}")
        if not problems:
            problems = TimeMap.problems(metas)
        return metas, problems, down

    def load_timemap(self, *, allow_missing: AnyCollection[str] = (), previous: TimeMap | None = None) -> TimeMap:
        """Read every cluster's metadata and build the time map (see :meth:`inspect_metadata`).

        With *previous* (a refresh), a cluster that does not answer keeps the period it
        had in *previous*, so one dead cluster does not freeze every router's map; its
        own metadata cannot have been changed by anyone meanwhile without reaching it.
        Otherwise raises :class:`ClusterUnavailable` naming every unreachable cluster,
        and :class:`MetadataError` listing every problem.
        """
        metas, problems, down = self.inspect_metadata(allow_missing=allow_missing)
        if down and previous is not None:
            kept = [m for m in previous.periods if m.name in down]
            log.warning(
                "metadata refresh: %s did not answer; keeping their last known periods", ", ".join(sorted(down))
            )
            metas += kept
            problems = problems or TimeMap.problems(metas)
            down = {}
        if down:
            first = next(iter(down.values()))
            if len(down) == 1:
                raise first
            raise ClusterUnavailable(
                ", ".join(down), "unreachable: " + "; ".join(str(e) for e in down.values())
            ) from first
        if problems:
            raise MetadataError(problems)
        timemap = TimeMap(metas)
        for end, start in timemap.gaps:
            log.warning("time map has a gap from %s to %s: writes in it will fail", end.isoformat(), start.isoformat())
        return timemap

    def close(self) -> None:
        """Close every client and the thread pool."""
        for pool in self._pools.values():
            pool.shutdown(wait=True, cancel_futures=True)
        for c in self._by_name.values():
            c.close()

    def __enter__(self) -> Clusters:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
