"""Fuzzed metadata documents and feed items against a real server: a RouterError, and nothing changed."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pymongo import MongoClient

from router import FeedItem, FeedRouter, InvalidItem, MetadataError, NoClusterForTime, RouterConfig, RouterError

from . import stored
from .conftest import NOW, P0, P1, P2

#: A storage contract file: every test here runs once per layout the servers hold (see conftest.py).
pytestmark = pytest.mark.contract

UTC = timezone.utc
Clients = dict[str, MongoClient[dict[str, Any]]]
SLOW = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

dates = st.sampled_from([P0, P1, P2, NOW]) | st.datetimes(
    min_value=datetime(1900, 1, 1), max_value=datetime(2200, 1, 1), timezones=st.just(UTC)
)
junk = st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=8) | st.lists(st.integers(0, 9), max_size=2)
meta_docs = st.fixed_dictionaries(
    {},
    optional={
        "_id": st.sampled_from(["cluster_1", "cluster_2", "other"]) | junk,
        "name": st.sampled_from(["cluster_1", "cluster_2", "other"]) | junk,
        "start_date": dates | junk,
        "end_date": dates | junk,
        "creator_name": junk,
        "created_at": dates | junk,
        "retired": junk,
    },
)


@SLOW
@given(first=st.lists(meta_docs, max_size=2), second=st.lists(meta_docs, max_size=2))
def test_fuzzed_metadata_is_a_metadata_error(
    first: list[dict[str, Any]], second: list[dict[str, Any]], make_config: Callable[..., RouterConfig],
    raw_clients: Clients, db_name: str,
) -> None:
    """Any metadata documents in two clusters: the router starts with a valid map, or refuses with MetadataError."""
    config = make_config()
    config = RouterConfig(database=config.database, clusters=config.clusters[:2])
    for name, docs in (("cluster_1", first), ("cluster_2", second)):
        coll = raw_clients[name][db_name].metadata
        coll.delete_many({})
        for i, doc in enumerate(docs):
            doc = {**doc, "_id": doc.get("_id", f"x{i}")}
            if isinstance(doc["_id"], list):
                doc["_id"] = str(doc["_id"])
            if coll.count_documents({"_id": doc["_id"]}) == 0:
                coll.insert_one(doc)
    try:
        with FeedRouter(config, refresh=False) as router:
            for m in router.timemap.periods:
                assert m.start_date.tzinfo is not None and (m.end_date is None or m.end_date > m.start_date)
    except MetadataError as exc:
        assert exc.problems and all("cluster '" in p or "overlaps" in p or "open-ended" in p for p in exc.problems)


items = st.builds(
    FeedItem,
    receiver_id=st.integers(-(2**70), 2**70) | st.text(max_size=4) | junk,
    sender_id=st.integers(0, 10) | junk,
    event_time=dates | st.datetimes() | junk,
    type=st.integers(0, 3) | junk,
    data=st.dictionaries(st.text(max_size=3), junk, max_size=3) | st.dictionaries(st.none() | st.integers(0, 9) | st.text(max_size=3), junk, max_size=2) | junk,
    data_key=st.text(max_size=4) | junk,
)


@SLOW
@given(batch=st.lists(items, min_size=1, max_size=6))
def test_fuzzed_items_rejected_whole_or_written_whole(
    batch: list[FeedItem], make_router: Callable[..., FeedRouter], raw_clients: Clients, db_name: str
) -> None:
    """A batch with junk raises InvalidItem or NoClusterForTime and changes no cluster; a clean one is stored whole."""
    router = make_router(refresh=False)
    before = sum(stored.count(c[db_name]) for c in raw_clients.values())
    good = FeedItem(receiver_id=1, sender_id=1, event_time=P1 + timedelta(days=1), type=1, data={}, data_key="k")
    try:
        ids = router.write_many([good, *batch])
    except (InvalidItem, NoClusterForTime) as exc:
        assert str(exc).startswith("items[")
        assert sum(stored.count(c[db_name]) for c in raw_clients.values()) == before
        return
    except RouterError as exc:  # anything else must still be ours, and say so
        raise AssertionError(f"unexpected {type(exc).__name__}: {exc}") from exc
    assert len(ids) == len(batch) + 1
    assert sum(stored.count(c[db_name]) for c in raw_clients.values()) == before + len(ids)
