"""The ``buckets`` layout at its edges: writers between a page's finds, counts, emptied buckets, unknown layouts.

Each test runs on two servers that apply one document's filter and update atomically: the session's
servers (FerretDB 2 on DocumentDB unless ``$FEED_TEST_BACKEND`` says otherwise) and a mongo-java-server of this
module's own. Periods as in ``layouts.buckets_config``: ``cluster_1`` [P0, P1) in copies, ``cluster_2`` [P1, P2)
and ``cluster_3`` [P2, open) in buckets, a database each on one server.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import attrs
import bson
import pytest
from bson import ObjectId
from pymongo import MongoClient, monitoring

from router import Activity, FeedItem, FeedRouter, RouterConfig, data_key
from router.admin.periods import stored_outside
from router.admin.status import check_report
from router.core.layouts.buckets import MAX_ITEMS, Buckets
from router.core.layouts.values import Copy
from router.core.steps import Upserts
from router.errors import UnknownLayout
from router.observe import Event, Metrics
from router.storage.clusters import Clusters
from harness.bench.plans import plan_summary
from harness.localservers import LocalClusters

from .buckets_child import BASE
from .conftest import P0, P1, P2
from .layouts import buckets_config, config, fan_out_at_once, feed, javaserver, page_all, raw, server  # noqa: F401 (fixtures)

NOW = datetime(2024, 9, 1, tzinfo=P0.tzinfo)


def item(receiver: int, t: datetime, n: int, *, kind: int | str = 1, key: str | None = None, data: Any = None) -> FeedItem:
    return FeedItem(receiver_id=receiver, sender_id=1, event_time=t, type=kind, data=data or {"n": n},
                    data_key=key or data_key("edge", f"{receiver}-{n}-{t.isoformat()}"))


class AfterFinds(Metrics):
    """Runs *act* once right after each of the first *times* finds of ``feed`` on *cluster* that the router under
    test sends while armed: a deterministic interleaving of another writer between a page's finds (the router's
    metrics are recorded on its thread or event loop as each answer arrives, before the program goes on)."""

    def __init__(self, cluster: str, act: Callable[[], None], times: int = 1) -> None:
        self.cluster, self.act, self.left, self.armed = cluster, act, times, False

    def record(self, event: Event) -> None:
        if self.armed and self.left and event.name == "request" and event.op == "find.feed" and event.cluster == self.cluster:
            self.left -= 1
            self.act()


def test_page_is_exact_when_a_writer_moves_a_bucket_between_its_finds(
    config: RouterConfig, open_router: Callable[..., Any]
) -> None:
    """A returning user's 140 items, written newest first (the bucket with room holds the oldest): a second router
    fans a post out to them between the page's finds. Every item is served once, newest first, on both doors; a
    type-filtered page loses nothing either."""
    old = [item(7, P2 + timedelta(hours=k), k, kind="mention" if k % 20 == 0 else "like") for k in range(140)][::-1]
    with FeedRouter(config, clock=lambda: NOW) as writer:
        writer.write_many(old)
        posts = iter(range(100))

        def fan_out() -> None:
            n = next(posts)
            writer.fan_out(Activity(sender_id=2, event_time=NOW - timedelta(minutes=100 - n), type="mention",
                                    data={"post": n}, data_key=data_key("late", n)), [7])

        hook = AfterFinds("cluster_3", fan_out, times=2)
        reader = open_router(config, clock=lambda: NOW, metrics=hook)
        hook.armed = True
        got = page_all(reader, 7, 120)
        assert hook.left == 0  # both appends happened between the page's finds
        keys = [(x.event_time, x.id.binary) for x in got if x.id is not None]
        assert keys == sorted(keys, reverse=True) and len(set(keys)) == len(keys)
        assert {x.data_key for x in old} <= {x.data_key for x in got}
        hook.left = 2
        mentions = page_all(reader, 7, 5, types=["mention"])
        assert hook.left == 0
        assert {x.data_key for x in old if x.type == "mention"} <= {x.data_key for x in mentions}
        assert all(x.type == "mention" for x in mentions)


class AfterCutFind(monitoring.CommandListener):
    """Runs *act* once, right after the first ``find`` of ``feed`` that the server answered with a batch stopped
    short (its cursor left open: the 16 MiB cut) and before the router reads the rest: another writer between the
    two finds of one bucket read, at the moment that matters."""

    def __init__(self, act: Callable[[], None]) -> None:
        self.act, self.done, self._finds = act, False, set[int]()

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        if event.command_name == "find" and event.command.get("find") == "feed":
            self._finds.add(event.request_id)

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        if event.request_id in self._finds and event.reply.get("cursor", {}).get("id") and not self.done:
            self.done = True
            self.act()

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass


#: A copy of 15 MiB: alone in its bucket, and with any other bucket of 1.5 MiB past the 16 MiB a batch holds.
HUGE = 15 * 1024 * 1024


@pytest.mark.parametrize("walk", ["page", "export"])
def test_a_bucket_moved_between_the_finds_of_a_cut_batch_is_still_read(
    walk: str, config: RouterConfig, server: tuple[str, bool], open_router: Callable[..., Any], tmp_path: Any
) -> None:
    """Two buckets of one receiver, a 15 MiB copy in one and a 1.5 MiB copy in the other: the find of both is cut
    after the first, and an append between the two finds moves the unread bucket ahead of the first one's place in
    the walk's order (a page: a newer item; an export, oldest first: an older one). Both items stored before the
    read are served (a page walk on both doors; the export's ``received`` file)."""
    config = attrs.evolve(config, timeout=timedelta(seconds=60))
    day = P2 + timedelta(days=3)
    huge, small = (day.replace(hour=10), day.replace(hour=9)) if walk == "page" else (day.replace(hour=8), day.replace(hour=9))
    late = day.replace(hour=11) if walk == "page" else day.replace(hour=7)
    with FeedRouter(config, clock=lambda: NOW) as writer:
        writer.write(item(7, huge, 1, data={"blob": "h" * HUGE}))
        writer.write(item(7, small, 2, data={"blob": "s" * (HUGE // 10)}))
        hook = AfterCutFind(lambda: writer.write(item(7, late, 3)))
        reader = open_router(config, clock=lambda: NOW, event_listeners=[hook])
        if walk == "page":
            got = [x.event_time for x in page_all(reader, 7, 10)]
        else:
            out = tmp_path / "export"
            out.mkdir()
            reader.export_user(7, out)
            got = [datetime.fromisoformat(json.loads(line)["event_time"])
                   for line in (out / "received.jsonl").read_text().splitlines()]
    assert hook.done or server[1]  # mongo-java-server never cuts a batch
    assert {huge, small} <= set(got) and len(got) == len(set(got))
    assert got == sorted(got, reverse=walk == "page")


def test_delete_and_update_count_copies(config: RouterConfig, raw: MongoClient[dict[str, Any]],
                                        open_router: Callable[..., Any]) -> None:
    """One receiver with two copies of a key in a buckets period and two in a copies period: update and delete say 4."""
    router = open_router(config, clock=lambda: NOW)
    key = data_key("twice", 1)
    router.write_many([item(3, P2 + timedelta(days=1), 1, key=key), item(3, P2 + timedelta(days=2), 2, key=key),
                       item(3, P0 + timedelta(days=1), 3, key=key), item(3, P0 + timedelta(days=2), 4, key=key)])
    assert router.update(key, {"v": 2}) == 4
    assert all(sum(i["data_key"] == key for i in d["items"]) <= 1 for d in feed(raw, config, 2).find({}))
    assert router.delete(key) == 4
    assert router.read(3, limit=10).items == ()


def test_a_deleted_copy_does_not_block_closing_a_period(config: RouterConfig) -> None:
    """A future-dated item, once deleted, no longer counts as stored past a boundary (its bucket's newest still
    says it was there)."""
    with FeedRouter(config, clock=lambda: NOW) as router:
        late = item(9, NOW + timedelta(days=30), 1)
        router.write_many([item(9, NOW - timedelta(days=1), 0), late])
        with Clusters(config) as clusters:
            assert stored_outside(clusters, "cluster_3", None, NOW, layout="buckets").count == 1
            assert router.delete(late.data_key) == 1
            assert stored_outside(clusters, "cluster_3", None, NOW, layout="buckets").count == 0
            assert stored_outside(clusters, "cluster_3", P2, None, layout="buckets").count == 0


def test_emptied_buckets_take_no_appends_and_do_not_collide(config: RouterConfig, raw: MongoClient[dict[str, Any]],
                                                           open_router: Callable[..., Any]) -> None:
    """Buckets of several receivers lose their only copies (delete, unfollow): later deletes still work (the unique
    copy index is partial), the emptied buckets' counters are back to zero, and later writes to those receivers start
    new buckets instead of appending to an emptied one (which mongo-java-server cannot do)."""
    router = open_router(config, clock=lambda: NOW)
    t = P2 + timedelta(days=3)
    shared = Activity(sender_id=4, event_time=t, type=1, data={"p": 1}, data_key=data_key("gone", 1))
    router.fan_out(shared, [11, 12, 13])
    assert router.delete(shared.data_key) == 3
    router.write_many([item(r, t + timedelta(hours=1), 1, key=data_key("solo", r)) for r in (11, 12)])
    assert router.delete(data_key("solo", 11)) == 1 and router.unfollow(12, 1) == 1
    router.write_many([item(r, t + timedelta(hours=2), 2) for r in (11, 12, 13)])
    assert [len(router.read(r, limit=5).items) for r in (11, 12, 13)] == [1, 1, 1]
    empty = list(feed(raw, config, 2).find({"items": {"$size": 0}}))
    assert len(empty) == 5 and all(d["count"] == 0 == d["bytes"] for d in empty)  # 11 and 12 emptied two each


def test_an_unknown_layout_fails_what_touches_its_cluster(config: RouterConfig, raw: MongoClient[dict[str, Any]],
                                                         open_router: Callable[..., Any]) -> None:
    """cluster_3's metadata names a layout of a newer router: the router starts; writes, reads, deletes and fan-outs
    that touch cluster_3 raise UnknownLayout naming the cluster and the layout; the older periods still work; and
    `feedrouter check` names the cluster."""
    meta = raw[config.database_for(config.clusters[2])][config.metadata_collection]
    meta.update_one({}, {"$set": {"layout": "columns"}})
    router = open_router(config, clock=lambda: NOW)
    message = r"cluster 'cluster_3': its period's layout 'columns' is not one this router knows"
    older = item(1, P1 + timedelta(days=1), 1)
    assert len(router.write_many([older])) == 1
    with pytest.raises(UnknownLayout, match=message) as raised:
        router.write_many([item(1, P2 + timedelta(days=1), 2)])
    assert (raised.value.cluster, raised.value.layout) == ("cluster_3", "columns")
    with pytest.raises(UnknownLayout, match=message):
        router.read(1, limit=5)
    with pytest.raises(UnknownLayout, match=message):
        router.delete(older.data_key)
    with pytest.raises(UnknownLayout, match=message):
        router.fan_out(Activity(sender_id=1, event_time=P2 + timedelta(days=2), type=1, data={}, data_key="k"), [1])
    report, _ = check_report(config)
    assert not report["ok"] and any(p.startswith("cluster 'cluster_3': layout 'columns' is not one of")
                                    for p in report["problems"])


def test_concurrent_fan_outs_do_not_fragment(config: RouterConfig, raw: MongoClient[dict[str, Any]]) -> None:
    """Three processes fan a post each out to the same 600 receivers at once: every copy kept, one bucket per receiver,
    and a first page reads one document. Then each fans 30 more posts out to the same 20 receivers at once (93 copies
    each): at most one bucket with room per writer beyond the full ones."""
    assert fan_out_at_once(config, [{"post": p, "receivers": 600} for p in (1, 2, 3)]) == [600, 600, 600]
    per_receiver = _buckets_per_receiver(raw, config)
    assert set(per_receiver.values()) == {(1, 3)}, sorted(set(per_receiver.values()))
    with FeedRouter(config, clock=lambda: BASE + timedelta(days=30)) as router:
        assert len(router.read(5, limit=50).items) == 3
    specs = [{"posts": list(range(10 + w, 100, 3)), "receivers": 20, "batch": 20} for w in range(3)]
    assert fan_out_at_once(config, specs) == [600, 600, 600]
    busy = [b for r, b in _buckets_per_receiver(raw, config).items() if r <= 20]
    assert len(busy) == 20 and {copies for _, copies in busy} == {93}
    assert max(buckets for buckets, _ in busy) <= 93 // MAX_ITEMS + 3


def _buckets_per_receiver(raw: MongoClient[dict[str, Any]], config: RouterConfig) -> dict[int, tuple[int, int]]:
    """Receiver -> (buckets, copies) in cluster_3's period; checks every bucket's count against its copies."""
    out: dict[int, tuple[int, int]] = {}
    for doc in feed(raw, config, 2).find({}, {"receiver_id": 1, "count": 1, "items._id": 1}):
        assert len(doc["items"]) <= doc["count"] <= MAX_ITEMS
        buckets, copies = out.get(doc["receiver_id"], (0, 0))
        out[doc["receiver_id"]] = (buckets + 1, copies + len(doc["items"]))
    return out


def test_an_append_filter_keeps_the_planner_on_the_receivers_index(servers: LocalClusters) -> None:
    """On the session's server (FerretDB 2: mongo-java-server has no explain), the filter of a bucket append is planned
    on the receiver's index alone, never as a BitmapAnd with a copy index.

    On FerretDB 2 such a BitmapAnd (what `$ne` on `items._id` or `items.data_key` gave) crashed DocumentDB's backend
    under concurrent appends (a RUM bitmap scan, signal 11: docs/servers.md); this checks the plan, which a crash
    that strikes one run in a few cannot be relied on to show."""
    config = buckets_config(servers.uris[0])
    raw: MongoClient[dict[str, Any]] = MongoClient(servers.uris[0], tz_aware=True)
    router = FeedRouter(config, clock=lambda: NOW)
    try:
        router.write_many([item(r, P2 + timedelta(days=1), n) for r in range(30) for n in range(3)])
    finally:
        router.close()
    copy = Copy(id=ObjectId(), receiver_id=7, sender_id=1, event_time=P2 + timedelta(days=2), type=1, data={},
                data_key=data_key("edge", "append"))
    layout = Buckets()
    request = layout.store("cluster_3", layout.copy_documents([copy]), time.monotonic() + 10)
    assert isinstance(request, Upserts)
    match, _ = request.ops[0]
    explained = raw[config.database_for(config.clusters[2])].command(
        "explain", {"find": "feed", "filter": match, "limit": 1}, verbosity="queryPlanner")
    for spec in config.clusters:
        raw.drop_database(config.database_for(spec))
    raw.close()
    plan = plan_summary(explained)
    assert "[receiver_newest_id]" in plan, plan
    assert "BitmapAnd" not in plan and "copy_id" not in plan and "items_data_key" not in plan, plan
