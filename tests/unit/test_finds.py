"""router.storage.finds: the finds of an exact read, answered by a scripted server whose batches stop short."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from router.storage.finds import WHOLE, Batch, CursorStuck, walk


def matches(doc: Mapping[str, Any], filter: Mapping[str, Any]) -> bool:
    """The few query operators the walk writes: equality, $gt, $lt, $in, $nin, $and, $or."""
    for key, want in filter.items():
        if key == "$and":
            ok = all(matches(doc, f) for f in want)
        elif key == "$or":
            ok = any(matches(doc, f) for f in want)
        elif isinstance(want, Mapping):
            value = doc[key]
            ok = all({"$gt": lambda v, w: v > w, "$lt": lambda v, w: v < w, "$in": lambda v, w: v in w,
                      "$nin": lambda v, w: v not in w}[op](value, w) for op, w in want.items())
        else:
            ok = doc[key] == want
        if not ok:
            return False
    return True


def project(doc: Mapping[str, Any], projection: Mapping[str, Any] | None) -> dict[str, Any]:
    if projection is None:
        return dict(doc)
    if any(v for k, v in projection.items() if k != "_id"):
        keep = {k for k, v in projection.items() if v} | ({"_id"} if projection.get("_id", 1) else set())
        return {k: v for k, v in doc.items() if k in keep}
    return {k: v for k, v in doc.items() if projection.get(k, 1)}


def ordered(docs: list[dict[str, Any]], sort: Sequence[tuple[str, int]] | None) -> list[dict[str, Any]]:
    docs = list(docs)
    random.shuffle(docs)  # no order asked: any order, a new one each time
    for field, direction in reversed(list(sort or ())):
        docs.sort(key=lambda d: d[field], reverse=direction < 0)
    return docs


class Server:
    """Answers each find with a first batch of at most *cap* documents (a 16 MiB batch), leaving a cursor open when
    more would follow."""

    def __init__(self, docs: list[dict[str, Any]], cap: int) -> None:
        self.docs = docs
        self.cap = cap
        self.finds: list[dict[str, Any]] = []

    def answer(self, fields: dict[str, Any]) -> Batch:
        self.finds.append(fields)
        found = ordered([d for d in self.docs if matches(d, fields["filter"])], list(fields.get("sort", {}).items()))
        if fields.get("limit"):
            found = found[: fields["limit"]]
        size = min(self.cap, fields["batchSize"])
        return Batch([project(d, fields.get("projection")) for d in found[:size]], len(found) > size)

    def read(self, filter: Mapping[str, Any], *, between: Any = None, **kwargs: Any) -> list[dict[str, Any]]:
        """Run a walk; *between* (if given) is called after each find, before the next (a writer meanwhile)."""
        steps = walk(filter, **kwargs)
        fields = next(steps)
        while True:
            try:
                batch = self.answer(fields)
                if between is not None:
                    between(self)
                fields = steps.send(batch)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]


DOCS = [{"_id": i, "t": i % 7, "r": i % 3} for i in range(60)]


def test_a_result_in_one_batch_is_one_find_asking_for_one_more_than_its_limit() -> None:
    server = Server(DOCS, cap=1000)
    docs = server.read({"r": 1}, sort=[("t", -1), ("_id", -1)], limit=10)
    assert [d["_id"] for d in docs] == [d["_id"] for d in ordered([d for d in DOCS if d["r"] == 1],
                                                                   [("t", -1), ("_id", -1)])][:10]
    assert server.finds == [{"filter": {"r": 1}, "sort": {"t": -1, "_id": -1}, "limit": 10, "batchSize": 11}]


def test_no_limit_asks_for_whole_batches() -> None:
    server = Server(DOCS, cap=1000)
    assert len(server.read({})) == 60
    assert server.finds == [{"filter": {}, "batchSize": WHOLE}]


def test_a_batch_stopped_short_continues_after_its_last_document_in_the_request_order() -> None:
    server = Server(DOCS, cap=25)
    docs = server.read({"r": 1}, sort=[("t", -1), ("_id", -1)])
    assert [d["_id"] for d in docs] == [d["_id"] for d in ordered([d for d in DOCS if d["r"] == 1], [("t", -1), ("_id", -1)])]
    assert len(server.finds) == 1
    server = Server(DOCS, cap=7)
    server.read({"r": 1}, sort=[("t", -1), ("_id", -1)], limit=15)
    last = server.finds[1]
    assert last["limit"] == 8 and last["filter"]["$and"][0] == {"r": 1}  # what is left, after the 7th document


def test_an_order_without_id_is_asked_again_from_the_start_with_id_last() -> None:
    server = Server(DOCS, cap=10)
    docs = server.read({}, sort=[("t", 1)], limit=30, projection={"_id": 0, "t": 1})
    assert [d["t"] for d in docs] == sorted(d["t"] for d in DOCS)[:30]
    assert all(set(d) == {"t"} for d in docs)  # the _id it needed is not handed on
    assert server.finds[1]["sort"] == {"t": 1, "_id": 1} and server.finds[1]["projection"] == {"t": 1}


def test_an_empty_batch_with_an_open_cursor_is_an_error() -> None:
    steps = walk({}, sort=[("_id", 1)])
    next(steps)
    with pytest.raises(CursorStuck):
        steps.send(Batch([], True))


def test_a_sort_on_an_inner_field_is_refused() -> None:
    with pytest.raises(ValueError, match="top-level"):
        next(walk({}, sort=[("items.t", 1)]))


SORTS = [None, [("t", -1)], [("t", 1), ("_id", 1)], [("t", -1), ("_id", -1)], [("_id", 1)], [("r", 1), ("t", -1)]]
PROJECTIONS = [None, {"_id": 0, "t": 1, "r": 1}, {"t": 1}, {"r": 0}]


@settings(max_examples=300, deadline=None)
@given(n=st.integers(0, 40), cap=st.integers(1, 45), limit=st.integers(0, 45), sort=st.sampled_from(SORTS),
       projection=st.sampled_from(PROJECTIONS), r=st.sampled_from([None, 0, 2]), seed=st.integers(0, 2**16))
def test_any_request_reads_exactly_what_one_unbounded_batch_would(
    n: int, cap: int, limit: int, sort: list[tuple[str, int]] | None, projection: dict[str, Any] | None, r: int | None,
    seed: int,
) -> None:
    random.seed(seed)
    docs = [{"_id": i, "t": random.randrange(4), "r": random.randrange(3)} for i in random.sample(range(1000), n)]
    filter = {} if r is None else {"r": r}
    got = Server(docs, cap).read(filter, sort=sort, limit=limit, projection=projection)
    want = Server(docs, 10**6).read(filter, sort=sort, limit=limit, projection=projection)
    assert len(got) == len(want)
    assert all(set(d) == set(w) for d, w in zip(got, want))  # the projection's fields, no more
    if got and "_id" in got[0]:
        assert len({d["_id"] for d in got}) == len(got)  # each document once
    if sort is None:
        if not limit and got and "_id" in got[0]:
            assert {d["_id"] for d in got} == {d["_id"] for d in want}
        return
    keys = [f for f, _ in sort]
    assert [[d.get(k) for k in keys] for d in got] == [[d.get(k) for k in keys] for d in want]  # the same order


def test_a_moving_order_is_read_on_by_the_documents_not_received() -> None:
    """Buckets by ``newest``, cut after the first: a writer raises the unread one's ``newest`` above it between the
    finds. After the last document, the keyset would lose it; read on by ``_id`` not received, it is there."""
    def raise_b(server: Server) -> None:
        server.docs[1]["newest"] = 9

    def two_buckets() -> list[dict[str, Any]]:
        return [{"_id": "a", "newest": 5}, {"_id": "b", "newest": 4}]

    order = [("newest", -1), ("_id", -1)]
    assert [d["_id"] for d in Server(two_buckets(), cap=1).read({}, sort=order, limit=2, between=raise_b)] == ["a"]
    server = Server(two_buckets(), cap=1)
    got = server.read({}, sort=order, limit=2, between=raise_b, moving=True, projection={"_id": 0, "newest": 1})
    assert got == [{"newest": 5}, {"newest": 9}]  # each find's order; the _id it needed is not handed on
    assert server.finds[1]["filter"] == {"_id": {"$nin": ["a"]}} and server.finds[1]["limit"] == 1


@settings(max_examples=300, deadline=None)
@given(n=st.integers(0, 30), cap=st.integers(1, 35), limit=st.integers(0, 35), seed=st.integers(0, 2**16))
def test_a_moving_read_holds_each_document_once_and_every_one_when_short(n: int, cap: int, limit: int, seed: int) -> None:
    """Sort fields rewritten at random after every find: no document twice, and an answer shorter than its limit
    (or without one) holds every matching document."""
    rng = random.Random(seed)
    docs = [{"_id": i, "t": rng.randrange(5), "r": rng.randrange(2)} for i in range(n)]

    def shuffle(server: Server) -> None:
        for doc in server.docs:
            if rng.random() < 0.5:
                doc["t"] = rng.randrange(5)

    got = Server(docs, cap).read({"r": 1}, sort=[("t", -1), ("_id", -1)], limit=limit, between=shuffle, moving=True)
    ids = [d["_id"] for d in got]
    assert len(ids) == len(set(ids)) and all(d["r"] == 1 for d in got)
    matching = {d["_id"] for d in docs if d["r"] == 1}
    assert len(ids) == (min(limit, len(matching)) if limit else len(matching))
