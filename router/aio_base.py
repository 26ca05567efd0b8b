"""What the async door keeps besides its operations: the event loop it belongs to, its calls in flight, the map,
its refresh, and how it runs a core program (:class:`AsyncDoorBase`, the base of :class:`~router.AsyncFeedRouter`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterable, Callable
from datetime import datetime
from typing import Any, TypeVar

from .config import RouterConfig
from .core import calls
from .core.fanout import FanOutJob, FanOutResult
from .core.periods import Routing
from .core.settings import Settings
from .core.steps import Program
from .errors import RouterClosed, RouterError, WrongEventLoop
from .fanout.tasks import AsyncFanOutExecutor, AsyncFanOutHandle, AsyncFanOutRun, Receivers
from .observe import Event, Observer
from .storage.aclusters import AsyncClusters
from .timemap import TimeMap

__all__ = ["AsyncDoorBase"]

log = logging.getLogger("router.aio")
T = TypeVar("T")


class AsyncDoorBase:
    """The event loop a router belongs to, its calls in flight (what ``close()`` waits for), the map and its
    refresh, and :meth:`_run`, which runs a core program as one call. Set up by ``AsyncFeedRouter.__init__`` and
    ``start()``."""

    config: RouterConfig
    settings: Settings
    _observe: Observer
    _clock: Callable[[], datetime]
    _clusters: AsyncClusters | None
    _routing: Routing | None
    _refresher: asyncio.Task[None] | None
    _refresh_lock: asyncio.Lock | None
    _active: int
    _idle: asyncio.Event | None
    _closed: bool
    _fanouts: AsyncFanOutExecutor | None
    _loop: asyncio.AbstractEventLoop | None

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
                await self._refresh_call()
            except RouterClosed:
                return
            except RouterError as exc:
                log.warning("metadata refresh failed; keeping the map loaded at %s: %s", self._routing.loaded_at.isoformat() if self._routing else '?', exc)

    async def _fan_out_job(
        self, job: FanOutJob, receivers: Receivers, *, active: calls.Active | None, concurrency: int, background: bool,
    ) -> FanOutResult | AsyncFanOutHandle:
        clusters, _routing = self._started("fan_out")
        run = AsyncFanOutRun(clusters, job, active=calls.active_filter(active), concurrency=concurrency,
                             policy=self.settings.write.policy, timeout=self.settings.timeout,
                             pseudonyms=self.settings.pseudonyms)
        if background:
            assert self._fanouts is not None
            return self._fanouts.submit(run, receivers)
        self._enter()
        try:
            return await run.run(receivers)
        finally:
            self._leave()

    async def _refresh_call(self) -> Routing:
        """``refresh()``: reload the metadata, as one call in flight."""
        self._started("refresh")
        self._on_loop("refresh")
        self._enter()
        try:
            with self._observe.call("refresh"):
                return await self._refresh()
        finally:
            self._leave()

    # -- state -------------------------------------------------------------------------

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

    # -- refresh -----------------------------------------------------------------------

    async def refresh(self) -> TimeMap:
        """Reload every cluster's metadata; the old map stays in use if this raises.

        A cluster that does not answer keeps its last known period. The map and the time
        its load began are replaced together, and never by an older load.
        """
        return (await self._refresh_call()).timemap

    async def stop_refresh(self) -> None:
        """Stop the background refresh (the map stays as it is)."""
        self._on_loop("stop_refresh")
        task, self._refresher = self._refresher, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


async def first(stream: AsyncIterable[Any], n: int) -> list[Any]:
    """Up to *n* items of *stream* (the rest stays unread)."""
    head: list[Any] = []
    async for item in stream:
        head.append(item)
        if len(head) >= n:
            break
    return head
