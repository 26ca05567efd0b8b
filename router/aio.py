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
from typing import Any, Literal, TypeVar, overload

from bson import ObjectId

from .config import RouterConfig, load_config
from .core import calls
from .core.checkpoint import JobStatus
from .core.erasure import ErasureResult, ErasureStatus
from .core.fanout import FanOutJob
from .core.routing import Routing
from .core.seen import Unseen
from .core.settings import Settings
from .core.social import BackfillResult, PublishResult
from .core.steps import Program
from .core.tally import FanOutResult
from .core.writes import Prepared, prepare_or_stale
from .cursor import Position
from .errors import RouterClosed, RouterError, WriteFailed, WrongEventLoop
from .exports import ExportFolder, ExportResult
from .fanout.tasks import AsyncFanOutExecutor, AsyncFanOutHandle, AsyncFanOutRun, Receivers
from .model import Activity, FeedItem, Page, utcnow
from .observe import Event, Metrics, Observer
from .storage.aclusters import AsyncClusters
from .timemap import TimeMap

__all__ = ["AsyncFeedRouter"]

log = logging.getLogger(__name__)
T = TypeVar("T")


class AsyncFeedRouter:
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
            await clusters.close()
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

    # -- state -------------------------------------------------------------------------

    def _on_loop(self, name: str) -> None:
        """Raise :class:`WrongEventLoop` unless this runs on the loop that started the router (no I/O happens first)."""
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if self._loop is not None and running is not self._loop:
            ended = " (that loop is closed)" if self._loop.is_closed() else ""
            raise WrongEventLoop(
                f"{name}(): this AsyncFeedRouter belongs to the event loop that started it{ended}; it cannot be used "
                "from another event loop: start one router per loop"
            )

    def _started(self, name: str) -> tuple[AsyncClusters, Routing]:
        if self._closed:
            raise RouterClosed(f"{name}(): this AsyncFeedRouter is closed")
        if self._clusters is None or self._routing is None:
            raise RouterClosed(f"{name}(): this AsyncFeedRouter is not started (await start(), or use async with)")
        return self._clusters, self._routing

    @property
    def timemap(self) -> TimeMap:
        """The time map in use (replaced as a whole by :meth:`refresh`)."""
        return self._started("timemap")[1].timemap

    @property
    def routing(self) -> Routing:
        """The time map in use with the moment its load began and its horizon."""
        return self._started("routing")[1]

    @property
    def refreshed_at(self) -> datetime:
        """When the load of the map in use began (by the router's clock)."""
        return self._started("refreshed_at")[1].loaded_at

    @property
    def clusters(self) -> AsyncClusters:
        """The configured clusters and their clients."""
        return self._started("clusters")[0]

    @property
    def fanouts(self) -> AsyncFanOutExecutor:
        """Background fan-outs: at most ``fanout_workers`` jobs at once; closed by :meth:`close`."""
        self._started("fanouts")
        assert self._fanouts is not None
        return self._fanouts

    def _view(self, name: str) -> calls.View:
        clusters, routing = self._started(name)
        self._on_loop(name)
        return calls.View(self.config, self.settings, routing, tuple(clusters.names), self._clock())

    async def _run(self, name: str, build: Callable[[calls.View], Program[T]]) -> T:
        """Run the program *build* makes from this router's view, counted as a call in flight."""
        view = self._view(name)
        program = build(view)
        self._enter()
        try:
            assert self._clusters is not None
            with self._observe.call(name):
                return await self._clusters.run(program)
        finally:
            self._leave()

    def _enter(self) -> None:
        assert self._idle is not None
        self._active += 1
        self._idle.clear()

    def _leave(self) -> None:
        assert self._idle is not None
        self._active -= 1
        if self._active == 0:
            self._idle.set()

    # -- refresh -----------------------------------------------------------------------

    async def refresh(self) -> TimeMap:
        """Reload every cluster's metadata; the old map stays in use if this raises (see ``FeedRouter.refresh``)."""
        self._started("refresh")
        self._on_loop("refresh")
        self._enter()
        try:
            with self._observe.call("refresh"):
                return (await self._refresh()).timemap
        finally:
            self._leave()

    async def _refresh(self) -> Routing:
        clusters, _routing = self._started("refresh")
        assert self._refresh_lock is not None and self._routing is not None
        async with self._refresh_lock:
            started = self._clock()
            timemap = await clusters.load_timemap(previous=self._routing.timemap)
            newer = self._routing.replaced_by(timemap, started)
            if newer is not None:
                self._routing = newer
                clusters.record(Event("timemap_loaded", started.timestamp()))
            return self._routing

    async def _refresh_for_core(self) -> Routing | RouterError:
        try:
            return await self._refresh()
        except RouterError as exc:
            return exc

    async def _refresh_loop(self) -> None:
        interval = self.config.refresh_interval.total_seconds()
        while True:
            await asyncio.sleep(interval)
            try:
                await self.refresh()
            except RouterClosed:
                return
            except RouterError as exc:
                log.warning("metadata refresh failed; keeping the map loaded at %s: %s", self.refreshed_at.isoformat(), exc)

    async def stop_refresh(self) -> None:
        """Stop the background refresh (the map stays as it is)."""
        self._on_loop("stop_refresh")
        task, self._refresher = self._refresher, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    # -- writes ------------------------------------------------------------------------

    async def write(self, item: FeedItem) -> ObjectId:
        """Store one item in the cluster owning its ``event_time``; return its ``_id`` (see ``FeedRouter.write``)."""
        try:
            return (await self._run("write", lambda v: calls.write_many(v, (item,), indexed=False)))[0]
        except WriteFailed as exc:
            raise exc.failed[0] from exc

    async def write_many(self, items: Iterable[FeedItem]) -> list[ObjectId]:
        """Store every item; return their ``_id``\\ s in the order given (see ``FeedRouter.write_many``)."""
        return await self._run("write_many", lambda v: calls.write_many(v, items))

    def prepare(self, items: Sequence[FeedItem]) -> Prepared:
        """The write path without I/O (see ``FeedRouter.prepare``); not a coroutine."""
        return prepare_or_stale(items, self._started("prepare")[1])

    # -- reads -------------------------------------------------------------------------

    async def read(
        self, receiver_id: int | str, *, limit: int = 50, cursor: str | None = None, on_unavailable: str | None = None,
        pull: Sequence[int | str] | None = None, types: Sequence[int | str] | None = None,
    ) -> Page:
        """One page of *receiver_id*'s feed, newest first (see ``FeedRouter.read``)."""
        return await self._run("read", lambda v: calls.read(
            v, receiver_id, limit=limit, cursor=cursor, on_unavailable=on_unavailable, pull=pull, types=types
        ))

    # -- notifications -----------------------------------------------------------------

    async def mark_seen(self, receiver_id: int | str, position: Position | FeedItem) -> Position:
        """Mark everything up to *position* as seen by *receiver_id*; never moves backwards (see ``FeedRouter.mark_seen``)."""
        return await self._run("mark_seen", lambda v: calls.mark_seen(v, receiver_id, position))

    async def seen_position(self, receiver_id: int | str) -> Position | None:
        """*receiver_id*'s seen marker, or ``None`` (see ``FeedRouter.seen_position``)."""
        return await self._run("seen_position", lambda v: calls.seen_position(v, receiver_id))

    async def unseen_count(self, receiver_id: int | str, *, cap: int = 99, pull: Sequence[int | str] | None = None) -> Unseen:
        """How many items are newer than the seen marker, up to *cap* (see ``FeedRouter.unseen_count``)."""
        return await self._run("unseen_count", lambda v: calls.unseen_count(v, receiver_id, cap=cap, pull=pull))

    # -- edits -------------------------------------------------------------------------

    async def delete(self, data_key: str) -> int:
        """Remove every copy of *data_key* and its outbox entry, every cluster (see ``FeedRouter.delete``)."""
        return await self._run("delete", lambda v: calls.delete(v, data_key))

    async def update(self, data_key: str, data: Mapping[str, Any]) -> int:
        """Replace ``data`` in every copy of *data_key* and its outbox entry (see ``FeedRouter.update``)."""
        return await self._run("update", lambda v: calls.update(v, data_key, data))

    async def unfollow(self, receiver_id: int | str, sender_id: int | str) -> int:
        """Remove *sender_id*'s copies from *receiver_id*'s feed (see ``FeedRouter.unfollow``)."""
        return await self._run("unfollow", lambda v: calls.unfollow(v, receiver_id, sender_id))

    # -- the social half -----------------------------------------------------------------

    async def backfill(
        self, receiver_id: int | str, senders: Sequence[int | str], *, since: datetime | None = None, limit: int = 200,
    ) -> BackfillResult:
        """Copy the senders' newest outbox entries into *receiver_id*'s feed; at most ``read.max_pull`` senders
        (see ``FeedRouter.backfill``)."""
        return await self._run("backfill", lambda v: calls.backfill(v, receiver_id, senders, since=since, limit=limit))

    async def follow(self, receiver_id: int | str, sender_id: int | str, *, limit: int = 50) -> BackfillResult:
        """Copy a newly followed sender's newest posts into *receiver_id*'s feed (see ``FeedRouter.follow``)."""
        self._on_loop("follow")
        return await self._run("backfill", lambda v: calls.follow(v, receiver_id, sender_id, limit=limit))

    async def publish(
        self, activity: Activity, followers: Receivers, *, active: calls.Active | None = None,
        pull: bool | None = None, background: bool = False, batch_size: int | None = None,
        concurrency: int | None = None, job_id: str | None = None,
    ) -> PublishResult:
        """Store *activity* in its author's outbox, then push it or not (see ``FeedRouter.publish``).

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
            followers = iter(await _first(followers, threshold + 1))  # counted as the sync door counts a stream
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
        """Write one copy of *activity* per receiver (an iterable or async iterable; see ``FeedRouter.fan_out``).

        At most ``concurrency`` batches are in flight (an asyncio semaphore);
        ``background=True`` returns an :class:`~router.fanout.tasks.AsyncFanOutHandle` at once.
        """
        self._on_loop("fan_out")
        with self._observe.call("fan_out"):
            slots = calls.concurrency(concurrency)
            job = await self.plan_fan_out(activity, batch_size=batch_size, job_id=job_id)
            return await self._fan_out_job(job, receivers, active=active, concurrency=slots, background=background)

    async def plan_fan_out(self, activity: Activity, *, batch_size: int | None = None, job_id: str | None = None) -> FanOutJob:
        """Check *activity* and choose its cluster; nothing is written (see ``FeedRouter.plan_fan_out``)."""
        return await self._run("plan_fan_out", lambda v: calls.plan_fan_out(v, activity, batch_size=batch_size, job_id=job_id))

    async def _fan_out_job(
        self, job: FanOutJob, receivers: Receivers, *, active: calls.Active | None, concurrency: int, background: bool,
    ) -> FanOutResult | AsyncFanOutHandle:
        clusters, _routing = self._started("fan_out")
        run = AsyncFanOutRun(clusters, job, active=calls.active_filter(active), concurrency=concurrency,
                             policy=self.settings.write.policy, timeout=self.settings.timeout,
                             pseudonyms=self.settings.pseudonyms)
        if background:
            return self.fanouts.submit(run, receivers)
        self._enter()
        try:
            return await run.run(receivers)
        finally:
            self._leave()

    async def fan_out_status(self, job_id: str) -> JobStatus:
        """A fan-out job's progress from its checkpoint (see ``FeedRouter.fan_out_status``)."""
        return await self._run("fan_out_status", lambda v: calls.fan_out_status(v, job_id))

    # -- a user's data ------------------------------------------------------------------

    async def erase_user(self, user_id: int | str, *, requested_by: str) -> ErasureResult:
        """Remove everything *user_id* sent and everything addressed to them, from every cluster (see
        ``FeedRouter.erase_user``)."""
        return await self._run("erase_user", lambda v: calls.erase_user(v, user_id, requested_by=requested_by))

    async def erasure_status(self, user_id: int | str) -> ErasureStatus:
        """*user_id*'s erasure records in every cluster (see ``FeedRouter.erasure_status``)."""
        return await self._run("erasure_status", lambda v: calls.erasure_status(v, user_id))

    async def export_user(self, user_id: int | str, out: str | PathLike[str]) -> ExportResult:
        """Write what the router holds about *user_id* into the folder *out* (see ``FeedRouter.export_user``); the
        files are written from the event loop, a buffered line at a time."""
        self._on_loop("export_user")
        folder = ExportFolder(out, user_id=calls.user(user_id))
        try:
            summary = await self._run("export_user", lambda v: calls.export_user(v, user_id, folder))
        except BaseException:
            folder.abort()
            raise
        return folder.finish(summary)

    # -- lifecycle ---------------------------------------------------------------------

    async def close(self) -> None:
        """Refuse new calls, let the ones in flight finish (each bounded by ``timeout``), cancel background
        fan-outs between batches (resumable), stop the refresh task, close every client."""
        if self._closed:
            return
        self._on_loop("close")
        self._closed = True
        if self._fanouts is not None:
            await self._fanouts.close(drain=False)
        await self.stop_refresh()
        if self._idle is not None:
            try:
                await asyncio.wait_for(self._idle.wait(), self.settings.timeout + 5)
            except TimeoutError:
                log.warning("close(): calls still running after %.0f s; closing the clients under them",
                            self.settings.timeout + 5)
        if self._clusters is not None:
            await self._clusters.close()


async def _first(stream: AsyncIterable[Any], n: int) -> list[Any]:
    """Up to *n* items of *stream* (the rest stays unread)."""
    head: list[Any] = []
    async for item in stream:
        head.append(item)
        if len(head) >= n:
            break
    return head
