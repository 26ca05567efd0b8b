"""Edits in steps (router.core.layouts.queries.in_steps) against a scripted store that runs out of time on big steps."""

from __future__ import annotations

import random
from typing import Any

import pytest
from bson import ObjectId

from router.core.layouts import EditSettings
from router.core.layouts.queries import SPLITS, in_steps, key_edit
from router.core.steps import Delete, Failure, Find, Program, Update
from router.errors import ClusterUnavailable
from router.testing.scripted import ScriptedStore, matches

KEY = "k"
#: Steps of 100 documents placed by samples of 100 (the defaults are 10,000 each; smaller keeps the store quick).
SMALL = EditSettings(step=100, sample=100)
#: Steps of 1,000 placed by samples of 1,000, for the tests of SPLITS splits in a row: a step split three times must
#: still span more than one sampled id (a quarter of a quarter of a quarter of a step of 100 is one id of a sample of
#: 100, and a step of one id is not split: the call would end before its third split).
SPLITTABLE = EditSettings(step=1_000, sample=1_000)


def store_with(n: int, seed: int = 7) -> ScriptedStore:
    rng = random.Random(seed)
    store = ScriptedStore()
    docs = store.docs("c", "feed")
    for _ in range(n):
        oid = ObjectId(rng.randbytes(12))
        docs[oid] = {"_id": oid, "data_key": KEY, "data": {"v": 0}}
    docs[ObjectId()] = {"_id": ObjectId(), "data_key": "other", "data": {"v": 0}}
    return store


def drive(program: Program[Any], store: ScriptedStore, *, slow_over: int | None, healthy_for: int | None = None,
          kind: str = "cancelled") -> tuple[Any, list[int]]:
    """Run *program* on *store*; an edit touching more than *slow_over* documents (or any edit after *healthy_for*
    edits) runs out of time, unfinished: stopped by the server (``cancelled``), or not answered in time (``timeout``).
    Returns the result and the size of every edit tried."""
    tried: list[int] = []
    reply: Any = None
    while True:
        try:
            request = program.send(reply)
        except StopIteration as stop:
            return stop.value, tried
        if isinstance(request, (Delete, Update)):
            n = sum(1 for d in store.docs("c", "feed").values() if matches(d, request.filter))
            tried.append(n)
            late = (slow_over is not None and n > slow_over) or (healthy_for is not None and len(tried) > healthy_for)
            if late:
                reply = Failure(kind, ClusterUnavailable("c", "deleting from feed timed out"))  # type: ignore[arg-type]
                continue
        assert isinstance(request, (Find, Delete, Update))
        reply = store.answer(request)


def delete_all(settings: EditSettings = SMALL) -> Program[Any]:
    match, _ = key_edit(KEY, None)
    return in_steps("c", "feed", match, settings, what="delete")


def left(store: ScriptedStore) -> int:
    return sum(1 for d in store.docs("c", "feed").values() if d["data_key"] == KEY)


@pytest.mark.parametrize("kind", ["cancelled", "timeout"])
def test_a_step_that_runs_out_of_time_is_split_and_the_call_finishes(kind: str) -> None:
    """A server that cannot edit more than 30 documents in time: the steps it stops (``cancelled``), or answers too
    late (``timeout``: its time limit and the client's end together, and its answer loses the race), are split in four,
    and one call removes all 600 copies."""
    store = store_with(600)
    (count, error), tried = drive(delete_all(), store, slow_over=30, kind=kind)
    assert (count, error, left(store)) == (600, None, 0)
    assert any(n > 30 for n in tried) and max(tried[-10:]) <= 30 * 4  # split, and grown back no further


def test_an_update_is_split_the_same_way() -> None:
    store = store_with(300)
    match, update = key_edit(KEY, {"v": 1})
    (count, error), _ = drive(in_steps("c", "feed", match, SMALL, update=update, what="update"), store,
                              slow_over=20)
    assert (count, error) == (300, None)
    assert all(d["data"] == {"v": 1} for d in store.docs("c", "feed").values() if d["data_key"] == KEY)


def test_a_call_that_must_stop_keeps_its_steps_and_the_next_call_goes_on() -> None:
    """A server that stops finishing anything after 3 edits: the call ends with its error, what it removed stays
    removed, and a second call (the server well again) removes the rest."""
    store = store_with(6_000)
    (count, error), tried = drive(delete_all(SPLITTABLE), store, slow_over=None, healthy_for=3)
    assert error is not None and count > 0 and left(store) == 6_000 - count
    assert len(tried) == 3 + 1 + SPLITS  # the finished steps, then the first late one and its splits
    (rest, error), _ = drive(delete_all(SPLITTABLE), store, slow_over=None)
    assert (count + rest, error, left(store)) == (6_000, None, 0)


def test_a_server_that_finishes_nothing_ends_the_call_after_its_splits() -> None:
    store = store_with(2_000)
    (count, error), tried = drive(delete_all(SPLITTABLE), store, slow_over=0)
    assert count == 0 and error is not None and 1 < len(tried) <= 1 + SPLITS
    assert all(b < a for a, b in zip(tried, tried[1:]))  # each try smaller than the one before


def delete_at_once() -> Program[Any]:
    match, _ = key_edit(KEY, None)
    return in_steps("c", "feed", match, SMALL, what="delete", at_once=True)


def test_a_delete_at_once_that_finishes_is_one_request() -> None:
    """``at_once`` (what ``delete`` asks): 600 copies, more than a sample or a step, go in one request when the
    server finishes it in time: no sample, no steps."""
    store = store_with(600)
    (count, error), tried = drive(delete_at_once(), store, slow_over=None)
    assert (count, error, left(store), tried) == (600, None, 0, [600])
    assert [type(r) for r in store.sent] == [Delete]


@pytest.mark.parametrize("kind", ["cancelled", "timeout", "too_large"])
def test_a_delete_at_once_too_big_for_its_time_goes_on_in_steps(kind: str) -> None:
    """A server that cannot remove more than 30 copies in time: the delete at once is stopped (or answered too late,
    or refused as too large), then sampled steps remove every copy in the same call, each counted once."""
    store = store_with(600)
    (count, error), tried = drive(delete_at_once(), store, slow_over=30, kind=kind)
    assert (count, error, left(store)) == (600, None, 0)
    assert tried[0] == 600 and isinstance(store.sent[0], Find)  # (the store sees only the requests it answered)


def test_a_delete_at_once_whose_cluster_fails_stops_there() -> None:
    """A failure that is not about time or size ends the call with its error, nothing counted."""
    store = store_with(100)
    program = delete_at_once()
    request = next(program)
    assert isinstance(request, Delete) and request.filter == {"data_key": KEY}
    with pytest.raises(StopIteration) as stop:
        program.send(Failure("unavailable", ClusterUnavailable("c", "connection refused")))
    assert stop.value.value[0] == 0 and isinstance(stop.value.value[1], ClusterUnavailable) and left(store) == 100
