"""The requests the core yields: an aggregate the router sends is one FerretDB 2 holds whole from its first batch."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
from bson import ObjectId

from router.core.layouts import LAYOUTS, grouping
from router.core.steps import HOLDING_STAGES, Aggregate
from router.cursor import Position

T = datetime(2024, 5, 1, tzinfo=timezone.utc)


def test_an_aggregate_of_streamable_stages_alone_is_refused() -> None:
    """A ``$match``/``$project`` pipeline would be continued by heap position on FerretDB 2: never sent."""
    with pytest.raises(ValueError, match=r"pipeline: .*\$sort.*got stages \['\$match', '\$project'\]"):
        Aggregate("c", "feed", [{"$match": {"a": 1}}, {"$project": {"a": 1}}], 0.0)
    assert Aggregate("c", "feed", [{"$match": {"a": 1}}, {"$sort": {"a": 1}}], 0.0).pipeline[-1] == {"$sort": {"a": 1}}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_a_pulled_senders_copies_are_asked_in_a_held_pipeline(layout: str) -> None:
    """The pulled copies of a grouped read (the one pipeline that returns copies whole, possibly past a batch) sort
    them, newest first: a stage that makes the server hold them."""
    request = grouping.pulled_copies(LAYOUTS[layout], "c", 7, T, T.replace(day=2), [5], [], Position(T, ObjectId()), 0.0)
    assert request.pipeline[-1] == {"$sort": {"event_time": -1, "_id": -1}}
    assert "$sort" in HOLDING_STAGES
