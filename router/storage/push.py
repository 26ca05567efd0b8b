"""Publishing live-feed pushes to Redis: what a driver does with a core :class:`~router.core.push.Push`.

One :class:`Publisher` (``redis.Redis``, for :class:`~router.storage.clusters.Clusters`) or
:class:`AsyncPublisher` (``redis.asyncio``, for the async storage) per storage, made from the
``push:`` section. A push is one pipelined round trip: per chunk of members a script that
looks each member up in the presence set and publishes ``head + body`` to those present
(:data:`SCRIPT`), and one ``PUBLISH`` per broadcast. Messages made per member (``write_many``'s
items) are looked up first (``TIME`` and ``ZMSCORE``), then made and published for the present
members only, in a second round trip when any is. Nothing is retried and nothing raises:

* every wait on Redis is bounded by ``push.timeout`` (to connect, then for the answer), and
  redis-py's own retries are off;
* after a failure, pushes are skipped (counted ``skipped``) for :data:`PAUSE` seconds, so a
  Redis that does not answer costs a write at most one ``timeout`` per pause;
* the first push that reaches Redis again first broadcasts the *gap* message (and if none comes
  within :data:`PAUSE`, the publisher sends the gap alone, again until it reaches Redis): every
  subscriber then catches up from storage, so items pushed into the void are still delivered.

Each push is counted (``push``: op, outcome ``ok``/``timeout``/``unavailable``/``failed``/``skipped``,
its seconds; ``pushed``: messages Redis handed to subscriber processes) and traced
(``feedrouter.push.<op>``). The URL's password is never logged.

Example::

    publisher = Publisher(config.push, metrics=metrics)
    publisher.send(PushItems(items, ids))     # None, whatever happened
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import threading
import time
from typing import Any

from ..core.push import EDITS, GAP, PRESENCE, Messages, Push
from ..errors import ConfigError, ConfigProblem
from ..observe import NO_METRICS, Event, Metrics
from ..observe.tracing import NO_TRACING, Tracing
from ..pushconfig import PushConfig
from ..uris import redact_uri

__all__ = ["AsyncPublisher", "PAUSE", "Publisher", "SCRIPT", "redis_options"]

log = logging.getLogger(__name__)

#: Seconds pushes are skipped after one failed.
PAUSE = 1.0
#: Members one script call looks up (a batch of more is several calls in the same round trip).
CHUNK = 1000
#: KEYS[1]: the presence set; ARGV: prefix, shared body, n, n members, then n heads or none. Publishes ``head .. body``
#: (the body alone without heads) to each member whose expiry (the presence set's score, Redis's own clock) is not
#: past; returns the deliveries.
SCRIPT = """
local now = tonumber(redis.call('TIME')[1])
local prefix, body, n = ARGV[1], ARGV[2], tonumber(ARGV[3])
local sent = 0
for i = 1, n, 500 do
  local j = math.min(i + 499, n)
  local scores = redis.call('ZMSCORE', KEYS[1], unpack(ARGV, 3 + i, 3 + j))
  for k = 1, #scores do
    local score = scores[k]
    if score and tonumber(score) >= now then
      local at = i + k - 1
      sent = sent + redis.call('PUBLISH', prefix .. ARGV[3 + at], (ARGV[3 + n + at] or '') .. body)
    end
  end
end
return sent
"""
SCRIPT_SHA = hashlib.sha1(SCRIPT.encode()).hexdigest()


def redis_options(config: PushConfig, *, patient: bool = False) -> dict[str, Any]:
    """The client options of every Redis client of live feeds: no retries of redis-py's own, no decoding (messages are
    BSON), and timeouts of ``push.timeout`` for a writer; *patient* (a subscriber's hub, which no write waits for):
    ten times that, at least 5 s, so a busy machine does not cut its subscribers off."""
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    seconds = config.timeout.total_seconds()
    if patient:
        seconds = max(5.0, 10 * seconds)
    return {"socket_timeout": seconds, "socket_connect_timeout": seconds, "retry": Retry(NoBackoff(), 0),
            "health_check_interval": 0}


def _need_redis() -> None:
    try:
        import redis  # noqa: F401
    except ImportError:  # pragma: no cover - the test environment has it
        raise ConfigError([ConfigProblem("<config>", 0, 0, "push", "needs the redis package: pip install "
                                                                     "'feed-router[live]'")]) from None


class _Gate:
    """Whether to try Redis now, and whether a gap is owed (pushes were skipped or failed since the last one that
    reached it)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._until = 0.0
        self.owed = False

    def open(self) -> bool:
        with self._lock:
            if time.monotonic() < self._until:
                self.owed = True
                return False
            return True

    def failed(self) -> bool:
        """Record a failure; True if it starts a pause (the first of a streak: worth a log line)."""
        with self._lock:
            first = not self.owed
            self._until = time.monotonic() + PAUSE
            self.owed = True
            return first

    def reached(self) -> None:
        with self._lock:
            self.owed = False
            self._until = 0.0


class _Base:
    """What both publishers share: the commands of a push, the gate, the metrics and spans."""

    def __init__(self, config: PushConfig, *, metrics: Metrics = NO_METRICS, tracing: Tracing = NO_TRACING) -> None:
        _need_redis()
        self.config = config
        self.metrics = metrics
        self.tracing = tracing
        self._gate = _Gate()
        self._presence = f"{config.prefix}:{PRESENCE}"
        self._edits = f"{config.prefix}:{EDITS}"
        self._prefix = f"{config.prefix}:"

    def _owe_gap(self) -> None:
        """Send the gap :data:`PAUSE` seconds from now if no push has by then (a writer that goes quiet still tells
        subscribers it missed pushes)."""
        raise NotImplementedError

    def _gap_sent(self, answer: object) -> bool:
        """Count the gap's send (*answer*: what PUBLISH answered, or what it raised); True if it reached Redis."""
        from redis.exceptions import RedisError

        if isinstance(answer, RedisError):
            self._gate.failed()
            self.metrics.record(Event("push", 0.0, op="gap", outcome="failed"))
            return False
        self._gate.reached()
        self.metrics.record(Event("push", 0.0, op="gap", outcome="ok"))
        return True

    def _commands(self, push: Push) -> tuple[list[tuple[Any, ...]], Messages] | None:
        """The commands of *push* (a gap first when one is owed, then the scripts, then the broadcasts; for messages
        made per member, the presence look-up instead of the scripts) and its messages, or None when there is nothing
        to send or the gate says not now (counted ``skipped``)."""
        messages = push.messages()
        if not len(messages):
            return None
        if not self._gate.open():
            self.metrics.record(Event("push", 0.0, op=push.op, outcome="skipped"))
            return None
        commands: list[tuple[Any, ...]] = [("PUBLISH", self._edits, GAP)] if self._gate.owed else []
        members, heads = messages.members, messages.heads
        if messages.head is not None and members:
            commands.append(("TIME",))
        for start in range(0, len(members), CHUNK):
            part = members[start:start + CHUNK]
            if messages.head is not None:
                commands.append(("ZMSCORE", self._presence, *part))
            else:
                commands.append(("EVALSHA", SCRIPT_SHA, 1, self._presence, self._prefix, messages.body, len(part),
                                 *part, *heads[start:start + CHUNK]))
        commands += [("PUBLISH", self._edits, raw) for raw in messages.broadcast]
        return commands, messages

    def _present(self, messages: Messages, answers: list[Any]) -> list[tuple[Any, ...]]:
        """For messages made per member, after the look-up: a ``PUBLISH`` of each present member's message (its expiry,
        by Redis's clock, not past)."""
        if messages.head is None or not messages.members:
            return []
        looked = [a for a in answers if isinstance(a, (list, tuple))]  # TIME, then each ZMSCORE
        if len(looked) != 1 + -(-len(messages.members) // CHUNK):
            return []  # the look-up failed: counted by _done
        now = int(looked[0][0])
        scores = [score for chunk in looked[1:] for score in chunk]
        return [("PUBLISH", self._prefix + m, messages.message(i))
                for i, (m, score) in enumerate(zip(messages.members, scores)) if score is not None and float(score) >= now]

    def _done(self, push: Push, began: float, results: list[Any] | BaseException) -> None:
        """Count what a push did (*results*: the pipeline's answers, or what it raised)."""
        from redis.exceptions import ConnectionError as Unavailable, TimeoutError as Timeout

        seconds = time.perf_counter() - began
        if isinstance(results, BaseException):
            outcome = "timeout" if isinstance(results, Timeout) else "unavailable" if isinstance(results, Unavailable) else "failed"
            if self._gate.failed():
                log.warning("push: Redis at %s: %s: %s; live pushes skipped for %.0f s, then subscribers catch up",
                            self.config.display_redis, outcome, redact_uri(str(results))[:200], PAUSE)
            self.metrics.record(Event("push", seconds, op=push.op, outcome=outcome))
            self._owe_gap()
            return
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            if self._gate.failed():
                log.warning("push: Redis at %s refused a push: %s", self.config.display_redis,
                            redact_uri(str(errors[0]))[:200])
            self.metrics.record(Event("push", seconds, op=push.op, outcome="failed"))
            self._owe_gap()
            return
        self._gate.reached()
        self.metrics.record(Event("push", seconds, op=push.op, outcome="ok"))
        delivered = sum(r for r in results if isinstance(r, int))
        if delivered:
            self.metrics.record(Event("pushed", delivered))



def _reload(results: list[Any]) -> list[tuple[Any, ...]]:
    """The command that loads the script, when Redis did not know it (restarted, or another one): send it, then the
    scripts again; else nothing."""
    from redis.exceptions import NoScriptError

    return [] if not any(isinstance(r, NoScriptError) for r in results) else [("SCRIPT", "LOAD", SCRIPT)]


def _scripts(commands: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    return [c for c in commands if c[0] == "EVALSHA"]


class Publisher(_Base):
    """Pushes on a ``redis.Redis`` client, from any thread (redis-py's pool is thread-safe)."""

    def __init__(self, config: PushConfig, *, metrics: Metrics = NO_METRICS, tracing: Tracing = NO_TRACING) -> None:
        super().__init__(config, metrics=metrics, tracing=tracing)
        import redis

        self._client = redis.Redis.from_url(config.redis, **redis_options(config))
        self._timer: threading.Timer | None = None
        self._timer_lock = threading.Lock()
        self._closed = False

    def _owe_gap(self) -> None:
        with self._timer_lock:
            if self._timer is None and not self._closed:
                self._timer = threading.Timer(PAUSE, self._send_gap)
                self._timer.daemon = True
                self._timer.start()

    def _send_gap(self) -> None:
        from redis.exceptions import RedisError

        with self._timer_lock:
            self._timer = None
        if not self._gate.owed or self._closed:
            return
        try:
            answer: object = self._client.publish(self._edits, GAP)
        except RedisError as exc:
            answer = exc
        if not self._gap_sent(answer):
            self._owe_gap()

    def send(self, push: Push) -> None:
        """Carry out *push*; never raises (see the module's docs)."""
        from redis.exceptions import RedisError

        planned = self._commands(push)
        if planned is None:
            return
        commands, messages = planned
        with self.tracing.span(f"feedrouter.push.{push.op}", op=f"push.{push.op}"):
            began = time.perf_counter()
            try:
                answers = self._pipeline(commands)
                if again := _reload(answers):  # (Redis restarted, or another one): load it, send again
                    answers = self._pipeline(again + _scripts(commands))[1:]
                if then := self._present(messages, answers):
                    answers = [a for a in answers if not isinstance(a, (list, tuple))] + self._pipeline(then)
            except RedisError as exc:
                self._done(push, began, exc)
                return
            self._done(push, began, answers)

    def _pipeline(self, commands: list[tuple[Any, ...]]) -> list[Any]:
        pipe = self._client.pipeline(transaction=False)
        for command in commands:
            pipe.execute_command(*command)  # type: ignore[no-untyped-call]
        return list(pipe.execute(raise_on_error=False))

    def close(self) -> None:
        """Close the client's connections (a gap still owed is not sent)."""
        with self._timer_lock:
            self._closed = True
            if self._timer is not None:
                self._timer.cancel()
        self._client.close()


class AsyncPublisher(_Base):
    """Pushes on a ``redis.asyncio.Redis`` client, on the event loop that made it."""

    def __init__(self, config: PushConfig, *, metrics: Metrics = NO_METRICS, tracing: Tracing = NO_TRACING) -> None:
        super().__init__(config, metrics=metrics, tracing=tracing)
        import redis.asyncio

        self._client = redis.asyncio.Redis.from_url(config.redis, **redis_options(config))
        self._retry: asyncio.TimerHandle | None = None
        self._sending: set[asyncio.Task[None]] = set()
        self._closed = False

    def _owe_gap(self) -> None:
        if self._retry is None and not self._closed:
            self._retry = asyncio.get_running_loop().call_later(PAUSE, self._start_gap)

    def _start_gap(self) -> None:
        self._retry = None
        task = asyncio.get_running_loop().create_task(self._send_gap())
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _send_gap(self) -> None:
        from redis.exceptions import RedisError

        if not self._gate.owed or self._closed:
            return
        try:
            answer: object = await self._client.publish(self._edits, GAP)
        except RedisError as exc:
            answer = exc
        if not self._gap_sent(answer):
            self._owe_gap()

    async def send(self, push: Push) -> None:
        """Carry out *push*; never raises (see the module's docs)."""
        from redis.exceptions import RedisError

        planned = self._commands(push)
        if planned is None:
            return
        commands, messages = planned
        with self.tracing.span(f"feedrouter.push.{push.op}", op=f"push.{push.op}"):
            began = time.perf_counter()
            try:
                answers = await self._pipeline(commands)
                if again := _reload(answers):
                    answers = (await self._pipeline(again + _scripts(commands)))[1:]
                if then := self._present(messages, answers):
                    answers = [a for a in answers if not isinstance(a, (list, tuple))] + await self._pipeline(then)
            except RedisError as exc:
                self._done(push, began, exc)
                return
            self._done(push, began, answers)

    async def _pipeline(self, commands: list[tuple[Any, ...]]) -> list[Any]:
        pipe = self._client.pipeline(transaction=False)
        for command in commands:
            pipe.execute_command(*command)
        return list(await pipe.execute(raise_on_error=False))

    async def close(self) -> None:
        """Close the client's connections (a gap still owed is not sent)."""
        self._closed = True
        if self._retry is not None:
            self._retry.cancel()
        for task in list(self._sending):
            task.cancel()
        await asyncio.gather(*self._sending, return_exceptions=True)
        await self._client.aclose()
