"""Erasure and export values without a server: pseudonyms, the erasure key in clusters.yaml, the status of records,
the registry's ids, and the export's files."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import re
from collections.abc import Generator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import attrs
import pytest
from bson import Decimal128, ObjectId
from bson.int64 import Int64

from router import Activity, ConfigError, FeedItem, InvalidItem, parse_config
from router.core.privacy.erasure import ErasureRecord, ErasureStatus
from router.core.privacy.export import ExportSummary
from router.core.layouts import posts
from router.core.layouts.buckets import first_bucket
from router.core.pseudonyms import DEFAULT_KEY, Pseudonyms
from router.core.settings import Settings
from router.exports import ExportFolder
from router.fanout.celery_plan import sendable
from router.model import identity

UTC = timezone.utc
T = datetime(2024, 5, 4, 12, 30, 15, 250000, tzinfo=UTC)
YAML = "clusters:\n  - name: a\n    uri: mongodb://h:1\n"


def test_pseudonyms_are_keyed_and_keep_int_and_str_ids_apart() -> None:
    """The same id gives the same 16 bytes under one key, others under another key; 5 and "5" are two users; the key
    is never shown."""
    a, b = Pseudonyms(b"k" * 32), Pseudonyms(b"j" * 32)
    assert a.of(5) == a.of(5) and len(a.of(5)) == 16
    assert len({a.of(5), a.of("5"), b.of(5), a.of(6)}) == 4
    assert a.many([5, "5", 5]) == {a.of(5): 5, a.of("5"): "5"}
    assert "k" * 8 not in repr(a) and Pseudonyms().default and not a.default
    with pytest.raises(ValueError):
        Pseudonyms(b"")


@pytest.mark.parametrize("user", [5, -3, 2**40 + 765, 2**63 - 1, -(2**63)])
def test_a_user_has_one_pseudonym_whatever_int_type_carries_the_id(user: int) -> None:
    """An id read back as bson.Int64 (every int stored as 64 bits) is the int's user: the same pseudonym, the same
    registry entry, the same first bucket; a str of the same digits stays another user, and a bool is no id."""
    names = Pseudonyms(b"k" * 32)
    assert names.of(Int64(user)) == names.of(user) != names.of(str(user))
    assert names.many([user, Int64(user)]).keys() == {names.of(user)}
    assert posts.post_id(Int64(user), "ab") == posts.post_id(user, "ab") != posts.post_id(str(user), "ab")
    assert first_bucket(Int64(user)) == first_bucket(user) != first_bucket(str(user))
    assert type(identity(Int64(user))) is int and identity(Int64(user)) == user
    assert sendable([1, Int64(user)], 0) == [1, user]
    for bad in (True, False, 1.0, 2**63, None, ""):
        with pytest.raises(InvalidItem, match=r"^user_id: must be a 64-bit int or a non-empty UTF-8 str"):
            identity(bad)
    for bad in (True, 1.0, None):  # (True == 1, but it is no user)
        with pytest.raises(InvalidItem):
            names.of(bad)  # type: ignore[arg-type]


def test_the_erasure_key_comes_from_clusters_yaml_and_is_never_shown() -> None:
    """erasure.key sets the pseudonyms' key (from the environment, as secrets are); a key of the wrong length is a
    config error that shows its length, not the key; without one the public default key is used."""
    config = parse_config(YAML + "erasure:\n  key: ${KEY}\n", env={"KEY": "s" * 24})
    assert Settings.from_config(config).pseudonyms == Pseudonyms(b"s" * 24) and "s" * 24 not in repr(config)
    assert Settings.from_config(parse_config(YAML)).pseudonyms == Pseudonyms(DEFAULT_KEY)
    with pytest.raises(ConfigError) as short:
        parse_config(YAML + "erasure:\n  key: short-secret\n")
    assert str(short.value) == ("clusters.yaml:5:8: erasure.key: must be a string of 16 to 64 bytes, kept secret "
                                "(got 12 bytes)") and "short-secret" not in str(short.value)
    with pytest.raises(ConfigError, match=r"erasure.key: is required in an erasure section"):
        parse_config(YAML + "erasure: {}\n")


def _migration(name: str) -> Any:
    path = Path(__file__).resolve().parents[2] / "migrations" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"migration_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_registry_ids_name_a_post_once_and_apart_from_the_other_shapes() -> None:
    """A post registered alone is named by its pair (injective), apart from migration 0006's ids of one post (a
    digit first; a bson.Int64 sender is the int's there too), the writes' (``w``) and migration 0008's (``m``), which
    cuts documents as the writers do (a copy of the rule, as shipped migrations keep theirs)."""
    m6, m8 = _migration("0006_erasure"), _migration("0008_registry_by_write")
    assert posts.post_id(7, "ab") != posts.post_id("7", "ab") != posts.post_id(7, "ab7")
    for sender, key in ((7, "abc"), ("7", "abc"), ("u", "4:xyzi7"), (-3, "k"), (Int64(7), "abc"), (Int64(2**40), "k")):
        assert posts.post_id(sender, key).startswith("p") and m6.registry_id(sender, key)[0].isdigit()
    assert m6.registry_id(Int64(2**40), "k") == m6.registry_id(2**40, "k")  # one sender, one entry
    item = FeedItem(receiver_id=1, sender_id=7, event_time=T, type=1, data={}, data_key="ab")
    assert [e.id[0] for e in posts.of_items([item])] == ["w"]
    assert m8.KEYS == posts.KEYS
    assert [role for role, _ in m6.pipelines("buckets")] == ["feed", "outbox"]


def record(cluster: str, request: str, state: str) -> ErasureRecord:
    return ErasureRecord(cluster=cluster, request_id=request, requested_by="t", requested_at=T, state=state, counts={},
                         finished_at=T if state == "done" else None)


def test_an_erasure_is_finished_once_every_cluster_with_a_record_has_a_done_one() -> None:
    """A request stopped part-way leaves running records; a later request done everywhere finishes it."""
    stopped = (record("c1", "a", "done"), record("c2", "a", "running"), record("c3", "a", "running"))
    assert not ErasureStatus(stopped).finished and ErasureStatus(stopped).unfinished == ("c2", "c3")
    again = stopped + tuple(record(c, "b", "done") for c in ("c1", "c2", "c3"))
    assert ErasureStatus(again).finished and ErasureStatus(again).unfinished == ()
    assert not ErasureStatus(()).finished  # never erased
    assert ErasureStatus(again).to_json()["records"][0]["requested_at"] == T.isoformat()


def test_only_a_later_done_erasure_finishes_one_that_stopped() -> None:
    """A request done before one that stopped part-way does not finish it (the later one may have met data the first
    never saw); one requested later does, whatever its id (ObjectIds of two processes in the same second are in
    no particular order)."""
    def at(cluster: str, request: str, state: str, seconds: float) -> ErasureRecord:
        return attrs.evolve(record(cluster, request, state), requested_at=T + timedelta(seconds=seconds))

    stopped_after_one_done = (at("c1", "a", "done", 0), at("c1", "b", "running", 60))
    assert not ErasureStatus(stopped_after_one_done).finished
    assert ErasureStatus(stopped_after_one_done).unfinished == ("c1",)
    called_again = (at("c1", "f", "running", 0.1), at("c1", "0", "done", 0.4))  # the later id is the smaller one
    assert ErasureStatus(called_again).finished


def test_export_files_are_json_lines_with_their_checksums_in_the_manifest(tmp_path: Path) -> None:
    """Each record is one line of JSON: the value's fields, then its period (times in ISO 8601, ObjectIds in hex,
    bytes in base64, other BSON values in relaxed Extended JSON); an empty stream is an empty file; the manifest,
    written last, holds each file's records, bytes and SHA-256."""
    folder = ExportFolder(tmp_path, user_id="u-7")
    oid = ObjectId()
    item = FeedItem(receiver_id="u-7", sender_id=42, event_time=T, type=1, data_key="k",
                    data={"b": b"\x00\x01", "d": Decimal128("1.5")}, id=oid)
    folder.write("received", item, "c1")
    folder.write("received", attrs.evolve(item, data={"text": "é"}), "c1")
    folder.write("received", attrs.evolve(item, data={"nan": float("nan"), "up": float("inf"),
                                                      "deep": [{"down": float("-inf")}, 1.5]}), "c1")
    assert not (tmp_path / "manifest.json").exists() and (tmp_path / "received.jsonl.partial").exists()
    result = folder.finish(ExportSummary((("c1", T.isoformat(), None),), {"sent": 0, "received": 3, "seen": 0, "read": 0}))
    lines = (tmp_path / "received.jsonl").read_text(encoding="utf-8").splitlines()
    assert json.loads(lines[0]) == {"receiver_id": "u-7", "sender_id": 42, "event_time": T.isoformat(), "type": 1,
                                    "data": {"b": "AAE=", "d": {"$numberDecimal": "1.5"}}, "data_key": "k",
                                    "id": str(oid), "period": "c1"}
    assert json.loads(lines[1])["data"] == {"text": "é"}
    assert json.loads(lines[2])["data"] == {"nan": {"$numberDouble": "NaN"}, "up": {"$numberDouble": "Infinity"},
                                            "deep": [{"down": {"$numberDouble": "-Infinity"}}, 1.5]}
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    data = (tmp_path / "received.jsonl").read_bytes()
    assert manifest["files"]["received.jsonl"] == {"records": 3, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    assert manifest["files"]["sent.jsonl"]["records"] == 0 and (tmp_path / "sent.jsonl").read_bytes() == b""
    assert manifest["user_id"] == "u-7" and manifest["periods"] == [{"name": "c1", "start": T.isoformat(), "end": None}]
    assert result.counts == {"sent": 0, "received": 3, "seen": 0, "read": 0} and result.manifest == tmp_path / "manifest.json"


def test_an_export_folder_must_exist_and_be_empty(tmp_path: Path) -> None:
    """Refused before anything is written, naming ``out``: missing, a file, or holding anything at all (a file of
    another name, a hidden file, a folder, an export); an aborted export leaves no partial file."""
    with pytest.raises(InvalidItem, match=r"^out: must be an existing folder \(got .*missing'?: missing\)"):
        ExportFolder(tmp_path / "missing", user_id=7)
    with pytest.raises(InvalidItem, match=r"^out: must be the path of a folder \(got NoneType\)"):
        ExportFolder(None, user_id=7)
    for name in ("notes.txt", ".hidden", "sub", "seen.jsonl"):
        held = tmp_path / name
        held.mkdir() if name == "sub" else held.write_text("kept")
        with pytest.raises(InvalidItem, match=rf"^out: must be an empty folder \(got .*, which holds {re.escape(name)}\)$"):
            ExportFolder(tmp_path, user_id=7)
        held.rmdir() if name == "sub" else held.unlink()
    for n in range(7):
        (tmp_path / f"f{n}").write_text("")
    with pytest.raises(InvalidItem, match=r"which holds f0, f1, f2, f3, f4 and 2 more\)$"):
        ExportFolder(tmp_path, user_id=7)
    other = tmp_path / "other"
    other.mkdir()
    folder = ExportFolder(other, user_id=7)
    folder.write("sent", Activity(sender_id=7, event_time=T, type=1, data={}, data_key="k"), "c1")
    folder.abort()
    assert list(other.iterdir()) == []


def test_copies_of_a_page_are_removed_a_few_posts_at_a_time() -> None:
    """A page of 500 posts, the first 20 with 10,000 copies each and the rest with 3: each group is sent once, in
    order; after the first group (8 posts), a group of big posts holds one post, and the small ones are taken in groups that double
    up to the page, so the page costs 22 groups, not 500 (one statement over all 500 keys gathered every copy's index
    entry per step, which ran out of time on DocumentDB)."""
    from router.core.privacy.erasure import _copies_of
    from router.core.layouts import EditSettings

    keys = [f"k{n:03}" for n in range(500)]
    copies = {k: 10_000 if n < 20 else 3 for n, k in enumerate(keys)}
    groups: list[list[str]] = []

    def remove_sent(cluster: str, user: int, group: list[str], settings: EditSettings) -> Generator[Any, Any, tuple[int, None]]:
        groups.append(list(group))
        return sum(copies[k] for k in group), None
        yield  # a program: this one sends nothing

    counts = {"feed_sent": 0}
    program = _copies_of("c1", 7, keys, EditSettings(), remove_sent, counts)
    with pytest.raises(StopIteration) as done:
        next(program)
    assert done.value.value is None and counts["feed_sent"] == sum(copies.values())
    assert [k for g in groups for k in g] == keys
    assert [len(g) for g in groups] == [8] + [1] * 13 + [2, 4, 8, 16, 32, 64, 128, 225]
