"""The layout table, and the copies layout's own clauses."""

from __future__ import annotations

import ast
from datetime import datetime, timezone
from pathlib import Path

import bson
import pytest
from bson import Int64, ObjectId

from router.core.layouts import DEFAULT, LAYOUTS, Copy, EditSettings, FanBatch, layout_named
from router.core.writes.checks import MAX_DATA_BYTES
from router.core.layouts.bucket_items import data_charge, slot
from router.core.layouts.queries import DIGEST, digest, newer_than, older_than
from router.core.steps import Update
from router.cursor import Position
from router.errors import InvalidItem
from router.model import ClusterMeta
from router.testing.scripted import run_alone
from router.timemap import TimeMap

UTC = timezone.utc


def test_older_than_breaks_ties_on_id() -> None:
    """Items in the same millisecond are ordered by _id."""
    t = datetime(2020, 1, 1, tzinfo=UTC)
    oid = ObjectId()
    assert older_than(Position(t, oid)) == {"$or": [{"event_time": {"$lt": t}}, {"event_time": t, "_id": {"$lt": oid}}]}
    assert newer_than(Position(t, oid), "key") == {"$or": [{"event_time": {"$gt": t}}, {"event_time": t, "key": {"$gt": oid}}]}
    assert older_than(None) == {} == newer_than(None)


def test_unknown_layout_is_refused_by_name() -> None:
    """A layout name outside the table is refused, naming the known ones."""
    with pytest.raises(InvalidItem, match=r"layout: must be one of .*copies.*\(got 'heap'\)"):
        layout_named("heap")
    assert layout_named(DEFAULT) is LAYOUTS["copies"]


def test_metadata_records_a_layout_only_when_not_the_default() -> None:
    """Existing clusters (no layout field) read as copies; another layout round-trips through the document."""
    start = datetime(2020, 1, 1, tzinfo=UTC)
    plain = ClusterMeta(name="c1", start_date=start)
    assert "layout" not in plain.to_document() and ClusterMeta.from_document(plain.to_document()).layout == "copies"
    other = ClusterMeta(name="c2", start_date=datetime(2021, 1, 1, tzinfo=UTC), layout="buckets")
    assert ClusterMeta.from_document(other.to_document()).layout == "buckets"
    timemap = TimeMap([plain.__class__(name="c1", start_date=start, end_date=other.start_date), other])
    assert timemap.layout_of("c1") == "copies" and timemap.layout_of("c2") == "buckets"
    assert timemap.layout_of("not-there") == "copies"


# -- the seam: only a layout knows a stored copy's fields ---------------------------------------


ROUTER = Path(__file__).resolve().parents[2] / "router"
#: The fields of a stored copy, bucket or outbox entry.
STORED_FIELDS = {"_id", "receiver_id", "data_key", "sender_id", "event_time", "type", "data", "items", "newest", "oldest",
                 "moved", "moving"}
#: Modules that build or read documents of other collections, and the fields of those documents they may name.
OTHER_DOCUMENTS = {
    "core/notify/seen.py": ({"_id", "receiver_id", "event_time"}, "seen markers"),
    "core/writes/fence.py": ({"_id", "data_key", "data"}, "edit fence records"),
    "core/fanout/checkpoint.py": ({"_id", "data_key", "event_time"}, "fan-out checkpoints and batch records"),
    "core/privacy/erasure.py": ({"_id"}, "erasure records"),
    "core/fanout/jobs.py": ({"sender_id", "type", "data", "data_key"}, "a Celery task's JSON (the activity)"),
    "core/push.py": ({"_id", "receiver_id", "sender_id", "event_time", "type", "data", "data_key"},
                          "live messages on Redis (an item as a page shows it)"),
    "core/live/stream.py": ({"_id", "receiver_id", "sender_id", "event_time", "type", "data", "data_key"},
                            "live messages on Redis (an item as a page shows it)"),
    "core/periods/metadata.py": ({"_id"}, "metadata documents"),
    "model.py": ({"_id"}, "metadata documents (ClusterMeta.to_document)"),
    "storage/clusters.py": ({"_id"}, "metadata documents"),
    "storage/finds.py": ({"_id"}, "any collection's documents: _id ends the order a read continues in"),
    "admin/rollover.py": ({"_id"}, "the rollover lock"),
    "admin/migrate.py": ({"_id"}, "migration records, metadata documents"),
    "cli/__init__.py": ({"receiver_id", "event_time"}, "the CLI's --json output"),
    "cli/tail.py": ({"receiver_id", "sender_id", "event_time", "type", "data", "data_key"},
                    "tail's --json output (an item as a page shows it)"),
    "live/hub.py": ({"type", "data"}, "redis-py's pub/sub messages"),
    "testing/scripted.py": ({"_id"}, "the scripted store, which plays the server"),
}


def document_keys(tree: ast.AST) -> list[tuple[int, str]]:
    """String constants used as a document's field: dict keys, subscripts, ``.get``/``.pop`` keys, and the field of a
    ``(field, 1 or -1)`` sort or index pair."""
    found = []
    for node in ast.walk(tree):
        keys: list[ast.expr | None] = []
        if isinstance(node, ast.Dict):
            keys = list(node.keys)
        elif isinstance(node, ast.Subscript):
            keys = [node.slice]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in (
                "get", "pop", "setdefault") and node.args:
            keys = [node.args[0]]
        elif isinstance(node, ast.Tuple) and len(node.elts) == 2 and ast.unparse(node.elts[1]) in ("1", "-1"):
            keys = [node.elts[0]]
        found += [(k.lineno, k.value) for k in keys if isinstance(k, ast.Constant) and isinstance(k.value, str)]
    return found


def outside_layouts() -> list[Path]:
    return [p for p in sorted(ROUTER.rglob("*.py")) if "core/layouts" not in p.relative_to(ROUTER).as_posix()]


def test_no_module_outside_the_layouts_names_a_stored_copys_field() -> None:
    """Only router/core/layouts/ builds or reads a stored copy, bucket or outbox entry (shipped migrations aside):
    elsewhere a stored field used as a document key is another collection's, named in OTHER_DOCUMENTS."""
    problems = []
    for path in outside_layouts():
        rel = path.relative_to(ROUTER).as_posix()
        allowed = OTHER_DOCUMENTS.get(rel, (set(), ""))[0]
        problems += [f"router/{rel}:{line}: {key!r}" for line, key in document_keys(ast.parse(path.read_text()))
                     if key in STORED_FIELDS and key not in allowed]
    assert not problems, "\n".join(problems)


def test_only_the_layouts_ask_for_the_feed_and_the_outbox() -> None:
    """No request outside router/core/layouts/ names the feed or outbox collection (a Find, Aggregate, Insert... whose
    collection argument is "feed" or "outbox")."""
    requests = {"Find", "Count", "Aggregate", "Insert", "Delete", "Update", "Upserts"}
    problems = []
    for path in outside_layouts():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) in requests:
                named = [a for a in node.args[1:2] + [k.value for k in node.keywords if k.arg == "collection"]]
                if any(isinstance(a, ast.Constant) and a.value in ("feed", "outbox") for a in named):
                    problems.append(f"router/{path.relative_to(ROUTER).as_posix()}:{node.lineno}")
    assert not problems, problems


@pytest.mark.parametrize("layout", ["copies", "buckets"])
def test_fixing_copies_with_the_largest_data_keeps_every_statement_within_16_mib(layout: str) -> None:
    """The requests that re-data 10,000 just-written copies with data of MAX_DATA_BYTES: each statement (filter,
    update and array filters) fits in 16 MiB, carrying the data once, and together they name every id."""
    data = {"fill": "x" * (MAX_DATA_BYTES - 64)}
    ids = [ObjectId() for _ in range(10_000)]
    requests = layout_named(layout).fix("c", "k" * 1024, ids, data, 0.0)
    assert all(isinstance(r, Update) for r in requests)
    named: list[list[ObjectId]] = []
    for request in requests:
        assert isinstance(request, Update)
        statement = {"q": request.filter, "u": request.update, "arrayFilters": request.array_filters or []}
        assert len(bson.encode(statement)) <= 16 * 1024 * 1024
        assert bson.encode(request.filter).count(b"x" * 1000) == 0  # the data is not matched on
        found = request.filter.get("_id") or request.filter["items"]["$elemMatch"]["_id"]
        named.append(found["$in"])
    assert [oid for chunk in named for oid in chunk] == ids


# -- a user's data: the erasure and the export find it by the layout's own indexes ------------------


def matched_fields(query: dict[str, object], prefix: str = "") -> set[str]:
    """The fields a query matches on, dotted through ``$elemMatch`` (``$or``/``$and`` left out)."""
    found: set[str] = set()
    for key, value in query.items():
        if key.startswith("$"):
            continue
        found.add(prefix + key)
        if isinstance(value, dict) and isinstance(value.get("$elemMatch"), dict):
            found |= matched_fields(value["$elemMatch"], f"{prefix}{key}.")
    return found


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_a_users_data_is_found_by_the_layouts_own_indexes(name: str) -> None:
    """Each feed request of an erasure and an export (remove_sent, remove_received, oldest_first, sent_copy) matches
    on the first field of an index the layout lists (Layout.indexes(), the one source of a period's feed indexes):
    none scans the feed, and none needs an index of its own."""
    layout = LAYOUTS[name]
    firsts = {spec.keys[0][0] for spec in layout.indexes()}
    steps = EditSettings(step=10, sample=10)
    after = Position(datetime(2024, 5, 4, tzinfo=UTC), ObjectId())
    programs = [layout.remove_sent("c", 7, ["k1", "k2"], steps), layout.remove_received("c", 7, steps),
                layout.oldest_first("c", 7, None, 10, 0.0), layout.oldest_first("c", 7, after, 10, 0.0),
                layout.sent_copy("c", 7, "k1", 0.0), layout.sent_copy("c", 7, "k1", 0.0, at=after.event_time)]
    for program in programs:
        _result, sent = run_alone(program)
        assert sent
        for request in sent:
            assert request.collection == "feed" and matched_fields(request.filter) & firsts, (request.filter, firsts)
