"""A live feed as the caller holds it: :class:`Subscription` (blocking iterator) and :class:`AsyncSubscription`.

Both are made by ``subscribe`` (:mod:`router.live.doors`) with the arguments checked and
nothing sent; the first wait subscribes (:meth:`~router.live.hub.Hub.join`), then catches up
from storage, then hands out live events (the protocol: :mod:`router.core.live.stream`).
The hub's reader only appends raw messages to a subscription's bounded backlog; the
consumer's own thread or task decodes them, drops repeats and reads storage for a catch-up,
so a slow consumer costs only its own backlog (full: dropped, and a ``Resync``).

Example::

    with feeds.subscribe(7, cursor=live_cursor(page)) as live:
        for event in live:               # NewItem, UpdatedItem, DeletedItem, Resync
            show(event)
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager
from types import TracebackType
from typing import Any

from ..core.live import Backlog, LiveEvent, LivePlan, Stream
from ..errors import RouterClosed
from ..observe import NO_METRICS, Event, Metrics
from .hub import Hub, ThreadHub

__all__ = ["AsyncSubscription", "Subscription"]


class _Consumer:
    """What both subscriptions share: the stream, the events ready to hand out, and how a taken thing is handled."""

    def __init__(self, plan: LivePlan, metrics: Metrics) -> None:
        self.plan = plan
        self._stream = Stream(plan)
        self._ready: list[LiveEvent] = []  # (a few at a time: a list is the smaller idle cost)
        self._metrics = metrics
        self._opened = False
        self._closed = False

    @property
    def receiver_id(self) -> int | str:
        """The receiver whose feed this is."""
        return self.plan.receiver_id

    @property
    def cursor(self) -> str | None:
        """Where the stream stands: the newest position handed out (or given); subscribe again with it to go on."""
        return self._stream.cursor

    def _handle(self, what: str, raw: bytes | None) -> None:
        if what == "lost":
            self._ready.append(self._stream.resync("disconnected"))
        elif what == "overflow":
            self._ready.append(self._stream.resync("overflow"))
        elif what == "back":
            self._stream.behind = True
        elif what == "message" and raw is not None:
            self._ready.extend(self._stream.accept(raw))

    def _emit(self) -> LiveEvent:
        event = self._ready.pop(0)
        self._metrics.record(Event("live_events", 1, outcome=event.kind))
        return event


class _Box:
    """A subscription's backlog as the hub feeds it (:class:`~router.live.hub.Box`): each change wakes the consumer."""

    def __init__(self, size: int) -> None:
        self.backlog = Backlog(size)
        self.closed = False

    def _guard(self) -> AbstractContextManager[Any]:
        return contextlib.nullcontext()

    def _wake(self) -> None:
        raise NotImplementedError

    def put(self, raw: bytes) -> None:
        with self._guard():
            self.backlog.put(raw)
            self._wake()

    def disconnected(self) -> None:
        with self._guard():
            self.backlog.disconnected()
            self._wake()

    def restored(self) -> None:
        with self._guard():
            self.backlog.restored()
            self._wake()

    def close(self) -> None:
        with self._guard():
            self.closed = True
            self._wake()

    @property
    def down(self) -> bool:
        with self._guard():
            return self.backlog.down


class _ThreadBox(_Box):
    """Fed by the hub's thread, taken by the consumer's."""

    def __init__(self, size: int) -> None:
        super().__init__(size)
        self._cond = threading.Condition()

    def _guard(self) -> AbstractContextManager[Any]:
        return self._cond

    def _wake(self) -> None:
        self._cond.notify_all()

    def take(self, timeout: float | None) -> tuple[str, bytes | None]:
        with self._cond:
            if not self._cond.wait_for(lambda: self.closed or self.backlog.ready, timeout):
                return "wait", None
            return ("closed", None) if self.closed else self.backlog.take()


class Subscription(_Consumer):
    """A receiver's live feed on the sync door (``FeedRouter.subscribe``): a blocking iterator of events.

    Example::

        with feeds.subscribe(7, cursor=live_cursor(page)) as live:
            for event in live:
                ...
            event = live.get(timeout=30)      # or: the next event, None after 30 s

    Iterating ends once :meth:`close` is called (from any thread) or the router closes.
    """

    def __init__(self, plan: LivePlan, hub: ThreadHub, catch_up: Callable[[Stream], list[LiveEvent]], *,
                 metrics: Metrics = NO_METRICS) -> None:
        super().__init__(plan, metrics)
        self._hub = hub
        self._catch_up = catch_up
        self._box = _ThreadBox(plan.queue)

    def __iter__(self) -> Subscription:
        return self

    def __next__(self) -> LiveEvent:
        event = self.get()
        if event is None:
            raise StopIteration
        return event

    def get(self, timeout: float | None = None) -> LiveEvent | None:
        """The next event, waiting up to *timeout* seconds (None: until one comes); None after that, or once closed.

        The first call subscribes, then catches up from the cursor; a catch-up that cannot read a
        cluster raises its :class:`ClusterUnavailable` (the next call tries it again)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        if not self._opened and not self._closed:
            self._opened = True
            self._metrics.record(Event("live_subscribers", 1))
            try:
                self._hub.call(self._hub.hub.join(self._box, self.plan.members))
            except RouterClosed:  # the router closed before it subscribed
                return None
        while True:
            if self._ready:
                return self._emit()
            if self._closed or self._box.closed:
                return None
            if self._stream.behind and not self._box.down:
                try:
                    self._ready.extend(self._catch_up(self._stream))
                except RouterClosed:  # the router closed under it: the iteration ends
                    return None
                continue
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return None
            what, raw = self._box.take(left)
            if what == "closed":
                return None
            self._handle(what, raw)

    def close(self) -> None:
        """Stop the feed: iterating ends, its channels are left (its presence expires)."""
        if self._closed:
            return
        self._closed = True
        self._box.close()
        if self._opened:
            self._metrics.record(Event("live_subscribers", -1))
            if not self._hub.closed:
                with contextlib.suppress(RouterClosed):
                    self._hub.call(self._hub.hub.leave(self._box, self.plan.members))

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


class _LoopBox(_Box):
    """Fed by the hub's reader, taken by the consumer, on one event loop (a future only while the consumer waits)."""

    def __init__(self, size: int) -> None:
        super().__init__(size)
        self._waiter: asyncio.Future[None] | None = None

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def take(self, timeout: float | None) -> tuple[str, bytes | None]:
        while not (self.closed or self.backlog.ready):
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await asyncio.wait_for(asyncio.shield(self._waiter), timeout)
            except TimeoutError:
                return "wait", None
            finally:
                self._waiter = None
        return ("closed", None) if self.closed else self.backlog.take()


class AsyncSubscription(_Consumer):
    """A receiver's live feed on the async door (``AsyncFeedRouter.subscribe``): an async iterator of events.

    Example::

        async with feeds.subscribe(7, cursor=live_cursor(page)) as live:
            async for event in live:
                ...
            event = await live.get(timeout=30)

    Iterating ends once :meth:`close` is awaited or the router closes. Use it on the router's event loop.
    """

    def __init__(self, plan: LivePlan, hub: Callable[[], Awaitable[Hub]],
                 catch_up: Callable[[Stream], Awaitable[list[LiveEvent]]], *, metrics: Metrics = NO_METRICS) -> None:
        super().__init__(plan, metrics)
        self._get_hub = hub
        self._hub: Hub | None = None
        self._catch_up = catch_up
        self._box = _LoopBox(plan.queue)

    def __aiter__(self) -> AsyncSubscription:
        return self

    async def __anext__(self) -> LiveEvent:
        event = await self.get()
        if event is None:
            raise StopAsyncIteration
        return event

    async def get(self, timeout: float | None = None) -> LiveEvent | None:
        """The next event, waiting up to *timeout* seconds (None: until one comes); None after that, or once closed.

        The first call subscribes, then catches up from the cursor; a catch-up that cannot read a
        cluster raises its :class:`ClusterUnavailable` (the next call tries it again)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        if not self._opened and not self._closed:
            self._opened = True
            self._metrics.record(Event("live_subscribers", 1))
            self._hub = await self._get_hub()
            await self._hub.join(self._box, self.plan.members)
        while True:
            if self._ready:
                return self._emit()
            if self._closed or self._box.closed:
                return None
            if self._stream.behind and not self._box.down:
                try:
                    self._ready.extend(await self._catch_up(self._stream))
                except RouterClosed:  # the router closed under it: the iteration ends
                    return None
                continue
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return None
            what, raw = await self._box.take(left)
            if what == "closed":
                return None
            self._handle(what, raw)

    async def close(self) -> None:
        """Stop the feed: iterating ends, its channels are left (its presence expires)."""
        if self._closed:
            return
        self._closed = True
        self._box.close()
        if self._opened:
            self._metrics.record(Event("live_subscribers", -1))
            if self._hub is not None:
                await self._hub.leave(self._box, self.plan.members)

    async def __aenter__(self) -> AsyncSubscription:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

