"""Period boundaries on UTC: where one period ends and the next begins. Pure; no I/O.

Period kinds (``rollover.period`` in clusters.yaml):

* ``monthly``, ``quarterly``, ``yearly``: boundaries on the first day of a month at
  00:00 UTC, every 1, 3 or 12 months counted from the month of ``anchor``;
* ``Nd`` / ``Nw``: every N days or weeks from ``anchor`` (a UTC midnight).

Everything is UTC, so daylight-saving changes never move a boundary, and month
lengths and leap years come from the calendar.

Example::

    >>> next_boundary(datetime(2024, 1, 31, 12, tzinfo=timezone.utc), period="monthly")
    datetime.datetime(2024, 2, 1, 0, 0, tzinfo=datetime.timezone.utc)
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone

from .model import to_utc

__all__ = ["next_boundary", "period_containing", "period_length_hint", "EPOCH"]

UTC = timezone.utc
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MONTHS = {"monthly": 1, "quarterly": 3, "yearly": 12}
_FIXED = re.compile(r"^(\d+)([dw])$")


def _months(period: str) -> int | None:
    return _MONTHS.get(period)


def _step(period: str) -> timedelta:
    m = _FIXED.match(period)
    if m is None or int(m.group(1)) == 0:
        raise ValueError(f"period: must be monthly, quarterly, yearly, or like 30d, 2w (got {period!r})")
    return timedelta(days=int(m.group(1)) * (7 if m.group(2) == "w" else 1))


def _month_index(t: datetime) -> int:
    return t.year * 12 + t.month - 1


def _from_index(index: int) -> datetime:
    return datetime(index // 12, index % 12 + 1, 1, tzinfo=UTC)


def period_containing(t: datetime, *, period: str, anchor: datetime = EPOCH) -> tuple[datetime, datetime]:
    """The period ``[start, end)`` of this kind that holds instant *t*."""
    t = to_utc(t, field="t")
    anchor = to_utc(anchor, field="anchor")
    months = _months(period)
    if months is not None:
        offset = (_month_index(t) - _month_index(anchor)) // months
        start_index = _month_index(anchor) + offset * months
        return _from_index(start_index), _from_index(start_index + months)
    step = _step(period)
    k = (t - anchor) // step
    start = anchor + k * step
    return start, start + step


def next_boundary(after: datetime, *, period: str, anchor: datetime = EPOCH) -> datetime:
    """The first boundary strictly after *after*."""
    return period_containing(after, period=period, anchor=anchor)[1]


def period_length_hint(period: str) -> timedelta:
    """The shortest length a period of this kind can have (28 days for monthly)."""
    months = _months(period)
    return timedelta(days=28 * months) if months is not None else _step(period)
