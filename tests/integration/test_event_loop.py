"""AsyncFeedRouter outside the event loop that started it: every public coroutine raises WrongEventLoop, sending nothing.

(The sync door has no event loop; its side of the contract is that it is not affected, which every other test shows.)
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Coroutine
from datetime import timedelta
from typing import Any

import pytest
from bson import ObjectId

from router import Activity, AsyncFeedRouter, FeedItem, Position, RouterConfig, RouterError, WrongEventLoop, data_key
from harness.commands import CommandLog

from .conftest import NOW, P1, register
from .doors import LoopThread

#: A storage contract file: every test here runs once per layout the servers hold (see conftest.py); none sends a
#: command, so none needs the second server.
pytestmark = [pytest.mark.contract, pytest.mark.scenario(reason="refused before any I/O: nothing reaches a server")]

POST = Activity(sender_id=7, event_time=P1 + timedelta(days=3), type=1, data={"n": 1}, data_key=data_key("loop", 1))
ITEM = FeedItem(receiver_id=1, sender_id=7, event_time=P1 + timedelta(days=4), type=1, data={}, data_key=data_key("loop", 2))

#: One call of every public coroutine of AsyncFeedRouter.
CALLS: dict[str, Callable[[AsyncFeedRouter], Coroutine[Any, Any, Any]]] = {
    "start": lambda r: r.start(),
    "write": lambda r: r.write(ITEM),
    "write_many": lambda r: r.write_many([ITEM]),
    "read": lambda r: r.read(1),
    "mark_seen": lambda r: r.mark_seen(1, Position(ITEM.event_time, ObjectId())),
    "seen_position": lambda r: r.seen_position(1),
    "unseen_count": lambda r: r.unseen_count(1),
    "read_groups": lambda r: r.read_groups(1),
    "mark_read": lambda r: r.mark_read(1, "all"),
    "unseen_groups": lambda r: r.unseen_groups(1),
    "erase_user": lambda r: r.erase_user(7, requested_by="tests"),
    "erasure_status": lambda r: r.erasure_status(7),
    "export_user": lambda r: r.export_user(7, "no-such-folder"),
    "delete": lambda r: r.delete(POST.data_key),
    "update": lambda r: r.update(POST.data_key, {"n": 2}),
    "unfollow": lambda r: r.unfollow(1, 7),
    "backfill": lambda r: r.backfill(1, [7]),
    "follow": lambda r: r.follow(1, 7),
    "publish": lambda r: r.publish(POST, [1, 2], pull=False),
    "fan_out": lambda r: r.fan_out(POST, [1, 2]),
    "plan_fan_out": lambda r: r.plan_fan_out(POST),
    "fan_out_status": lambda r: r.fan_out_status("no-such-job"),
    "refresh": lambda r: r.refresh(),
    "stop_refresh": lambda r: r.stop_refresh(),
    "close": lambda r: r.close(),
}


def test_every_public_coroutine_is_covered() -> None:
    """CALLS names every public coroutine of the async door, so none escapes the tests below."""
    public = {name for name, member in inspect.getmembers(AsyncFeedRouter)  # its own and its base's
              if not name.startswith("_") and inspect.iscoroutinefunction(member)}
    assert public == set(CALLS)


def refused_everywhere(router: AsyncFeedRouter, run: Callable[[Coroutine[Any, Any, Any]], Any]) -> list[WrongEventLoop]:
    """Each call, run by *run* on a loop that is not the router's, raises WrongEventLoop naming the call."""
    errors = []
    for name, call in CALLS.items():
        with pytest.raises(WrongEventLoop) as info:
            run(call(router))
        assert isinstance(info.value, RouterError)
        assert str(info.value).startswith(f"{name}(): this AsyncFeedRouter belongs to the event loop that started it")
        errors.append(info.value)
    return errors


@pytest.fixture
def config(registered_database: None, make_config: Callable[..., RouterConfig]) -> RouterConfig:
    made = make_config()
    register(made)
    return made


def test_a_second_loop_is_refused_before_any_io(config: RouterConfig, event_loop_thread: LoopThread) -> None:
    """Started on one loop (running on its thread), awaited from another: refused, nothing sent; its own loop still works."""
    log = CommandLog()
    router = AsyncFeedRouter(config, clock=lambda: NOW, refresh=False, event_listeners=[log])
    event_loop_thread.run(router.start())
    try:
        log.on = True
        errors = refused_everywhere(router, asyncio.run)
        assert log.commands == [], "a call from the wrong loop sent commands"
        assert all("closed" not in str(e) for e in errors)
        page = event_loop_thread.run(router.read(1))  # the router is untouched on its own loop
        assert page.items == ()
        assert log.total("find") > 0
    finally:
        event_loop_thread.run(router.close())


def test_a_closed_loop_is_refused_before_any_io(config: RouterConfig) -> None:
    """Started by asyncio.run, whose loop then ended: every later call, from a new loop, is refused and sends nothing."""
    log = CommandLog()
    router = AsyncFeedRouter(config, clock=lambda: NOW, refresh=False, event_listeners=[log])
    asyncio.run(router.start())
    log.on = True
    errors = refused_everywhere(router, asyncio.run)
    assert log.commands == [], "a call after the router's loop ended sent commands"
    assert all("(that loop is closed)" in str(e) for e in errors)
