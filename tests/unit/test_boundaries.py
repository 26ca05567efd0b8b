"""Period boundaries: calendar months, fixed day counts, leap years, and tiling without gaps."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given
from hypothesis import strategies as st

from router.boundaries import next_boundary, period_containing, period_length_hint

UTC = timezone.utc


def d(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


@pytest.mark.parametrize(
    "t, period, anchor, expected",
    [
        (d(2024, 1, 31, 23, 59), "monthly", d(1970, 1, 1), (d(2024, 1, 1), d(2024, 2, 1))),
        (d(2024, 2, 29, 12), "monthly", d(1970, 1, 1), (d(2024, 2, 1), d(2024, 3, 1))),  # leap day
        (d(2023, 2, 28, 12), "monthly", d(1970, 1, 1), (d(2023, 2, 1), d(2023, 3, 1))),
        (d(2024, 12, 31, 23, 59, 59), "monthly", d(1970, 1, 1), (d(2024, 12, 1), d(2025, 1, 1))),
        (d(2024, 3, 1), "monthly", d(1970, 1, 1), (d(2024, 3, 1), d(2024, 4, 1))),  # a boundary starts its period
        (d(2024, 5, 15), "quarterly", d(1970, 1, 1), (d(2024, 4, 1), d(2024, 7, 1))),
        (d(2024, 5, 15), "quarterly", d(2020, 2, 1), (d(2024, 5, 1), d(2024, 8, 1))),
        (d(2024, 11, 30), "quarterly", d(1970, 1, 1), (d(2024, 10, 1), d(2025, 1, 1))),
        (d(2024, 7, 4), "yearly", d(1970, 1, 1), (d(2024, 1, 1), d(2025, 1, 1))),
        (d(2024, 3, 5), "30d", d(2024, 1, 1), (d(2024, 3, 1), d(2024, 3, 31))),
        (d(2023, 12, 31), "30d", d(2024, 1, 1), (d(2023, 12, 2), d(2024, 1, 1))),  # before the anchor
        (d(2024, 1, 10), "2w", d(2024, 1, 1), (d(2024, 1, 1), d(2024, 1, 15))),
    ],
)
def test_period_containing(t: datetime, period: str, anchor: datetime, expected: tuple[datetime, datetime]) -> None:
    """Each kind cuts time where the calendar says, leap years included."""
    assert period_containing(t, period=period, anchor=anchor) == expected


def test_leap_year_lengths() -> None:
    """February and the year are a day longer in a leap year."""
    feb24 = period_containing(d(2024, 2, 10), period="monthly")
    feb23 = period_containing(d(2023, 2, 10), period="monthly")
    assert feb24[1] - feb24[0] == timedelta(days=29) and feb23[1] - feb23[0] == timedelta(days=28)
    y = period_containing(d(2024, 6, 1), period="yearly")
    assert y[1] - y[0] == timedelta(days=366)


def test_daylight_saving_never_matters() -> None:
    """A local time on a DST change day is placed by its UTC instant."""
    ny = ZoneInfo("America/New_York")
    # 2024-03-31 20:30 in New York (EDT, UTC-4) is 2024-04-01 00:30 UTC: April.
    assert period_containing(datetime(2024, 3, 31, 20, 30, tzinfo=ny), period="monthly")[0] == d(2024, 4, 1)
    assert next_boundary(datetime(2024, 3, 10, 1, 59, tzinfo=ny), period="monthly") == d(2024, 4, 1)


def test_next_boundary_is_strictly_after() -> None:
    """At a boundary, the next one is a whole period later."""
    assert next_boundary(d(2024, 3, 1), period="monthly") == d(2024, 4, 1)
    assert next_boundary(d(2024, 2, 29, 23, 59, 59), period="monthly") == d(2024, 3, 1)


@pytest.mark.parametrize("bad", ["weekly", "0d", "3m", "", "d"])
def test_unknown_period_kind(bad: str) -> None:
    """Unknown kinds are refused with the accepted ones named."""
    with pytest.raises(ValueError, match="monthly, quarterly, yearly"):
        period_length_hint(bad)


kinds = st.sampled_from(["monthly", "quarterly", "yearly", "1d", "7d", "30d", "2w", "13d"])
instants = st.datetimes(min_value=datetime(1971, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(UTC))
anchors = st.dates(min_value=datetime(1970, 1, 1).date(), max_value=datetime(2099, 1, 1).date()).map(
    lambda x: datetime(x.year, x.month, 1 if x.day > 28 else x.day, tzinfo=UTC)
)


@given(t=instants, kind=kinds, anchor=anchors)
def test_periods_tile_time(t: datetime, kind: str, anchor: datetime) -> None:
    """The period holding t contains t, and its neighbours meet it exactly: no gap, no overlap."""
    if kind in ("monthly", "quarterly", "yearly"):
        anchor = anchor.replace(day=1)
    start, end = period_containing(t, period=kind, anchor=anchor)
    assert start <= t < end
    assert end - start >= period_length_hint(kind)
    assert period_containing(end, period=kind, anchor=anchor)[0] == end
    assert period_containing(start - timedelta(microseconds=1), period=kind, anchor=anchor)[1] == start
    assert start.hour == start.minute == start.second == start.microsecond == 0


@given(t=instants, kind=kinds)
def test_next_boundary_is_a_boundary(t: datetime, kind: str) -> None:
    """next_boundary(t) is after t and starts a period."""
    b = next_boundary(t, period=kind)
    assert b > t and period_containing(b, period=kind)[0] == b
