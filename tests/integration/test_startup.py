"""Start-up: the time map is built from every cluster's metadata, or refused with every problem."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from pymongo import MongoClient

from router import FeedRouter, MetadataError, RouterConfig

from .conftest import P0, P1, P2, register

#: A storage contract file: every test here runs once per layout the servers hold (see conftest.py).
pytestmark = pytest.mark.contract

Clients = dict[str, MongoClient[dict[str, Any]]]


def test_loads_the_time_map(make_config: Callable[..., RouterConfig]) -> None:
    """Three registered periods make a three-entry map in time order."""
    config = make_config()
    register(config)
    with FeedRouter(config) as router:
        assert [m.name for m in router.timemap.periods] == ["cluster_1", "cluster_2", "cluster_3"]
        assert router.timemap.periods[2].end_date is None
        assert router.timemap.gaps == ()


def test_every_metadata_problem_reported_at_once(
    make_config: Callable[..., RouterConfig], raw_clients: Clients, db_name: str
) -> None:
    """Missing, duplicated and misnamed metadata, in one MetadataError naming each cluster."""
    config = make_config()
    meta = {c: raw_clients[c][db_name].metadata for c in raw_clients}
    # cluster_1: no metadata at all
    meta["cluster_2"].insert_many([
        {"_id": "cluster_2", "name": "cluster_2", "start_date": P1, "end_date": P2},
        {"_id": "other", "name": "other", "start_date": P1, "end_date": P2},
    ])
    meta["cluster_3"].insert_one({"_id": "cluster_x", "name": "cluster_x", "start_date": P2, "end_date": None})
    with pytest.raises(MetadataError) as info:
        FeedRouter(config)
    text = str(info.value)
    assert f"cluster 'cluster_1': no metadata document in {db_name}.metadata" in text
    assert "cluster 'cluster_2': 2 metadata documents" in text
    assert "cluster 'cluster_3': metadata _id 'cluster_x' does not match the configured name 'cluster_3'" in text
    assert len(info.value.problems) == 3


def test_overlaps_and_two_open_ends_refused(make_config: Callable[..., RouterConfig]) -> None:
    """Overlapping periods and two open-ended ones are refused with both clusters named."""
    config = make_config()
    register(config, [(P0, P2), (P1, None), (P2, None)])
    with pytest.raises(MetadataError) as info:
        FeedRouter(config)
    text = str(info.value)
    assert "more than one open-ended period: cluster_2, cluster_3" in text
    assert "cluster 'cluster_1' [2024-01-01T00:00:00Z, 2024-07-01T00:00:00Z) overlaps cluster 'cluster_2'" in text


def test_malformed_metadata_field_named(make_config: Callable[..., RouterConfig], raw_clients: Clients, db_name: str) -> None:
    """A start_date that is not a date is reported with the field's name."""
    config = make_config()
    register(config)
    raw_clients["cluster_2"][db_name].metadata.update_one({"_id": "cluster_2"}, {"$set": {"start_date": "2024-04-01"}})
    with pytest.raises(MetadataError, match=r"cluster 'cluster_2': metadata.start_date: must be a timezone-aware datetime \(got '2024-04-01'\)"):
        FeedRouter(config)


def test_inverted_period_in_metadata(make_config: Callable[..., RouterConfig], raw_clients: Clients, db_name: str) -> None:
    """An end_date before start_date is refused, naming the cluster."""
    config = make_config()
    register(config)
    raw_clients["cluster_1"][db_name].metadata.update_one({"_id": "cluster_1"}, {"$set": {"end_date": P0 - timedelta(days=1)}})
    with pytest.raises(MetadataError, match="cluster 'cluster_1': metadata.end_date: must be after start_date"):
        FeedRouter(config)


def test_refresh_picks_up_new_metadata(make_config: Callable[..., RouterConfig], raw_clients: Clients, db_name: str) -> None:
    """refresh() reloads the map; a broken reload keeps the old one in use."""
    config = make_config()
    register(config)
    with FeedRouter(config) as router:
        raw_clients["cluster_3"][db_name].metadata.update_one({"_id": "cluster_3"}, {"$set": {"end_date": P2 + timedelta(days=400)}})
        assert router.refresh().periods[2].end_date == P2 + timedelta(days=400)
        raw_clients["cluster_3"][db_name].metadata.delete_many({})
        with pytest.raises(MetadataError):
            router.refresh()
        assert router.timemap.periods[2].end_date == P2 + timedelta(days=400)
