"""Both front doors behind one synchronous interface, so one contract suite runs against each.

:class:`AsyncDoor` drives a real :class:`~router.AsyncFeedRouter` (real ``AsyncMongoClient``\\ s,
a real event loop on a thread of its own) and shows it through ``FeedRouter``'s methods:
each coroutine is run on that loop and its result returned. Nothing is faked: every
call goes through the async door's own code to the servers.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from router import AsyncFanOutHandle, AsyncFeedRouter, AsyncSubscription, FanOutResult, LiveEvent

T = TypeVar("T")


class LoopThread:
    """An asyncio event loop running on a daemon thread; :meth:`run` waits for a coroutine from any thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="test-event-loop", daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(30)
        self.loop.close()


class SyncHandle:
    """An :class:`AsyncFanOutHandle` with ``FanOutHandle``'s synchronous methods."""

    def __init__(self, handle: AsyncFanOutHandle, loop: LoopThread) -> None:
        self._handle = handle
        self._loop = loop

    job_id = property(lambda self: self._handle.job_id)
    cluster = property(lambda self: self._handle.cluster)
    progress = property(lambda self: self._handle.progress)
    errors = property(lambda self: self._handle.errors)
    cancel_requested = property(lambda self: self._handle.cancel_requested)

    def done(self) -> bool:
        return self._handle.done()

    def wait(self, timeout: float | None = None) -> bool:
        return self._loop.run(self._handle.wait(timeout))

    def result(self, timeout: float | None = None) -> FanOutResult:
        return self._loop.run(self._handle.result(timeout))

    def exception(self, timeout: float | None = None) -> BaseException | None:
        try:
            self.result(timeout)
        except BaseException as exc:
            return exc
        return None

    def cancel(self) -> bool:
        return self._loop.run(_call(self._handle.cancel))


async def _call(fn: Any, *args: Any) -> Any:
    return fn(*args)


class SyncFanouts:
    """The async door's background fan-outs, with ``FanOutExecutor``'s synchronous methods."""

    def __init__(self, door: AsyncDoor) -> None:
        self._door = door

    @property
    def pending(self) -> tuple[SyncHandle, ...]:
        return tuple(self._door._wrap(h) for h in self._door._router.fanouts.pending)

    def close(self, *, drain: bool = True) -> None:
        self._door._loop.run(self._door._router.fanouts.close(drain=drain))


class SyncSubscription:
    """An :class:`AsyncSubscription` with ``Subscription``'s synchronous methods (each wait runs on the router's loop)."""

    def __init__(self, live: AsyncSubscription, loop: LoopThread) -> None:
        self._live = live
        self._loop = loop

    cursor = property(lambda self: self._live.cursor)
    receiver_id = property(lambda self: self._live.receiver_id)

    def get(self, timeout: float | None = None) -> LiveEvent | None:
        return self._loop.run(self._live.get(timeout))

    def __iter__(self) -> SyncSubscription:
        return self

    def __next__(self) -> LiveEvent:
        event = self.get()
        if event is None:
            raise StopIteration
        return event

    def close(self) -> None:
        self._loop.run(self._live.close())

    def __enter__(self) -> SyncSubscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncDoor:
    """An :class:`AsyncFeedRouter` seen through ``FeedRouter``'s synchronous interface (for the contract suite)."""

    door = "async"

    def __init__(self, router: AsyncFeedRouter, loop: LoopThread) -> None:
        self._router = router
        self._loop = loop
        self._handles: dict[int, SyncHandle] = {}
        loop.run(router.start())

    def _wrap(self, value: Any) -> Any:
        if isinstance(value, AsyncFanOutHandle):
            return self._handles.setdefault(id(value), SyncHandle(value, self._loop))
        if hasattr(value, "handle") and isinstance(getattr(value, "handle"), AsyncFanOutHandle):
            import attrs

            return attrs.evolve(value, handle=self._wrap(value.handle))
        return value

    @property
    def fanouts(self) -> SyncFanouts:
        return SyncFanouts(self)

    def subscribe(self, *args: Any, **kwargs: Any) -> SyncSubscription:
        """``subscribe`` called on the router's loop (it belongs there), its subscription waited on there."""
        async def made() -> AsyncSubscription:
            return self._router.subscribe(*args, **kwargs)

        return SyncSubscription(self._loop.run(made()), self._loop)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._router, name)
        if inspect.iscoroutinefunction(attr):

            def call(*args: Any, **kwargs: Any) -> Any:
                return self._wrap(self._loop.run(attr(*args, **kwargs)))

            return call
        return attr

    def close(self) -> None:
        self._loop.run(self._router.close())

    def __enter__(self) -> AsyncDoor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
