"""The layout table, and the copies layout's own clauses."""

from __future__ import annotations

from datetime import datetime, timezone

import bson
import pytest
from bson import ObjectId

from router.core.layouts import DEFAULT, LAYOUTS, layout_named
from router.core.checks import MAX_DATA_BYTES
from router.core.layouts.copies import newer_than, older_than
from router.core.steps import Update
from router.cursor import Position
from router.errors import InvalidItem
from router.model import ClusterMeta
from router.timemap import TimeMap

UTC = timezone.utc


def test_older_than_breaks_ties_on_id() -> None:
    """Items in the same millisecond are ordered by _id."""
    t = datetime(2020, 1, 1, tzinfo=UTC)
    oid = ObjectId()
    assert older_than(Position(t, oid)) == {"$or": [{"event_time": {"$lt": t}}, {"event_time": t, "_id": {"$lt": oid}}]}
    assert newer_than(Position(t, oid), "key") == {"$or": [{"event_time": {"$gt": t}}, {"event_time": t, "key": {"$gt": oid}}]}
    assert older_than(None) == {} == newer_than(None)


def test_unknown_layout_is_refused_by_name() -> None:
    """A layout name outside the table is refused, naming the known ones."""
    with pytest.raises(InvalidItem, match=r"layout: must be one of .*copies.*\(got 'heap'\)"):
        layout_named("heap")
    assert layout_named(DEFAULT) is LAYOUTS["copies"]


def test_metadata_records_a_layout_only_when_not_the_default() -> None:
    """Existing clusters (no layout field) read as copies; another layout round-trips through the document."""
    start = datetime(2020, 1, 1, tzinfo=UTC)
    plain = ClusterMeta(name="c1", start_date=start)
    assert "layout" not in plain.to_document() and ClusterMeta.from_document(plain.to_document()).layout == "copies"
    other = ClusterMeta(name="c2", start_date=datetime(2021, 1, 1, tzinfo=UTC), layout="buckets")
    assert ClusterMeta.from_document(other.to_document()).layout == "buckets"
    timemap = TimeMap([plain.__class__(name="c1", start_date=start, end_date=other.start_date), other])
    assert timemap.layout_of("c1") == "copies" and timemap.layout_of("c2") == "buckets"
    assert timemap.layout_of("not-there") == "copies"


@pytest.mark.parametrize("layout", ["copies", "buckets"])
def test_fixing_copies_with_the_largest_data_keeps_every_statement_within_16_mib(layout: str) -> None:
    """The requests that re-data 10,000 just-written copies with data of MAX_DATA_BYTES: each statement (filter,
    update and array filters) fits in 16 MiB, carrying the data once, and together they name every id."""
    data = {"fill": "x" * (MAX_DATA_BYTES - 64)}
    ids = [ObjectId() for _ in range(10_000)]
    requests = layout_named(layout).fix("c", "k" * 1024, ids, data, 0.0)
    assert all(isinstance(r, Update) for r in requests)
    named: list[list[ObjectId]] = []
    for request in requests:
        assert isinstance(request, Update)
        statement = {"q": request.filter, "u": request.update, "arrayFilters": request.array_filters or []}
        assert len(bson.encode(statement)) <= 16 * 1024 * 1024
        assert bson.encode(request.filter).count(b"x" * 1000) == 0  # the data is not matched on
        found = request.filter.get("_id") or request.filter["items"]["$elemMatch"]["_id"]
        named.append(found["$in"])
    per = 2 if layout == "buckets" else 1  # buckets: a statement for lone copies' buckets, one for shared buckets
    assert all(named[i] == named[i + j] for i in range(0, len(named), per) for j in range(per))
    assert [oid for chunk in named[::per] for oid in chunk] == ids
