"""The pure half of aggregated notifications: keys, windows, cursors and the newest actors."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import attrs
import pytest
from bson import Decimal128, Int64, ObjectId
from hypothesis import given
from hypothesis import strategies as st

from router import FeedItem, GroupBy, InvalidCursor, InvalidItem, Position
from router.core.notify.groups import (
    Group,
    GroupCursor,
    canonical,
    check_group,
    decode_group_cursor,
    decode_key,
    encode_group_cursor,
    group_key,
    ident,
    key_hash,
    newest_actors,
)

UTC = timezone.utc
T = datetime(2024, 7, 3, 10, 30, tzinfo=UTC)
times = st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1)).map(
    lambda t: t.replace(microsecond=t.microsecond // 1000 * 1000, tzinfo=UTC))
spans = st.integers(1, 7 * 24 * 60).map(lambda m: timedelta(minutes=m))


def item(sender: int | str, t: datetime, *, data: dict[str, object] | None = None, oid: ObjectId | None = None) -> FeedItem:
    return FeedItem(receiver_id=1, sender_id=sender, event_time=t, type="like", data=data or {}, data_key="k",
                    id=oid or ObjectId())


def test_the_default_key_is_type_target_and_utc_day() -> None:
    by = GroupBy()
    assert (by.fields, by.span) == (("type", "data.target"), timedelta(days=1))
    assert by.window_bounds(by.window_of(T)) == (datetime(2024, 7, 3, tzinfo=UTC), datetime(2024, 7, 4, tzinfo=UTC))
    assert by.values_of(item(1, T, data={"target": 7})) == ("like", 7)
    assert by.values_of(item(1, T)) == ("like", None)  # a missing field is None, as the server's grouping has it


def test_parse_and_nested_fields() -> None:
    by = GroupBy.parse("type, data.post.id/3h")
    assert (by.fields, by.span) == (("type", "data.post.id"), timedelta(hours=3))
    assert by.values_of(item(1, T, data={"post": {"id": "p1"}})) == ("like", "p1")
    assert by.values_of(item(1, T, data={"post": "flat"})) == ("like", None)
    assert GroupBy.parse("sender_id") == GroupBy(fields=("sender_id",))


@pytest.mark.parametrize("make, field", [
    (lambda: GroupBy(fields=()), "key.fields"),
    (lambda: GroupBy(fields=("type", "type")), "key.fields"),
    (lambda: GroupBy(fields=("data",)), r"key.fields\[0\]"),
    (lambda: GroupBy(fields=("type", "data.$where")), r"key.fields\[1\]"),
    (lambda: GroupBy(fields=("receiver_id",)), r"key.fields\[0\]"),
    (lambda: GroupBy(span=timedelta(seconds=90)), "key.span"),
    (lambda: GroupBy(span=timedelta(days=8)), "key.span"),
    (lambda: GroupBy.parse("type/2w"), "key"),
])
def test_bad_keys_name_the_field(make: object, field: str) -> None:
    with pytest.raises(InvalidItem, match=f"^{field}: "):
        make()  # type: ignore[operator]


@given(times, spans)
def test_a_time_lies_in_its_window(t: datetime, span: timedelta) -> None:
    by = GroupBy(span=span)
    start, end = by.window_bounds(by.window_of(t))
    assert start <= t < end and end - start == span


@given(st.lists(st.one_of(st.integers(-2**63, 2**63 - 1), st.text(max_size=20), st.none()), min_size=1, max_size=4),
       st.integers(-10**6, 10**6))
def test_group_keys_round_trip(values: list[object], window: int) -> None:
    by = GroupBy(fields=("type", "sender_id", "data_key", "data.x")[:len(values)])
    key = group_key(by, values, window)
    assert decode_key(key) == (by.fields, by.span_ms, window, tuple(values))
    assert key == group_key(by, list(values), window) and len(key_hash(key)) == 8


@pytest.mark.parametrize("bad", ["", "g1.", "g1.!!!", "c1.AAAA", 7, None])
def test_a_bad_key_names_the_argument(bad: object) -> None:
    with pytest.raises(InvalidItem, match=r"^groups\[2\]: "):
        decode_key(bad, field="groups[2]")


@given(times, st.binary(min_size=12, max_size=12), st.integers(-10**9, 10**9),
       st.frozensets(st.binary(min_size=8, max_size=8), max_size=50), st.booleans())
def test_cursors_round_trip(t: datetime, oid: bytes, window: int, served: frozenset[bytes], below: bool) -> None:
    mark = GroupBy().fingerprint(("like",))
    cursor = GroupCursor(mark, Position(t, ObjectId(oid)), window, frozenset() if below else served, below)
    assert decode_group_cursor(encode_group_cursor(cursor), mark) == cursor


def test_a_cursor_of_another_key_or_types_is_refused() -> None:
    by = GroupBy()
    text = encode_group_cursor(GroupCursor(by.fingerprint(), Position(T, ObjectId()), 5))
    with pytest.raises(InvalidCursor, match="another key or other types"):
        decode_group_cursor(text, GroupBy(span=timedelta(hours=1)).fingerprint())
    with pytest.raises(InvalidCursor, match="another key or other types"):
        decode_group_cursor(text, by.fingerprint(("mention",)))
    for bad in ["c1.AAAA", "gc1.AAAA", text + "AAAAAAAAAAA", 3]:
        with pytest.raises(InvalidCursor, match="^cursor: "):
            decode_group_cursor(bad, by.fingerprint())


def test_newest_actors_keeps_each_actors_newest_item_newest_first() -> None:
    a1, a2, b, c, d = (item(s, T + timedelta(minutes=m)) for s, m in [("a", 1), ("a", 5), ("b", 3), (7, 4), ("7", 2)])
    assert newest_actors([a1, b, a2, c, d], 3) == (a2, c, b)
    assert newest_actors([a1, b, a2, c, d], 10) == (a2, c, b, d)  # 7 and "7" are two actors
    same = item("x", T, oid=ObjectId(b"\x00" * 12))
    later = item("x", T, oid=ObjectId(b"\x01" * 12))
    assert newest_actors([later, same], 1) == (later,)  # equal times: the higher id is the newer


def test_values_are_canonical_and_told_apart_as_the_servers_group_them() -> None:
    """Numbers by value whatever their BSON type (named by an int when whole), booleans apart from numbers, lists
    and documents element by element (a document's fields in order), NaN one value."""
    assert [canonical(v) for v in (5.0, Int64(5), Decimal128("5.00"), 5.5, Decimal128("0.1"), -0.0)] == [
        5, 5, 5, 5.5, Decimal128("0.1"), 0]
    assert type(canonical(5.0)) is int and canonical([1.0, {"a": 2.0}]) == [1, {"a": 2}]
    assert ident(True) != ident(1) and ident(1) == ident(1.0) == ident(Int64(1)) == ident(Decimal128("1"))
    assert ident([1, 2]) == ident([1.0, 2]) != ident([2, 1]) and ident({"a": 1, "b": 2}) != ident({"b": 2, "a": 1})
    assert ident(float("nan")) == ident(Decimal128("NaN")) and ident("1") != ident(1) and ident(None) != ident("")
    assert len({ident(v) for v in (True, 1, 1.0, [1], {"a": 1}, "1", None, b"1")}) == 7
    by = GroupBy(fields=("type", "data.post.id"))
    assert by.values_of(item(1, T, data={"post": [{"id": 1.0}, {"x": 2}, {"id": [3]}]})) == ("like", [1, [3]])
    assert group_key(by, ("like", 5.0), 7) == group_key(by, ("like", Int64(5)), 7) != group_key(by, ("like", True), 7)


def test_only_a_group_a_page_returned_is_marked() -> None:
    """check_group gives the position a Group is read through, and refuses one whose key, values, window or newest
    item were altered, naming the field."""
    by = GroupBy()
    newest = Position(T, ObjectId())
    window = by.window_of(T)
    group = Group(key=group_key(by, ("like", 5), window), values=("like", 5.0), window_start=by.window_bounds(window)[0],
                  count=2, actor_count=2, items=(), first_time=T, last_time=T, newest=newest, seen=False, read=False)
    assert check_group(group, field="groups[0]") == newest
    for bad in [attrs.evolve(group, key=group_key(by, ("like", 5), window + 1)),
                attrs.evolve(group, values=("like", True)), attrs.evolve(group, newest=None),
                attrs.evolve(group, newest=Position(T.replace(tzinfo=None), newest.id)),
                attrs.evolve(group, window_start=T), attrs.evolve(group, last_time=T + timedelta(hours=1)),
                attrs.evolve(group, key="g1.AAAA")]:
        with pytest.raises(InvalidItem, match=r"^groups\[3\]: "):
            check_group(bad, field="groups[3]")
