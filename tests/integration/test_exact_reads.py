"""Every read is exact whatever the server's cursors do: documents updated between the batches of a read are each
served once, and no read continues a cursor.

FerretDB 2.7 on DocumentDB serves documents twice and skips others on ``getMore`` once
documents of the collection were updated (``docs/ferretdb2-cursor-bug.md``). A listener on
the router's own clients (:class:`Churn`) updates documents of the collection read after
every batch the router receives, so each read here meets what triggers it; the reads
must come back exact, without a ``getMore``, on every server.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import attrs
import pytest
from pymongo import MongoClient, monitoring

from router import Activity, FeedItem, RouterConfig, data_key
from router.core.policy import deadline_in
from router.core.steps import Find, ask
from router.storage.aclusters import AsyncClusters
from router.storage.clusters import Clusters

from .conftest import NOW, P1, P2, register
from .doors import LoopThread

#: A storage contract file, on the copies layout alone: its churn updates copies documents directly.
pytestmark = [pytest.mark.contract, pytest.mark.layouts("copies", reason="the churn updates copies documents directly")]

Clients = dict[str, MongoClient[dict[str, Any]]]


class Churn(monitoring.CommandListener):
    """After every ``find``/``getMore`` reply on *collection*, updates a few of its documents through another client,
    and records the names of the read commands sent."""

    def __init__(self, raw: Any, collection: str, *, per_batch: int = 10) -> None:
        self.raw = raw  # a database on a plain client of the same server
        self.collection = collection
        self.per_batch = per_batch
        self.on = False
        self.sent: list[str] = []
        self.updated = 0
        self.ids: list[Any] = []

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        name = event.command_name
        target = event.command.get("collection") if name == "getMore" else event.command.get(name)
        if self.on and name in ("find", "getMore") and target == self.collection:
            self.sent.append(name)

    def start(self) -> None:
        """Update some documents now (before the read, as in the bug's reproduction), then after every batch."""
        self.churn()
        self.on = True

    def churn(self) -> None:
        coll = self.raw[self.collection]
        if not self.ids:  # one batch (no getMore to go wrong), once
            self.ids = [d["_id"] for d in coll.find({}, {"_id": 1}, batch_size=100_000)]
        ids = random.sample(self.ids, min(self.per_batch, len(self.ids)))
        self.updated += coll.update_many({"_id": {"$in": ids}}, {"$inc": {"churned": 1}}).modified_count

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        if self.on and event.command_name in ("find", "getMore"):
            self.churn()

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass


# -- the storage's find, every shape the core asks for ---------------------------------------------------------

N = 3000
#: A third of the documents carry 20 kB: the whole collection is about 20 MB, more than one 16 MiB batch.
DOCS = [{"_id": i, "r": i % 2, "t": i % 50, "pad": "x" * (20_000 if i % 3 == 0 else 10)} for i in range(N)]


def _key(order: list[tuple[str, int]]) -> Callable[[dict[str, Any]], tuple[Any, ...]]:
    return lambda d: tuple(d[f] if s > 0 else -d[f] for f, s in order)


SHAPES: dict[str, tuple[dict[str, Any], list[tuple[str, int]] | None, int, dict[str, Any] | None]] = {
    "unsorted, no limit": ({}, None, 0, None),
    "_id $in, no limit": ({"_id": {"$in": list(range(0, N, 2))}}, None, 0, None),
    "unsorted, limit": ({"r": 0}, None, 1400, None),
    "page order, limit": ({"r": 1}, [("t", -1), ("_id", -1)], 1200, None),
    "page order, no limit": ({}, [("t", 1), ("_id", 1)], 0, None),
    "order without _id, limit, _id hidden": ({"r": 1}, [("t", -1)], 1200, {"_id": 0, "t": 1, "r": 1}),
    "ids only, no limit": ({}, None, 0, {"_id": 1}),
}


def expected(filter: dict[str, Any], sort: list[tuple[str, int]] | None, limit: int) -> list[dict[str, Any]]:
    docs = [d for d in DOCS if all(d[k] == v for k, v in filter.items() if k != "_id")]
    if "_id" in filter:
        wanted = set(filter["_id"]["$in"])
        docs = [d for d in docs if d["_id"] in wanted]
    if sort:
        docs.sort(key=_key(sort))
    return docs[:limit] if limit else docs


@pytest.fixture
def churned_feed(make_config: Callable[..., RouterConfig], raw_clients: Clients, db_name: str) -> tuple[RouterConfig, Any]:
    config = make_config()
    raw = raw_clients["cluster_1"][db_name]
    for start in range(0, N, 500):
        raw.feed.insert_many([dict(d) for d in DOCS[start:start + 500]])
    return config, raw


@pytest.mark.parametrize("shape", list(SHAPES))
def test_every_find_shape_is_exact_while_documents_change(
    shape: str, door: str, churned_feed: tuple[RouterConfig, Any], event_loop_thread: LoopThread
) -> None:
    """Each shape of Find (limit or none, sorted or not, a projection hiding the sort's fields) over a collection
    larger than one 16 MiB batch, its documents updated after every batch: each matching document exactly once, in
    order, in finds only."""
    config, raw = churned_feed
    filter, sort, limit, projection = SHAPES[shape]
    churn = Churn(raw, "feed")

    def find() -> Find:
        return Find("cluster_1", "feed", filter, deadline_in(60), sort=sort, limit=limit, projection=projection)

    churn.start()
    if door == "sync":
        with Clusters(config, extra_options={"event_listeners": [churn]}) as clusters:
            docs = clusters.run(ask(find()))
    else:
        async def run() -> Any:
            clusters = AsyncClusters(config, extra_options={"event_listeners": [churn]})
            try:
                return await clusters.run(ask(find()))
            finally:
                await clusters.close()
        docs = event_loop_thread.run(run())
    churn.on = False
    assert isinstance(docs, list), docs
    want = expected(filter, sort, limit)
    if projection is not None and "_id" in projection and not projection["_id"]:
        assert [d["t"] for d in docs] == [d["t"] for d in want]  # the order's field, in order
        assert all(set(d) == {"t", "r"} and d["r"] == 1 for d in docs)  # and nothing the projection hides
    elif sort is None:
        assert sorted(d["_id"] for d in docs) == [d["_id"] for d in sorted(want, key=lambda d: d["_id"])] or (
            limit and len({d["_id"] for d in docs}) == limit and all(d["r"] == filter["r"] for d in docs))
    else:
        assert [d["_id"] for d in docs] == [d["_id"] for d in want]
    assert churn.updated > 0 and "getMore" not in churn.sent


# -- the router's reads that can span batches -------------------------------------------------------------------

@pytest.fixture
def churn_router(make_config: Callable[..., RouterConfig], open_router: Callable[..., Any], raw_clients: Clients,
                 db_name: str) -> Iterator[Callable[[str, str], tuple[Any, Churn]]]:
    """Open a router through this test's door whose reads of *collection* in *cluster* meet a :class:`Churn`."""

    def make(cluster: str, collection: str) -> tuple[Any, Churn]:
        config = make_config(timeout=timedelta(seconds=60))
        register(config)
        churn = Churn(raw_clients[cluster][db_name], collection)
        return open_router(config, clock=lambda: NOW, event_listeners=[churn]), churn

    yield make


def test_a_page_over_101_items_is_one_exact_find(churn_router: Callable[[str, str], tuple[Any, Churn]]) -> None:
    """A page of 300 of a receiver's 400 items, its copies updated after every batch: the newest 300, each once, in
    order, read with one find."""
    router, churn = churn_router("cluster_3", "feed")
    items = [FeedItem(receiver_id=7, sender_id=s, event_time=P2 + timedelta(minutes=s), type=1, data={"n": s},
                      data_key=data_key("page", s)) for s in range(400)]
    ids = router.write_many(items)
    newest = [oid for _, oid in sorted(zip(items, ids), key=lambda p: (p[0].event_time, p[1]), reverse=True)][:300]
    churn.start()
    page = router.read(7, limit=300)
    churn.on = False
    assert [item.id for item in page.items] == newest
    assert churn.sent == ["find"] and churn.updated > 0


def test_a_write_repeated_with_ids_recognises_every_stored_item(
    churn_router: Callable[[str, str], tuple[Any, Churn]], raw_clients: Clients, db_name: str
) -> None:
    """write_many of 1,000 items, then again with their ids (a retry after WriteFailed): the read-back of the
    duplicates (``_id $in``) finds every one, its copies updated after every batch, so every item counts as written
    and none is refused as another item's id."""
    router, churn = churn_router("cluster_2", "feed")
    items = [FeedItem(receiver_id=i % 40, sender_id=5, event_time=P1 + timedelta(seconds=i), type=1, data={"i": i},
                      data_key=data_key("again", i)) for i in range(1000)]
    ids = router.write_many(items)
    churn.start()
    again = router.write_many([attrs.evolve(item, id=oid) for item, oid in zip(items, ids)])
    churn.on = False
    assert again == ids
    assert raw_clients["cluster_2"][db_name].feed.count_documents({}) == 1000
    assert "getMore" not in churn.sent and churn.updated > 0


def test_a_resumed_fan_out_reads_every_batch_record(churn_router: Callable[[str, str], tuple[Any, Churn]]) -> None:
    """A fan-out of 300 receivers in batches of 1, then run again: its 300 batch records, updated after every batch
    the resume reads, are each read once, so every batch counts as resumed and none is written again."""
    router, churn = churn_router("cluster_2", "fanout_batches")
    act = Activity(sender_id=3, event_time=P1 + timedelta(days=3), type=1, data={"x": 1}, data_key=data_key("resume", 1))
    first = router.fan_out(act, range(300), batch_size=1)
    assert first.ok and first.written == 300
    churn.start()
    again = router.fan_out(act, range(300), batch_size=1)
    churn.on = False
    assert (again.batches_resumed, again.resumed, again.written, again.already_present) == (300, 300, 0, 0)
    assert "getMore" not in churn.sent and churn.updated > 0


# -- reads the server continues by getMore: held cursors only ---------------------------------------------------

class EditUnread(monitoring.CommandListener):
    """After the first batch of an ``aggregate`` on ``feed`` that leaves its cursor open, sets a field of every
    matching document that batch did not hold (an editor reaching the copies still to be read), through another
    client. The space their old versions held was freed by ``VACUUM`` beforehand, so FerretDB 2 writes the new
    versions before the cursor's position, where a streamed cursor's ``getMore`` passes them by."""

    def __init__(self, raw: Any, match: dict[str, Any]) -> None:
        self.raw = raw
        self.match = match
        self.edited = 0
        self._asked: set[int] = set()

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        if event.command_name == "aggregate" and event.command.get("aggregate") == "feed":
            self._asked.add(event.request_id)

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        if event.request_id not in self._asked:
            return
        cursor = event.reply.get("cursor", {})
        if cursor.get("id") and not self.edited:
            read = [d["_id"] for d in cursor.get("firstBatch", ())]
            self.edited = self.raw.feed.update_many({**self.match, "_id": {"$nin": read}},
                                                    {"$set": {"data.edited": True}}).modified_count

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass


@pytest.mark.parametrize("size", ["40 of 1 MiB", "10,500 small"])
def test_a_pulled_senders_copies_are_counted_whole_while_edited(
    size: str, make_config: Callable[..., RouterConfig], open_router: Callable[..., Any], raw_clients: Clients,
    servers: Any, db_name: str
) -> None:
    """read_groups with a pulled sender whose copies in one group pass a first batch (40 items of 1 MiB: the 16 MiB
    cut; 10,500 small ones: the 10,000 rows asked for), the copies not in the first batch edited before the rest is
    read, with the space of older versions freed (``VACUUM``): the group counts every item, once."""
    config = make_config(timeout=timedelta(seconds=60))
    register(config)
    r, celeb = 7, 4242
    day = P2 + timedelta(days=3)
    n, pad = (40, 1 << 20) if size.startswith("40") else (10_500, 0)
    items = [FeedItem(receiver_id=r, sender_id=celeb, event_time=day + timedelta(seconds=i), type="post",
                      data={"target": 1, "pad": random.randbytes(pad).hex()[:pad]}, data_key=data_key("celeb", i))
             for i in range(n)]
    raw = raw_clients["cluster_3"][db_name]
    setup = open_router(config, clock=lambda: NOW)
    step = 4 if pad else 2000
    for start in range(0, n, step):
        setup.write_many(items[start:start + step])
    raw.feed.update_many({"receiver_id": r}, {"$set": {"data.seen": 1}})  # every copy's first version is now dead ...
    vacuumed = servers.vacuum("cluster_3", db_name, "feed")  # ... and its space free (FerretDB 2)
    editor = EditUnread(raw, {"receiver_id": r})
    router = open_router(config, clock=lambda: NOW, event_listeners=[editor])
    groups = router.read_groups(r, pull=[celeb]).groups
    assert [(g.values, g.count, g.actor_count) for g in groups] == [(("post", 1), n, 1)]
    if servers.backend == "javaserver":  # it answers an aggregate in one batch: nothing read after an edit
        assert editor.edited == 0
    else:
        assert editor.edited > 0 and (vacuumed or servers.backend != "ferretdb2")
