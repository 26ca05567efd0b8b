"""The time map: lookup, validation and read order."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from router import ClusterMeta, MetadataError, NoClusterForTime, ReadWindow, TimeMap

UTC = timezone.utc
T0 = datetime(2016, 5, 1, tzinfo=UTC)


def meta(name: str, start: datetime, end: datetime | None) -> ClusterMeta:
    return ClusterMeta(name=name, start_date=start, end_date=end, creator_name="test")


def three() -> TimeMap:
    return TimeMap(
        [
            meta("c2", T0 + timedelta(days=92), T0 + timedelta(days=184)),
            meta("c1", T0, T0 + timedelta(days=92)),
            meta("c3", T0 + timedelta(days=184), None),
        ]
    )


def test_lookup_is_half_open() -> None:
    """A boundary instant belongs to the period it starts, not the one it ends."""
    tm = three()
    assert tm.cluster_for(T0) == "c1"
    assert tm.cluster_for(T0 + timedelta(days=92) - timedelta(milliseconds=1)) == "c1"
    assert tm.cluster_for(T0 + timedelta(days=92)) == "c2"
    assert tm.cluster_for(datetime(2100, 1, 1, tzinfo=UTC)) == "c3"


def test_lookup_converts_other_timezones() -> None:
    """An aware time in another zone is routed by its UTC instant."""
    plus8 = timezone(timedelta(hours=8))
    # 08:00 on the boundary day in UTC+8 is exactly the UTC boundary.
    assert three().cluster_for(datetime(2016, 8, 1, 8, tzinfo=plus8)) == "c2"
    assert three().cluster_for(datetime(2016, 8, 1, 7, 59, tzinfo=plus8)) == "c1"


def test_before_first_period_names_nearest() -> None:
    """A time before every period raises NoClusterForTime naming the next period."""
    with pytest.raises(NoClusterForTime, match=r"2016-04-30T00:00:00Z.*'c1' \[2016-05-01T00:00:00Z, 2016-08-01T00:00:00Z\) starts after it"):
        three().cluster_for(T0 - timedelta(days=1))


def test_gap_is_reported_and_refuses_writes() -> None:
    """A hole between periods is listed in gaps and no cluster owns times inside it."""
    tm = TimeMap([meta("a", T0, T0 + timedelta(days=10)), meta("b", T0 + timedelta(days=20), None)])
    assert tm.gaps == ((T0 + timedelta(days=10), T0 + timedelta(days=20)),)
    with pytest.raises(NoClusterForTime) as info:
        tm.cluster_for(T0 + timedelta(days=15))
    assert "'a'" in str(info.value) and "ends before it" in str(info.value)
    assert "'b'" in str(info.value) and "starts after it" in str(info.value)
    assert "(gap)" in tm.describe()


def test_all_problems_reported_together() -> None:
    """Overlaps, duplicate names and two open ends all appear in one MetadataError."""
    with pytest.raises(MetadataError) as info:
        TimeMap(
            [
                meta("a", T0, None),
                meta("b", T0 + timedelta(days=1), None),
                meta("b", T0 + timedelta(days=5), T0 + timedelta(days=6)),
            ]
        )
    text = str(info.value)
    assert "more than one open-ended period: a, b" in text
    assert "cluster 'a' [2016-05-01T00:00:00Z, open) overlaps cluster 'b'" in text
    assert "cluster 'b': has more than one period" in text
    assert len(info.value.problems) >= 3


def test_inverted_period_refused() -> None:
    """A period whose end is not after its start cannot even be built."""
    with pytest.raises(ValueError, match="end_date: must be after start_date"):
        meta("a", T0, T0)


def test_read_order_newest_first_and_only_started() -> None:
    """Reads go newest period first and skip periods that have not started."""
    tm = TimeMap(
        [
            meta("c1", T0, T0 + timedelta(days=10)),
            meta("c2", T0 + timedelta(days=10), T0 + timedelta(days=20)),
            meta("c3", T0 + timedelta(days=20), None),
        ]
    )
    assert tm.clusters_for_read(now=T0 + timedelta(days=30)) == ["c3", "c2", "c1"]
    assert tm.clusters_for_read(now=T0 + timedelta(days=15)) == ["c2", "c1"]


def test_read_window_limits() -> None:
    """The window keeps the N newest started periods and/or those ending within max_age."""
    tm = three()
    now = T0 + timedelta(days=200)
    assert tm.clusters_for_read(now=now, window=ReadWindow(clusters=2)) == ["c3", "c2"]
    assert tm.clusters_for_read(now=now, window=ReadWindow(max_age=timedelta(days=20))) == ["c3", "c2"]
    assert tm.clusters_for_read(now=now, window=ReadWindow(max_age=timedelta(days=1))) == ["c3"]
    assert tm.clusters_for_read(now=now, window=ReadWindow(clusters=1, max_age=timedelta(days=400))) == ["c3"]


def test_read_before_cursor_skips_newer_periods() -> None:
    """With a cursor inside c2, c3 is not asked again."""
    tm = three()
    now = T0 + timedelta(days=200)
    assert tm.clusters_for_read(now=now, before=T0 + timedelta(days=100)) == ["c2", "c1"]
    assert tm.clusters_for_read(now=now, before=T0 + timedelta(days=92)) == ["c2", "c1"]


def test_read_window_validates() -> None:
    """Zero or negative windows are refused."""
    with pytest.raises(ValueError, match="clusters: must be positive"):
        ReadWindow(clusters=0)
    with pytest.raises(ValueError, match="max_age: must be positive"):
        ReadWindow(max_age=timedelta(0))


# -- properties -------------------------------------------------------------------------

boundaries = st.lists(
    st.integers(min_value=0, max_value=4_000_000_000), min_size=2, max_size=8, unique=True
).map(sorted)


def tiled(bounds: list[int], open_end: bool, gaps: list[bool]) -> list[ClusterMeta]:
    """Periods between consecutive boundaries, optionally skipping some (gaps)."""
    metas = []
    for i, (a, b) in enumerate(zip(bounds, bounds[1:])):
        if gaps[i % len(gaps)] and 0 < i < len(bounds) - 2:
            continue
        end = None if open_end and i == len(bounds) - 2 else datetime.fromtimestamp(b, UTC)
        metas.append(meta(f"c{i}", datetime.fromtimestamp(a, UTC), end))
    return metas


@settings(max_examples=200)
@given(bounds=boundaries, open_end=st.booleans(), gaps=st.lists(st.booleans(), min_size=1, max_size=4),
       probe=st.integers(min_value=0, max_value=4_294_967_295))
def test_lookup_matches_linear_scan(bounds: list[int], open_end: bool, gaps: list[bool], probe: int) -> None:
    """For any map and any instant, cluster_for agrees with a plain scan of the periods."""
    metas = tiled(bounds, open_end, gaps)
    tm = TimeMap(metas)
    t = datetime.fromtimestamp(probe, UTC)
    owners = [m.name for m in metas if m.start_date <= t and (m.end_date is None or t < m.end_date)]
    assert len(owners) <= 1
    if owners:
        assert tm.cluster_for(t) == owners[0]
    else:
        with pytest.raises(NoClusterForTime):
            tm.cluster_for(t)


@settings(max_examples=200)
@given(bounds=boundaries, now=st.integers(min_value=0, max_value=4_294_967_295),
       before=st.none() | st.integers(min_value=0, max_value=4_294_967_295),
       n=st.none() | st.integers(min_value=1, max_value=5))
def test_read_order_properties(bounds: list[int], now: int, before: int | None, n: int | None) -> None:
    """Read order is newest first, only started periods, at most N, never newer than the cursor."""
    metas = tiled(bounds, True, [False])
    tm = TimeMap(metas)
    now_t = datetime.fromtimestamp(now, UTC)
    before_t = datetime.fromtimestamp(before, UTC) if before is not None else None
    names = tm.clusters_for_read(now=now_t, window=ReadWindow(clusters=n), before=before_t)
    by_name = {m.name: m for m in metas}
    starts = [by_name[x].start_date for x in names]
    assert starts == sorted(starts, reverse=True)
    assert all(s <= now_t for s in starts)
    if n is not None:
        assert len(names) <= n
    if before_t is not None:
        assert all(s <= before_t for s in starts)
        # the period holding the cursor is included whenever it is in the window
        owner = next((m.name for m in metas if m.start_date <= before_t and (m.end_date is None or before_t < m.end_date)), None)
        window = tm.clusters_for_read(now=now_t, window=ReadWindow(clusters=n))
        if owner in window:
            assert owner in names


@given(bounds=boundaries)
def test_consecutive_periods_validate(bounds: list[int]) -> None:
    """Periods that tile time pass validation; shifting one start back makes an overlap."""
    metas = tiled(bounds, True, [False])
    assert TimeMap.problems(metas) == []
    if len(metas) >= 2:
        second = metas[1]
        moved = meta(second.name, second.start_date - timedelta(seconds=1), second.end_date)
        assert any("overlaps" in p for p in TimeMap.problems([metas[0], moved, *metas[2:]]))
