"""Edits in the ``buckets`` layout reach every copy: a copy that no longer fits its bucket moves, once, and the
counters follow the copies.

Each test runs on the session's servers (FerretDB 2 on DocumentDB unless ``$FEED_TEST_BACKEND`` says otherwise) and on
a mongo-java-server of this module's own (the ``server`` fixtures of ``layouts.py``), through both doors. Periods as
in ``layouts.buckets_config``: ``cluster_3`` [P2, open) stores buckets. A bucket is made full by bytes with a few
large items (half a MiB each), so that an update of a small copy in it to a large one no longer fits.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Generator, Iterator, Sequence
from datetime import datetime, timedelta
from typing import Any

import bson
import pytest
from pymongo import MongoClient

from router import Activity, FeedItem, RouterConfig, data_key
from router.core.push import Push
from router.core.writes.edits import update_program
from router.core.layouts.buckets import MAX_BYTES, MAX_ITEMS
from router.core.settings import Settings
from router.core.steps import Concurrently, Delete, Insert, Program, Report, Sleep, Update, Upserts
from router.observe import Event
from router.storage.clusters import Clusters

from .conftest import P0, P2
from .layouts import config, feed, javaserver, page_all, raw, server  # noqa: F401 (fixtures)
from .test_buckets_edges import AfterFinds

NOW = datetime(2024, 9, 1, tzinfo=P0.tzinfo)
KIB = 1024
Raw = MongoClient[dict[str, Any]]


def blob(tag: str, kib: float) -> dict[str, Any]:
    """Data of about *kib* KiB, told apart by *tag*."""
    return {"blob": "x" * int(kib * KIB), "tag": tag}


def item(receiver: int, hour: float, name: str, data: dict[str, Any], *, sender: int = 1) -> FeedItem:
    return FeedItem(receiver_id=receiver, sender_id=sender, event_time=P2 + timedelta(hours=hour), type=1, data=data,
                    data_key=data_key("move", f"{receiver}-{name}"))


def stored(raw: Raw, config: RouterConfig, receiver: int | None = None) -> list[dict[str, Any]]:
    """cluster_3's buckets (of *receiver*), after checking what every bucket must keep: each copy in one bucket and
    once, ``count`` the copies it holds, ``bytes`` no less than their BSON size and within the cap (one copy alone
    may pass it), and no copy left half-moved."""
    docs = list(feed(raw, config, 2).find({} if receiver is None else {"receiver_id": receiver}))
    ids = [i["_id"] for d in docs for i in d["items"]]
    assert len(ids) == len(set(ids)), "a copy stored twice"
    for doc in docs:
        items = doc["items"]
        assert all("moving" not in i for i in items), f"a copy left half-moved in {doc['_id']}"
        assert doc["count"] == len(items), (doc["count"], len(items))
        size = sum(len(bson.encode(i)) for i in items)
        assert size <= doc["bytes"], (size, doc["bytes"])
        assert doc["bytes"] <= MAX_BYTES or len(items) == 1, doc["bytes"]
        assert len(bson.encode(doc)) < 16 * 1024 * 1024
    return docs


def tags(router: Any, receiver: int, limit: int = 3) -> dict[str, str]:
    """Each of *receiver*'s items by data_key: its data's tag, after checking the pages (of *limit*) hold each item
    once, newest first."""
    got = page_all(router, receiver, limit)
    keys = [(x.event_time, x.id.binary) for x in got if x.id is not None]
    assert keys == sorted(keys, reverse=True) and len(set(keys)) == len(got), "an item twice, or out of order"
    return {x.data_key: x.data["tag"] for x in got}


#: What fills a bucket nearly to its byte cap: one item of this many KiB (7.6 MiB of the 8 MiB cap), written after the
#: small ones (each append rewrites the bucket).
BIG_KIB = 7782


def fill(router: Any, receiver: int, *, first: Sequence[FeedItem] = ()) -> list[FeedItem]:
    """*receiver*'s bucket nearly full by bytes: the items *first*, then one of :data:`BIG_KIB`."""
    items = [*first, item(receiver, 0, "big", blob("big", BIG_KIB))]
    router.write_many(items)
    return items


def test_growing_edits_reach_every_copy(config: RouterConfig, raw: Raw, open_router: Callable[..., Any]) -> None:
    """Nine copies of 8 KiB in one bucket, each updated to 2 MiB (18 MiB in all, twice a bucket's cap): every update
    changes its copy, which moves to a bucket with room when its own has none; every copy pages back once with its new
    data, and every bucket keeps its caps. (Before: the fourth and later updates failed with BucketsFull, for ever.)"""
    router = open_router(config, clock=lambda: NOW)
    small = [item(5, k, f"s{k}", blob("small", 8)) for k in range(9)]
    router.write_many(small)
    for x in small:
        assert router.update(x.data_key, blob("grown", 2048)) == 1
    assert set(tags(router, 5).values()) == {"grown"}
    docs = stored(raw, config, 5)
    assert sum(len(d["items"]) for d in docs) == 9 and len(docs) >= 3


def test_a_post_moves_in_every_receiver(config: RouterConfig, raw: Raw, open_router: Callable[..., Any]) -> None:
    """A post in three receivers' nearly full buckets, updated to 600 KiB: the update returns 3, each receiver pages it
    once with the new data, and an update back to small data and a delete reach every copy too."""
    router = open_router(config, clock=lambda: NOW)
    receivers = [21, 22, 23]
    post = Activity(sender_id=7, event_time=P2 + timedelta(hours=30), type=1, data=blob("v0", 4),
                    data_key=data_key("move", "post"))
    assert router.fan_out(post, receivers).written == 3
    for r in receivers:
        fill(router, r)
    assert router.update(post.data_key, blob("v1", 600)) == 3
    for r in receivers:
        assert tags(router, r)[post.data_key] == "v1"
        assert len(stored(raw, config, r)) == 2
    assert router.update(post.data_key, blob("v2", 1)) == 3
    assert {tags(router, r)[post.data_key] for r in receivers} == {"v2"}
    assert router.delete(post.data_key) == 3
    assert all(post.data_key not in tags(router, r) for r in receivers)
    stored(raw, config)


def test_counters_follow_the_copies_so_later_appends_fit(config: RouterConfig, raw: Raw,
                                                         open_router: Callable[..., Any]) -> None:
    """A bucket's ``count`` and ``bytes`` go down when copies leave (delete, unfollow, an erasure's removal) or shrink
    (an update to smaller data), so later appends fill the same bucket instead of starting new ones."""
    router = open_router(config, clock=lambda: NOW)
    # delete: a full bucket of 50 loses 10 copies, then takes 10 more
    fifty = [item(31, k, f"c{k}", blob("c", 0.1)) for k in range(MAX_ITEMS)]
    router.write_many(fifty)
    for x in fifty[:10]:
        assert router.delete(x.data_key) == 1
    (doc,) = stored(raw, config, 31)
    assert doc["count"] == 40
    router.write_many([item(31, 60 + k, f"d{k}", blob("d", 0.1)) for k in range(10)])
    assert [len(d["items"]) for d in stored(raw, config, 31)] == [MAX_ITEMS]
    # an update to smaller data: two copies of 3.8 MiB, one shrunk to 1 KiB, then another of 3.8 MiB fits
    big = [item(32, k, f"b{k}", blob("b", BIG_KIB / 2)) for k in range(3)]
    router.write_many(big[:2])
    before = stored(raw, config, 32)[0]["bytes"]
    assert router.update(big[0].data_key, blob("shrunk", 1)) == 1
    (doc,) = stored(raw, config, 32)
    assert doc["bytes"] < before - BIG_KIB / 2 * KIB + 2 * KIB
    router.write_many(big[2:])
    assert [len(d["items"]) for d in stored(raw, config, 32)] == [3]
    # unfollow and an erasure: 40 copies of two senders leave a full bucket, 40 others fill it again
    mixed = [item(33, k, f"m{k}", blob("m", 0.1), sender=70 + k % 3) for k in range(MAX_ITEMS)]
    router.write_many(mixed)
    assert router.unfollow(33, 71) == 17
    router.erase_user(72, requested_by="tests")
    (doc,) = stored(raw, config, 33)
    assert doc["count"] == 17 and {i["sender_id"] for i in doc["items"]} == {70}
    router.write_many([item(33, 60 + k, f"n{k}", blob("n", 0.1)) for k in range(33)])
    assert [len(d["items"]) for d in stored(raw, config, 33)] == [MAX_ITEMS]


def test_concurrent_edits_of_one_post_leave_one_copy(config: RouterConfig, raw: Raw,
                                                     open_router: Callable[..., Any]) -> None:
    """Two routers update one post in three receivers' nearly full buckets at the same time, each to growing data
    (their first updates both move each copy): every copy is stored once, with the data of one of the last updates,
    and the next update reaches each."""
    routers = [open_router(config, clock=lambda: NOW) for _ in range(2)]
    receivers = [41, 42, 43]
    post = Activity(sender_id=7, event_time=P2 + timedelta(hours=30), type=1, data=blob("v0", 4),
                    data_key=data_key("move", "both"))
    routers[0].fan_out(post, receivers)
    for r in receivers:
        fill(routers[0], r)
    errors: list[BaseException] = []
    start = threading.Barrier(2)

    def edit(router: Any, names: list[str]) -> None:
        try:
            start.wait()
            for k, name in enumerate(names):
                router.update(post.data_key, blob(name, 500 + 100 * k))
        except BaseException as exc:  # noqa: BLE001 (reported below)
            errors.append(exc)

    threads = [threading.Thread(target=edit, args=(r, [f"{who}{k}" for k in range(3)]))
               for r, who in zip(routers, "ab")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    assert not errors, errors
    for r in receivers:
        assert tags(routers[1], r)[post.data_key] in {"a2", "b2"}
        assert len([i for d in stored(raw, config, r) for i in d["items"] if i["data_key"] == post.data_key]) == 1
    assert routers[1].update(post.data_key, blob("last", 900)) == 3
    assert {tags(routers[0], r)[post.data_key] for r in receivers} == {"last"}
    stored(raw, config)


# -- an edit stopped between its steps ---------------------------------------------------------------------------


def flat(program: Program[Any]) -> Generator[Any, Any, Any]:
    """*program*'s storage requests one at a time (the sub-programs of ``Concurrently`` one after another)."""
    reply: Any = None
    while True:
        try:
            request = program.send(reply)
        except StopIteration as stop:
            return stop.value
        if isinstance(request, Concurrently):
            reply = []
            for sub in request.programs:
                reply.append((yield from flat(sub)))
        elif isinstance(request, (Report, Sleep, Push)):  # (a live push: answered at once, as a driver does)
            reply = None
        else:
            reply = yield request


#: The requests that change what is stored: where an edit may stop.
WRITES = (Insert, Upserts, Update, Delete)


class Stepper:
    """Runs an update of *key* in cluster_3 one request at a time, as the router runs it: stopping it is the crash of
    the process that ran it (``writes``: how many of the requests sent changed what is stored)."""

    def __init__(self, config: RouterConfig, clusters: Clusters, key: str, data: dict[str, Any]) -> None:
        settings = Settings.from_config(config).edit
        self.clusters = clusters
        self.steps = flat(update_program(key, data, ["cluster_3"], settings, clusters.load_timemap()))
        self.request: Any = next(self.steps)
        self.writes = 0

    @property
    def done(self) -> bool:
        return self.request is None

    def run(self, writes: int | None = None) -> None:
        """Send requests up to the *writes*-th write since the start (None: to the end)."""
        while self.request is not None and (writes is None or self.writes < writes):
            answer = self.clusters[self.request.cluster].execute(self.request)
            self.writes += isinstance(self.request, WRITES)
            try:
                self.request = self.steps.send(answer)
            except StopIteration:
                self.request = None


@pytest.fixture
def clusters(config: RouterConfig) -> Iterator[Clusters]:
    with Clusters(config) as opened:
        yield opened


def _moving(router: Any, receiver: int) -> FeedItem:
    """*receiver*'s bucket nearly full by bytes, holding a small copy that an update to 600 KiB must move."""
    return fill(router, receiver, first=[item(receiver, 20, "x", blob("old", 1))])[0]


def test_a_rerun_finishes_an_edit_stopped_between_its_steps(config: RouterConfig, raw: Raw, clusters: Clusters,
                                                           open_router: Callable[..., Any]) -> None:
    """An update that must move a copy, stopped after each of its writes in turn (a crashed process): then the
    receiver's pages hold the copy once, with its old or its new data; running the update again stores it once, with
    the new data, and leaves no copy half-moved."""
    router = open_router(config, clock=lambda: NOW)
    whole = _moving(router, 50)
    full = Stepper(config, clusters, whole.data_key, blob("new", 600))
    full.run()
    assert tags(router, 50)[whole.data_key] == "new"
    assert full.writes >= 4  # the fence, the copy made to move, moved, and its old place let go
    for cut in range(1, full.writes):
        receiver = 50 + cut
        x = _moving(router, receiver)
        Stepper(config, clusters, x.data_key, blob("new", 600)).run(cut)
        assert tags(router, receiver)[x.data_key] in {"old", "new"}, cut
        assert router.update(x.data_key, blob("new", 600)) in (0, 1)
        assert tags(router, receiver)[x.data_key] == "new", cut
        assert sum(len(d["items"]) for d in stored(raw, config, receiver)) == 2, cut


def _three_buckets(router: Any, receiver: int) -> FeedItem:
    """*receiver*'s items in three buckets read newest first: the oldest full by count and nearly by bytes (holding
    the small copy to move), a middle one full by count, and the newest with room (where the copy moves)."""
    oldest = fill(router, receiver, first=[item(receiver, 1 + k, f"o{k}", blob("o", 0.1)) for k in range(MAX_ITEMS - 1)])
    router.write_many([item(receiver, 100 + k, f"m{k}", blob("m", 0.1)) for k in range(MAX_ITEMS)])
    router.write_many([item(receiver, 200 + k, f"n{k}", blob("n", 0.1)) for k in range(10)])
    return oldest[30]


class CountedFinds(AfterFinds):
    """:class:`AfterFinds` that also counts the finds of ``feed`` on its cluster."""

    finds = 0

    def record(self, event: Event) -> None:
        if self.armed and event.name == "request" and event.op == "find.feed" and event.cluster == self.cluster:
            self.finds += 1
        super().record(event)


@pytest.mark.parametrize("before", [False, True], ids=["between", "before-and-between"])
def test_pages_are_exact_while_a_copy_moves(config: RouterConfig, raw: Raw, clusters: Clusters,
                                            open_router: Callable[..., Any], before: bool) -> None:
    """A page reads the receiver's newest buckets (where the copy moves to), then the oldest (where it was): an update
    that moves the copy runs to each of its writes in turn between the page's two finds (``between``), or up to it
    before the page and the rest between them (``before-and-between``). Every page holds every item once, newest
    first, the moving copy with its old or its new data."""
    setup = open_router(config, clock=lambda: NOW)
    probe = _three_buckets(setup, 60)
    full = Stepper(config, clusters, probe.data_key, blob("new", 600))
    full.run()
    assert sorted(len(d["items"]) for d in stored(raw, config, 60)) == [11, 49, 50]
    finds: list[int] = []
    for cut in range(full.writes + 1):
        receiver = 61 + cut
        x = _three_buckets(setup, receiver)
        edit = Stepper(config, clusters, x.data_key, blob("new", 600))
        if before:
            edit.run(cut)
        hook = CountedFinds("cluster_3", lambda: edit.run(None if before else cut))
        reader = open_router(config, clock=lambda: NOW, metrics=hook)
        hook.armed = True
        got = tags(reader, receiver, 120)  # one page: every bucket in one walk
        assert hook.left == 0
        finds.append(hook.finds)
        assert len(got) == 110 and got[x.data_key] in {x.data["tag"], "new"}, (cut, got.get(x.data_key))
        edit.run()
        assert edit.done
        stored(raw, config, receiver)
        reader.close()
    # Two finds read the three buckets; a third asks for the copy by id where the page read its new bucket before it
    # arrived and its old one after it left (all of the move between the finds).
    assert finds[-1 if not before else 0] == 3 and min(finds) == 2, finds
