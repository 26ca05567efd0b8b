"""Edits of any size on real servers: data up to the write limit, in every layout, through both doors.

Data is accepted on write up to 16 MiB - 64 KiB (``MAX_DATA_BYTES``); ``update`` must take
the same data. The copies and buckets layouts each get a period of their own (buckets: a
period created by the operator path, on a server that appends atomically); a copy that big
sits alone in its bucket.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import attrs
import bson
import pytest
from pymongo import MongoClient

from router import Activity, DeleteFailed, RouterConfig, UpdateFailed, data_key
from router.core.writes.checks import MAX_DATA_BYTES
from harness.localservers import LocalClusters

from .conftest import NOW, P0, P1, register
from .layouts import buckets_config

Clients = dict[str, MongoClient[dict[str, Any]]]


def near_limit(fill: str) -> dict[str, Any]:
    """Data whose BSON takes MAX_DATA_BYTES less a few bytes."""
    data = {"fill": "", "tag": fill}
    data["fill"] = fill * (MAX_DATA_BYTES - len(bson.encode(data)) - 16)
    assert MAX_DATA_BYTES - 32 < len(bson.encode(data)) <= MAX_DATA_BYTES
    return data


@pytest.mark.parametrize("layout", ["copies", "buckets"])
def test_update_takes_data_as_large_as_a_write_does(
    layout: str, servers: LocalClusters, make_config: Callable[..., RouterConfig], open_router: Callable[..., Any],
) -> None:
    """A post published with data of 16 MiB - 64 KiB to two followers, then updated twice to other such data: each
    update changes both copies and the outbox entry, and a repeat changes nothing."""
    if layout == "buckets":
        config = buckets_config(servers.uris[0])  # cluster_2, [P1, P2), stores buckets
        when = P1 + timedelta(days=2)
    else:
        config = make_config(timeout=timedelta(seconds=60))
        register(config)
        when = P0 + timedelta(days=2)
    router = open_router(config, clock=lambda: NOW)
    key = data_key("big", layout)
    first, second, third = near_limit("a"), near_limit("b"), near_limit("c")
    result = router.publish(Activity(sender_id=9, event_time=when, type=1, data=first, data_key=key), [1, 2], pull=False)
    assert result.fan_out is not None and result.fan_out.written == 2
    assert router.update(key, second) == 2
    assert [item.data["tag"] for r in (1, 2) for item in router.read(r, limit=5).items] == ["b", "b"]
    assert router.update(key, third) == 2
    assert router.update(key, third) == 0  # nothing left to change
    assert router.read(1, limit=5).items[0].data == third
    assert [item.data["tag"] for item in router.read(9, limit=5, pull=[9]).items] == ["c"]  # the outbox entry


# -- edits that always make progress -----------------------------------------------------------------------------

def edit_until_done(call: Callable[[], int], remaining: Callable[[], int], *,
                    calls: int) -> list[tuple[str, float, int, int]]:
    """Call *call* until it returns, at most *calls* times; after each failed call fewer documents must be left to edit
    than before it (the calls converge). Returns each call's outcome, time, count (what it returned, or what the
    ``UpdateFailed`` / ``DeleteFailed`` it raised counted) and what was left after it."""
    log: list[tuple[str, float, int, int]] = []
    before = remaining()
    for _ in range(calls):
        began = time.monotonic()
        try:
            count = call()
        except (UpdateFailed, DeleteFailed) as failed:
            after = remaining()
            count = failed.updated if isinstance(failed, UpdateFailed) else failed.deleted
            why = "; ".join(str(error) for error in failed.failed.values())
            log.append((f"failed ({why})", time.monotonic() - began, count, after))
            assert after < before, f"a call made no progress: {log}"
            before = after
            continue
        log.append(("done", time.monotonic() - began, count, remaining()))
        assert log[-1][3] == 0, log
        return log
    raise AssertionError(f"{calls} calls did not finish: {log}")


def counts(log: list[tuple[str, float, int, int]]) -> list[int]:
    """What each call of an :func:`edit_until_done` log counted."""
    return [count for _, _, count, _ in log]


#: Copies the edits with a short timeout change: three steps of 10,000 (what a step does, not the count, meets the
#: timeout; the big edits below are ten such steps).
SPLIT_COPIES = 30_000


def test_edits_with_a_short_timeout_split_their_steps_and_progress_on_every_call(
    make_config: Callable[..., RouterConfig], open_router: Callable[..., Any], raw_clients: Clients, db_name: str,
) -> None:
    """30,000 copies, then update and delete with ``timeout: 1s``, less than a step of 10,000 copies takes on
    FerretDB 2: a step that runs out of time is split (not retried whole, not given up), so every call edits copies
    itself, and the calls finish."""
    config = make_config()
    register(config)
    key = data_key("split", 1)
    act = Activity(sender_id=4, event_time=P1 + timedelta(days=1), type=1, data={"v": 0}, data_key=key)
    assert open_router(config, clock=lambda: NOW).fan_out(act, range(SPLIT_COPIES)).written == SPLIT_COPIES
    hasty = open_router(attrs.evolve(config, timeout=timedelta(seconds=1)), clock=lambda: NOW)
    feed = raw_clients["cluster_2"][db_name].feed
    stale = {"data_key": key, "data": {"$ne": {"v": 1}}}
    updated = counts(edit_until_done(lambda: hasty.update(key, {"v": 1}), lambda: feed.count_documents(stale),
                                     calls=40))
    assert all(n > 0 for n in updated) and sum(updated) == SPLIT_COPIES  # each call changed copies, each copy once
    deleted = counts(edit_until_done(lambda: hasty.delete(key), lambda: feed.count_documents({"data_key": key}),
                                     calls=40))
    assert all(n > 0 for n in deleted) and sum(deleted) == SPLIT_COPIES


#: Copies of the big edits at the default timeout: ten steps of 10,000, each call going on from where the last one
#: stopped (the steps, not their number, meet the timeout; scripts/bench's ``delete_big`` measures 400,000).
BIG_COPIES = 100_000


@pytest.mark.slow
def test_big_edits_are_updated_and_deleted_with_the_default_timeout(
    sync_router: Any, raw_clients: Clients, db_name: str, caplog: pytest.LogCaptureFixture,
) -> None:
    """A 100,000-receiver fan-out, then update and delete with the default timeout (10 s): each finishes, or every
    further call leaves fewer copies to edit than the one before and the calls finish (docs: call it again). The
    deletes count every copy once and remove nothing else; a delete again finds nothing. (This is the suite's one
    100,000-copy delete: test_fanout's delete of a fan-out runs 12,000, more than one step.)"""
    feed = raw_clients["cluster_2"][db_name].feed
    key = data_key("huge", 1)
    act = Activity(sender_id=5, event_time=P1 + timedelta(days=2), type=1, data={"v": 0}, data_key=key)
    other = attrs.evolve(act, sender_id=6, data_key=data_key("huge", 2))
    assert sync_router.fan_out(other, range(100)).written == 100
    assert sync_router.fan_out(act, range(BIG_COPIES)).written == BIG_COPIES
    with caplog.at_level(logging.INFO, logger="router.core.layouts.queries"):
        updates = edit_until_done(lambda: sync_router.update(key, {"v": 1}),
                                  lambda: feed.count_documents({"data_key": key, "data": {"$ne": {"v": 1}}}), calls=30)
        deletes = edit_until_done(lambda: sync_router.delete(key), lambda: feed.count_documents({"data_key": key}),
                                  calls=30)
    assert sum(counts(deletes)) == BIG_COPIES, deletes
    assert feed.count_documents({"data_key": other.data_key, "data": {"v": 0}}) == 100
    assert sync_router.delete(key) == 0  # repeatable
    print(f"\nupdate calls: {updates}\ndelete calls: {deletes}")
