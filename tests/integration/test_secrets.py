"""Passwords in URIs never show: not in logs at any level, errors, reprs, or CLI output."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest

from router import ClusterUnavailable, FeedItem, FeedRouter, RouterError, data_key, load_config
from router.admin.migrate import discover
from router.admin.periods import apply_period, plan_period
from router.storage.clusters import Clusters
from harness.localservers import LocalClusters
from harness.process import checkout_env

from .conftest import P0, P1

INLINE = "inl1ne-Pa55"
FROM_ENV = "env-S3cret"


@pytest.fixture(autouse=True)
def users(servers: LocalClusters) -> None:
    """The two logins of write_config: FerretDB 2 users (SCRAM), or real PostgreSQL roles on ferretdb-pg (PLAIN)."""
    servers.create_user("feed", INLINE)
    servers.create_user("feed_env", FROM_ENV)


def write_config(path: Path, uris: list[str], db: str, extra: str = "", *, mechanism: str = "SCRAM-SHA-256") -> None:
    """cluster_1 logs in as feed with its password inline, cluster_2 as feed_env with ${FEED_PW}."""
    host1, host2 = (u.removeprefix("mongodb://") for u in uris)
    path.write_text(
        f"database: {db}\n"
        "clusters:\n"
        f"  - name: cluster_1\n    uri: mongodb://feed:{INLINE}@{host1}/?authMechanism={mechanism}\n"
        "    options: {serverSelectionTimeoutMS: 1500}\n"
        f"  - name: cluster_2\n    uri: mongodb://feed_env:${{FEED_PW}}@{host2}/?authMechanism={mechanism}\n"
        "    options: {serverSelectionTimeoutMS: 1500}\n" + extra
    )


def assert_clean(text: str) -> None:
    assert INLINE not in text and FROM_ENV not in text, text[:2000]


def test_no_password_anywhere(tmp_path: Path, servers: LocalClusters, db_name: str, caplog: pytest.LogCaptureFixture,
                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A whole session with password-bearing URIs, including failures, captured at DEBUG for every logger."""
    monkeypatch.setenv("FEED_PW", FROM_ENV)
    path = tmp_path / "clusters.yaml"
    write_config(path, servers.uris[:2], db_name, mechanism=servers.auth_mechanism)
    seen: list[str] = []
    with caplog.at_level(logging.DEBUG):  # the root logger: ours and pymongo's records alike
        config = load_config(path)
        assert config.clusters[1].uri.count(FROM_ENV) == 1  # the secret did arrive
        seen += [repr(config), str(config), repr(config.clusters)]
        with Clusters(config) as clusters:
            seen.append(repr(clusters["cluster_1"]))
            migrations = discover()
            for count, name, start in ((1, "cluster_1", P0), (2, "cluster_2", P1)):
                change = plan_period(clusters, name=name, start=start, close_previous=count > 1)
                seen += apply_period(clusters, change, migrations=migrations)
        with FeedRouter(config) as router:
            seen.append(repr(router))
            router.write_many(
                FeedItem(receiver_id=1, sender_id=2, event_time=P0 + timedelta(days=d), type=1, data={}, data_key=data_key("f", d))
                for d in range(0, 200, 10)
            )
            page = router.read(1)
            seen += [repr(page), repr(page.items[0])]
            router.delete(data_key("f", 10))
            router.refresh()
        # failures: an unreachable cluster with a password, and a bad URI with one
        servers.servers[1].pause()
        try:
            with pytest.raises(ClusterUnavailable) as down:
                FeedRouter(config)
            seen += [str(down.value), repr(down.value), str(down.value.__cause__)]
        finally:
            servers.servers[1].resume()
        bad = tmp_path / "bad.yaml"
        bad.write_text(f"clusters:\n  - name: a\n    uri: mysql://feed:{INLINE}@h\n  - name: b\n    uri: mongodb://feed:${{FEED_PW}}@h:1\n"
                       f"  - name: c\n    uri: mongodb://feed:${{FEED_PW}}@h:1\n")
        with pytest.raises(RouterError) as config_error:
            load_config(bad)
        seen += [str(config_error.value), repr(config_error.value)]
    logged = "\n".join(r.getMessage() + " " + repr(r.args) for r in caplog.records)
    assert any(r.name.startswith("pymongo.command") for r in caplog.records)  # the driver's own records are in too
    assert any(r.name.startswith("router") for r in caplog.records)
    assert "feed:***@" in str(config_error.value)
    for text in [*seen, logged]:
        assert_clean(text)


def test_cli_output_has_no_password(tmp_path: Path, servers: LocalClusters, db_name: str) -> None:
    """status and check, text and JSON, healthy and with a cluster down: no password."""
    path = tmp_path / "clusters.yaml"
    write_config(path, [servers.uris[0], "mongodb://127.0.0.1:9"], db_name, mechanism=servers.auth_mechanism)
    env = checkout_env(FEED_PW=FROM_ENV)
    outputs, stdouts = [], []
    for args in (["status"], ["--json", "status"], ["check"], ["--json", "check"], ["-vv", "check"],
                 ["add-cluster", "cluster_1", "--start", "2024-01-01"], ["-vv", "--json", "status"]):
        r = subprocess.run([sys.executable, "-m", "router.cli", "-c", str(path), *args],
                           capture_output=True, text=True, env=env, timeout=120)
        outputs.append(r.stdout + r.stderr)
        stdouts.append(r.stdout)
    rows = json.loads(stdouts[1])  # --json status
    assert rows[0]["uri"].startswith("mongodb://feed:***@")
    assert "error" in rows[1] and rows[1]["reachable"] is False
    for text in outputs:
        assert_clean(text)
