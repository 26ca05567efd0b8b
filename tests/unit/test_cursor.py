"""Opaque page cursors."""

from __future__ import annotations

import re
from datetime import datetime, timezone

import pytest
from bson import ObjectId
from hypothesis import given
from hypothesis import strategies as st

from router import InvalidCursor
from router.cursor import CursorState, Position, check_state, decode_cursor, decode_state, encode_cursor, encode_state

UTC = timezone.utc


@given(
    st.datetimes(min_value=datetime(1970, 1, 1), max_value=datetime(2106, 1, 1), timezones=st.just(UTC)),
    st.binary(min_size=12, max_size=12),
)
def test_round_trip_at_millisecond_precision(t: datetime, raw: bytes) -> None:
    """A cursor decodes to the position it encoded, at BSON's millisecond precision."""
    t = t.replace(microsecond=t.microsecond // 1000 * 1000)
    pos = Position(t, ObjectId(raw))
    cursor = encode_cursor(pos)
    assert cursor.startswith("c1.") and "=" not in cursor
    assert decode_cursor(cursor) == pos


@pytest.mark.parametrize("bad", ["", "abc", "c1.", "c1.!!!!", "c1.AAAA", "c2.AAAAAAAAAAAAAAAAAAAAAAAAAAA"])
def test_garbage_is_invalid_cursor(bad: str) -> None:
    """Anything not made by encode_cursor raises InvalidCursor, never a bare decoding error."""
    with pytest.raises(InvalidCursor, match="cursor: "):
        decode_cursor(bad)


def test_non_string_is_invalid_cursor() -> None:
    """A cursor must be a string."""
    with pytest.raises(InvalidCursor):
        decode_cursor(12)  # type: ignore[arg-type]


positions = st.builds(
    Position,
    st.datetimes(min_value=datetime(1970, 1, 1), max_value=datetime(2106, 1, 1), timezones=st.just(UTC)).map(
        lambda t: t.replace(microsecond=t.microsecond // 1000 * 1000)
    ),
    st.binary(min_size=12, max_size=12).map(ObjectId),
)


@given(
    main=st.none() | positions,
    pending=st.lists(st.tuples(st.text(min_size=1, max_size=20), st.none() | positions), max_size=4),
    done=st.booleans(),
)
def test_state_round_trip(main: Position | None, pending: list[tuple[str, Position | None]], done: bool) -> None:
    """A cursor that owes skipped clusters decodes to exactly the state it encoded."""
    from router.cursor import CursorState, decode_state, encode_state

    state = CursorState(position=main, pending=tuple(pending), done=done)
    assert decode_state(encode_state(state)) == state


@pytest.mark.parametrize("bad", ["c2.", "c2.AQ", "c2.AAAB", "c2.AAAAAAAAAAA"])
def test_garbage_state_is_invalid_cursor(bad: str) -> None:
    """Truncated or malformed partial-page cursors raise InvalidCursor."""
    from router.cursor import decode_state

    with pytest.raises(InvalidCursor):
        decode_state(bad)


STARTS = {"c1": datetime(2024, 1, 1, tzinfo=UTC), "c2": datetime(2024, 4, 1, tzinfo=UTC)}
LATE = Position(datetime(2024, 5, 1, tzinfo=UTC), ObjectId(b"\x00" * 12))
EARLY = Position(datetime(2023, 5, 1, tzinfo=UTC), ObjectId(b"\x00" * 12))


@pytest.mark.parametrize(
    "state, message",
    [
        (CursorState(pending=(("c2", None), ("c2", None)), done=True), "owes cluster 'c2' twice"),
        (CursorState(pending=(("nope", None),)), "owes cluster 'nope', which has no period here"),
        (CursorState(pending=(("c2", EARLY),)), "owes cluster 'c2' items before 2023-05-01"),
        (CursorState(position=LATE, done=True), "marks a finished walk that owes nothing"),
    ],
)
def test_states_the_router_never_makes_are_refused(state: CursorState, message: str) -> None:
    """A well-formed but forged state (duplicate, unknown or impossible owed clusters) is InvalidCursor."""
    decoded = decode_state(encode_state(state))
    with pytest.raises(InvalidCursor, match=re.escape(message)):
        check_state(decoded, STARTS)


@pytest.mark.parametrize(
    "state",
    [
        CursorState(),
        CursorState(position=LATE),
        CursorState(position=LATE, pending=(("c1", None), ("c2", LATE))),
        CursorState(position=None, pending=(("c1", LATE),), done=True),
    ],
)
def test_states_the_router_makes_pass(state: CursorState) -> None:
    """Every state the read path produces passes the check unchanged."""
    assert check_state(decode_state(encode_state(state)), STARTS) == state
