"""Event-time ObjectIds and data_key hashes."""

from __future__ import annotations

import os
import threading
from datetime import datetime, timedelta, timezone

import mmh3
import pytest
from hypothesis import given
from hypothesis import strategies as st

from router import InvalidItem, data_key, object_id_for
from router.ids import event_seconds, make_ids, murmur3_hex

UTC = timezone.utc


@given(st.datetimes(min_value=datetime(1970, 1, 1), max_value=datetime(2106, 2, 7, 6, 28, 15), timezones=st.just(UTC)))
def test_timestamp_is_event_time_seconds(t: datetime) -> None:
    """The id's 4-byte timestamp is the event's UTC second."""
    oid = object_id_for(t)
    assert int.from_bytes(oid.binary[:4], "big") == int(t.timestamp())
    assert oid.generation_time == t.replace(microsecond=0)


def test_other_timezones_use_the_utc_instant() -> None:
    """An aware time in UTC+8 stamps the same second as its UTC equivalent."""
    t = datetime(2016, 5, 1, 18, tzinfo=timezone(timedelta(hours=8)))
    assert object_id_for(t).generation_time == datetime(2016, 5, 1, 10, tzinfo=UTC)


@pytest.mark.parametrize(
    "bad, match",
    [
        (datetime(2016, 5, 1), "must be timezone-aware"),
        (datetime(1969, 12, 31, 23, 59, 59, tzinfo=UTC), "range of an ObjectId"),
        (datetime(2106, 2, 7, 6, 28, 16, tzinfo=UTC), "range of an ObjectId"),
        ("2016-05-01", "must be a timezone-aware datetime"),
    ],
)
def test_unrepresentable_times_rejected(bad: object, match: str) -> None:
    """Naive, pre-1970 and post-2106 times raise InvalidItem naming event_time."""
    with pytest.raises(InvalidItem, match=f"event_time: .*{match}"):
        object_id_for(bad)  # type: ignore[arg-type]


def test_last_representable_second_accepted() -> None:
    """2106-02-07T06:28:15Z is the last second an ObjectId holds."""
    assert event_seconds(datetime(2106, 2, 7, 6, 28, 15, 999999, tzinfo=UTC)) == 2**32 - 1


def test_100k_ids_for_one_second_are_unique() -> None:
    """One event second, 100k ids, all distinct; the same from several threads at once."""
    t = datetime(2020, 1, 1, tzinfo=UTC)
    sec = int(t.timestamp())
    assert len(set(make_ids([sec] * 100_000))) == 100_000

    results: list[list[object]] = []

    def worker() -> None:
        results.append([object_id_for(t) for _ in range(20_000)])

    threads = [threading.Thread(target=worker) for _ in range(5)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert len({o for r in results for o in r}) == 100_000


def test_ids_unique_across_fork() -> None:
    """A forked child redraws its random bytes, so parent and child ids never collide."""
    sec = int(datetime(2020, 1, 1, tzinfo=UTC).timestamp())
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        os.close(read_fd)
        payload = b"".join(o.binary for o in make_ids([sec] * 1000))
        os.write(write_fd, payload)
        os._exit(0)
    os.close(write_fd)
    parent = {o.binary for o in make_ids([sec] * 1000)}
    chunks = []
    while chunk := os.read(read_fd, 65536):
        chunks.append(chunk)
    os.close(read_fd)
    os.waitpid(pid, 0)
    raw = b"".join(chunks)
    child = {raw[i : i + 12] for i in range(0, len(raw), 12)}
    assert len(child) == 1000
    assert not parent & child
    assert {b[4:9] for b in parent}.isdisjoint({b[4:9] for b in child})


def test_data_key_known_vector() -> None:
    """The reference MurmurHash3_x64_128 vector, as Guava prints it."""
    assert murmur3_hex("The quick brown fox jumps over the lazy dog") == "6c1b07bc7bbc4be347939ac4a93c437a"


def test_data_key_is_fabula_prefix() -> None:
    """data_key('fabula', id) hashes the string 'fabula_<id>'."""
    assert data_key("fabula", 1000983) == mmh3.hash_bytes(b"fabula_1000983").hex() == "243594d857def216113909cc6956dd08"


def test_data_key_non_ascii_is_utf8() -> None:
    """Non-ASCII ids are hashed as UTF-8 bytes, as other languages' implementations do."""
    assert data_key("fabula", "动态") == mmh3.hash_bytes("fabula_动态".encode("utf-8")).hex()
    assert murmur3_hex("ü") == mmh3.hash_bytes(b"\xc3\xbc").hex()
    assert data_key("fabula", "动态") != data_key("fabula", "动恣")


@given(st.text(min_size=1), st.one_of(st.integers(), st.text()))
def test_data_key_shape(kind: str, obj: object) -> None:
    """Always 32 lowercase hex digits."""
    key = data_key(kind, obj)
    assert len(key) == 32 and key == key.lower() and int(key, 16) >= 0


def test_data_key_rejects_empty_kind() -> None:
    """An empty kind is refused."""
    with pytest.raises(InvalidItem, match="kind"):
        data_key("", 1)
