"""The feedrouter command, run as an operator runs it: a subprocess."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from router.admin.migrate import discover
from router import RouterConfig
from harness.localservers import LocalClusters
from harness.process import checkout_env

from .conftest import register


def feedrouter(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = checkout_env()
    return subprocess.run(
        [sys.executable, "-m", "router.cli", *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=300
    )


def demo(*args: str) -> subprocess.CompletedProcess[str]:
    """The demo as scripts/demo runs it, from the checkout's harness."""
    env = checkout_env()
    return subprocess.run([sys.executable, "-m", "harness.demo", *args], capture_output=True, text=True, env=env,
                          timeout=300)


def write_yaml(path: Path, config: RouterConfig, password: str | None = None) -> Path:
    lines = [f"database: {config.database}", "clusters:"]
    for c in config.clusters:
        uri = c.uri if password is None else c.uri.replace("mongodb://", f"mongodb://feed:{password}@")
        lines += [f"  - name: {c.name}", f"    uri: {uri}", "    options: {serverSelectionTimeoutMS: 1500}"]
    path.write_text("\n".join(lines) + "\n")
    return path


def running_with(folder: str) -> list[int]:
    """Pids of processes whose command line mentions *folder*."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if folder.encode() in (entry / "cmdline").read_bytes():
                    pids.append(int(entry.name))
            except OSError:
                pass
    return pids


def test_demo_runs_and_leaves_no_server(servers: LocalClusters) -> None:
    """The demo's checks all hold (the Celery fan-out's and the rollover to buckets' too), it exits 0, and its servers
    (four on the session's backend, PostgreSQL behind them where there is one), Redis and worker are gone afterwards."""
    result = demo("--posts", "60")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "all checks passed" in result.stdout and "copies written by a Celery worker" in result.stdout
    assert "[FAILED]" not in result.stdout
    # The page read across the rollover spans both layouts: one document per copy, then up to 50 copies a bucket.
    assert "write metadata of cluster 'cluster_4': [" in result.stdout and "), layout buckets" in result.stdout
    spent = {layout: (int(items), int(docs)) for _, layout, items, docs in re.findall(
        r"^   (cluster_\d) \((copies|buckets)\): (\d+) items stored in (\d+) documents", result.stdout, re.M)}
    assert set(spent) == {"copies", "buckets"} and spent["copies"][0] + spent["buckets"][0] == 100
    assert spent["copies"][0] == spent["copies"][1] and spent["buckets"][1] == -(-spent["buckets"][0] // 50)
    assert "[ok] every bucket holds at most 50 copies" in result.stdout
    assert "[ok] every one of the page's 100 items is stored exactly once (in all four clusters)" in result.stdout
    standby = "javaserver" if servers.backend in ("ferretdb-pg", "ferretdb-sqlite") else servers.backend
    assert re.search(rf"^   cluster_4: mongodb://\S+ \({standby}, data in ", result.stdout, re.M)
    folders = set(re.findall(r"data in (\S+)/cluster_\d", result.stdout))
    assert len(folders) == 1
    assert running_with(folders.pop()) == []  # every server's command line (PostgreSQL's, a JVM's) names that folder
    broker = re.search(r"broker: \S+ \(redis-server, data in (\S+)\)", result.stdout)
    worker = re.search(r"worker \(pid (\d+)\) ready", result.stdout)
    assert broker is not None and worker is not None
    assert running_with(broker[1]) == [] and not Path(f"/proc/{worker[1]}").exists()


def test_check_prints_the_time_map(make_config: Callable[..., RouterConfig], tmp_path: Path) -> None:
    """check exits 0 and prints every period; --json gives the same as data."""
    config = make_config()
    register(config)
    path = write_yaml(tmp_path / "clusters.yaml", config)
    result = feedrouter("-c", str(path), "check")
    assert result.returncode == 0, result.stderr
    assert "3 periods" in result.stdout and result.stdout.rstrip().endswith("ok") and "cluster_3        [2024-07-01T00:00:00Z, open)" in result.stdout
    as_json = json.loads(feedrouter("--json", "-c", str(path), "check").stdout)
    assert [c["name"] for c in as_json["clusters"]] == ["cluster_1", "cluster_2", "cluster_3"]
    assert as_json["clusters"][2]["end_date"] is None


def test_check_shows_what_each_server_can_do(make_config: Callable[..., RouterConfig], tmp_path: Path,
                                             servers: LocalClusters) -> None:
    """check names each cluster's server and its capabilities, as the server reports them (text and JSON)."""
    config = make_config()
    register(config)
    path = write_yaml(tmp_path / "clusters.yaml", config)
    result = feedrouter("-c", str(path), "check")
    as_json = json.loads(feedrouter("--json", "-c", str(path), "check").stdout)
    caps = as_json["capabilities"]
    assert sorted(caps) == ["cluster_1", "cluster_2", "cluster_3"]
    expected = {  # what each local backend is, as check must find it out from the server itself
        "ferretdb2": ("ferretdb", True, False, False, False),
        "javaserver": ("mongo-java-server", True, False, False, False),
        "ferretdb-pg": ("ferretdb", False, False, False, False),
        "ferretdb-sqlite": ("ferretdb", False, False, False, False),
    }[servers.backend]
    for name, one in caps.items():
        assert (one["server"], one["atomic_updates"], one["transactions"], one["change_streams"],
                one["index_ordered_sorts"]) == expected
        assert f"server of {name}: {one['server']} {one['version']}: sharded (mongos) no, atomic updates " \
               f"{'yes' if expected[1] else 'no'}, transactions no, change streams no, index-ordered sorts no" in result.stdout


def test_check_config_error_exits_2_without_traceback(tmp_path: Path) -> None:
    """A broken clusters.yaml: exit 2, every problem with its position, no traceback."""
    path = tmp_path / "clusters.yaml"
    path.write_text("clusters:\n  - name: a\n    uri: localhost\n  - name: a\n    uri: mongodb://h:1\n")
    result = feedrouter("-c", str(path), "check")
    assert result.returncode == 2
    assert f"{path}:3:10: clusters[0].uri: must be a mongodb:// or mongodb+srv:// URI (got 'localhost')" in result.stderr
    assert f"{path}:4:11: clusters[1].name: duplicate cluster name" in result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""
    secret = "S3cret-erasure-key-0123456789"
    path.write_text(f"clusters:\n  - name: a\n    uri: mongodb://h:1\nerasure: {secret}\n")  # key: left out
    result = feedrouter("-c", str(path), "check")
    assert result.returncode == 2 and f"{path}:4:10: erasure: must be a mapping (got a single value, not shown" in result.stderr
    assert secret not in result.stderr + result.stdout


def test_check_metadata_problem_exits_1(make_config: Callable[..., RouterConfig], tmp_path: Path) -> None:
    """Clusters without metadata: exit 1, each named, and the password never printed."""
    config = make_config()
    path = write_yaml(tmp_path / "clusters.yaml", config)
    result = feedrouter("-v", "-c", str(path), "check")
    assert result.returncode == 1
    for name in ("cluster_1", "cluster_2", "cluster_3"):
        assert f"problem: cluster '{name}': no metadata document" in result.stdout
        assert f"problem: cluster '{name}': migrations not applied: {', '.join(m.id for m in discover())}" in result.stdout


def test_unreachable_cluster_named_and_password_hidden(make_config: Callable[..., RouterConfig], tmp_path: Path) -> None:
    """An unreachable cluster fails check with its name; a URI password appears nowhere in the output."""
    config = make_config(uris=["mongodb://127.0.0.1:1", "mongodb://127.0.0.1:2", "mongodb://127.0.0.1:3"])
    path = write_yaml(tmp_path / "clusters.yaml", config, password="hunter2")
    result = feedrouter("-vv", "-c", str(path), "check")
    assert result.returncode == 1
    for name in ("cluster_1", "cluster_2", "cluster_3"):
        assert f"problem: cluster '{name}': reading metadata failed" in result.stdout
    assert "hunter2" not in result.stdout + result.stderr


def test_version_and_usage() -> None:
    """--version prints the version; a bad subcommand is a usage error (exit 2)."""
    result = feedrouter("--version")
    assert result.returncode == 0 and result.stdout.startswith("feedrouter 0.")
    assert feedrouter("frobnicate").returncode == 2
    assert feedrouter("demo").returncode == 2  # the demo is the checkout's (scripts/demo), not the installed command's
    assert demo("--posts", "0").returncode == 2


def test_status_marks_bad_metadata_and_prints_every_cluster(
    make_config: Callable[..., RouterConfig], tmp_path: Path, raw_clients: dict[str, Any]
) -> None:
    """A start_date stored as a string: status still prints every cluster, marks that one with the field and
    value, and exits 1 (it used to print an AttributeError and no table)."""
    config = make_config()
    register(config)
    raw_clients["cluster_2"][config.database].metadata.update_one({"_id": "cluster_2"}, {"$set": {"start_date": "2024-04-01"}})
    path = write_yaml(tmp_path / "clusters.yaml", config)
    result = feedrouter("-c", str(path), "status")
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr and "AttributeError" not in result.stdout + result.stderr
    rows = {line.split()[0]: line for line in result.stdout.splitlines()[1:4]}
    assert set(rows) == {"cluster_1", "cluster_2", "cluster_3"}
    assert "(bad metadata)" in rows["cluster_2"] and "[2024-01-01T00:00:00Z, 2024-04-01T00:00:00Z)" in rows["cluster_1"]
    assert "error: cluster 'cluster_2': bad metadata document: start_date: must be a timezone-aware datetime (got '2024-04-01')" in result.stdout
    as_json = json.loads(feedrouter("--json", "-c", str(path), "status").stdout)
    assert [r["cluster"] for r in as_json] == ["cluster_1", "cluster_2", "cluster_3"]
    assert "start_date" in as_json[1]["error"] and "error" not in as_json[0]


@pytest.mark.parametrize(
    "text, expected",
    [
        ("clusters: " + "[" * 5000 + "]" * 5000 + "\n", "nested too deeply"),
        ("clusters:\n  - {name: a, uri: 'mongodb://127.0.0.1:99999/'}\n", "clusters[0].uri: not a valid MongoDB URI: port '99999' of host '127.0.0.1' must be"),
        ("clusters:\n  - {name: a, uri: 'mongodb://127.0.0.1/?bogusOption=1'}\n", "unknown URI option 'bogusOption'"),
    ],
)
def test_unusable_config_exits_2(tmp_path: Path, text: str, expected: str) -> None:
    """Deep YAML and malformed URIs are configuration errors (exit 2) before any connection is tried."""
    path = tmp_path / "clusters.yaml"
    path.write_text(text)
    for command in (["check"], ["status"], ["--json", "status"]):
        result = feedrouter("-c", str(path), *command)
        assert result.returncode == 2, (command, result.stdout, result.stderr)
        assert expected in result.stderr and "Traceback" not in result.stderr


def test_status_shows_what_a_service_saw(make_config: Callable[..., RouterConfig], tmp_path: Path) -> None:
    """status --metrics URL adds, per cluster, the requests a running router sent, the failed ones and their latency."""
    from prometheus_client import CollectorRegistry, start_http_server

    from router import FeedItem, FeedRouter, data_key
    from router.observe.prometheus import PrometheusMetrics

    from .conftest import NOW, P0, P1, P2

    config = make_config()
    register(config)
    registry = CollectorRegistry()
    server, thread = start_http_server(0, addr="127.0.0.1", registry=registry)  # the service's endpoint, not the router's
    try:
        url = f"http://127.0.0.1:{server.server_port}/metrics"
        with FeedRouter(config, clock=lambda: NOW, refresh=False, metrics=PrometheusMetrics(registry=registry)) as feeds:
            feeds.write_many([FeedItem(receiver_id=1, sender_id=1, event_time=t, type=1, data={}, data_key=data_key("m", i))
                              for i, t in enumerate((P0, P1, P2))])
            feeds.read(1)
            path = write_yaml(tmp_path / "clusters.yaml", config)
            result = feedrouter("-c", str(path), "status", "--metrics", url)
            as_json = json.loads(feedrouter("--json", "-c", str(path), "status", "--metrics", url).stdout)
    finally:
        server.shutdown()
        thread.join(10)
    assert result.returncode == 0, result.stderr
    assert f"seen by the service at {url}:" in result.stdout
    rows = {line.split()[0]: line.split() for line in result.stdout.split("seen by the service")[1].splitlines()[2:5]}
    assert set(rows) == {"cluster_1", "cluster_2", "cluster_3"}
    # a metadata read each at start-up, then one insert each and its post's registration (the posts registry by
    # sender, which an erasure reads), then the page's find in each (one item per period)
    assert [rows[c][1:3] for c in ("cluster_1", "cluster_2", "cluster_3")] == [["4", "0"]] * 3
    assert all(rows[c][4] == "yes" for c in rows)
    assert [r["metrics"]["requests"] for r in as_json] == [4, 4, 4] and all(r["metrics"]["mean_ms"] > 0 for r in as_json)


def test_unseen_arguments(make_config: Callable[..., RouterConfig], tmp_path: Path) -> None:
    """`unseen`: a --cap outside 1..10000 and an int receiver past 64 bits are usage errors (exit 2, before any
    cluster is asked); only ASCII digits make an int id (other Unicode digits are a str id, as the router stores
    it); --json works after the subcommand as before it."""
    config = make_config()
    register(config)
    path = str(write_yaml(tmp_path / "clusters.yaml", config))
    for args, message in [
        (["5", "--cap", "0"], "--cap: must be an int from 1 to 10000 (got 0)"),
        (["5", "--cap", "-3"], "--cap: must be an int from 1 to 10000 (got -3)"),
        (["5", "--cap", "100000"], "--cap: must be an int from 1 to 10000 (got 100000)"),
        (["5", "--cap", "５"], "--cap: must be an int from 1 to 10000 (got '５')"),
        (["18446744073709551616"], "RECEIVER: an int id must fit in 64 bits, from -2**63 to 2**63 - 1 (got 18446744073709551616)"),
        (["--", "-9223372036854775809"], "RECEIVER: an int id must fit in 64 bits"),
        ([""], "RECEIVER: must be a non-empty"),
    ]:
        result = feedrouter("-c", path, "unseen", *args)
        assert (result.returncode, result.stdout) == (2, ""), (args, result.stderr)
        assert message in result.stderr and "Traceback" not in result.stderr, (args, result.stderr)
    for text, shown in [("²", "'²'"), ("５", "'５'"), ("-7", "-7"), ("9223372036854775807", "9223372036854775807"),
                        ("--5", "'--5'")]:
        result = feedrouter("-c", path, "unseen", "--", text) if text.startswith("-") else feedrouter("-c", path, "unseen", text)
        assert result.returncode == 0, (text, result.stderr)
        assert result.stdout.startswith(f"receiver {shown}: 0 unseen; nothing marked seen"), (text, result.stdout)
    before = json.loads(feedrouter("--json", "-c", path, "unseen", "５", "--cap", "3").stdout)
    after = feedrouter("-c", path, "unseen", "５", "--json", "--cap", "3")
    assert after.returncode == 0, after.stderr
    assert json.loads(after.stdout) == before and before["receiver_id"] == "５" and before["unseen"] == 0


def on_a_terminal(*args: str, cwd: Path | None = None) -> tuple[int, str]:
    """Run feedrouter with stdout and stderr on a pseudo-terminal of their own (as a person at a terminal runs it):
    its exit code and everything it wrote there."""
    master, slave = pty.openpty()
    env = checkout_env(COLUMNS="200")
    child = subprocess.Popen([sys.executable, "-m", "router.cli", *args], stdin=subprocess.DEVNULL, stdout=slave,
                             stderr=slave, cwd=cwd, env=env)
    os.close(slave)
    out = bytearray()
    deadline = time.monotonic() + 300
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 1.0)
            if not ready:
                if child.poll() is not None:
                    break
                continue
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the child closed its end
                break
            if not chunk:
                break
            out += chunk
    finally:
        os.close(master)
        code = child.wait(60)
    return code, out.decode("utf-8", "replace")


def test_erase_and_export_show_progress_on_a_terminal_only(make_config: Callable[..., RouterConfig],
                                                           tmp_path: Path) -> None:
    """On a terminal, `export` and `erase` rewrite a line of progress on stderr (the records of each file so far; the
    clusters done and what each running one removed so far) and clear it before the result; with --json, or with
    stdout and stderr not on a terminal, nothing but the result is written."""
    from router import Activity, FeedItem, FeedRouter, data_key

    config = make_config()
    register(config)
    path = str(write_yaml(tmp_path / "clusters.yaml", config))
    user = 2**40 + 7
    with FeedRouter(config) as router:
        for n, when in enumerate((datetime(2024, 2, 1, tzinfo=timezone.utc), datetime(2024, 5, 1, tzinfo=timezone.utc),
                                  datetime(2024, 8, 1, tzinfo=timezone.utc))):
            router.publish(Activity(sender_id=user, event_time=when, type=1, data={"n": n}, data_key=data_key("tty", n)),
                           range(1, 3001), batch_size=500)
            router.write_many([FeedItem(receiver_id=user, sender_id=5, event_time=when, type=1, data={"to": n},
                                        data_key=data_key("tty-in", n))])
    clear = "\r\x1b[2K"
    for n, json_flag in enumerate(((), ("--json",))):
        folder = tmp_path / f"export{n}"
        folder.mkdir()
        code, shown = on_a_terminal("-c", path, *json_flag, "export", str(user), str(folder))
        assert code == 0, shown
        if json_flag:
            assert clear not in shown and "exporting" not in shown and json.loads(shown)["files"]["sent.jsonl"]["records"] == 3
        else:
            assert f"{clear}exporting: sent 1 (sent, reading cluster_1)" in shown
            assert f"{clear}exporting: sent 3, received 1 (received, reading cluster_1)" in shown, shown
            assert f"{clear}exported to {folder}" in shown.replace("\r\n", "\n")  # the line cleared, then the result
    piped = feedrouter("-c", path, "export", str(user), str(tmp_path))  # not a terminal: a usage error, no progress
    assert piped.returncode == 2 and clear not in piped.stderr
    code, shown = on_a_terminal("-c", path, "erase", str(user), "--by", "tests")
    assert code == 0, shown
    frames = re.findall(r"\r\x1b\[2K(erasing: [^\r\n]*)", shown)
    assert frames and frames[-1] == "erasing: 3/3 clusters done", frames
    assert any(re.fullmatch(r"erasing: [012]/3 clusters done; (cluster_\d [\d,]+ removed(, )?)+", f) for f in frames), frames
    assert f"{clear}erasure " in shown and "erased in 3 clusters" in shown and str(user) not in shown
    again = feedrouter("-c", path, "erase", str(user), "--by", "tests, again")  # piped: the result alone
    assert again.returncode == 0 and again.stderr == "" and "erased in 3 clusters" in again.stdout
    code, shown = on_a_terminal("-c", path, "--json", "erase", str(user), "--by", "tests, json")
    assert code == 0 and clear not in shown and json.loads(shown)["totals"]["feed_sent"] == 0
