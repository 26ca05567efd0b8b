"""Deterministic fan-out copy ids, and the checkpoint's set of finished batches."""

from __future__ import annotations

from datetime import datetime, timezone

import mmh3
import pytest
from hypothesis import given
from hypothesis import strategies as st

from router import InvalidItem
from router.ids import copy_id, copy_ids, copy_key

UTC = timezone.utc
SECOND = int(datetime(2024, 5, 1, 10, tzinfo=UTC).timestamp())
KEY = "243594d857def216113909cc6956dd08"

receivers = st.one_of(st.integers(min_value=-(2**63), max_value=2**63 - 1), st.text(min_size=1))


@given(st.integers(min_value=0, max_value=2**32 - 1), receivers)
def test_timestamp_is_the_event_second(seconds: int, receiver: int | str) -> None:
    """The first 4 bytes are the event's UTC second, as for every feed _id."""
    oid = copy_id(seconds, KEY, receiver)
    assert int.from_bytes(oid.binary[:4], "big") == seconds
    assert oid.generation_time == datetime.fromtimestamp(seconds, UTC)


def test_layout_is_murmur3_of_the_copy_key() -> None:
    """The other 8 bytes are the first 8 of mmh3.hash_bytes of the documented key."""
    oid = copy_id(SECOND, KEY, 1000386)
    assert copy_key(KEY, 1000386) == f"32:{KEY}i1000386".encode()
    assert oid.binary == SECOND.to_bytes(4, "big") + mmh3.hash_bytes(f"32:{KEY}i1000386".encode())[:8]


def test_deterministic() -> None:
    """The same (second, data_key, receiver) gives the same id, in one call or in a batch."""
    assert copy_id(SECOND, KEY, 7) == copy_id(SECOND, KEY, 7)
    assert copy_ids(SECOND, KEY, [7, "7", 8]) == [copy_id(SECOND, KEY, 7), copy_id(SECOND, KEY, "7"), copy_id(SECOND, KEY, 8)]


def test_int_and_str_receivers_differ() -> None:
    """Receiver 5 and receiver "5" are different people and get different ids."""
    assert copy_id(SECOND, KEY, 5) != copy_id(SECOND, KEY, "5")
    assert copy_key(KEY, 5) != copy_key(KEY, "5")


def test_key_encoding_is_injective_across_the_boundary() -> None:
    """Moving characters between data_key and receiver changes the key (the length prefix)."""
    assert copy_key("ab", "cd") != copy_key("abs", "d") != copy_key("a", "bscd")
    assert copy_id(SECOND, "a\x00s", "b") != copy_id(SECOND, "a", "\x00sb")


@given(st.sets(st.tuples(st.text(min_size=1, max_size=40), receivers), min_size=2, max_size=300))
def test_distinct_pairs_give_distinct_ids(pairs: set[tuple[str, int | str]]) -> None:
    """Distinct (data_key, receiver) pairs in one event second give distinct ids."""
    ids = [copy_id(SECOND, key, receiver) for key, receiver in pairs]
    assert len(set(ids)) == len(pairs)


def test_a_million_receivers_of_one_item_are_distinct() -> None:
    """One item fanned out to 1M int receivers: 1M distinct ids (a 64-bit hash; ~2.7e-8 odds of a clash)."""
    ids = copy_ids(SECOND, KEY, range(1_000_000))  # type: ignore[arg-type]
    assert len(set(ids)) == 1_000_000


@pytest.mark.parametrize(
    "seconds, key, receiver, field",
    [
        (-1, KEY, 1, "seconds"),
        (2**32, KEY, 1, "seconds"),
        (SECOND, "", 1, "data_key"),
        (SECOND, KEY, True, "receiver_id"),
        (SECOND, KEY, "", "receiver_id"),
        (SECOND, KEY, 2**63, "receiver_id"),
        (SECOND, KEY, 1.5, "receiver_id"),
        (SECOND, KEY, "a\ud800", "receiver_id"),
    ],
)
def test_bad_arguments_rejected(seconds: int, key: str, receiver: object, field: str) -> None:
    """copy_id refuses what cannot be a copy's id, naming the argument (a lone surrogate too)."""
    with pytest.raises(InvalidItem, match=f"^{field}: "):
        copy_id(seconds, key, receiver)  # type: ignore[arg-type]


def test_batch_variant_raises_on_invalid_unicode() -> None:
    """copy_ids raises UnicodeEncodeError (never hashes a str mmh3 would crash on)."""
    with pytest.raises(UnicodeEncodeError):
        copy_ids(SECOND, KEY, ["ok", "a\ud800"])
