"""Erasing and exporting a user, end to end on real servers: both doors, both layouts, three periods.

A user who pushed, pulled and wrote posts, received copies from others' fan-outs, writes
and backfills, had their posts copied into others' feeds by backfill, updated one post,
deleted another and marked their feed seen: after ``erase_user`` no document of any
collection of any period names them (scanned with plain pymongo), everyone else's data is
as it was, and the counts returned match what was stored. Their export matches a model of
what they did, and the manifest's checksums match the files. Races with writers still
running are in ``test_erasure_races.py``.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import attrs
import pytest
from bson import ObjectId
from pymongo import MongoClient
from pymongo.errors import OperationFailure

from router import (Activity, ErasureFailed, ErasureProgress, ExportProgress, FeedItem, InvalidItem, RouterConfig,
                    data_key)
from router.errors import UnknownLayout
from router.admin.migrate import MIGRATIONS_COLLECTION, discover, migrate_cluster
from router.admin.status import check_report
from router.cli import main
from router.storage.clusters import Clusters
from harness.bench_celery import worker_yaml
from harness.localservers import LocalClusters

from .conftest import NOW, P0, P1, P2
from .erasure import USER, USERS, Clients, copies_sent, documents, layout_config, names, naming
from .erasure import config, layout, router  # noqa: F401 - fixtures

#: Others: a sender who pushes to the user, one who writes to them directly, and an author they backfill from.
PUSHER, WRITER, AUTHOR = 5, 6, "author-7"
#: A receiver who backfills the user's posts.
READER = 400
#: Receivers of each post the user pushes where no assertion counts its copies (in 4 batches of 5).
FEW = 20


@attrs.define
class Model:
    """What the user did and received, as their export must show it (each stream in time order)."""

    sent: list[dict[str, Any]] = attrs.Factory(list)
    received: list[dict[str, Any]] = attrs.Factory(list)
    seen: list[dict[str, Any]] = attrs.Factory(list)
    read: list[dict[str, Any]] = attrs.Factory(list)
    keys: set[str] = attrs.Factory(set)


def at(start: datetime, i: int, hours: int) -> datetime:
    return start + timedelta(days=10, hours=hours, minutes=i, milliseconds=7 + i)


def populate(router: Any, user: int | str = USER, *, receivers: int = 200) -> Model:
    """Three periods of *user*'s life, each post they push sent to *receivers* followers in 4 batches; returns the
    model of their export."""
    model = Model()
    periods = ((P0, "cluster_1"), (P1, "cluster_2"), (P2, "cluster_3"))
    pushed: list[Activity] = []
    for i, (start, period) in enumerate(periods):
        post = Activity(sender_id=user, event_time=at(start, i, 0), type=1, data={"post": i, "how": "pushed"},
                        data_key=data_key("erase-pushed", i))
        router.publish(post, range(1, receivers + 1), pull=False, batch_size=receivers // 4)
        pushed.append(post)
        pulled = Activity(sender_id=user, event_time=at(start, i, 1), type=2, data={"post": i, "how": "pulled"},
                          data_key=data_key("erase-pulled", i))
        router.publish(pulled, [], pull=True)
        direct = [FeedItem(receiver_id=300 + j, sender_id=user, event_time=at(start, i, 2), type=3,
                           data={"post": i, "how": "direct"}, data_key=data_key("erase-direct", i)) for j in range(5)]
        router.write_many(direct)
        for a in (post, pulled, direct[0]):
            model.sent.append({"sender_id": user, "event_time": a.event_time, "type": a.type, "data": a.data,
                               "data_key": a.data_key, "period": period})
        other = Activity(sender_id=PUSHER, event_time=at(start, i, 3), type=1, data={"from": "pusher", "n": i},
                         data_key=data_key("erase-other", i))
        router.publish(other, [user, 2, 3], pull=False)
        letter = FeedItem(receiver_id=user, sender_id=WRITER, event_time=at(start, i, 4), type=4, data={"letter": i},
                          data_key=data_key("erase-letter", i))
        router.write_many([letter, attrs.evolve(letter, receiver_id=2)])
        followed = Activity(sender_id=AUTHOR, event_time=at(start, i, 5), type=5, data={"from": "author", "n": i},
                            data_key=data_key("erase-author", i))
        router.publish(followed, [], pull=True)
        for a in (other, letter, followed):
            model.received.append({"receiver_id": user, "sender_id": a.sender_id, "event_time": a.event_time,
                                   "type": a.type, "data": a.data, "data_key": a.data_key, "period": period})
    router.backfill(user, [AUTHOR])  # the author's three posts into the user's feed
    edited = {"post": 1, "how": "pushed", "edited": True}
    router.update(pushed[1].data_key, edited)  # an edit record holding the post's data
    router.delete(pushed[2].data_key)  # a tombstone; the post's copies and outbox entry go
    router.backfill(READER, [user])  # the user's posts left in an outbox, into another's feed
    pusher_edit = {"from": "pusher", "n": 0, "edited": True}
    router.update(data_key("erase-other", 0), pusher_edit)  # a copy they received, updated (it gains a data_digest)
    for record in model.received:
        if record["data_key"] == data_key("erase-other", 0):
            record["data"] = pusher_edit
    for record in model.sent:
        if record["data_key"] == pushed[1].data_key:
            record["data"] = edited
    model.sent = [r for r in model.sent if r["data_key"] != pushed[2].data_key]
    page = router.read(user, limit=2)
    router.mark_seen(user, page.items[1])
    model.seen.append({"event_time": page.items[1].event_time, "item": str(page.items[1].id), "period": "cluster_3"})
    router.mark_read(user, "all")  # a read mark of notification groups, through now, in now's period
    model.read.append({"group": "*", "read_time": NOW.isoformat(), "item": "f" * 24, "period": "cluster_3"})
    model.keys = {r["data_key"] for r in model.sent} | {pushed[2].data_key}
    for stream in (model.sent, model.received):
        stream.sort(key=lambda r: r["event_time"])
    return model


def of_the_user(cluster: str, collection: str, doc: dict[str, Any], keys: set[str], user: int | str) -> bool:
    """Whether *doc* is the user's (names them) or one of their posts' (its data_key, or its job's)."""
    job = str(doc.get("job", doc.get("_id") if collection == "fanouts" else ""))
    return names(doc, user) or doc.get("data_key") in keys or job.split(":")[0] in keys


def others(clients: Clients, config: RouterConfig, keys: set[str], user: int | str) -> set[tuple[str, str, Any]]:
    """Everyone else's stored data, copy by copy (a bucket's items one by one): what an erasure must not touch."""
    out: set[tuple[str, str, Any]] = set()
    for cluster, collection, doc in documents(clients, config):
        if collection in ("erasures", MIGRATIONS_COLLECTION):
            continue
        if collection == "feed" and "items" in doc:  # a bucket: its copies
            out |= {(cluster, "feed", (doc["receiver_id"], i["_id"])) for i in doc["items"]
                    if doc["receiver_id"] != user and not of_the_user(cluster, "feed", i, keys, user)}
        elif not of_the_user(cluster, collection, doc, keys, user):
            out.add((cluster, collection, doc["_id"]))
    return out


def stored_counts(clients: Clients, config: RouterConfig, keys: set[str], user: int | str) -> dict[str, int]:
    """What the erasure should count, read with pymongo before it runs."""
    counts = dict.fromkeys(("feed_received", "outbox", "posts", "seen", "fanouts", "fanout_batches", "edits"), 0)
    counts["feed_sent"] = copies_sent(clients, config, user)
    jobs: set[Any] = set()
    for _cluster, collection, doc in documents(clients, config):
        if collection == "feed":
            counts["feed_received"] += len(doc["items"]) if doc.get("receiver_id") == user and "items" in doc else (
                doc.get("receiver_id") == user)
        elif collection in ("outbox", "posts") and doc.get("sender_id") == user:
            counts[collection] += 1
        elif collection == "seen" and doc.get("receiver_id") == user:
            counts["seen"] += 1
        elif collection in ("fanouts", "edits") and doc.get("data_key") in keys:
            counts[collection] += 1
            jobs.add(doc["_id"])
    counts["fanout_batches"] = sum(1 for _c, coll, d in documents(clients, config)
                                   if coll == "fanout_batches" and d.get("job") in jobs)
    return counts


@USERS
def test_erase_user_leaves_nothing_that_names_them_and_everything_else(
    router: Any, raw_clients: Clients, config: RouterConfig, caplog: pytest.LogCaptureFixture, user: int, layout: str,
) -> None:
    """After erase_user returns, no document of any collection of any period names the user; every copy, entry and
    record of everyone else is still there; the counts are what was stored, and nothing returned or logged names
    the user; its progress callback hears each cluster's removals as they go and each cluster's end. Calling it again
    finds nothing more and leaves a second record."""
    model = populate(router, user)
    expected = stored_counts(raw_clients, config, model.keys, user)
    assert expected["feed_sent"] > 400 and expected["feed_received"] == 9 and expected["fanout_batches"] >= 8
    kept = others(raw_clients, config, model.keys, user)
    notes: list[ErasureProgress] = []
    with caplog.at_level(logging.INFO, logger="router"):
        result = router.erase_user(user, requested_by="support ticket 4411", progress=notes.append)
    assert naming(raw_clients, config) == []
    assert naming(raw_clients, config, user) == []
    assert others(raw_clients, config, model.keys, user) == kept
    assert [(c, coll) for c, coll, d in documents(raw_clients, config) if of_the_user(c, coll, d, model.keys, user)] == []
    assert {k: v for k, v in result.totals.items() if k in expected} == expected
    assert str(user) not in json.dumps(result.to_json()) and str(user) not in caplog.text
    assert [c.cluster for c in result.clusters] == ["cluster_1", "cluster_2", "cluster_3"]
    finished = {n.cluster: n.removed for n in notes if n.finished and not n.failed}
    assert sorted(finished) == ["cluster_1", "cluster_2", "cluster_3"] and len(notes) > 3  # each cluster's steps, then its end
    for c in result.clusters:  # each note of a cluster says no less than the one before
        said = [n.removed for n in notes if n.cluster == c.cluster]
        assert said == sorted(said) and said[-1] == finished[c.cluster]
        if layout == "copies":  # (a bucket counts once per statement that pulled from it)
            assert finished[c.cluster] == sum(c.counts.values())
    status = router.erasure_status(user)
    assert status.finished and {r.state for r in status.records} == {"done"}
    assert {r.request_id for r in status.records} == {result.request_id}
    assert all(r.requested_by == "support ticket 4411" and r.finished_at is not None for r in status.records)
    assert sum(r.counts["feed_sent"] for r in status.records) == expected["feed_sent"]
    kept = [d for _c, coll, d in documents(raw_clients, config) if coll == "erasures"]
    records = [d for d in kept if "state" in d]  # (the others remember the data_keys of their posts, a page each)
    assert len(records) == 3 and len(kept) == 6
    assert not any(user in (v if isinstance(v, list) else [v]) or str(user) in str(d) for d in kept for v in d.values())
    again = router.erase_user(user, requested_by="support ticket 4411, checked")
    assert again.removed == 0 and len(router.erasure_status(user).records) == 6
    assert router.erasure_status(PUSHER).records == ()  # another user has no record


@USERS
def test_export_across_three_periods_matches_a_model(router: Any, tmp_path: Path, user: int) -> None:
    """The export holds the user's posts as sent (the updated one with its new data, the deleted one not at all),
    the items they received (an updated one with its new data), their seen marker and their read mark of
    notification groups, and nothing the router keeps
    for itself (an updated copy's data_digest), each stream in time order across the three periods; the
    manifest names the periods and gives each file's records and SHA-256."""
    model = populate(router, user, receivers=FEW)
    notes: list[ExportProgress] = []
    result = router.export_user(user, tmp_path, progress=notes.append)
    assert result.counts == {"sent": 8, "received": 9, "seen": 1, "read": 1}
    assert len(notes) == 19 and {n.stream: n.records for n in notes} == result.counts  # one note per record
    assert [n.period for n in notes if n.stream == "received"] == [r["period"] for r in model.received]
    lines = {stream: [json.loads(line) for line in (tmp_path / f"{stream}.jsonl").read_text().splitlines()]
             for stream in ("sent", "received", "seen", "read")}
    iso = {s: [{**r, "event_time": r["event_time"].isoformat()} for r in getattr(model, s)] for s in ("sent", "received")}
    assert lines["sent"] == iso["sent"]
    assert not [r for s in ("sent", "received") for r in lines[s] if "data_digest" in r]
    assert [{k: v for k, v in r.items() if k != "id"} for r in lines["received"]] == iso["received"]
    assert lines["seen"] == [{**model.seen[0], "event_time": model.seen[0]["event_time"].isoformat()}]
    assert lines["read"] == model.read
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["user_id"] == user and [p["name"] for p in manifest["periods"]] == ["cluster_1", "cluster_2", "cluster_3"]
    for stream in ("sent", "received", "seen", "read"):
        data = (tmp_path / f"{stream}.jsonl").read_bytes()
        assert manifest["files"][f"{stream}.jsonl"] == {"records": len(lines[stream]), "bytes": len(data),
                                                       "sha256": hashlib.sha256(data).hexdigest()}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["manifest.json", "read.jsonl", "received.jsonl", "seen.jsonl",
                                                          "sent.jsonl"]


@pytest.mark.parametrize("layout", ["copies"])
def test_bad_input_gets_a_clear_router_error(router: Any, tmp_path: Path) -> None:
    """A bad user id, a missing requester, and an out that is not an empty folder are refused, naming what was
    wrong, before anything is read or written."""
    for bad in (None, 1.5, True, "", "x" * 2000, 2**70):
        for call in (lambda b=bad: router.erase_user(b, requested_by="t"), lambda b=bad: router.erasure_status(b),
                     lambda b=bad: router.export_user(b, tmp_path)):
            with pytest.raises(InvalidItem, match=r"^user_id: must be a 64-bit int or a non-empty UTF-8 str"):
                call()
    for who in (None, "", 7):
        with pytest.raises(InvalidItem, match=r"^requested_by: must be a non-empty UTF-8 str .*who asked"):
            router.erase_user(USER, requested_by=who)
    with pytest.raises(InvalidItem, match=r"^progress: must be a callable or None \(got int\)"):
        router.erase_user(USER, requested_by="t", progress=5)
    with pytest.raises(InvalidItem, match=r"^progress: must be a callable or None \(got str\)"):
        router.export_user(USER, tmp_path, progress="yes")
    (tmp_path / "a-file").write_text("x")
    used, other = tmp_path / "used", tmp_path / "other"
    used.mkdir()
    other.mkdir()
    (other / "notes.txt").write_text("kept")
    router.export_user(USER, used)
    refusals = [(tmp_path / "missing", "must be an existing folder .*missing"),
                (tmp_path / "a-file", "must be an existing folder .*a file"), (42, "must be the path of a folder"),
                (other, r"must be an empty folder \(got .*, which holds notes.txt\)$"),
                (used, r"must be an empty folder \(got .*, which holds manifest.json, read.jsonl, .*\(it already holds an export\)")]
    for out, message in refusals:
        with pytest.raises(InvalidItem, match=rf"^out: {message}"):
            router.export_user(USER, out)
    assert [p.name for p in other.iterdir()] == ["notes.txt"] and (other / "notes.txt").read_text() == "kept"
    assert router.erasure_status(USER).records == ()  # nothing was erased by the refused calls


def strict_json(line: str) -> Any:
    """*line* read as JSON (RFC 8259): a bare NaN or Infinity is refused, where Python's json takes it."""
    def refuse(constant: str) -> Any:
        raise ValueError(f"not JSON: {constant}")

    return json.loads(line, parse_constant=refuse)


def test_an_export_is_json_whatever_the_data(router: Any, tmp_path: Path) -> None:
    """Posts and items whose data holds NaN and infinities are exported as JSON every parser takes: those doubles in
    relaxed Extended JSON ({"$numberDouble": "NaN"}), the rest as stored."""
    odd = {"nan": float("nan"), "up": float("inf"), "list": [float("-inf"), 2.5], "nested": {"down": float("-inf")}}
    shown = {"nan": {"$numberDouble": "NaN"}, "up": {"$numberDouble": "Infinity"},
             "list": [{"$numberDouble": "-Infinity"}, 2.5], "nested": {"down": {"$numberDouble": "-Infinity"}}}
    router.publish(Activity(sender_id=USER, event_time=at(P2, 1, 0), type=1, data=odd, data_key=data_key("odd", 1)),
                   [2, 3], pull=False)
    router.write_many([FeedItem(receiver_id=USER, sender_id=PUSHER, event_time=at(P1, 2, 0), type=1, data=odd,
                                data_key=data_key("odd", 2))])
    router.export_user(USER, tmp_path)
    for stream in ("sent", "received"):
        lines = [strict_json(line) for line in (tmp_path / f"{stream}.jsonl").read_text().splitlines()]
        assert [line["data"] for line in lines] == [shown], stream


@pytest.mark.parametrize("layout", ["copies"])
def test_an_unknown_layout_fails_the_erasure_of_its_cluster_and_the_export(
    router: Any, raw_clients: Clients, config: RouterConfig, tmp_path: Path,
) -> None:
    """A period whose metadata names a layout this router does not know (a newer router's): erase_user finishes the
    other clusters and raises ErasureFailed naming that cluster with its UnknownLayout (as the docs' table says);
    export_user raises UnknownLayout and leaves no partial file."""
    populate(router, receivers=FEW)
    spec = config.clusters[2]
    raw_clients[spec.name][config.database_for(spec)][config.metadata_collection].update_one({}, {"$set": {"layout": "columns"}})
    router.refresh()
    with pytest.raises(ErasureFailed) as failed:
        router.erase_user(USER, requested_by="tests")
    assert set(failed.value.failed) == {"cluster_3"} and isinstance(failed.value.failed["cluster_3"], UnknownLayout)
    assert set(failed.value.counts) == {"cluster_1", "cluster_2", "cluster_3"}
    status = router.erasure_status(USER)
    assert status.unfinished == ("cluster_3",)
    with pytest.raises(UnknownLayout, match="cluster 'cluster_3'"):
        router.export_user(USER, tmp_path)
    assert list(tmp_path.iterdir()) == []


@USERS
@pytest.mark.parametrize("door", ["sync"])
def test_posts_stored_before_the_registry_are_found(router: Any, raw_clients: Clients, config: RouterConfig,
                                                    layout: str, user: int, tmp_path: Path) -> None:
    """Data written before migration 0006 (no registry): the migration registers it by one scan of each period's
    feed and outbox (a sender stored as a 64-bit int is read back as Int64: the same user, so a post stored again
    after the migration is still one post of theirs), and the erasure then finds every copy."""
    model = populate(router, user, receivers=FEW)
    for spec in config.clusters:
        db = raw_clients[spec.name][config.database_for(spec)]
        db["posts"].drop()
        db[MIGRATIONS_COLLECTION].delete_one({"_id": "0006_erasure"})
    with Clusters(config) as clusters:
        reports = [migrate_cluster(clusters[name], config, discover()) for name in clusters.names]
    assert all(r.applied == ("0006_erasure",) for r in reports)
    assert sum(raw_clients[s.name][config.database_for(s)]["posts"].count_documents({"sender_id": user})
               for s in config.clusters) == len(model.keys) - 1  # every post stored, the deleted one not
    again = FeedItem(receiver_id=399, sender_id=user, event_time=at(P2, 2, 2), type=3, data={"post": 2, "how": "direct"},
                     data_key=data_key("erase-direct", 2))
    router.write_many([again])  # one of their posts stored again, after the migration
    assert router.export_user(user, tmp_path).counts["sent"] == len(model.sent)  # still one post each
    router.erase_user(user, requested_by="tests")
    assert naming(raw_clients, config, user) == []


@pytest.mark.parametrize(("door", "layout"), [("sync", "copies")])
def test_posts_stored_before_the_registry_are_found_on_a_server_without_min_in_group(
    make_config: Callable[..., RouterConfig], ferretdb1: LocalClusters, open_router: Callable[..., Any], layout: str,
) -> None:
    """FerretDB 1 implements no ``$min`` in ``$group``: migration 0006 registers the posts stored before it from one
    ``find`` of each period's feed and outbox instead, grouped by the migration, and the erasure then finds every copy."""
    config = layout_config(make_config, layout, uris=ferretdb1.uris)
    router = open_router(config, clock=lambda: NOW)
    model = populate(router)  # 200 receivers a post: the migration's find of a period's feed here needs a getMore
    erasure_migration = next(m for m in discover() if m.id == "0006_erasure").load()
    raw: Clients = {spec.name: MongoClient(spec.uri, tz_aware=True) for spec in config.clusters}
    try:
        for spec in config.clusters:
            db = raw[spec.name][config.database_for(spec)]
            with pytest.raises(OperationFailure) as refused:  # the server this test is about: the pipeline is refused
                list(db["feed"].aggregate(erasure_migration.pipelines(layout)[0][1]))
            assert refused.value.code == erasure_migration.NOT_IMPLEMENTED
            db["posts"].drop()
            db[MIGRATIONS_COLLECTION].delete_one({"_id": "0006_erasure"})
        with Clusters(config) as clusters:
            reports = [migrate_cluster(clusters[name], config, discover()) for name in clusters.names]
        assert all(r.applied == ("0006_erasure",) for r in reports)
        registered = [doc for s in config.clusters for doc in raw[s.name][config.database_for(s)]["posts"].find({"sender_id": USER})]
        assert sorted(d["data_key"] for d in registered) == sorted(model.keys - {data_key("erase-pushed", 2)})  # not the deleted one
        first = {r["data_key"]: r["event_time"] for r in model.sent}  # each post registered at its own time
        assert all(d["event_time"] == first[d["data_key"]] for d in registered)
        router.erase_user(USER, requested_by="tests")
        assert naming(raw, config) == []
    finally:
        for client in raw.values():
            client.close()


@pytest.mark.parametrize(("door", "layout"), [("sync", "copies")])
def test_operators_erase_export_and_see_the_proof(router: Any, config: RouterConfig, raw_clients: Clients,
                                                  tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """feedrouter export, erase and erase-status: results on stdout, no user data in them, exit codes 0, 1 and 2;
    feedrouter check reports an erasure that did not finish."""
    populate(router, receivers=FEW)
    path = tmp_path / "clusters.yaml"
    path.write_text(worker_yaml(config, broker="redis://127.0.0.1:6379/0"))
    out = tmp_path / "export"
    out.mkdir()
    assert main(["-c", str(path), "export", str(USER), str(out)]) == 0
    assert "sent.jsonl: 8 records, sha256 " in capsys.readouterr().out
    assert main(["-c", str(path), "erase-status", str(USER)]) == 1  # never erased
    assert "no erasure of this user" in capsys.readouterr().out
    for who in ("", "x" * 1025):  # usage errors: nothing erased, and an empty --by is not the operator's login
        with pytest.raises(SystemExit) as usage:
            main(["-c", str(path), "erase", str(USER), "--by", who])
        assert usage.value.code == 2 and "--by: must be a non-empty UTF-8 str of at most 1024" in capsys.readouterr().err
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("kept")
    assert main(["-c", str(path), "export", str(USER), str(other)]) == 2  # not empty
    assert "out: must be an empty folder" in capsys.readouterr().err and [p.name for p in other.iterdir()] == ["notes.txt"]
    assert router.erasure_status(USER).records == ()
    assert main(["-c", str(path), "erase", str(USER), "--by", "ticket 4411"]) == 0
    text = capsys.readouterr().out
    assert "erased in 3 clusters" in text and "feed_sent" in text and str(USER) not in text
    assert main(["-c", str(path), "--json", "erase-status", str(USER)]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["finished"] and [r["state"] for r in status["records"]] == ["done"] * 3
    assert main(["-c", str(path), "erase", "not a number"]) == 0  # a str id is a user id too (one never seen)
    capsys.readouterr()
    with pytest.raises(SystemExit) as usage:  # argparse's own exit for a bad argument
        main(["-c", str(path), "erase", ""])
    assert usage.value.code == 2 and "USER: must be a non-empty UTF-8 str" in capsys.readouterr().err
    assert main(["-c", str(path), "export", str(USER), str(out)]) == 2  # out holds an export already
    assert "(it already holds an export)" in capsys.readouterr().err
    # an erasure that stopped part-way: its record says running in one cluster
    spec = config.clusters[1]
    records = raw_clients[spec.name][config.database_for(spec)]["erasures"]
    unfinished = {**records.find_one({"state": "done"}), "_id": "66b000000000000000000000", "state": "running"}
    records.insert_one(unfinished)
    records.delete_many({"_id": {"$ne": unfinished["_id"]}})
    report, _ = check_report(config)
    assert any("erasure 66b000000000000000000000" in p and "did not finish" in p for p in report["problems"])
    assert main(["-c", str(path), "erase-status", str(USER)]) == 1
    assert "NOT finished in cluster_2" in capsys.readouterr().out
    assert main(["-c", str(path), "erase", str(USER), "--by", "ticket 4411"]) == 0
    report, _ = check_report(config)
    assert not any("erasure" in p for p in report["problems"])


@pytest.mark.parametrize(("door", "layout"), [("sync", "copies")])
def test_a_stopped_erasure_is_finished_by_a_later_one_whatever_the_ids(
    router: Any, config: RouterConfig, raw_clients: Clients,
) -> None:
    """An erasure killed part-way and called again by another process in the same second: the second's id may sort
    before the first's (an ObjectId's middle bytes are its process's), and once the second is done neither check nor
    erase-status reports the first. One stopped after the last done erasure is reported by both."""
    router.erase_user(USER, requested_by="tests")
    spec = config.clusters[0]
    records = raw_clients[spec.name][config.database_for(spec)]["erasures"]
    done = records.find_one({"state": "done"})
    assert done is not None and done["state"] == "done"
    killed = {**done, "_id": done["_id"][:8] + "f" * 16, "state": "running", "counts": {},
              "finished_at": None, "requested_at": done["requested_at"] - timedelta(milliseconds=300)}
    records.insert_one(killed)
    report, _ = check_report(config)
    assert [p for p in report["problems"] if "erasure" in p] == []
    assert router.erasure_status(USER).finished
    stopped = {**killed, "_id": str(ObjectId()), "requested_at": done["requested_at"] + timedelta(seconds=5)}
    records.insert_one(stopped)
    report, _ = check_report(config)
    assert [p for p in report["problems"] if "erasure" in p and stopped["_id"] in p and "did not finish" in p]
    assert len([p for p in report["problems"] if "erasure" in p]) == 1
    status = router.erasure_status(USER)
    assert not status.finished and status.unfinished == ("cluster_1",)
