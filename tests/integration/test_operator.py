"""The operator story, driven through the feedrouter CLI in subprocesses, as an operator would."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from pymongo import MongoClient

from router.admin.migrate import discover
from router import FeedItem, FeedRouter, data_key
from harness.localservers import LocalClusters, LocalServer
from harness.process import checkout_env

from .conftest import NOW, P0, P1, P2

Clients = dict[str, MongoClient[dict[str, Any]]]


class Operator:
    """Edits clusters.yaml and runs feedrouter, like a person at a terminal."""

    def __init__(self, tmp: Path, db: str, uris: list[str]) -> None:
        self.path = tmp / "clusters.yaml"
        self.db = db
        self.uris = uris
        self.listed = 0

    def list_clusters(self, count: int) -> None:
        lines = [f"database: {self.db}", "clusters:"]
        for i in range(count):
            lines += [f"  - name: cluster_{i + 1}", f"    uri: {self.uris[i]}", "    options: {serverSelectionTimeoutMS: 1500}"]
        self.path.write_text("\n".join(lines) + "\n")
        self.listed = count

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        env = checkout_env()
        return subprocess.run([sys.executable, "-m", "router.cli", "-c", str(self.path), *args],
                              capture_output=True, text=True, env=env, timeout=120)


def metadata(clients: Clients, db: str) -> dict[str, list[dict[str, Any]]]:
    return {name: list(c[db].metadata.find({})) for name, c in clients.items()}


def test_operator_grows_the_system(tmp_path: Path, servers: LocalClusters, raw_clients: Clients, db_name: str) -> None:
    """Start with one cluster, add two more with add-cluster, write everywhere, and see check/status tell the truth."""
    op = Operator(tmp_path, db_name, servers.uris)
    op.list_clusters(1)
    r = op.run("add-cluster", "cluster_1", "--start", P0.isoformat(), "--creator", "ops")
    assert r.returncode == 0, r.stderr
    assert "cluster_1        [2024-01-01T00:00:00Z, open)" in r.stdout
    assert op.run("check").returncode == 0

    op.list_clusters(2)
    r = op.run("check")
    assert r.returncode == 1 and "cluster 'cluster_2': no metadata document" in r.stdout
    before = metadata(raw_clients, db_name)
    r = op.run("add-cluster", "cluster_2", "--start", P1.isoformat())
    assert r.returncode == 1
    assert "overlaps the open-ended period of cluster 'cluster_1'" in r.stderr and "--close-previous" in r.stderr
    r = op.run("add-cluster", "cluster_2", "--start", P1.isoformat(), "--close-previous", "--force", "--dry-run")
    assert r.returncode == 0, r.stderr
    assert "dry run, nothing changed" in r.stdout and "would close cluster 'cluster_1'" in r.stdout
    assert metadata(raw_clients, db_name) == before
    r = op.run("add-cluster", "cluster_2", "--start", "2024-04-01", "--close-previous", "--force", "--creator", "ops")
    assert r.returncode == 0, r.stderr
    again = op.run("add-cluster", "cluster_2", "--start", "2024-04-01", "--close-previous", "--force")
    assert again.returncode == 0 and "nothing to change" in again.stdout

    op.list_clusters(3)
    r = op.run("add-cluster", "cluster_3", "--start", "2024-07-01T00:00:00Z", "--close-previous", "--force")
    assert r.returncode == 0, r.stderr
    assert "cluster_1        [2024-01-01T00:00:00Z, 2024-04-01T00:00:00Z)" in r.stdout
    assert "cluster_2        [2024-04-01T00:00:00Z, 2024-07-01T00:00:00Z)" in r.stdout
    assert "cluster_3        [2024-07-01T00:00:00Z, open)" in r.stdout
    meta = metadata(raw_clients, db_name)
    assert meta["cluster_2"][0]["creator_name"] == "ops" and meta["cluster_1"][0]["end_date"] == P1

    with FeedRouter.from_yaml(op.path, clock=lambda: NOW) as router:
        times = [P0 + timedelta(days=d) for d in range(0, 240, 3)]
        router.write_many(
            FeedItem(receiver_id=i % 7, sender_id=1, event_time=t, type=1, data={}, data_key=data_key("f", i))
            for i, t in enumerate(times)
        )
    expected = {"cluster_1": sum(t < P1 for t in times), "cluster_2": sum(P1 <= t < P2 for t in times),
                "cluster_3": sum(t >= P2 for t in times)}

    assert op.run("check").returncode == 0
    status = op.run("--json", "status")
    assert status.returncode == 0, status.stderr
    rows = {row["cluster"]: row for row in json.loads(status.stdout)}
    assert {n: rows[n]["feed_documents"] for n in rows} == expected
    assert all(rows[n]["reachable"] and rows[n]["migrations"] == [m.id for m in discover()] for n in rows)
    assert rows["cluster_3"]["period"]["end_date"] is None
    text = op.run("status").stdout
    assert "cluster_2      [2024-04-01T00:00:00Z, 2024-07-01T00:00:00Z)" in text

    migrate = op.run("migrate")
    assert migrate.returncode == 0 and migrate.stdout.count(f"applied nothing ({len(discover())} already applied)") == 3


@pytest.mark.parametrize(
    "args, reason",
    [
        (["--start", "2024-08-01", "--close-previous"], "cluster 'cluster_3' holds 1 documents at or after 2024-08-01T00:00:00+00:00"),
        (["--start", "2024-05-01", "--end", "2024-06-01"], "overlaps cluster 'cluster_2'"),
        (["--start", "2024-09-01"], "overlaps the open-ended period of cluster 'cluster_3'"),
        (["--start", "2023-01-01", "--end", "2023-06-01"], "cluster 'cluster_4' already holds 1 documents outside"),
        (["--start", "2023-06-01", "--end", "2023-01-01"], "must be after start"),
    ],
)
def test_refused_changes_leave_metadata_untouched(
    tmp_path: Path, servers: LocalClusters, raw_clients: Clients, db_name: str, spare: LocalServer, args: list[str],
    reason: str,
) -> None:
    """Every unsafe add-cluster is refused with its reason, and no cluster's metadata changes."""
    op = Operator(tmp_path, db_name, [*servers.uris, spare.uri])  # cluster_4 on the file's spare server
    for count, (name, start) in enumerate((("cluster_1", P0), ("cluster_2", P1), ("cluster_3", P2)), start=1):
        op.list_clusters(count)
        assert op.run("add-cluster", name, "--start", start.isoformat(), "--close-previous", "--force").returncode == 0
    raw_clients["cluster_3"][db_name].feed.insert_one({"receiver_id": 1, "event_time": P2 + timedelta(days=45)})
    stray = MongoClient(spare.uri, tz_aware=True)
    stray[db_name].feed.insert_one({"receiver_id": 1, "event_time": P2 + timedelta(days=100)})
    op.list_clusters(4)
    before = metadata(raw_clients, db_name)
    r = op.run("add-cluster", "cluster_4", *args)
    assert r.returncode == 1, r.stdout
    assert reason in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    assert metadata(raw_clients, db_name) == before
    assert list(stray[db_name].metadata.find({})) == []
    stray.close()


def test_status_names_an_unreachable_cluster(tmp_path: Path, servers: LocalClusters, db_name: str) -> None:
    """status still shows the reachable clusters, marks the dead one, and exits 1."""
    op = Operator(tmp_path, db_name, [servers.uris[0], "mongodb://127.0.0.1:9"])
    op.list_clusters(1)
    assert op.run("add-cluster", "cluster_1", "--start", "2024-01-01").returncode == 0
    op.list_clusters(2)
    r = op.run("status")
    assert r.returncode == 1
    assert "cluster_1" in r.stdout and "cluster_2" in r.stdout and "NO" in r.stdout
    assert "error: cluster 'cluster_2'" in r.stdout


def test_usage_errors_exit_2(tmp_path: Path, servers: LocalClusters, db_name: str) -> None:
    """A bad date or an unknown cluster for migrate is a usage error."""
    op = Operator(tmp_path, db_name, servers.uris)
    op.list_clusters(1)
    r = op.run("add-cluster", "cluster_1", "--start", "next tuesday")
    assert r.returncode == 2 and "not an ISO date or datetime" in r.stderr
    r = op.run("migrate", "--cluster", "nope")
    assert r.returncode == 2 and "'nope' is not in" in r.stderr
    r = op.run("add-cluster", "cluster_9", "--start", "2024-01-01")
    assert r.returncode == 1 and "cluster 'cluster_9' is not in" in r.stderr


def test_listed_clusters_without_period(tmp_path: Path, servers: LocalClusters, raw_clients: Clients, db_name: str) -> None:
    """Empty listed clusters may wait for their turn; one holding data without metadata blocks every change."""
    op = Operator(tmp_path, db_name, servers.uris)
    op.list_clusters(3)
    r = op.run("add-cluster", "cluster_1", "--start", "2024-01-01")
    assert r.returncode == 0, r.stderr
    assert "cluster_3        (listed in" in r.stdout
    raw_clients["cluster_3"][db_name].feed.insert_one({"receiver_id": 1, "event_time": P2})
    r = op.run("add-cluster", "cluster_2", "--start", "2024-04-01", "--close-previous", "--force")
    assert r.returncode == 1
    assert "cluster 'cluster_3' has no metadata document but holds 1 documents (1 feed): restore its metadata first" in r.stderr


def test_rollover_and_retire_through_the_cli(tmp_path: Path, servers: LocalClusters, raw_clients: Clients, db_name: str) -> None:
    """scheduler --once, rollover (dry run, real, again) and retire, on the real clock."""
    from datetime import datetime, timezone

    from router.admin.rollover import upcoming_boundary
    from router.config import RolloverConfig

    now = datetime.now(timezone.utc)
    month = datetime(now.year, now.month, 1, tzinfo=timezone.utc)
    previous = datetime(now.year - (now.month == 1), (now.month - 2) % 12 + 1, 1, tzinfo=timezone.utc)
    op = Operator(tmp_path, db_name, servers.uris)
    op.list_clusters(2)
    assert op.run("add-cluster", "cluster_1", "--start", previous.isoformat()).returncode == 0
    assert op.run("add-cluster", "cluster_2", "--start", month.isoformat(), "--close-previous", "--force").returncode == 0
    op.list_clusters(3)
    with op.path.open("a") as f:
        f.write("rollover: {period: monthly, lead_time: 3d, standby: [cluster_3]}\n")
    boundary = upcoming_boundary(month, now=now, settings=RolloverConfig(lead_time=timedelta(days=3)))

    r = op.run("scheduler", "--once")
    assert r.returncode == 1 and "standby cluster 'cluster_3' is not migrated" in r.stdout + r.stderr
    assert op.run("migrate", "--cluster", "cluster_3").returncode == 0
    r = op.run("rollover", "--dry-run")
    assert r.returncode == 0, r.stderr
    assert f"next boundary {boundary.isoformat()}" in r.stdout and "dry run, nothing changed" in r.stdout
    assert list(raw_clients["cluster_3"][db_name].metadata.find({})) == []
    r = op.run("rollover")
    assert r.returncode == 0, r.stderr
    assert raw_clients["cluster_3"][db_name].metadata.find_one({})["start_date"] == boundary  # type: ignore[index]
    r = op.run("rollover")
    assert r.returncode == 1 and "no standby cluster is ready" in r.stderr

    r = op.run("retire", "cluster_2")
    assert r.returncode == 1 and "has not ended yet" in r.stderr
    r = op.run("retire", "cluster_1")
    assert r.returncode == 0 and "retired cluster 'cluster_1'" in r.stdout
    rows = {row["cluster"]: row for row in json.loads(op.run("--json", "status").stdout)}
    assert rows["cluster_1"]["retired"] is True and rows["cluster_2"]["retired"] is False
    assert " retired" in op.run("status").stdout


def test_closing_a_live_period_needs_notice(tmp_path: Path, servers: LocalClusters, raw_clients: Clients, db_name: str) -> None:
    """Closing the running period sooner than routers refresh is refused unless --force; nothing changes."""
    from datetime import datetime, timezone

    now = datetime.now(timezone.utc).replace(microsecond=0)
    op = Operator(tmp_path, db_name, servers.uris)
    op.list_clusters(1)
    assert op.run("add-cluster", "cluster_1", "--start", (now - timedelta(days=30)).isoformat()).returncode == 0
    op.list_clusters(2)
    before = metadata(raw_clients, db_name)
    soon = (now + timedelta(seconds=10)).isoformat()
    r = op.run("add-cluster", "cluster_2", "--start", soon, "--close-previous")
    assert r.returncode == 1 and "leaves running routers less than 0:01:00 to learn of it" in r.stderr
    assert metadata(raw_clients, db_name) == before
    later = (now + timedelta(hours=1)).isoformat()
    assert op.run("add-cluster", "cluster_2", "--start", later, "--close-previous").returncode == 0


def test_a_close_never_strands_a_seen_marker(tmp_path: Path, servers: LocalClusters, raw_clients: Clients, db_name: str) -> None:
    """The issue's steps: a pulled post 3 days old marked seen, then a close 5 days back is refused, with --force and
    without (--force waives only the notice), naming the outbox entry and the marker; so is a close an hour ahead
    while a pulled post 3 hours ahead is marked seen. A close after every record goes through."""
    from datetime import datetime, timezone

    from router import Activity

    now = datetime.now(timezone.utc).replace(microsecond=0)
    op = Operator(tmp_path, db_name, servers.uris)
    op.list_clusters(1)
    assert op.run("add-cluster", "cluster_1", "--start", (now - timedelta(days=30)).isoformat()).returncode == 0
    past, future = now - timedelta(days=3), now + timedelta(hours=3)
    with FeedRouter.from_yaml(op.path) as router:
        for n, when in enumerate((past, future)):
            router.publish(Activity(sender_id="celeb", event_time=when, type="mention", data={"n": n},
                                    data_key=data_key("celeb", n)), [], pull=True)
        for n in (1, 2):  # receiver 1 has seen the old post, receiver 2 the future one too
            router.mark_seen(n, router.read(n, limit=2, pull=["celeb"]).items[2 - n])
    op.list_clusters(2)
    before = metadata(raw_clients, db_name)
    start = now - timedelta(days=5)
    for force in (["--force"], []):
        r = op.run("add-cluster", "cluster_2", "--start", start.isoformat(), "--close-previous", *force)
        assert r.returncode == 1, r.stdout
        assert (f"cluster 'cluster_1' holds 4 documents at or after {start.isoformat()} (latest {future.isoformat()}; "
                "2 outbox, 2 seen): closing its period there would strand them") in r.stderr, r.stderr
        assert metadata(raw_clients, db_name) == before
    soon = now + timedelta(hours=1)
    r = op.run("add-cluster", "cluster_2", "--start", soon.isoformat(), "--close-previous")
    assert r.returncode == 1 and f"holds 2 documents at or after {soon.isoformat()} (latest {future.isoformat()}; " \
                                  "1 outbox, 1 seen)" in r.stderr, r.stderr
    assert metadata(raw_clients, db_name) == before
    later = now + timedelta(hours=4)
    r = op.run("add-cluster", "cluster_2", "--start", later.isoformat(), "--close-previous")
    assert r.returncode == 0, r.stderr
    with FeedRouter.from_yaml(op.path) as router:
        assert router.seen_position(2) is not None and router.seen_position(2).event_time == future  # type: ignore[union-attr]
        assert router.unseen_count(1, pull=["celeb"]).count == 1 and router.unseen_count(2, pull=["celeb"]).count == 0
