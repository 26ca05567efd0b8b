"""FeedRouter: write, read and delete feed items across clusters split by time.

Use it when one MongoDB cluster per period of ``event_time`` holds all feeds
(fan-out on write, one copy per receiver). Do not use it for data whose reads
are not "newest first for one receiver": every other query would touch every
cluster.

Example::

    with FeedRouter.from_yaml("clusters.yaml") as router:
        oid = router.write(FeedItem(receiver_id=7, sender_id=3, event_time=now, type=1,
                                    data={"fabula_id": 42}, data_key=data_key("fabula", 42)))
        page = router.read(7, limit=20)
        more = router.read(7, limit=20, cursor=page.next_cursor)
        router.delete(data_key("fabula", 42))
"""

from __future__ import annotations

import gc
import logging
import random
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal, overload

import attrs
from bson import ObjectId
from pymongo.errors import (
    AutoReconnect,
    BulkWriteError,
    NetworkTimeout,
    PyMongoError,
    ServerSelectionTimeoutError,
)

from .clusters import DUPLICATE_KEY, TRANSIENT_WRITE_CODES, Cluster, Clusters
from .config import RouterConfig, load_config
from .cursor import CursorState, Position, check_state, decode_state, encode_state
from .fanout import Active, Activity, FanOutExecutor, FanOutHandle, FanOutResult
from .fanout import fan_out as _fan_out
from .errors import ClusterUnavailable, DeleteFailed, InvalidItem, RouterError, StaleMetadata, WriteFailed
from .ids import make_ids
from .model import FeedItem, Page, check_item, is_id, is_text
from .timemap import TimeMap

__all__ = ["FeedRouter", "Prepared", "MAX_PAGE"]

log = logging.getLogger(__name__)
UTC = timezone.utc
#: The largest page a single read returns.
MAX_PAGE = 1000
_DUPLICATE_KEY = DUPLICATE_KEY
_TRANSIENT_CODES = TRANSIENT_WRITE_CODES
_SORT = [("event_time", -1), ("_id", -1)]


def _utcnow() -> datetime:
    return datetime.now(UTC)


def _fresh_id(old: ObjectId) -> ObjectId:
    """A new id for the same event second as *old*."""
    return make_ids([int.from_bytes(old.binary[:4], "big")])[0]


@attrs.frozen
class Prepared:
    """Items checked, routed and turned into documents: ``ids`` in input order, and per
    cluster the input indexes and the documents to insert, in the same order."""

    ids: list[ObjectId]
    batches: dict[str, tuple[list[int], list[dict[str, Any]]]]


@attrs.frozen
class _Loaded:
    """A time map and the moment its load began: read and replaced together."""

    timemap: TimeMap
    at: datetime


class _PastHorizon(Exception):
    """Item ``index`` lies past what the time map can vouch for (internal: triggers a refresh)."""

    def __init__(self, index: int) -> None:
        self.index = index


class FeedRouter:
    """Routes feed writes, reads and deletes to the cluster that owns each ``event_time``.

    Example::

        router = FeedRouter.from_yaml("clusters.yaml")
        router.write_many(items)                  # grouped per cluster, clusters in parallel
        page = router.read(receiver_id, limit=50) # newest first, fewest clusters touched
        router.close()

    Construction connects to every cluster and loads the time map; a bad
    configuration or metadata fails here, not at the first write. A daemon thread
    then reloads the map every ``refresh_interval`` (``refresh=False`` turns it
    off) until :meth:`close`. *clock* (for tests) tells the router what "now" is.

    With ``rollover`` configured, a map refreshed at time R is trusted for
    ``event_time`` before ``R + lead_time``; a write in the open-ended period (or in
    no period) at or past that horizon triggers one refresh and then raises
    :class:`StaleMetadata` if it is still past it.
    """

    def __init__(
        self, config: RouterConfig, *, clock: Callable[[], datetime] = _utcnow, refresh: bool = True
    ) -> None:
        self.config = config
        self._clock = clock
        self._clusters = Clusters(config)
        self._refresh_lock = threading.Lock()
        started = clock()
        try:
            self._loaded = _Loaded(self._clusters.load_timemap(), started)
        except BaseException:
            self._clusters.close()
            raise
        log.info("time map loaded from %d clusters:\n%s", len(self._clusters), self._loaded.timemap.describe())
        #: Background fan-outs: a bounded pool of jobs (see :mod:`router.fanout`); closed by :meth:`close`.
        self.fanouts = FanOutExecutor(self._clusters, lambda: self._loaded.timemap)
        self._stop = threading.Event()
        self._refresher: threading.Thread | None = None
        if refresh:
            self._refresher = threading.Thread(target=self._refresh_loop, name="feed-router-refresh", daemon=True)
            self._refresher.start()

    @classmethod
    def from_yaml(
        cls, path: str | Path = "clusters.yaml", *, clock: Callable[[], datetime] = _utcnow, refresh: bool = True
    ) -> FeedRouter:
        """Load ``clusters.yaml``, connect to every cluster and build the time map."""
        return cls(load_config(path), clock=clock, refresh=refresh)

    @property
    def timemap(self) -> TimeMap:
        """The time map in use (replaced as a whole by :meth:`refresh`)."""
        return self._loaded.timemap

    @property
    def clusters(self) -> Clusters:
        """The configured clusters and their clients."""
        return self._clusters

    @property
    def refreshed_at(self) -> datetime:
        """When the load of the map in use began (by the router's clock)."""
        return self._loaded.at

    def refresh(self) -> TimeMap:
        """Reload every cluster's metadata; the old map stays in use if this raises.

        A cluster that does not answer keeps its last known period. The map and the
        time its load began are replaced together, and never by an older load.
        """
        with self._refresh_lock:
            started = self._clock()
            timemap = self._clusters.load_timemap(previous=self._loaded.timemap)
            if started >= self._loaded.at:
                self._loaded = _Loaded(timemap, started)
            return self._loaded.timemap

    def _refresh_loop(self) -> None:
        interval = self.config.refresh_interval.total_seconds()
        while not self._stop.wait(interval):
            try:
                self.refresh()
            except RouterError as exc:
                log.warning("metadata refresh failed; keeping the map loaded at %s: %s", self._loaded.at.isoformat(), exc)

    def stop_refresh(self) -> None:
        """Stop the background refresh (the map stays as it is)."""
        self._stop.set()
        if self._refresher is not None:
            self._refresher.join()
            self._refresher = None

    def _horizon(self, loaded: _Loaded) -> float:
        """UTC epoch seconds up to which *loaded*'s open-ended period can be trusted (infinite without rollover)."""
        rollover = self.config.rollover
        if rollover is None:
            return float("inf")
        return loaded.at.timestamp() + rollover.lead_time.total_seconds()

    # -- writes -------------------------------------------------------------------------

    def write(self, item: FeedItem) -> ObjectId:
        """Store one item in the cluster owning its ``event_time``; return its ``_id``.

        Raises :class:`InvalidItem`, :class:`NoClusterForTime` or :class:`ClusterUnavailable`.
        """
        try:
            return self._write((item,), indexed=False)[0]
        except WriteFailed as exc:
            raise exc.failed[0] from exc

    def write_many(self, items: Iterable[FeedItem]) -> list[ObjectId]:
        """Store every item; return their ``_id``\\ s in the order given.

        All items are checked and routed before anything is written: one invalid
        item (:class:`InvalidItem`) or one that no period owns
        (:class:`NoClusterForTime`) rejects the whole call and changes no cluster.
        Items are then grouped per cluster and sent as unordered ``insert_many``
        batches of ``write.batch_size``, different clusters concurrently. If some
        are not written, :class:`WriteFailed` says which (by index) and why; the
        others are stored.
        """
        if not isinstance(items, (list, tuple)):
            try:
                items = list(items)
            except TypeError:
                raise InvalidItem("items", f"must be an iterable of FeedItem (got {type(items).__name__})") from None
        return self._write(items, indexed=True)

    def prepare(self, items: Sequence[FeedItem]) -> Prepared:
        """The write path without I/O: check every item, route it, make its ``_id``, build its document.

        Raises what :meth:`write_many` raises for bad input, plus :class:`StaleMetadata`
        for an item past the map's horizon (:meth:`write_many` refreshes once first).
        Useful to measure the router's own CPU cost, and to inspect where items would go.
        """
        try:
            return self._prepare(items, indexed=True)
        except _PastHorizon as past:
            raise self._stale(items, past.index, indexed=True) from None

    def _prepare(self, seq: Sequence[FeedItem], *, indexed: bool) -> Prepared:
        # The loop allocates a dict per item and no reference cycles; the cyclic garbage
        # collector would otherwise rescan the growing batch over and over (measured: a
        # third of the cost at 100k items). It is paused for this loop only.
        paused = gc.isenabled()
        gc.disable()
        try:
            return self._prepare_unpaused(seq, indexed=indexed)
        finally:
            if paused:
                gc.enable()

    def _prepare_unpaused(self, seq: Sequence[FeedItem], *, indexed: bool) -> Prepared:
        loaded = self._loaded  # one read: the map and its horizon belong together
        timemap = loaded.timemap
        locate = timemap.locate
        retired = timemap.retired
        horizon = self._horizon(loaded)
        open_period = timemap.open_period
        open_name = open_period.name if open_period is not None else None
        batches: dict[str, tuple[list[int], list[dict[str, Any]]]] = {}
        seconds: list[int] = []
        documents: list[dict[str, Any]] = []
        add_second = seconds.append
        add_document = documents.append
        name, lo, hi = "", 1.0, 0.0  # the period of the previous item
        indexes: list[int] = []
        docs: list[dict[str, Any]] = []
        for i, item in enumerate(seq):
            ts = check_item(item, i if indexed else None)
            if not lo <= ts < hi:
                found = locate(ts)
                if found is None or found[0] in retired:
                    if found is None and ts >= horizon:
                        raise _PastHorizon(i)  # a period this map has not heard of may own it
                    raise timemap.no_cluster(item.event_time, index=i if indexed else None)
                name, lo, hi = found
                batch = batches.get(name)
                if batch is None:
                    batch = batches[name] = ([], [])
                indexes, docs = batch
            if ts >= horizon and name == open_name:
                raise _PastHorizon(i)
            doc: dict[str, Any] = {
                "_id": None,  # filled below, once the ids of the whole call are made
                "data_key": item.data_key,
                "receiver_id": item.receiver_id,
                "sender_id": item.sender_id,
                "event_time": item.event_time,
                "type": item.type,
                "data": item.data,
            }
            add_second(int(ts))
            add_document(doc)
            indexes.append(i)
            docs.append(doc)
        ids = make_ids(seconds)
        for doc, oid in zip(documents, ids):
            doc["_id"] = oid
        return Prepared(ids=ids, batches=batches)

    def _write(self, seq: Sequence[FeedItem], *, indexed: bool, refreshed: bool = False) -> list[ObjectId]:
        try:
            prepared = self._prepare(seq, indexed=indexed)
        except _PastHorizon as past:
            return self._write_after_refresh(seq, past.index, indexed=indexed, refreshed=refreshed)
        ids = prepared.ids
        if not prepared.batches:
            return ids
        failed: dict[int, BaseException] = {}
        outcomes: list[tuple[dict[int, BaseException], dict[int, ObjectId]]]
        if len(prepared.batches) == 1:
            ((name, (idx, docs)),) = prepared.batches.items()
            outcomes = [self._insert(self._clusters[name], idx, docs)]
        else:
            futures = [
                self._clusters.submit(n, self._insert, self._clusters[n], idx, docs)
                for n, (idx, docs) in prepared.batches.items()
            ]
            outcomes = [f.result() for f in futures]
        for cluster_failed, replaced in outcomes:
            failed.update(cluster_failed)
            for i, oid in replaced.items():  # new ids after a collision
                ids[i] = oid
        if failed:
            err = WriteFailed(failed, ids)
            log.error("%s", err)
            raise err
        return ids

    def _write_after_refresh(self, seq: Sequence[FeedItem], i: int, *, indexed: bool, refreshed: bool) -> list[ObjectId]:
        """Item *i* lies past the map's horizon: refresh once and route again, or raise StaleMetadata."""
        item = seq[i]
        if not refreshed:
            where = f"items[{i}].event_time" if indexed else "event_time"
            log.info("%s %s is past the time map's horizon; refreshing before writing", where, item.event_time.isoformat())
            try:
                self.refresh()
            except RouterError as exc:
                raise StaleMetadata(
                    f"{where}: {item.event_time.isoformat()} is past what the time map loaded at "
                    f"{self._loaded.at.isoformat()} can vouch for, and the refresh failed: {exc}"
                ) from exc
            return self._write(seq, indexed=indexed, refreshed=True)
        raise self._stale(seq, i, indexed=indexed)

    def _stale(self, seq: Sequence[FeedItem], i: int, *, indexed: bool) -> StaleMetadata:
        where = f"items[{i}].event_time" if indexed else "event_time"
        loaded = self._loaded
        lead = self.config.rollover.lead_time if self.config.rollover else None
        return StaleMetadata(
            f"{where}: {seq[i].event_time.isoformat()} is at or past "
            f"{datetime.fromtimestamp(self._horizon(loaded), UTC).isoformat()}, the time map's horizon "
            f"(loaded {loaded.at.isoformat()}, plus lead time {lead}); "
            "a period starting before it may not be announced yet, so the router does not guess"
        )

    def _insert(
        self, cluster: Cluster, indexes: list[int], documents: list[dict[str, Any]]
    ) -> tuple[dict[int, BaseException], dict[int, ObjectId]]:
        """Insert *documents* (the items at *indexes*) into *cluster* in batches.

        Returns the items not written and why, and the items whose ``_id`` had to be
        replaced after a collision (see :meth:`_insert_batch`), with their new ``_id``.
        """
        failed: dict[int, BaseException] = {}
        replaced: dict[int, ObjectId] = {}
        size = self.config.batch_size
        for start in range(0, len(indexes), size):
            chunk = indexes[start : start + size]
            docs = documents[start : start + size]
            try:
                refused, renamed = self._insert_batch(cluster, docs)
                for position in renamed:
                    replaced[chunk[position]] = docs[position]["_id"]
                for position, reason in refused:
                    failed[chunk[position]] = ClusterUnavailable(cluster.name, reason)
            except PyMongoError as exc:
                # Outcome of this batch unknown, later batches not tried: none is reported as written.
                error = cluster.error(exc, doing="insert_many")
                error.__cause__ = exc
                for i in indexes[start:]:
                    failed[i] = error
                break
        return failed, replaced

    def _insert_batch(self, cluster: Cluster, docs: list[dict[str, Any]]) -> tuple[list[tuple[int, str]], set[int]]:
        """``insert_many`` one batch, retrying transient failures.

        Returns the refused documents with the reason, and the positions of documents
        that were given a fresh ``_id``.

        * A network error mid-batch, a primary step-down or an interrupted write is
          retried up to ``write.retries`` times with jittered exponential backoff.
          A server that cannot be selected, or does not answer within the socket
          timeout, is not retried (its timeout is spent): the error propagates.
        * A duplicate ``_id`` on the first send is a collision with an older item
          (event seconds recur, and the 3-byte counter wraps after 2**24 ids): the
          document gets a fresh ``_id`` and is sent again. After a failed or retried
          send, a duplicate may be this very document stored by the earlier attempt:
          the stored copies are read back, and only an identical one counts as written.
        * A write-concern error leaves every document of the send in doubt: all are
          reported not written (writing them again is safe).
        """
        pending = list(range(len(docs)))
        attempts = self.config.write_retries + 1
        backoff = self.config.retry_backoff.total_seconds()
        refused: list[tuple[int, str]] = []
        renamed: set[int] = set()
        attempt = 0
        sent_before = False  # has any send of this batch possibly reached the server?
        while pending:
            retry: list[int] = []
            again: list[int] = []  # collisions: new ids, resend at once
            try:
                cluster.feed.insert_many([docs[p] for p in pending], ordered=False)
                return refused, renamed
            except BulkWriteError as exc:
                details = exc.details
                if details.get("writeConcernErrors"):
                    wce = details["writeConcernErrors"][0]
                    reason = f"write concern not satisfied, outcome unknown: {str(wce.get('errmsg', ''))[:200]}"
                    return refused + [(p, reason) for p in pending], renamed
                duplicates: list[int] = []
                for werr in details.get("writeErrors", []):
                    position = pending[werr["index"]]
                    code = werr.get("code")
                    if code == _DUPLICATE_KEY:
                        duplicates.append(position)
                    elif code in _TRANSIENT_CODES and attempt < attempts - 1:
                        retry.append(position)
                    else:
                        refused.append((position, f"insert refused (code {code}): {str(werr.get('errmsg', ''))[:200]}"))
                stored = self._stored_copies(cluster, docs, duplicates) if sent_before and duplicates else set()
                for position in duplicates:
                    if position not in stored:
                        docs[position]["_id"] = _fresh_id(docs[position]["_id"])
                        renamed.add(position)
                        again.append(position)
                sent_before = True
            except (ServerSelectionTimeoutError, NetworkTimeout):
                raise
            except AutoReconnect:
                if attempt == attempts - 1:
                    raise
                retry = pending
                sent_before = True
            pending = again + retry
            if retry:
                attempt += 1
                delay = backoff * (2 ** (attempt - 1)) * random.uniform(0.5, 1.5)
                log.debug(
                    "cluster %s: %d documents hit a transient error; retry %d of %d in %.3f s",
                    cluster.name, len(retry), attempt, attempts - 1, delay,
                )
                time.sleep(delay)
            elif again:
                log.debug("cluster %s: %d _id collisions; resending with fresh ids", cluster.name, len(again))
        return refused, renamed

    @staticmethod
    def _stored_copies(cluster: Cluster, docs: list[dict[str, Any]], positions: list[int]) -> set[int]:
        """Which of *positions* are stored exactly as built (an earlier attempt), not another item's _id."""
        wanted = {docs[p]["_id"]: p for p in positions}
        found = cluster.call("reading back duplicates", lambda: list(cluster.feed.find({"_id": {"$in": list(wanted)}})))
        same: set[int] = set()
        for stored in found:
            p = wanted.get(stored["_id"])
            if p is not None and all(stored.get(f) == docs[p][f] for f in ("data_key", "receiver_id", "sender_id", "type")):
                same.add(p)
        return same

    # -- fan-out ------------------------------------------------------------------------

    @overload
    def fan_out(
        self, activity: Activity, receivers: Iterable[int | str], *, background: Literal[False] = ...,
        active: Active | None = ..., batch_size: int | None = ..., concurrency: int | None = ..., job_id: str | None = ...,
    ) -> FanOutResult: ...

    @overload
    def fan_out(
        self, activity: Activity, receivers: Iterable[int | str], *, background: Literal[True],
        active: Active | None = ..., batch_size: int | None = ..., concurrency: int | None = ..., job_id: str | None = ...,
    ) -> FanOutHandle: ...

    def fan_out(
        self, activity: Activity, receivers: Iterable[int | str], *, background: bool = False,
        active: Active | None = None, batch_size: int | None = None, concurrency: int | None = None,
        job_id: str | None = None,
    ) -> FanOutResult | FanOutHandle:
        """Write one copy of *activity* per receiver into the cluster owning its ``event_time``.

        Example::

            result = router.fan_out(activity, followers(author), active=active_ids)
            handle = router.fan_out(activity, followers(author), background=True)

        Streaming, bounded, idempotent and resumable (see :mod:`router.fanout`).
        ``background=True`` returns a :class:`FanOutHandle` at once; otherwise it blocks
        and returns a :class:`FanOutResult`. Raises :class:`InvalidItem`,
        :class:`NoClusterForTime` or :class:`StaleMetadata` before writing anything, and
        :class:`FanOutFailed` (with ``.result``) if receivers are left without a copy.
        """
        self._check_horizon(activity)
        if background:
            return self.fanouts.submit(
                activity, receivers, active=active, batch_size=batch_size, concurrency=concurrency, job_id=job_id
            )
        return _fan_out(
            self._clusters, self._loaded.timemap, activity, receivers, active=active,
            batch_size=batch_size, concurrency=concurrency, job_id=job_id,
        )

    def _check_horizon(self, activity: Activity) -> None:
        """The write path's staleness rule for one activity: refresh once, else StaleMetadata."""
        probe = [activity.for_receiver(0)]
        try:
            self._prepare(probe, indexed=False)
        except _PastHorizon:
            try:
                self.refresh()
            except RouterError as exc:
                raise StaleMetadata(
                    f"event_time: {activity.event_time.isoformat()} is past what the time map loaded at "
                    f"{self._loaded.at.isoformat()} can vouch for, and the refresh failed: {exc}"
                ) from exc
            try:
                self._prepare(probe, indexed=False)
            except _PastHorizon:
                raise self._stale(probe, 0, indexed=False) from None

    # -- reads --------------------------------------------------------------------------

    def read(
        self, receiver_id: int | str, *, limit: int = 50, cursor: str | None = None, on_unavailable: str | None = None
    ) -> Page:
        """One page of *receiver_id*'s feed, newest first by ``(event_time, _id)``.

        The newest cluster in the read window is asked first; an older one only while
        the page is not full, and only for the items still missing. Pass the page's
        ``next_cursor`` to get the next page; it is ``None`` once the window is
        exhausted (a full page always carries a cursor, so the last page may be empty).

        *on_unavailable* (default ``read.on_unavailable`` from the config) decides what
        a cluster that cannot be read does to the page: ``"raise"`` raises
        :class:`ClusterUnavailable`; ``"partial"`` serves what the other clusters hold
        and marks the page ``partial`` with the clusters in ``unavailable``. Its cursor
        remembers them: once one answers again, its unread items come first on the
        following pages (they sort before items already served), so none is skipped.
        """
        if not is_id(receiver_id):
            raise InvalidItem("receiver_id", f"must be a 64-bit int or a non-empty UTF-8 str (got {receiver_id!r:.80})")
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_PAGE:
            raise InvalidItem("limit", f"must be an int from 1 to {MAX_PAGE} (got {limit!r})")
        policy = self.config.on_unavailable if on_unavailable is None else on_unavailable
        if policy not in ("raise", "partial"):
            raise InvalidItem("on_unavailable", f"must be 'raise' or 'partial' (got {policy!r})")
        timemap = self._loaded.timemap
        state = (
            check_state(decode_state(cursor), {m.name: m.start_date for m in timemap.periods})
            if cursor is not None else CursorState()
        )
        items: list[FeedItem] = []
        sources: list[str] = []
        queried: list[str] = []
        unavailable: list[str] = []
        owed: list[tuple[str, Position | None]] = []

        def fetch(name: str, position: Position | None) -> Position | None:
            """Append up to the missing count from *name*; return where it stands if it may hold more."""
            need = limit - len(items)
            query: dict[str, Any] = {"receiver_id": receiver_id}
            if position is not None:
                query.update(position.older_filter())
            try:
                docs = list(self._clusters[name].feed.find(query, sort=_SORT, limit=need))
            except PyMongoError as exc:
                error = self._clusters[name].error(exc, doing="find")
                if policy == "raise":
                    raise error from exc
                log.warning("%s; serving a partial page", error)
                unavailable.append(name)
                owed.append((name, position))
                return None
            queried.append(name)
            items.extend(FeedItem.from_document(d) for d in docs)
            sources.extend([name] * len(docs))
            if len(docs) < need:
                return None
            last = items[-1]
            assert last.id is not None
            return Position(last.event_time, last.id)

        for name, position in state.pending:  # clusters skipped earlier while down
            if len(items) >= limit:
                owed.append((name, position))
                continue
            more = fetch(name, position)
            if more is not None:
                owed.append((name, more))
        main, done = state.position, state.done
        first_main = len(items)  # items from here on come from the main walk
        if not done:
            names = timemap.clusters_for_read(
                now=self._clock(),
                window=self.config.read_window,
                before=main.event_time if main is not None else None,
            )
            done = True
            for name in names:
                if len(items) >= limit:
                    done = False
                    break
                more = fetch(name, main)
                if more is not None:
                    done = False
                    break
            if len(items) > first_main and not done:
                last = items[-1]
                assert last.id is not None
                main = Position(last.event_time, last.id)
        next_state = CursorState(position=main, pending=tuple(owed), done=done)
        next_cursor = None if done and not owed else encode_state(next_state)
        return Page(
            items=tuple(items), next_cursor=next_cursor, sources=tuple(sources), queried=tuple(queried),
            partial=bool(unavailable), unavailable=tuple(unavailable),
        )

    # -- deletes ------------------------------------------------------------------------

    def delete(self, data_key: str) -> int:
        """Remove every copy of the item *data_key* from every cluster; return how many.

        All clusters are asked concurrently. If some do not answer, :class:`DeleteFailed`
        says which, and how many copies the others removed; re-running is safe.
        """
        if not is_text(data_key):
            raise InvalidItem("data_key", f"must be a non-empty UTF-8 str (got {data_key!r:.80})")

        results = self._clusters.each(lambda cluster: cluster.delete_copies(data_key))
        deleted = sum(r for r in results.values() if isinstance(r, int))
        failed = {n: r for n, r in results.items() if isinstance(r, ClusterUnavailable)}
        if failed:
            raise DeleteFailed(deleted, failed)
        return deleted

    # -- lifecycle ----------------------------------------------------------------------

    def close(self) -> None:
        """Stop the refresh thread and background fan-outs (resumable), close every client and worker thread."""
        self.fanouts.close(drain=False)  # running jobs stop between batches; their checkpoints stay resumable
        self.stop_refresh()
        self._clusters.close()

    def __enter__(self) -> FeedRouter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
