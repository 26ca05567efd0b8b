"""Feed item checks and metadata documents."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import bson
import pytest
from bson import ObjectId
from hypothesis import given, settings
from hypothesis import strategies as st

from router import ClusterMeta, FeedItem, InvalidItem
from router.core.writes.checks import check_item
from router.model import stored_item
from router.core.layouts import LAYOUTS, Copy, CopyList

UTC = timezone.utc

anything = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20)
    | st.binary(max_size=8) | st.datetimes(timezones=st.just(UTC)) | st.sets(st.integers(), max_size=2),
    lambda inner: st.lists(inner, max_size=3)
    | st.dictionaries(st.text(max_size=5) | st.sampled_from(["$set", "a.b", ".", "$", "ok", ""]) | st.integers(), inner, max_size=3),
    max_leaves=8,
)


def _keys(value: Any) -> list[Any]:
    """Every mapping key at any depth of *value*."""
    if isinstance(value, dict):
        return [*value, *(k for v in value.values() for k in _keys(v))]
    if isinstance(value, (list, tuple)):
        return [k for v in value for k in _keys(v)]
    return []


@settings(max_examples=400)
@given(
    receiver=anything, sender=anything, event_time=anything | st.datetimes(timezones=st.just(UTC)), type_=anything,
    data=anything, key=anything,
)
def test_check_item_accepts_only_what_bson_stores(
    receiver: Any, sender: Any, event_time: Any, type_: Any, data: Any, key: Any
) -> None:
    """Any junk is either refused with InvalidItem or encodes as a valid BSON document."""
    item = FeedItem(receiver_id=receiver, sender_id=sender, event_time=event_time, type=type_, data=data, data_key=key)
    try:
        check_item(item, 0)
    except InvalidItem as exc:
        assert str(exc).startswith("items[0].")
        return
    copy = Copy(ObjectId(), item.receiver_id, item.sender_id, item.event_time, item.type, item.data, item.data_key)
    for layout in LAYOUTS.values():  # as each layout stores it (a bucket holds it as one of its items)
        assert len(bson.encode({"d": layout.documents(CopyList([copy]))[0]})) < 16 * 1024 * 1024
    assert not any(k.startswith("$") or "." in k for k in _keys(data))


@given(receiver=anything, sender=anything, event_time=anything, type_=anything, data=anything, key=anything,
       oid=anything)
def test_a_stored_item_is_the_item_the_class_builds(
    receiver: Any, sender: Any, event_time: Any, type_: Any, data: Any, key: Any, oid: Any,
) -> None:
    """Built through the slots, every field is set, and the item equals, hashes and prints as FeedItem(...)'s."""
    fields = (receiver, sender, event_time, type_, data, key, oid)
    built = FeedItem(receiver_id=receiver, sender_id=sender, event_time=event_time, type=type_, data=data,
                     data_key=key, id=oid)
    stored = stored_item(*fields)
    assert type(stored) is FeedItem and stored == built and repr(stored) == repr(built)
    assert (stored.receiver_id, stored.sender_id, stored.event_time, stored.type, stored.data, stored.data_key,
            stored.id) == fields
    try:
        expected = hash(built)
    except TypeError:  # an unhashable field value (a list, a dict): the same refusal
        with pytest.raises(TypeError):
            hash(stored)
    else:
        assert hash(stored) == expected
    with pytest.raises(AttributeError):  # still frozen
        stored.data = {}  # type: ignore[misc]


def test_flat_data_passes_without_encoding() -> None:
    """The usual small item passes and yields its event second."""
    t = datetime(2016, 5, 1, 10, tzinfo=UTC)
    item = FeedItem(receiver_id=1, sender_id=2, event_time=t, type=1, data={"fabula_id": 3, "x": None, "y": 1.5}, data_key="k")
    assert check_item(item) == t.timestamp()


def test_metadata_round_trip() -> None:
    """ClusterMeta survives to_document/from_document unchanged."""
    meta = ClusterMeta(name="c1", start_date=datetime(2016, 5, 1, tzinfo=UTC), end_date=datetime(2016, 8, 1, tzinfo=UTC),
                       creator_name="ethan", created_at=datetime(2016, 5, 1, tzinfo=UTC))
    assert ClusterMeta.from_document(meta.to_document()) == meta
    assert meta.to_document()["_id"] == "c1"


@pytest.mark.parametrize(
    "doc, message",
    [
        ({"_id": "a", "name": "a"}, "start_date: is missing"),
        ({"_id": "a", "name": "b", "start_date": datetime(2016, 5, 1, tzinfo=UTC)}, "name: must equal _id 'a' (got 'b')"),
        ({"_id": "a", "name": "a", "start_date": datetime(2016, 5, 1)}, "start_date: must be timezone-aware"),
        ({"_id": "a", "name": "a", "start_date": datetime(2016, 5, 1, tzinfo=UTC), "end_date": datetime(2016, 4, 1, tzinfo=UTC)},
         "end_date: must be after start_date"),
        ({"_id": "a", "name": "a", "start_date": 5}, "start_date: must be a timezone-aware datetime (got 5)"),
    ],
)
def test_bad_metadata_documents(doc: dict[str, Any], message: str) -> None:
    """Each malformed metadata document names its field."""
    with pytest.raises(InvalidItem) as info:
        ClusterMeta.from_document(doc)
    assert str(info.value).startswith(message)


def test_metadata_other_timezone_normalised() -> None:
    """A start_date in another zone is read as its UTC instant."""
    plus8 = timezone(timedelta(hours=8))
    meta = ClusterMeta.from_document({"_id": "a", "name": "a", "start_date": datetime(2016, 5, 1, 8, tzinfo=plus8)})
    assert meta.start_date == datetime(2016, 5, 1, tzinfo=UTC) and meta.start_date.tzinfo is UTC
