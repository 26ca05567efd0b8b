"""Edits of any size on real servers: data up to the write limit, in every layout, through both doors.

Data is accepted on write up to 16 MiB - 64 KiB (``MAX_DATA_BYTES``); ``update`` must take
the same data. The copies and buckets layouts each get a period of their own (buckets: a
period created by the operator path, on a server that appends atomically); a copy that big
sits alone in its bucket.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import bson
import pytest
from pymongo import MongoClient

from router import Activity, RouterConfig, data_key
from router.core.checks import MAX_DATA_BYTES
from router.testing.localservers import LocalClusters

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
