"""AsyncFeedRouter: the asyncio front door, on pymongo's ``AsyncMongoClient``.

The same operations, errors and guarantees as :class:`~router.FeedRouter`, as coroutines,
for asyncio services (FastAPI, aiohttp): clusters are asked at once with
``asyncio.gather``, the metadata refresh is an asyncio task, background fan-outs are
tasks bounded by a semaphore. Every decision is made by the same core
(:mod:`router.core`); only the running of its programs differs.

Example::

    async with AsyncFeedRouter.from_yaml("clusters.yaml") as feeds:
        await feeds.write(item)
        page = await feeds.read(7, limit=20)
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterable, Callable, Iterable, Mapping, Sequence
from datetime import datetime
from os import PathLike
from pathlib import Path
from typing import Any, Literal, overload

from bson import ObjectId

from .aio_base import first
from .config import RouterConfig, load_config
from .core import calls
from .core.fanout import FanOutJob, FanOutResult, JobStatus
from .core.privacy import ErasureProgress, ErasureResult, ErasureStatus, ExportProgress
from .core.periods import Routing
from .core.notify import Group, GroupBy, GroupPage, Unseen, UnseenGroups
from .core.settings import Settings
from .core.social import BackfillResult, PublishResult
from .core.writes import Prepared, prepare_or_stale
from .cursor import Position
from .errors import RouterClosed, WriteFailed
from .exports import ExportFolder, ExportResult
from .fanout.tasks import AsyncFanOutExecutor, AsyncFanOutHandle, Receivers
from .live.doors import AsyncLiveDoor
from .model import Activity, FeedItem, Page, utcnow
from .observe import Event, Metrics, Observer
from .storage.aclusters import AsyncClusters

__all__ = ["AsyncFeedRouter"]

log = logging.getLogger(__name__)


class AsyncFeedRouter(AsyncLiveDoor):
    """Routes feed writes, reads and deletes to the cluster that owns each ``event_time``, on asyncio.

    Example (in a FastAPI lifespan)::

        @asynccontextmanager
        async def lifespan(app):
            async with AsyncFeedRouter.from_yaml("clusters.yaml") as feeds:
                app.state.feeds = feeds
                yield

    Build it, then ``await start()`` (or ``async with``): that connects to every cluster
    and loads the time map, failing on a bad configuration or metadata. A task reloads
    the map every ``refresh_interval`` (``refresh=False`` turns it off) until
    :meth:`close`. Calls before :meth:`start` or after :meth:`close` raise :class:`RouterClosed`.

    The router belongs to the event loop that started it (its clients do): awaiting any
    of its coroutines from another loop, or after that loop ended, raises
    :class:`WrongEventLoop` before anything is sent. Start one router per event loop.
    """

    def __init__(
        self, config: RouterConfig, *, clock: Callable[[], datetime] = utcnow, refresh: bool = True,
        fanout_workers: int = 2, event_listeners: Sequence[Any] = (), metrics: Metrics | None = None,
        tracer_provider: Any = None,
    ) -> None:
        self.config = config
        self._observe = Observer(metrics, tracer_provider)
        self.settings = Settings.from_config(config)
        self._clock = clock
        self._refresh_wanted = refresh
        self._fanout_workers = fanout_workers
        self._extra = {"event_listeners": list(event_listeners)} if event_listeners else None
        self._clusters: AsyncClusters | None = None
        self._routing: Routing | None = None
        self._refresher: asyncio.Task[None] | None = None
        self._refresh_lock: asyncio.Lock | None = None
        self._active = 0
        self._idle: asyncio.Event | None = None
        self._closed = False
        self._fanouts: AsyncFanOutExecutor | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    def from_yaml(
        cls, path: str | Path = "clusters.yaml", *, clock: Callable[[], datetime] = utcnow, refresh: bool = True,
        fanout_workers: int = 2, event_listeners: Sequence[Any] = (), metrics: Metrics | None = None,
        tracer_provider: Any = None,
    ) -> AsyncFeedRouter:
        """A router for ``clusters.yaml`` (checked now); ``await start()`` or ``async with`` connects it."""
        return cls(load_config(path), clock=clock, refresh=refresh, fanout_workers=fanout_workers,
                   event_listeners=event_listeners, metrics=metrics, tracer_provider=tracer_provider)

    async def start(self) -> AsyncFeedRouter:
        """Connect to every cluster and load the time map; start the refresh task. Returns the router.

        The running event loop becomes the router's own (see :class:`WrongEventLoop`).
        """
        if self._loop is not None:
            self._on_loop("start")
        if self._clusters is not None:
            return self
        self._loop = asyncio.get_running_loop()
        self._refresh_lock = asyncio.Lock()
        self._idle = asyncio.Event()
        self._idle.set()
        clusters = AsyncClusters(self.config, refresh=self._refresh_for_core, extra_options=self._extra,
                                 metrics=self._observe.metrics, tracing=self._observe.tracing)
        started = self._clock()
        try:
            timemap = await clusters.load_timemap()
        except BaseException:
            await clusters.close(within=self.settings.close_wait)
            raise
        self._clusters = clusters
        self._routing = Routing(timemap, started, self.config.rollover.lead_time if self.config.rollover else None)
        clusters.record(Event("timemap_loaded", started.timestamp()))
        if log.isEnabledFor(logging.INFO):  # the table of a thousand periods takes a while to format
            log.info("time map loaded from %d clusters:\n%s", len(clusters), timemap.describe())
        self._fanouts = AsyncFanOutExecutor(workers=self._fanout_workers)
        if self._refresh_wanted:
            self._refresher = asyncio.create_task(self._refresh_loop(), name="feed-router-refresh")
        return self

    async def __aenter__(self) -> AsyncFeedRouter:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- writes ------------------------------------------------------------------------

    async def write(self, item: FeedItem) -> ObjectId:
        """Store one item in the cluster owning its ``event_time``; return its ``_id``.

        Raises :class:`InvalidItem`, :class:`NoClusterForTime`, :class:`StaleMetadata` or
        :class:`ClusterUnavailable` (``from`` the :class:`WriteFailed` that holds the id).
        """
        try:
            return (await self._run("write", lambda v: calls.write_many(v, (item,), indexed=False)))[0]
        except WriteFailed as exc:
            raise exc.failed[0] from exc

    async def write_many(self, items: Iterable[FeedItem]) -> list[ObjectId]:
        """Store every item; return their ``_id``\\ s in the order given.

        All items are checked and routed before anything is written: one invalid item
        (:class:`InvalidItem`) or one no period owns (:class:`NoClusterForTime`) rejects the
        whole call and changes no cluster. Items are then grouped per cluster and sent as
        unordered ``insert_many`` batches of ``write.batch_size``, clusters concurrently.
        If some are not confirmed written, :class:`WriteFailed` says which (by index) and
        why, with every item's id; the others are stored. An item with ``id`` set is
        stored under that id (a repeat of a stored item is found, not stored twice).
        """
        return await self._run("write_many", lambda v: calls.write_many(v, items))

    def prepare(self, items: Sequence[FeedItem]) -> Prepared:
        """The write path without I/O: check, route, id and build every item (for measuring, or to inspect).

        Raises what :meth:`write_many` raises for bad input, and :class:`StaleMetadata` for
        an item past the map's horizon (:meth:`write_many` would refresh once first).

        Not a coroutine: it does no I/O.
        """
        return prepare_or_stale(items, self._started("prepare")[1])

    # -- reads -------------------------------------------------------------------------

    async def read(
        self, receiver_id: int | str, *, limit: int = 50, cursor: str | None = None, on_unavailable: str | None = None,
        pull: Sequence[int | str] | None = None, types: Sequence[int | str] | None = None,
    ) -> Page:
        """One page of *receiver_id*'s feed, newest first by ``(event_time, _id)``.

        The newest cluster in the read window is asked first; an older one only while
        the page is not full. Pass ``next_cursor`` for the next page (``None`` once the
        window is exhausted). *pull* merges in the outboxes of those senders (authors
        whose posts are not copied to followers), each post once. *on_unavailable*
        (default ``read.on_unavailable``): ``"raise"`` raises :class:`ClusterUnavailable`
        for a cluster the page needs; ``"partial"`` serves the rest, marks the page
        ``partial`` and owes that cluster's items to later pages. *types* keeps only items
        of those types (a notification feed's filter): pages stay full and cursors work as
        without it.
        """
        return await self._run("read", lambda v: calls.read(
            v, receiver_id, limit=limit, cursor=cursor, on_unavailable=on_unavailable, pull=pull, types=types
        ))

    # -- notifications -----------------------------------------------------------------

    async def mark_seen(self, receiver_id: int | str, position: Position | FeedItem) -> Position:
        """Mark everything up to *position* (an item of a page, or its :class:`Position`) as seen by *receiver_id*.

        Example::

            page = await feeds.read(7, limit=20)
            await feeds.mark_seen(7, page.items[0])          # the newest item shown
            (await feeds.unseen_count(7)).count                # 0 until something newer arrives

        The marker never moves backwards: marking an older position, or two devices
        marking at once, leaves the highest one. It lives in the cluster that owns its time,
        so it survives rollovers.
        """
        return await self._run("mark_seen", lambda v: calls.mark_seen(v, receiver_id, position))

    async def seen_position(self, receiver_id: int | str) -> Position | None:
        """*receiver_id*'s seen marker, or ``None`` if nothing in the read window was marked."""
        return await self._run("seen_position", lambda v: calls.seen_position(v, receiver_id))

    async def unseen_count(self, receiver_id: int | str, *, cap: int = 99, pull: Sequence[int | str] | None = None) -> Unseen:
        """How many items are newer than the seen marker, stopping past *cap* (``capped``: show "99+").

        Asks the newest cluster first and never one older than the marker; with *pull*, the
        pulled senders' outbox posts count too, each post once.
        """
        return await self._run("unseen_count", lambda v: calls.unseen_count(v, receiver_id, cap=cap, pull=pull))

    # -- aggregated notifications ------------------------------------------------------

    async def read_groups(
        self, receiver_id: int | str, *, key: GroupBy | str | None = None, limit: int = 20, newest: int = 3,
        cursor: str | None = None, pull: Sequence[int | str] | None = None, types: Sequence[int | str] | None = None,
    ) -> GroupPage:
        """A page of *receiver_id*'s notifications as groups ("Alice and 3 others liked your post"), newest first.

        Example::

            page = await feeds.read_groups(7, limit=20)                  # type + data.target, per UTC day
            for g in page.groups:
                print(g.actors[0], g.others, g.values, g.count, g.seen, g.read)
            await feeds.mark_read(7, [page.groups[0]])

        *key* is a :class:`GroupBy` (or its text, ``"type,data.target/1d"``); each group carries
        its exact item count and its distinct actors (counted on the server, never by reading its
        items; exact up to 1,000 items in a period, ``actors_capped`` beyond: "999+ others"), the
        newest item of each of its *newest* newest actors, its first and last time, and
        ``seen``/``read``. Pass ``next_cursor`` for the next page: every group once per walk; a
        group that gets a new item meanwhile is not served again (it leads the next walk).
        *pull* and *types* work as in :meth:`read`. Raises :class:`ClusterUnavailable` for a
        cluster the page needs (:class:`RequestRefused` where its server refuses a request).
        """
        return await self._run("read_groups", lambda v: calls.read_groups(
            v, receiver_id, key=key, limit=limit, newest=newest, cursor=cursor, pull=pull, types=types))

    async def mark_read(self, receiver_id: int | str, groups: Iterable[Group | str] | Literal["all"]) -> int:
        """Mark *groups* read (``Group`` values from a page, their keys, or ``"all"``); returns how many marks.

        Example::

            page = await feeds.read_groups(7)
            await feeds.mark_read(7, [page.groups[0]])         # opened: bold until a newer item arrives
            await feeds.mark_read(7, "all")                    # "mark all as read"

        A group passed as a value is read through its newest item (a newer item makes it unread
        again), and must be one a page returned (:class:`InvalidItem` naming ``groups[i]``
        otherwise); a key or ``"all"`` marks through now. Each mark is stored in the cluster that
        owns its position. Marks are inserted, never updated, so two devices marking at once lose
        nothing, on every supported server.
        """
        return await self._run("mark_read", lambda v: calls.mark_read(v, receiver_id, groups))

    async def unseen_groups(
        self, receiver_id: int | str, *, cap: int = 99, key: GroupBy | str | None = None,
        pull: Sequence[int | str] | None = None, types: Sequence[int | str] | None = None,
    ) -> UnseenGroups:
        """How many groups have an item newer than the seen marker, stopping past *cap* (the badge: "99+").

        Example::

            badge = await feeds.unseen_groups(7, cap=99)
            label = f"{badge.count}+" if badge.capped else str(badge.count)

        Asks the newest cluster first and never one older than the marker; *key*, *pull* and
        *types* as in :meth:`read_groups`.
        """
        return await self._run("unseen_groups", lambda v: calls.unseen_groups(
            v, receiver_id, cap=cap, key=key, pull=pull, types=types))

    # -- edits -------------------------------------------------------------------------

    async def delete(self, data_key: str) -> int:
        """Remove every copy of the item *data_key*, and its outbox entry, from every cluster; return how many copies.

        Works in bounded steps, clusters concurrently, after leaving a tombstone in each
        cluster: fan-outs still running remove what they write afterwards and stop, and the
        key is never fanned out or published again (:class:`ItemDeleted`). If some cluster
        fails, :class:`DeleteFailed` says which and how many were removed; run it again to finish.
        """
        return await self._run("delete", lambda v: calls.delete(v, data_key))

    async def update(self, data_key: str, data: Mapping[str, Any]) -> int:
        """Replace ``data`` in every copy of *data_key* and in its outbox entry; return how many changed.

        Same steps and failure rules as :meth:`delete` (:class:`UpdateFailed`); repeatable.
        Recorded in each cluster's edit fence first, so copies that fan-outs still running
        write afterwards get the new data too.
        """
        return await self._run("update", lambda v: calls.update(v, data_key, data))

    async def unfollow(self, receiver_id: int | str, sender_id: int | str) -> int:
        """Remove *sender_id*'s copies from *receiver_id*'s feed in every cluster of the read window; return how many."""
        return await self._run("unfollow", lambda v: calls.unfollow(v, receiver_id, sender_id))

    # -- the social half -----------------------------------------------------------------

    async def backfill(
        self, receiver_id: int | str, senders: Sequence[int | str], *, since: datetime | None = None, limit: int = 200,
    ) -> BackfillResult:
        """Copy the senders' newest outbox entries (newer than *since*, at most *limit*) into *receiver_id*'s feed.

        Rebuilds a dormant user's inbox on return. Copies have fan-out's ids, so running it
        again, or while a fan-out of the same post runs, leaves one copy each. At most
        ``read.max_pull`` distinct senders (default 1,000) per call: more is
        :class:`InvalidItem` (``senders: at most 1000 senders per backfill ...``).
        """
        return await self._run("backfill", lambda v: calls.backfill(v, receiver_id, senders, since=since, limit=limit))

    async def follow(self, receiver_id: int | str, sender_id: int | str, *, limit: int = 50) -> BackfillResult:
        """Copy the *limit* newest posts of a newly followed *sender_id* into *receiver_id*'s feed (a :meth:`backfill`)."""
        self._on_loop("follow")
        return await self._run("backfill", lambda v: calls.follow(v, receiver_id, sender_id, limit=limit))

    @overload
    async def publish(
        self, activity: Activity, followers: Receivers, *, active: calls.Active | None = ...,
        pull: bool | None = ..., background: Literal[False] = ..., batch_size: int | None = ...,
        concurrency: int | None = ..., job_id: str | None = ...,
    ) -> PublishResult: ...

    @overload
    async def publish(
        self, activity: Activity, followers: Receivers, *, active: calls.Active | None = ...,
        pull: bool | None = ..., background: Literal[True], batch_size: int | None = ...,
        concurrency: int | None = ..., job_id: str | None = ...,
    ) -> PublishResult: ...

    async def publish(
        self, activity: Activity, followers: Receivers, *, active: calls.Active | None = None,
        pull: bool | None = None, background: bool = False, batch_size: int | None = None,
        concurrency: int | None = None, job_id: str | None = None,
    ) -> PublishResult:
        """Store *activity* in its author's outbox, then push it to the (active) followers or, for a pulled author, not.

        ``pull=True``/``False`` decides; else ``fanout.pull_threshold`` applied to the
        follower count (see :mod:`router.core.social.publish`). The push is :meth:`fan_out`
        (``background=True`` puts its handle in ``result.handle``). Raises what
        :meth:`fan_out` raises; the outbox entry stays if the push fails, and publishing
        again is safe.

        *followers* may be an async iterable; with a pull threshold and no ``pull=``, at most
        threshold + 1 of them are read to decide, as the sync door does for a stream.
        """
        self._on_loop("publish")
        with self._observe.call("publish"):
            return await self._publish(activity, followers, active=active, pull=pull, background=background,
                                       batch_size=batch_size, concurrency=concurrency, job_id=job_id)

    async def _publish(
        self, activity: Activity, followers: Receivers, *, active: calls.Active | None, pull: bool | None,
        background: bool, batch_size: int | None, concurrency: int | None, job_id: str | None,
    ) -> PublishResult:
        slots = calls.concurrency(concurrency)
        threshold = self.settings.pull_threshold
        if pull is None and threshold is not None and isinstance(followers, AsyncIterable):
            followers = iter(await first(followers, threshold + 1))  # counted as the sync door counts a stream
        publishing = await self._run("publish", lambda v: calls.publish(v, activity, followers, pull=pull,  # type: ignore[arg-type]
                                                                        batch_size=batch_size, job_id=job_id))
        if publishing.path == "pull":
            return publishing.result()
        return publishing.result(await self._fan_out_job(publishing.job, publishing.receivers, active=active,
                                                         concurrency=slots, background=background))

    # -- fan-out -------------------------------------------------------------------------

    @overload
    async def fan_out(
        self, activity: Activity, receivers: Receivers, *, background: Literal[False] = ...,
        active: calls.Active | None = ..., batch_size: int | None = ..., concurrency: int | None = ...,
        job_id: str | None = ...,
    ) -> FanOutResult: ...

    @overload
    async def fan_out(
        self, activity: Activity, receivers: Receivers, *, background: Literal[True],
        active: calls.Active | None = ..., batch_size: int | None = ..., concurrency: int | None = ...,
        job_id: str | None = ...,
    ) -> AsyncFanOutHandle: ...

    async def fan_out(
        self, activity: Activity, receivers: Receivers, *, background: bool = False,
        active: calls.Active | None = None, batch_size: int | None = None, concurrency: int | None = None,
        job_id: str | None = None,
    ) -> FanOutResult | AsyncFanOutHandle:
        """Write one copy of *activity* per receiver into the cluster owning its ``event_time``.

        Example::

            result = await feeds.fan_out(activity, followers(author), active=active_ids)
            handle = await feeds.fan_out(activity, followers(author), background=True)

        Streaming (at most ``concurrency`` batches of ``batch_size`` in flight), idempotent
        (derived ids: a rerun stores nothing twice) and resumable (a checkpoint per job in
        the owning cluster). Raises :class:`InvalidItem`, :class:`NoClusterForTime` or
        :class:`StaleMetadata` before writing anything, :class:`ItemDeleted` (from
        ``result()`` in background mode) for a post that was deleted, before or while it runs
        (``.result`` says how far it got), and :class:`FanOutFailed` (with ``.result``) if
        receivers are left without a copy.

        *receivers* may be an iterable or an async iterable (a plain iterable is read a batch at
        a time in a worker thread). At most ``concurrency`` batches are in flight (an asyncio
        semaphore); ``background=True`` returns an :class:`~router.fanout.tasks.AsyncFanOutHandle` at once.
        """
        self._on_loop("fan_out")
        with self._observe.call("fan_out"):
            slots = calls.concurrency(concurrency)
            job = await self.plan_fan_out(activity, batch_size=batch_size, job_id=job_id)
            return await self._fan_out_job(job, receivers, active=active, concurrency=slots, background=background)

    async def plan_fan_out(self, activity: Activity, *, batch_size: int | None = None, job_id: str | None = None) -> FanOutJob:
        """Check *activity* and choose its cluster: the job :meth:`fan_out`, :meth:`publish` and other engines
        (:mod:`router.fanout.celery`) run. Nothing is written; raises as :meth:`fan_out` does before writing.
        """
        return await self._run("plan_fan_out", lambda v: calls.plan_fan_out(v, activity, batch_size=batch_size, job_id=job_id))

    async def fan_out_status(self, job_id: str) -> JobStatus:
        """A fan-out job's progress from its checkpoint (any process's job), looked up in every cluster.

        Raises :class:`InvalidItem` if no cluster has a job *job_id*.
        """
        return await self._run("fan_out_status", lambda v: calls.fan_out_status(v, job_id))

    # -- a user's data ------------------------------------------------------------------

    async def erase_user(self, user_id: int | str, *, requested_by: str,
                         progress: Callable[[ErasureProgress], None] | None = None) -> ErasureResult:
        """Remove everything *user_id* sent and everything addressed to them, from every cluster; return the counts.

        Example::

            result = await feeds.erase_user(1000765, requested_by="support ticket 4411")
            result.totals["feed_sent"]          # copies of their posts removed, every cluster

        Each cluster gets the erasure's record first (the user's keyed hash, never the id;
        who asked, when, and at the end the counts), which every fan-out batch, Celery task,
        backfill and publish reads after writing, so nothing still running leaves a copy.
        Raises :class:`ErasureFailed` when a cluster did not finish: call it again.

        *progress*, when given, is called with an :class:`~router.core.privacy.erasure.ErasureProgress` (a cluster, the
        documents removed there so far, finished or not) after every statement that removed something and once per
        cluster at the end, from whatever runs that cluster's share: keep it quick. ``feedrouter erase`` shows it on a
        terminal.
        """
        return await self._run("erase_user", lambda v: calls.erase_user(v, user_id, requested_by=requested_by,
                                                                                progress=progress))

    async def erasure_status(self, user_id: int | str) -> ErasureStatus:
        """*user_id*'s erasure records in every cluster: who asked, when, the counts, and whether each finished.

        Example::

            status = await feeds.erasure_status(1000765)
            status.finished                     # every cluster with a record has a done one at or after it

        A record holds the user's keyed hash, never the id. Raises :class:`InvalidItem` for a
        bad id, :class:`ClusterUnavailable` when a cluster cannot be read.
        """
        return await self._run("erasure_status", lambda v: calls.erasure_status(v, user_id))

    async def export_user(self, user_id: int | str, out: str | PathLike[str], *,
                          progress: Callable[[ExportProgress], None] | None = None) -> ExportResult:
        """Write what the router holds about *user_id* (posts sent, items received, seen markers, read marks of
        groups) into the existing, empty folder *out*: JSON Lines in time order, then ``manifest.json`` with each
        file's SHA-256.

        Example::

            exported = await feeds.export_user(1000765, "/srv/exports/1000765")
            exported.counts                     # {'sent': 8, 'received': 9, 'seen': 1, 'read': 1}

        Each line is a value of this API (an :class:`Activity` sent, a :class:`FeedItem`
        received, a seen marker, a read mark), field by field, with the period it was read from. Raises
        :class:`InvalidItem` for a bad id or an *out* that is not an empty folder, and
        :class:`ClusterUnavailable` when a cluster cannot be read (the partial files are
        removed).

        *progress*, when given, is called with an :class:`~router.core.privacy.export.ExportProgress` (the stream, the period
        it reads, the stream's records so far) after every record written: keep it quick. ``feedrouter export`` shows
        it on a terminal.

        On this door the files are written from the event loop, a buffered line at a time.
        """
        self._on_loop("export_user")
        folder = ExportFolder(out, user_id=calls.user(user_id), progress=calls.callback(progress))
        try:
            summary = await self._run("export_user", lambda v: calls.export_user(v, user_id, folder))
        except BaseException:
            folder.abort()
            raise
        return folder.finish(summary)

    # -- lifecycle ---------------------------------------------------------------------

    async def close(self) -> None:
        """Refuse new calls, let the ones in flight finish (each bounded by ``timeout``), cancel background
        fan-outs between batches (resumable), stop the refresh task, close every client (waiting for them at most
        ``timeout`` + 5 s: a client that does not finish closing is left, with a warning)."""
        if self._closed:
            return
        self._on_loop("close")
        self._closed = True
        if self._fanouts is not None:
            await self._fanouts.close(drain=False)
        await self.stop_refresh()
        await self._close_live()
        if self._idle is not None:
            try:
                await asyncio.wait_for(self._idle.wait(), self.settings.close_wait)
            except TimeoutError:
                log.warning("close(): calls still running after %.0f s; closing the clients under them",
                            self.settings.close_wait)
        if self._clusters is not None:
            await self._clusters.close(within=self.settings.close_wait)
