"""What the live feeds' integration tests share: items, a metrics recorder, waits on a subscription, and the
fixtures of a real Redis and a router with ``push:`` (imported by each test module that uses them)."""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import attrs
import pytest
from bson import ObjectId

from router import FeedItem, LiveEvent, NewItem, RouterConfig, data_key
from router.observe import Event, Metrics
from router.pushconfig import PushConfig
from harness.redis import LocalRedis

from .conftest import NOW, P2, register

R = 1000386          # the receiver most tests watch
S = 1000765          # a sender
WHEN = P2 + timedelta(days=10)


def item(n: int, receiver: int | str = R, *, sender: int | str = S, type: int | str = 1) -> FeedItem:
    """Item *n*: later *n*, later time (a second apart)."""
    return FeedItem(receiver_id=receiver, sender_id=sender, event_time=WHEN + timedelta(seconds=n), type=type,
                    data={"n": n}, data_key=data_key("live", n))


class Recorded(Metrics):
    """Every event the router reports, kept (from any thread)."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self._lock = threading.Lock()

    def record(self, event: Event) -> None:
        with self._lock:
            self.events.append(event)

    def total(self, name: str, **labels: str) -> float:
        with self._lock:
            return sum(e.value for e in self.events if e.name == name
                       and all(getattr(e, k) == v for k, v in labels.items()))

    def outcomes(self, name: str) -> Counter[str | None]:
        """The outcomes of *name* events (for ``push``: the pushes of writes, not the gap's own sends)."""
        with self._lock:
            return Counter(e.outcome for e in self.events if e.name == name and e.op != "gap")


def until(live: Any, done: Callable[[LiveEvent], bool], *, timeout: float = 60.0) -> list[LiveEvent]:
    """Events of *live* up to and including the first that *done* accepts; fails if none comes within *timeout*."""
    got: list[LiveEvent] = []
    while True:
        event = live.get(timeout=timeout)
        assert event is not None, f"no event within {timeout:.0f} s; so far {got!r:.2000}"
        got.append(event)
        if done(event):
            return got


def opened(live: Any) -> Any:
    """*live* subscribed and caught up, with nothing to hand out yet (``get(timeout=0)`` does both, then looks)."""
    assert live.get(timeout=0) is None
    return live


def wait_for(what: str, check: Callable[[], bool], *, timeout: float = 30.0) -> None:
    """Poll *check* until it is true; fail naming *what* after *timeout* seconds."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"{what}: not within {timeout:.0f} s"
        time.sleep(0.05)


def opened_or_not(live: Any) -> tuple[Any, list[LiveEvent]]:
    """*live* subscribed and caught up, with the events it had ready by then."""
    ready: list[LiveEvent] = []
    while (event := live.get(timeout=0)) is not None:
        ready.append(event)
    return live, ready


def is_item(oid: ObjectId) -> Callable[[LiveEvent], bool]:
    return lambda e: isinstance(e, NewItem) and e.item.id == oid


def new_ids(events: list[LiveEvent]) -> list[ObjectId]:
    return [e.item.id for e in events if isinstance(e, NewItem) and e.item.id is not None]


@pytest.fixture(scope="module")
def redis_server() -> Iterator[LocalRedis]:
    with LocalRedis() as server:
        yield server


@pytest.fixture
def push(redis_server: LocalRedis) -> PushConfig:
    """The push section of this test: the module's Redis, a prefix of its own, a short presence expiry."""
    return PushConfig(redis=redis_server.url, prefix=f"t{uuid.uuid4().hex[:10]}", presence_ttl=timedelta(seconds=3))


@pytest.fixture
def live_config(registered_database: None, make_config: Callable[..., RouterConfig], push: PushConfig) -> RouterConfig:
    config = attrs.evolve(make_config(), push=push)
    register(config)
    return config


@pytest.fixture
def metrics() -> Recorded:
    return Recorded()


@pytest.fixture
def feeds(open_router: Callable[..., Any], live_config: RouterConfig, metrics: Recorded) -> Any:
    """A router with push: through this test's door."""
    return open_router(live_config, clock=lambda: NOW, metrics=metrics)


