"""The async storage's outside watch of a read that waits for a server: it ends in its time even when the call
would swallow a cancellation (as ``asyncio.wait_for`` can on Python 3.11), never cancels it, and nothing it gave up
is left unretrieved."""

from __future__ import annotations

import asyncio
import time

import pytest

from router.storage import aclusters
from router.storage.aclusters import _within


async def stubborn(seconds: float) -> str:
    """A call that swallows the first cancellation and goes on, as a lost cancellation does."""
    try:
        await asyncio.sleep(seconds)
    except asyncio.CancelledError:
        await asyncio.sleep(seconds)
    return "too late"


def test_a_call_that_ends_in_time_gives_its_value() -> None:
    async def quick() -> str:
        await asyncio.sleep(0.01)
        return "answer"

    assert asyncio.run(_within(quick(), 5.0)) == (True, "answer")


def test_a_call_that_raises_in_time_raises() -> None:
    async def refused() -> str:
        raise LookupError("no such thing")

    with pytest.raises(LookupError, match="no such thing"):
        asyncio.run(_within(refused(), 5.0))


def test_a_call_that_swallows_its_cancellation_is_given_up_in_time_and_left_to_end() -> None:
    cancelled: list[bool] = []

    async def watched() -> str:
        try:
            await asyncio.sleep(0.5)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise
        return "too late"

    async def main() -> tuple[float, tuple[bool, str | None], float]:
        began = time.monotonic()
        outcome = await _within(watched(), 0.1)
        returned = time.monotonic() - began
        assert len(aclusters._ABANDONED) == 1  # still running, kept referenced
        await asyncio.sleep(0.7)
        return returned, outcome, time.monotonic() - began

    returned, outcome, _ = asyncio.run(main())
    assert outcome == (False, None) and not cancelled
    assert returned < 0.4  # (the call itself went on for 0.5 s more)
    assert not aclusters._ABANDONED  # it ended, and its end was taken


def test_asyncio_timeout_alone_waits_for_such_a_call() -> None:
    """Why the watch exists: under ``asyncio.timeout`` the same call runs to its own end."""
    async def main() -> float:
        began = time.monotonic()
        async with asyncio.timeout(0.1):
            await stubborn(0.5)
        return time.monotonic() - began

    assert asyncio.run(main()) >= 0.5
