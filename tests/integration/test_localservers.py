"""Tests for router.testing.localservers against real servers it starts (no skips: fail loudly)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pymongo

from router.testing.localservers import FERRETDB_VERSION, LocalClusters, ensure_ferretdb


def _client(uri: str) -> pymongo.MongoClient[dict[str, object]]:
    return pymongo.MongoClient(uri, directConnection=True, serverSelectionTimeoutMS=5000)


def _pid_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_ferretdb_binary_reports_pinned_version() -> None:
    """The binary built into the cache reports the pinned FerretDB version."""
    binary = ensure_ferretdb()
    out = subprocess.run(
        [str(binary), "--version"], capture_output=True, text=True, check=True
    ).stdout
    assert FERRETDB_VERSION in out


def test_two_clusters_survive_a_kill_and_restart(tmp_path: Path) -> None:
    """Two servers answer; killing one leaves the other up; a restart keeps the data."""
    clusters = LocalClusters(2, base_dir=tmp_path)
    try:
        uris = clusters.start()
        assert uris == clusters.uris
        assert len(set(uris)) == 2
        first, second = clusters.servers
        assert [first.name, second.name] == ["cluster_1", "cluster_2"]
        for uri in uris:
            with _client(uri) as client:
                assert client.admin.command("ping")["ok"] == 1

        with _client(first.uri) as client:
            client.test_localservers.items.insert_one({"_id": 1, "text": "kept"})
            assert client.test_localservers.items.find_one({"_id": 1}) == {
                "_id": 1,
                "text": "kept",
            }

        first.kill()
        assert not first.alive
        assert second.alive
        with _client(second.uri) as client:
            assert client.admin.command("ping")["ok"] == 1

        first.restart()
        assert first.alive
        with _client(first.uri) as client:
            assert client.test_localservers.items.find_one({"_id": 1}) == {
                "_id": 1,
                "text": "kept",
            }

        pids = [server.pid for server in clusters.servers]
    finally:
        clusters.stop()
    assert all(pid is not None and _pid_gone(pid) for pid in pids)
    assert not any(server.alive for server in clusters.servers)
    clusters.stop()  # idempotent
