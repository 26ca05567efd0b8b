"""One Redis pub/sub connection per router, shared by its subscriptions: channels, presence, reconnection.

A :class:`Hub` runs on an event loop (the async door's own; for the sync door, a loop on a
thread of its own, :class:`ThreadHub`). It keeps:

* **channels**: one per presence member (``<prefix>:r:<receiver>``, ``<prefix>:a:<author>``),
  subscribed while a subscription needs it, plus the broadcast channel of edits; a reader task
  hands each message to the backlogs (:class:`~router.core.live.stream.Backlog`) of the
  subscriptions on its channel, nothing more;
* **presence**: each member in the presence set with an expiry of ``push.presence_ttl``, by
  Redis's clock, renewed by a keeper task every third of it; writers publish to present
  members only (:mod:`router.storage.push`);
* **the order a subscription needs**: :meth:`Hub.join` returns only once Redis confirmed the
  subscription's channels and its members are present, so its catch-up reads after that;
* **reconnection**: a lost connection (the reader fails, or the keeper gets no answer within
  ten times ``push.timeout``, at least 5 s) marks every backlog disconnected (its subscription says
  :class:`~router.core.live.stream.Resync`), then the hub connects again with backoff,
  subscribes every channel, marks every member present and marks every backlog restored (its
  subscription catches up from its cursor). Nothing here touches storage.

Example::

    hub = Hub(config.push, metrics=metrics)
    up = await hub.join(backlog, plan.members)   # False: Redis is down; the backlog is told when it is back
    await hub.leave(backlog, plan.members)
    await hub.close()
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
from collections import Counter
from collections.abc import Coroutine, Sequence
from typing import Any, Protocol, TypeVar

from ..core.push import EDITS, PRESENCE
from ..errors import RouterClosed
from ..observe import NO_METRICS, Metrics
from ..pushconfig import PushConfig
from ..storage.push import redis_options
from ..uris import redact_uri

__all__ = ["Box", "Hub", "PRESENT", "ThreadHub"]

log = logging.getLogger(__name__)
T = TypeVar("T")

#: KEYS[1]: the presence set; ARGV: the expiry in seconds, then members. Each member's expiry becomes Redis's "now"
#: plus the expiry (never lowered: GT), and members expired for a second are removed.
PRESENT = """
local now = tonumber(redis.call('TIME')[1])
local expiry = now + tonumber(ARGV[1])
for i = 2, #ARGV, 500 do
  local args = {}
  for j = i, math.min(i + 499, #ARGV) do
    args[#args + 1] = expiry
    args[#args + 1] = ARGV[j]
  end
  redis.call('ZADD', KEYS[1], 'GT', unpack(args))
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - 1)
return #ARGV - 1
"""
#: Pauses between attempts to reconnect (seconds), the last one repeated.
BACKOFF = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0)


class Box(Protocol):
    """What the hub does to a subscription: hand it a message, tell it the connection was lost, then restored."""

    def put(self, raw: bytes) -> None: ...
    def disconnected(self) -> None: ...
    def restored(self) -> None: ...
    def close(self) -> None: ...


class Hub:
    """The Redis side of every subscription of one router (see the module's docs). Runs on one event loop."""

    def __init__(self, config: PushConfig, *, metrics: Metrics = NO_METRICS) -> None:
        self.config = config
        self.metrics = metrics
        self._prefix = f"{config.prefix}:"
        self._presence = f"{config.prefix}:{PRESENCE}"
        self._edits = (self._prefix + EDITS).encode()
        #: How long a subscription's confirmation may take before the connection counts as lost.
        self._confirm_within = max(5.0, 10 * config.timeout.total_seconds())
        self._boxes: dict[bytes, set[Box]] = {}     # channel -> the boxes on it
        self._all: set[Box] = set()
        self._members: Counter[str] = Counter()
        # Of this connection (a join or a leave touches only its own entries: ten thousand subscriptions stay cheap):
        self._subscribed: set[bytes] = set()               # channels Redis confirmed
        self._waiting: dict[bytes, asyncio.Future[None]] = {}  # channels asked for, not confirmed yet
        self._unsent: dict[bytes, None] = {}               # of those, the ones the next SUBSCRIBE sends
        self._marked: set[str] = set()                     # members in the presence set
        self._unmarked: dict[str, None] = {}               # members the next presence script marks
        self._commands = asyncio.Lock()  # pub/sub commands go out in the order they are asked for
        self._client: Any = None
        self._pubsub: Any = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._connecting: asyncio.Task[None] | None = None
        #: Counts connections lost: what a wait that spans an await compares.
        self._losses = 0
        self.up = False
        self._closed = False

    # -- subscriptions ------------------------------------------------------------------

    async def join(self, box: Box, members: Sequence[str]) -> bool:
        """Put *box* on its members' channels and them in the presence set; True once Redis confirmed both. False
        when Redis is not reachable now: the box is told (disconnected), and restored once the hub is back (its
        channels subscribed and its members present by then)."""
        channels = [(self._prefix + m).encode() for m in members]
        for channel in channels:
            self._boxes.setdefault(channel, set()).add(box)
        self._all.add(box)
        self._members.update(members)
        if self.up:
            try:
                await self._sync(channels, members)
            except Exception as exc:  # noqa: BLE001 - Redis or the connection failed: every box learns it
                self._lost(exc)
        if not self.up:
            box.disconnected()
            self._reconnect()
            return False
        return True

    async def leave(self, box: Box, members: Sequence[str]) -> None:
        """Take *box* off its channels; channels nobody needs any more are unsubscribed (members expire)."""
        self._all.discard(box)
        empty = []
        for member in members:
            self._members[member] -= 1
            if self._members[member] <= 0:
                del self._members[member]
                self._marked.discard(member)
                self._unmarked.pop(member, None)
            channel = (self._prefix + member).encode()
            boxes = self._boxes.get(channel)
            if boxes is None:
                continue
            boxes.discard(box)
            if boxes:
                continue
            del self._boxes[channel]
            waiting = self._waiting.pop(channel, None)
            if waiting is not None and not waiting.done():  # nobody needs it now: wake who waits
                waiting.set_result(None)
            if channel in self._unsent:  # never sent: nothing to take back
                del self._unsent[channel]
                continue
            if waiting is not None or channel in self._subscribed:
                self._subscribed.discard(channel)
                empty.append(channel)
        if empty and self.up:
            try:
                async with self._commands:
                    await self._pubsub.unsubscribe(*empty)
            except Exception as exc:  # noqa: BLE001
                self._lost(exc)

    async def _sync(self, channels: Sequence[bytes], members: Sequence[str]) -> None:
        """Subscribe *channels* and mark *members*, waiting until Redis confirmed both. Joins at once share the
        work: whoever holds the command lock sends every channel pending in one ``SUBSCRIBE`` and marks every member
        pending in one script."""
        losses = self._losses
        loop = asyncio.get_running_loop()
        for channel in channels:
            if channel not in self._subscribed and channel not in self._waiting:
                self._waiting[channel] = loop.create_future()
                self._unsent[channel] = None
        for member in members:
            if member not in self._marked:
                self._unmarked[member] = None
        while True:
            waiting = [f for c in channels if (f := self._waiting.get(c)) is not None]
            if not waiting and all(m in self._marked for m in members):
                return
            async with self._commands:
                if self._unsent:
                    sent, self._unsent = list(self._unsent), {}
                    await self._pubsub.subscribe(*sent)
                if self._unmarked:
                    marking, self._unmarked = list(self._unmarked), {}
                    await self._mark(marking)
                    self._marked.update(marking)
            # shielded: a join that gives up must not cancel the confirmation other joins wait for
            await asyncio.wait_for(asyncio.gather(*(asyncio.shield(f) for f in waiting)), self._confirm_within)
            if self._losses != losses:
                raise ConnectionError("the connection was lost meanwhile")

    # -- the connection -------------------------------------------------------------------

    async def start(self) -> None:
        """Connect now, waiting a bounded time; a failure is logged, and the hub keeps trying in the background."""
        if not self.up:
            self._reconnect()
        if self._connecting is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._connecting), self._confirm_within)

    def _reconnect(self) -> None:
        if self._connecting is None and not self._closed:
            self._connecting = asyncio.get_running_loop().create_task(self._connect_loop(), name="feed-router-live-connect")

    async def _connect_loop(self) -> None:
        attempt = 0
        try:
            while not self._closed:
                await self._drop()
                try:
                    await self._connect()
                    return
                except Exception as exc:  # noqa: BLE001 - unreachable, refused, timed out: try again
                    if attempt == 0:
                        log.warning("live: Redis at %s not reachable (%s); subscribers wait for it",
                                    self.config.display_redis, redact_uri(str(exc))[:200])
                    await asyncio.sleep(BACKOFF[min(attempt, len(BACKOFF) - 1)])
                    attempt += 1
        finally:
            self._connecting = None

    async def _connect(self) -> None:
        import redis.asyncio

        self._client = redis.asyncio.Redis.from_url(self.config.redis, **redis_options(self.config, patient=True))
        self._pubsub = self._client.pubsub()
        self._subscribed, self._waiting, self._unsent, self._marked, self._unmarked = set(), {}, {}, set(), {}
        self._waiting[self._edits] = asyncio.get_running_loop().create_future()
        await self._pubsub.subscribe(self._edits)  # (the reader needs a subscription to read)
        self._spawn(self._read(self._pubsub), "feed-router-live-reader")
        while True:  # every channel and member, those of joins made meanwhile too; then up, with no await between
            await self._sync([self._edits, *self._boxes], list(self._members))
            if all(c in self._subscribed for c in self._boxes) and all(m in self._marked for m in self._members):
                break
        self.up = True
        self._spawn(self._keep(), "feed-router-live-presence")
        for box in list(self._all):
            box.restored()
        log.info("live: subscribed on Redis at %s (%d channels)", self.config.display_redis, len(self._boxes))

    async def _mark(self, members: list[str]) -> None:
        """Members present now (the presence script), within ``push.timeout``."""
        if members:
            ttl = max(1, round(self.config.presence_ttl.total_seconds()))
            await self._client.eval(PRESENT, 1, self._presence, ttl, *members)

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _read(self, pubsub: Any) -> None:
        """Hand each message to the boxes on its channel (every box for an edit), until the connection fails."""
        edits = self._edits
        try:
            while True:
                message = await pubsub.get_message(timeout=None)
                if message is None:
                    continue
                kind, channel = message["type"], message["channel"]
                if kind == "message":
                    for box in (self._all if channel == edits else self._boxes.get(channel, ())):
                        box.put(message["data"])
                elif kind == "subscribe":
                    waiting = self._waiting.pop(channel, None)
                    if waiting is not None:
                        self._subscribed.add(channel)
                        if not waiting.done():
                            waiting.set_result(None)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - the connection is gone
            if pubsub is self._pubsub:
                self._lost(exc)

    async def _keep(self) -> None:
        """Renew the members' presence every third of its expiry; no answer in time is a lost connection."""
        every = self.config.presence_ttl.total_seconds() / 3
        while True:
            await asyncio.sleep(every)
            try:
                await self._mark(list(self._members))
            except Exception as exc:  # noqa: BLE001
                self._lost(exc)
                return

    def _lost(self, exc: BaseException) -> None:
        """The connection failed: every box is told, and a reconnection starts (which drops the old connection)."""
        if not self.up or self._closed:
            return
        self.up = False
        self._losses += 1
        log.warning("live: lost Redis at %s (%s); subscribers get a resync and catch up once it is back",
                    self.config.display_redis, redact_uri(str(exc))[:200])
        for box in list(self._all):
            box.disconnected()
        for waiting in self._waiting.values():  # wake joins waiting for a confirmation: they see it is down
            if not waiting.done():
                waiting.set_result(None)
        self._reconnect()

    async def _drop(self) -> None:
        """Stop the reader and the keeper, close the connection (if any)."""
        current = asyncio.current_task()
        tasks = [t for t in self._tasks if t is not current]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        pubsub, client, self._pubsub, self._client = self._pubsub, self._client, None, None
        for closing in (pubsub, client):
            if closing is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(closing.aclose(), self.config.timeout.total_seconds())

    async def close(self) -> None:
        """End every subscription's iteration; stop reading, renewing and reconnecting; close the connection (members
        expire on their own)."""
        self._closed = True
        self.up = False
        for box in list(self._all):
            box.close()
        if self._connecting is not None:
            self._connecting.cancel()
            await asyncio.gather(self._connecting, return_exceptions=True)
        await self._drop()


class ThreadHub:
    """A :class:`Hub` on an event loop of its own, on a daemon thread, for the sync door: each call waits for its
    coroutine there."""

    def __init__(self, config: PushConfig, *, metrics: Metrics = NO_METRICS) -> None:
        self.loop = asyncio.new_event_loop()
        self.hub = Hub(config, metrics=metrics)
        self.closed = False
        #: The longest a call waits for the hub (a join's confirmation is bounded well below it).
        self._wait = 5 + 20 * config.timeout.total_seconds()
        self._thread = threading.Thread(target=self.loop.run_forever, name="feed-router-live", daemon=True)
        self._thread.start()
        self.call(self.hub.start())

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run *coro* on the hub's loop and wait for it; :class:`RouterClosed` once the hub is closed."""
        if self.closed:
            coro.close()
            raise RouterClosed("subscribe(): this FeedRouter is closed")
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(self._wait)
        except concurrent.futures.TimeoutError:  # the loop stopped under it (close() raced this call)
            future.cancel()
            raise RouterClosed("subscribe(): this FeedRouter is closed") from None

    def close(self) -> None:
        """Close the hub (every subscription's iteration ends), stop its loop and thread."""
        if self.closed:
            return
        self.call(self.hub.close())
        self.closed = True
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()
