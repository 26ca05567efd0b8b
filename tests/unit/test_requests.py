"""How a read's deadline reaches the server, and what a read cut at it answers: the parts of
router.storage.requests no server is asked for (an unconnected client knows no server)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from pymongo import MongoClient

from router import ClusterUnavailable
from router.core.steps import Failure, Find
from router.storage.finds import max_time_ms
from router.storage.requests import expired, server_deadline


@pytest.fixture
def client() -> Iterator[MongoClient[dict[str, Any]]]:
    unconnected: MongoClient[dict[str, Any]] = MongoClient("mongodb://127.0.0.1:1", connect=False)
    yield unconnected
    unconnected.close()


def test_a_read_sends_what_is_left_as_max_time_ms() -> None:
    """maxTimeMS is the time left before the server must stop, in whole milliseconds, and never 0 (no limit)."""
    assert 1_900 <= max_time_ms(time.monotonic() + 2.0) <= 2_000
    assert max_time_ms(time.monotonic() - 1.0) == 1


def test_the_server_must_stop_a_round_trip_before_the_client(client: MongoClient[dict[str, Any]]) -> None:
    """With no round trip measured yet the server gets the whole time; under a millisecond a read is not sent."""
    before = time.monotonic()
    until = server_deadline(client, 1.0)
    assert until is not None and before + 1.0 <= until <= time.monotonic() + 1.0
    assert server_deadline(client, 0.0005) is None


def test_a_read_cut_while_no_server_is_known_is_unavailable(client: MongoClient[dict[str, Any]]) -> None:
    """As pymongo's ServerSelectionTimeoutError under its deadline: unavailable, naming the cluster and the read."""
    request = Find("p3", "feed", {"receiver_id": 7}, time.monotonic())
    answer = expired(request, "p3", client, 1.5)
    assert isinstance(answer, Failure) and answer.kind == "unavailable" and answer.cluster_down
    assert isinstance(answer.error, ClusterUnavailable) and answer.error.cluster == "p3"
    assert "reading feed" in str(answer.error) and "1.5 s" in str(answer.error)
