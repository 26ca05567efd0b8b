"""``subscribe`` on each front door: :class:`LiveDoor` (under :class:`~router.FeedRouter`) and :class:`AsyncLiveDoor`
(under :class:`~router.AsyncFeedRouter`).

Each door checks the arguments with ``read``'s own checks (:func:`~router.core.live.stream.subscribe_plan`),
makes its hub on first use (one Redis pub/sub connection per router: :mod:`router.live.hub`) and
hands back a subscription whose catch-ups are ``read`` pages run as the door's calls (metrics
and spans ``subscribe``, like every call). Closing the router ends every subscription.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from ..aio_base import AsyncDoorBase
from ..core.live import LiveEvent, Stream, catch_up_events, subscribe_plan
from ..errors import PushNotConfigured
from ..pushconfig import PushConfig
from ..sync_base import SyncDoorBase
from .hub import Hub, ThreadHub
from .subscription import AsyncSubscription, Subscription

__all__ = ["AsyncLiveDoor", "LiveDoor"]


def _push(config: PushConfig | None) -> PushConfig:
    if config is None:
        raise PushNotConfigured("subscribe(): clusters.yaml has no push: section; live feeds need a Redis, e.g. "
                                "push: {redis: 'redis://:${REDIS_PASSWORD}@host:6379/0'}, named by every router and "
                                "worker that writes")
    return config


class LiveDoor(SyncDoorBase):
    """The sync door's ``subscribe``, and its hub (a loop on a thread of its own, made at the first subscribe)."""

    _live: ThreadHub | None = None
    _live_lock = threading.Lock()

    def subscribe(
        self, receiver_id: int | str, *, cursor: str | None = None, pull: Sequence[int | str] | None = None,
        types: Sequence[int | str] | None = None,
    ) -> Subscription:
        """*receiver_id*'s feed as it changes: new items, updates, deletes, and ``Resync`` (needs ``push:`` in clusters.yaml).

        Example::

            page = feeds.read(7, limit=20)
            live = feeds.subscribe(7, cursor=live_cursor(page))
            event = live.get(timeout=30)      # NewItem, UpdatedItem, DeletedItem or Resync; None after 30 s
            live.close()

        With the *cursor* of the page just shown (:func:`~router.live.live_cursor`, or any event's
        ``cursor``) every item stored after it comes exactly once: the subscription subscribes first,
        then catches up from storage, then drops what came both ways. *pull* and *types* work as in
        :meth:`read` (a pulled author's new posts come too), and bad arguments raise what :meth:`read`
        raises. Nothing is sent until the first wait; a write is pushed after it is stored, only
        to receivers with a live subscriber. A slow consumer's backlog (``push.queue``) overflows into
        a ``Resync``; a lost Redis is a ``Resync`` too, and the subscription reconnects and catches up
        by itself. Raises :class:`PushNotConfigured` without ``push:``.
        """
        with self._calls.call("subscribe"):
            plan = subscribe_plan(self._view(), receiver_id, cursor=cursor, pull=pull, types=types)
            push = _push(self.config.push)
            with self._live_lock:
                if self._live is None:
                    self._live = ThreadHub(push, metrics=self._observe.metrics)
                hub = self._live

        def catch_up(stream: Stream) -> list[LiveEvent]:
            return self._run("subscribe", catch_up_events(self._view(), stream))

        return Subscription(plan, hub, catch_up, metrics=self._observe.metrics)

    def _close_live(self) -> None:
        """End every subscription and close the hub (``close()``)."""
        with self._live_lock:
            hub, self._live = self._live, None
        if hub is not None:
            hub.close()


class AsyncLiveDoor(AsyncDoorBase):
    """The async door's ``subscribe``, and its hub (on the router's event loop, made at the first subscribe)."""

    _live: Hub | None = None

    def subscribe(
        self, receiver_id: int | str, *, cursor: str | None = None, pull: Sequence[int | str] | None = None,
        types: Sequence[int | str] | None = None,
    ) -> AsyncSubscription:
        """*receiver_id*'s feed as it changes: new items, updates, deletes, and ``Resync`` (needs ``push:`` in clusters.yaml).

        Example::

            page = await feeds.read(7, limit=20)
            live = feeds.subscribe(7, cursor=live_cursor(page))
            event = await live.get(timeout=30)      # NewItem, UpdatedItem, DeletedItem or Resync; None after 30 s
            await live.close()

        With the *cursor* of the page just shown (:func:`~router.live.live_cursor`, or any event's
        ``cursor``) every item stored after it comes exactly once: the subscription subscribes first,
        then catches up from storage, then drops what came both ways. *pull* and *types* work as in
        :meth:`read` (a pulled author's new posts come too), and bad arguments raise what :meth:`read`
        raises. Nothing is sent until the first wait; a write is pushed after it is stored, only
        to receivers with a live subscriber. A slow consumer's backlog (``push.queue``) overflows into
        a ``Resync``; a lost Redis is a ``Resync`` too, and the subscription reconnects and catches up
        by itself. Raises :class:`PushNotConfigured` without ``push:``.

        Not a coroutine: it checks the arguments and returns an async iterator (``async with`` it,
        or ``async for event in live``), which subscribes at its first wait.
        """
        plan = subscribe_plan(self._view("subscribe"), receiver_id, cursor=cursor, pull=pull, types=types)
        push = _push(self.config.push)

        async def hub() -> Hub:
            self._on_loop("subscribe")
            if self._live is None:
                self._live = Hub(push, metrics=self._observe.metrics)
            await self._live.start()
            return self._live

        async def catch_up(stream: Stream) -> list[LiveEvent]:
            return await self._run("subscribe", lambda view: catch_up_events(view, stream))

        return AsyncSubscription(plan, hub, catch_up, metrics=self._observe.metrics)

    async def _close_live(self) -> None:
        """End every subscription and close the hub (``close()``)."""
        hub, self._live = self._live, None
        if hub is not None:
            await hub.close()
