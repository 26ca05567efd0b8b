"""Live feeds without a server: the messages, the stream's gap-free rules, the backlog, and what writers push, when.

The races are proved as the edit fence's are (``test_edit_races.py``): the core's own programs
run against one scripted store in every order their requests can take, and a model subscriber
applies the pushes in the order the programs made them; once all end, what it shows is what is
stored. Real Redis and servers: ``tests/integration/test_live.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta, timezone
from typing import Any

import bson
import pytest
from bson import ObjectId

from router import Activity, FeedItem, Page, data_key
from router.core.writes.edits import EditSettings, delete_program, update_program
from router.core.fanout.plan import FanOutJob, batch_program
from router.core.writes.fence import DELETED, Fence
from router.core.push import (
    GAP, Messages, Push, PushCopies, PushEdit, PushItems, PushPost, cleanups, decode, member,
)
from router.core.live.stream import (
    START, Backlog, CatchUp, DeletedItem, LivePlan, NewItem, Resync, Stream, UpdatedItem, catch_up_program,
    live_cursor,
)
from router.core.layouts import outbox
from router.core.layouts.values import Post
from router.core.policy import RetryPolicy
from router.core.steps import Find, Insert, Program
from router.core.writes.insert import WriteSettings, write_program
from router.cursor import Position, decode_cursor, encode_cursor
from router.errors import WriteFailed
from router.testing.scripted import ScriptedStore, interleavings, run_alone
from router.timemap import TimeMap
from router import ClusterMeta

UTC = timezone.utc
T0 = datetime(2024, 8, 2, 10, tzinfo=UTC)
R = 7


def item(n: int, receiver: int | str = R, *, type: int | str = 1) -> FeedItem:
    return FeedItem(receiver_id=receiver, sender_id=3, event_time=T0 + timedelta(seconds=n), type=type,
                    data={"n": n}, data_key=f"k{n}", id=ObjectId.from_datetime(T0 + timedelta(seconds=n)))


def raw(push: Push) -> list[tuple[str, bytes]]:
    """What Redis would publish for *push* if every member were present: (member or 'edits', message)."""
    m = push.messages()
    return [(mem, m.message(i)) for i, mem in enumerate(m.members)] + [("edits", b) for b in m.broadcast]


def page(items: Sequence[FeedItem], more: bool = False) -> Page:
    return Page(items=tuple(items), next_cursor=encode_cursor(Position(items[-1].event_time, items[-1].id)) if more
                else None)  # type: ignore[arg-type]


# -- messages -------------------------------------------------------------------------------------


def test_members_tell_an_int_id_from_the_str_of_its_digits() -> None:
    assert (member("r", 42), member("r", "42"), member("a", 42)) == ("r:i42", "r:s42", "a:i42")


def test_an_item_message_decodes_to_the_item() -> None:
    """Every kind of push decodes (head and shared body merged) to the item it names; skipped positions send nothing."""
    items = [item(1), item(2, 8)]
    push = PushItems(items, [i.id for i in items], skip={1})
    messages = push.messages()
    assert messages.members == ["r:i7"] and messages.heads == () and messages.head is not None  # made on demand
    ((m1, first),) = raw(push)  # type: ignore[misc]
    doc = decode(first)
    assert m1 == "r:i7" and doc["k"] == "item" and doc["_id"] == items[0].id and doc["data"] == {"n": 1}
    act = Activity(sender_id=3, event_time=T0, type=1, data={"x": 1}, data_key="k")
    sent = raw(PushCopies(act, [7, "8", 9], [ObjectId(), ObjectId(), ObjectId()], {"x": 2}, skip={2}))
    assert [m for m, _ in sent] == ["r:i7", "r:s8"] and sent[0][1] == sent[1][1]  # one message: ids are derived
    assert decode(sent[0][1])["k"] == "copy" and decode(sent[0][1])["data"] == {"x": 2}
    ((m3, post),) = raw(PushPost(act))  # type: ignore[misc]
    assert m3 == "a:i3" and decode(post)["k"] == "post"
    assert raw(PushEdit(["a", "b"])) == [("edits", bson.encode({"k": "deleted", "keys": ["a", "b"]}))]
    assert [decode(b)["data_key"] for _, b in raw(PushEdit(["a", "b"], {"v": 1}))] == ["a", "b"]
    assert PushEdit([]).messages() == Messages() and len(PushCopies(act, [], [], {}).messages()) == 0


def test_a_copy_pushed_by_a_fan_out_is_the_copy_its_subscriber_reads() -> None:
    """A fan-out's message carries no id: each subscriber derives its copy's (router.ids.copy_id), the one stored."""
    from router.ids import copy_id

    act = Activity(sender_id=3, event_time=T0 + timedelta(milliseconds=125), type=1, data={"x": 1}, data_key="k")
    ((_, message), _) = raw(PushCopies(act, [7, "7"], [ObjectId(), ObjectId()], {"x": 1}))
    for receiver in (7, "7"):
        s = Stream(LivePlan(receiver_id=receiver))
        s.caught_up(CatchUp(None, 10))
        (event,) = s.accept(message)
        oid = copy_id(int(T0.timestamp()), "k", receiver)
        assert event == NewItem(act.for_receiver(receiver, id=oid), encode_cursor(Position(act.event_time, oid)))


def test_cleanups_push_what_a_fence_undid() -> None:
    """A key found deleted: one DeletedItem push; an update newer than the data written: its data; else nothing."""
    fences = {"gone": Fence(DELETED), "newer": Fence(2, {"v": 2}), "same": Fence(1, {"v": 1}), "never": Fence()}
    pushed = list(cleanups(fences, {"same": 1}))
    assert pushed == [PushEdit(["gone"]), PushEdit(["newer"], {"v": 2})]


# -- the stream -------------------------------------------------------------------------------------


def stream(after: Position | None = START, **kwargs: Any) -> Stream:
    return Stream(LivePlan(receiver_id=R, after=after, **kwargs))


def caught_up(s: Stream, *pages: Page) -> list[Any]:
    done = s.catch_up()
    for p in pages:
        if done.take(p):
            break
    return s.caught_up(done)


def test_a_catch_up_hands_out_items_after_the_cursor_oldest_first_then_live_ones_once() -> None:
    """Pages newest first down to the cursor (exclusive): oldest first; what then comes live as well is dropped by id;
    each event's cursor is the newest position handed out."""
    s = stream(Position(item(2).event_time, item(2).id))  # type: ignore[arg-type]
    events = caught_up(s, page([item(6), item(5), item(4)], more=True), page([item(3), item(2), item(1)]))
    assert [e.item.data["n"] for e in events] == [3, 4, 5, 6]
    assert events[-1].cursor == encode_cursor(Position(item(6).event_time, item(6).id))  # type: ignore[arg-type]
    assert s.accept(raw(PushItems([item(5)], [item(5).id]))[0][1]) == []  # type: ignore[list-item]
    (late,) = s.accept(raw(PushItems([item(0)], [item(0).id]))[0][1])  # type: ignore[list-item]
    assert isinstance(late, NewItem) and late.item == item(0)
    assert late.cursor == events[-1].cursor  # an older position pushed late does not move the cursor back


def test_the_cursor_item_itself_and_items_in_the_same_millisecond_before_it_are_not_served() -> None:
    at = item(2)
    before = FeedItem(**{**{f: getattr(at, f) for f in ("receiver_id", "sender_id", "event_time", "type", "data",
                                                      "data_key")}, "id": ObjectId(b"\x00" * 12)})
    s = stream(Position(at.event_time, at.id))  # type: ignore[arg-type]
    assert caught_up(s, page([item(3), at, before])) == [NewItem(item(3), encode_cursor(Position(item(3).event_time, item(3).id)))]  # type: ignore[arg-type]


def test_no_cursor_starts_at_the_newest_item_and_an_empty_feed_at_the_start() -> None:
    s = stream(None)
    assert s.catch_up().page_size == 1 and caught_up(s, page([item(9)])) == []
    assert s.position == Position(item(9).event_time, item(9).id)  # type: ignore[arg-type]
    empty = stream(None)
    assert caught_up(empty, Page(items=(), next_cursor=None)) == [] and empty.position == START
    assert decode_cursor(live_cursor(Page(items=(), next_cursor=None))) == START


def test_too_many_items_to_catch_up_is_a_resync_from_the_newest() -> None:
    s = stream(catch_up=2)
    (event,) = caught_up(s, page([item(3), item(2), item(1)]))
    assert event == Resync("too_far", encode_cursor(Position(item(3).event_time, item(3).id)))  # type: ignore[arg-type]


def test_types_are_kept_and_others_dropped() -> None:
    s = stream(types=("like",))
    caught_up(s, Page(items=(), next_cursor=None))
    assert s.accept(raw(PushItems([item(1, type="comment")], [item(1).id]))[0][1]) == []  # type: ignore[list-item]
    assert len(s.accept(raw(PushItems([item(2, type="like")], [item(2).id]))[0][1])) == 1  # type: ignore[list-item]


def test_a_pulled_post_comes_as_the_pulled_read_shows_it() -> None:
    """An outbox push becomes the subscriber's item under the id its copy would have, as a pulled page shows it."""
    s = stream(pull=(3,))
    caught_up(s, Page(items=(), next_cursor=None))
    act = Activity(sender_id=3, event_time=T0, type=1, data={"x": 1}, data_key="k")
    ((_, message),) = raw(PushPost(act))
    (event,) = s.accept(message)
    shown = outbox.pulled_item(Post(ObjectId(), act), R)
    assert isinstance(event, NewItem) and event.pulled and shown is not None and event.item == shown[2]


def test_edits_gaps_and_garbage() -> None:
    s = stream()
    caught_up(s, Page(items=(), next_cursor=None))
    ((_, deleted),) = raw(PushEdit(["a"]))
    ((_, updated),) = raw(PushEdit(["b"], {"v": 2}))
    assert s.accept(deleted) == [DeletedItem("a", encode_cursor(START))]
    assert s.accept(updated) == [UpdatedItem("b", {"v": 2}, encode_cursor(START))]
    assert s.accept(b"\x05\x00") == [] and s.accept(bson.encode({"k": "item"})) == []  # malformed: ignored
    assert s.accept(GAP) == [Resync("missed", encode_cursor(START))] and s.behind


def test_repeats_are_dropped_within_the_window() -> None:
    s = stream()
    caught_up(s, Page(items=(), next_cursor=None))
    message = raw(PushItems([item(1)], [item(1).id]))[0][1]  # type: ignore[list-item]
    assert len(s.accept(message)) == 1 and s.accept(message) == []


def test_catch_up_program_reads_pages_until_the_cursor() -> None:
    """The catch-up asks read for page after page (each from the last one's cursor) and stops at the cursor."""
    pages = {None: page([item(6), item(5)], more=True), "more": page([item(4), item(3)])}
    asked: list[str | None] = []

    def read(cursor: str | None) -> Program[Page]:
        asked.append(cursor)
        return pages[None if cursor is None else "more"]
        yield  # a program that asks nothing

    done = CatchUp(Position(item(3).event_time, item(3).id), 10)  # type: ignore[arg-type]
    result, _ = run_alone(catch_up_program(read, done))
    assert [i.data["n"] for i, _ in result.found] == [6, 5, 4] and len(asked) == 2


# -- the backlog ----------------------------------------------------------------------------------


def test_a_full_backlog_drops_everything_and_says_so() -> None:
    b = Backlog(3)
    for n in range(5):
        b.put(bytes([n]))
    assert len(b.messages) == 1 and b.take() == ("overflow", None) and b.take() == ("message", b"\x04")
    b.put(b"x")
    b.disconnected()
    b.put(b"lost while down")
    assert b.take() == ("lost", None) and b.take() == ("wait", None) and not b.ready
    b.restored()
    b.put(b"y")
    assert [b.take(), b.take(), b.take()] == [("back", None), ("message", b"y"), ("wait", None)]


# -- what writers push, and when ----------------------------------------------------------------


def logged(program: Program[Any], log: list[tuple[Push, int]], store: ScriptedStore) -> Program[Any]:
    """*program*, each push it makes appended to *log* when it makes it, with how many requests *store* had answered
    by then (its sub-programs' included)."""
    reply: Any = None
    while True:
        try:
            request = program.send(reply)
        except StopIteration as stop:
            return stop.value
        if isinstance(request, Push):
            log.append((request, len(store.sent)))
            reply = None
            continue
        reply = yield request


def test_write_many_pushes_what_it_stored_after_storing_it() -> None:
    """The push comes after every insert was answered, and leaves out an item the server refused."""
    store = ScriptedStore()
    taken = item(1)
    store.docs("c3", "feed")[taken.id] = {"_id": taken.id, "receiver_id": 99, "sender_id": 1, "event_time": T0,
                                           "type": 1, "data": {}, "data_key": "other"}  # another item under its id
    timemap = TimeMap([ClusterMeta(name="c3", start_date=datetime(2024, 7, 1, tzinfo=UTC))])
    from router.core.periods.routing import Routing

    log: list[tuple[Push, int]] = []
    with pytest.raises(WriteFailed):
        run_alone(logged(write_program([item(2), taken], Routing(timemap, T0, None), WriteSettings(), indexed=True),
                         log, store), store)
    ((push, answered),) = log
    assert answered == len(store.sent)  # after every request of the write, the last read-back of the refused one too
    assert [type(r) for r in store.sent if getattr(r, "collection", None) == "feed"] == [Insert, Find]
    assert isinstance(push, PushItems) and [m for m, _ in raw(push)] == ["r:i7"] and set(push.skip) == {1}


KEY = data_key("fabula", 77)
ACT = Activity(sender_id="author", event_time=T0, type=1, data={"v": 1}, data_key=KEY)
JOB = FanOutJob(job_id=f"{KEY}:1", cluster="c3", activity=ACT, batch_size=3)


def batch(number: int, receivers: Sequence[Any]) -> Program[Any]:
    return batch_program(JOB, number, number * 3, receivers, policy=RetryPolicy(attempts=1), timeout=60.0)


def shown(log: list[tuple[Push, int]]) -> dict[tuple[Any, str], Any]:
    """What a subscriber of every receiver shows after the pushes in *log*, in order: (receiver, key) -> data."""
    view: dict[tuple[Any, str], Any] = {}
    for push, _ in log:
        for member, message in raw(push):
            doc = decode(message)
            if doc["k"] == "item":
                view[(doc["receiver_id"], doc["data_key"])] = doc["data"]
            elif doc["k"] == "copy":
                view[(int(member.split(":i")[1]), doc["data_key"])] = doc["data"]
            elif doc["k"] == "deleted":
                view = {k: v for k, v in view.items() if k[1] not in doc["keys"]}
            elif doc["k"] == "updated":
                view = {k: (doc["data"] if k[1] == doc["data_key"] else v) for k, v in view.items()}
    return view


def stored(store: ScriptedStore) -> dict[tuple[Any, str], Any]:
    return {(c["receiver_id"], c["data_key"]): c["data"] for c in store.find("c3", "feed", {})}


@pytest.mark.parametrize("edit", ["delete", "update"])
def test_what_a_subscriber_shows_is_what_is_stored_whatever_the_order(edit: str) -> None:
    """A fan-out batch racing delete (or update), in every order: once both end, a subscriber that applied every push
    in the order they were made shows exactly the copies stored, with their data: the batch's fence clean-up pushes
    what it undid, and every push comes after its write."""
    logs: dict[int, list[tuple[Push, int]]] = {}

    def setup(store: ScriptedStore) -> None:
        logs[id(store)] = log = []
        run_alone(logged(batch(0, [1, 2]), log, store), store)

    def make(store: ScriptedStore) -> list[Program[Any]]:
        change = (delete_program(KEY, ["c3"], EditSettings(step=2, sample=2, timeout=60.0)) if edit == "delete"
                  else update_program(KEY, {"v": 2}, ["c3"], EditSettings(timeout=60.0)))
        return [logged(batch(1, [4, 5, 6]), logs[id(store)], store), logged(change, logs[id(store)], store)]

    runs = 0
    for run in interleavings(make, setup=setup):
        runs += 1
        log = logs.pop(id(run.store))
        assert shown(log) == stored(run.store), run.order
        for push, answered in log:  # a batch's copies are pushed once its insert was answered
            if isinstance(push, PushCopies):
                assert any(isinstance(r, Insert) and r.collection == "feed" for r in run.store.sent[:answered])
        assert all(v == {"v": 2} for v in stored(run.store).values()) if edit == "update" else not stored(run.store)
    assert runs > 10
