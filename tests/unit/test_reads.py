"""A page's reads against a scripted store (no server): the short path for a page the newest cluster fills, and the
walk that takes over from the newest cluster's answer when it does not fill it."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from bson import ObjectId

from router import ClusterMeta, ClusterUnavailable, Page, ReadWindow, TimeMap
from router.core.reads.pages import ReadPlan, read_program
from router.core.steps import Concurrently, Failure, Find, Program, Report
from router.cursor import CursorState, decode_state

UTC = timezone.utc
T0 = datetime(2024, 1, 1, tzinfo=UTC)
NOW = T0 + timedelta(days=30)
#: Three periods of ten days, oldest first; "c" is open-ended.
PERIODS = {"a": (T0, T0 + timedelta(days=10)), "b": (T0 + timedelta(days=10), T0 + timedelta(days=20)),
           "c": (T0 + timedelta(days=20), None)}
RECEIVER = 7


def timemap() -> TimeMap:
    return TimeMap([ClusterMeta(name=n, start_date=s, end_date=e, creator_name="test") for n, (s, e) in PERIODS.items()])


def stored(per_period: Mapping[str, int]) -> dict[str, list[dict[str, Any]]]:
    """*per_period* copies of RECEIVER's in each cluster (and one of another receiver), a minute apart."""
    out: dict[str, list[dict[str, Any]]] = {}
    for cluster, n in per_period.items():
        start = PERIODS[cluster][0]
        out[cluster] = [
            {"_id": ObjectId(), "receiver_id": receiver, "sender_id": 1, "event_time": start + timedelta(minutes=i),
             "type": 1, "data": {"n": i}, "data_key": f"{cluster}{i}"}
            for i in range(n) for receiver in (RECEIVER, RECEIVER + 1)
        ]
    return out


def matches(doc: Mapping[str, Any], query: Mapping[str, Any]) -> bool:
    """The filters a page sends: equality, ``$lt``/``$gt``, and ``$or``."""
    for field, want in query.items():
        if field == "$or":
            if not any(matches(doc, clause) for clause in want):
                return False
        elif isinstance(want, dict):
            for op, value in want.items():
                if not {"$lt": doc[field] < value, "$gt": doc[field] > value}[op]:
                    return False
        elif doc[field] != want:
            return False
    return True


class Store:
    """Answers a page's finds from *docs* per cluster as a server would, or with a failure for the clusters in
    *down*; keeps the finds and the events."""

    def __init__(self, docs: Mapping[str, list[dict[str, Any]]], down: Sequence[str] = ()) -> None:
        self.docs = docs
        self.down = set(down)
        self.finds: list[tuple[str, int, str]] = []
        self.events: list[Any] = []

    def run(self, program: Program[Any]) -> Any:
        reply: Any = None
        while True:
            try:
                request = program.send(reply)
            except StopIteration as stop:
                return stop.value
            reply = self.answer(request)

    def answer(self, request: Any) -> Any:
        if isinstance(request, Report):
            self.events.append(request.event)
            return None
        if isinstance(request, Concurrently):  # one after another: the answers are the same
            return [self.run(p) for p in request.programs]
        assert isinstance(request, Find) and request.collection == "feed", request
        self.finds.append((request.cluster, request.limit, repr(request.filter)))
        if request.cluster in self.down:
            return Failure("timeout", ClusterUnavailable(request.cluster, "reading feed timed out"))
        found = [d for d in self.docs.get(request.cluster, []) if matches(d, request.filter)]
        found.sort(key=lambda d: (d["event_time"], d["_id"].binary), reverse=True)
        return found[:request.limit] if request.limit else found


def page(store: Store, limit: int, cursor: str | None = None, *, policy: str = "raise") -> Page:
    state = decode_state(cursor) if cursor is not None else CursorState()
    plan = ReadPlan(receiver_id=RECEIVER, limit=limit, state=state, timemap=timemap(), now=NOW, window=ReadWindow(),
                    on_unavailable=policy, deadline=time.monotonic() + 10)  # type: ignore[arg-type]
    return store.run(read_program(plan))


def newest_first(docs: Mapping[str, list[dict[str, Any]]]) -> list[int]:
    mine = [d for ds in docs.values() for d in ds if d["receiver_id"] == RECEIVER]
    return [d["data"]["n"] + 1000 * "abc".index(d["data_key"][0])
            for d in sorted(mine, key=lambda d: (d["event_time"], d["_id"].binary), reverse=True)]


def served(p: Page) -> list[int]:
    return [it.data["n"] + 1000 * "abc".index(it.data_key[0]) for it in p.items]


def test_a_page_the_newest_cluster_fills_is_one_find() -> None:
    """The newest cluster holds more than a page: one find for exactly the page, its items newest first, each from
    that cluster, a cursor after the last, one read_clusters event; the second page the same from the cursor."""
    docs = stored({"a": 5, "b": 5, "c": 30})
    store = Store(docs)
    first = page(store, 10)
    assert store.finds == [("c", 10, repr({"receiver_id": RECEIVER}))]
    assert served(first) == newest_first(docs)[:10]
    assert first.sources == ("c",) * 10 and first.queried == ("c",) and first.pulled == (False,) * 10
    assert not first.partial and first.unavailable == ()
    last = first.items[-1]
    state = decode_state(first.next_cursor or "")
    assert (state.position.event_time, state.position.id) == (last.event_time, last.id)  # type: ignore[union-attr]
    assert state.pending == () and not state.done
    assert [(e.name, e.value) for e in store.events] == [("read_clusters", 1)]
    store.finds.clear()
    second = page(store, 10, first.next_cursor)
    assert [c for c, _n, _f in store.finds] == ["c"]
    assert served(second) == newest_first(docs)[10:20]


@pytest.mark.parametrize("limit", [1, 4, 7, 12, 45])
def test_pages_over_every_period_ask_each_cluster_once_a_page(limit: int) -> None:
    """Paging a feed of 30, 5 and 5 items (newest first) to its end: every item once, in order; no page asks a
    cluster twice (the newest cluster's answer, when it does not fill the page, is the walk's first, not asked
    again)."""
    docs = stored({"a": 5, "b": 5, "c": 30})
    store = Store(docs)
    seen: list[int] = []
    cursor: str | None = None
    while True:
        store.finds.clear()
        p = page(store, limit, cursor)
        asked = [c for c, _n, _f in store.finds]
        assert len(asked) == len(set(asked)), asked
        assert set(p.queried) <= set(asked)  # a wave may ask clusters whose answers the filled page leaves out
        seen += served(p)
        cursor = p.next_cursor
        if cursor is None:
            break
    assert seen == newest_first(docs)


def test_a_newest_cluster_that_fails_is_owed_and_asked_once() -> None:
    """The newest cluster fails (partial): its failure is the walk's, the older clusters fill the page, it is named
    unavailable and owed, and it was asked once."""
    docs = stored({"a": 5, "b": 5, "c": 30})
    store = Store(docs, down=["c"])
    p = page(store, 8, policy="partial")
    assert [c for c, _n, _f in store.finds].count("c") == 1
    assert p.partial and p.unavailable == ("c",)
    assert served(p) == newest_first({"a": docs["a"], "b": docs["b"]})[:8]
    assert decode_state(p.next_cursor or "").pending[0][0] == "c"
    with pytest.raises(ClusterUnavailable):
        page(Store(docs, down=["c"]), 8)
