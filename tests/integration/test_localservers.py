"""Tests for harness.localservers against real servers it starts (no skips: fail loudly)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pymongo
import pymongo.errors
import pytest

from harness.localservers import FERRETDB2_VERSION, FERRETDB_VERSION, LocalClusters, ensure_ferretdb
from harness.redis import LocalRedis
from harness.process import checkout_env

REPO = Path(__file__).resolve().parents[2]


def _client(uri: str, timeout_ms: int = 5000) -> pymongo.MongoClient[dict[str, object]]:
    return pymongo.MongoClient(
        uri,
        directConnection=True,
        serverSelectionTimeoutMS=timeout_ms,
        connectTimeoutMS=timeout_ms,
        socketTimeoutMS=timeout_ms,
    )


def _pid_gone(pid: int) -> bool:
    """True when the process has exited (a zombie nobody has reaped yet counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rpartition(")")[2].split()[0] == "Z"


def _pids_naming(*folders: Path) -> list[int]:
    """Live processes whose command line names one of ``folders``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if any(str(folder) in cmdline for folder in folders) and not _pid_gone(int(entry.name)):
            found.append(int(entry.name))
    return found


def _cmdline(pid: int | None) -> str:
    assert pid is not None
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()


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
    assert _pids_naming(tmp_path) == []
    clusters.stop()  # idempotent


def test_pg_backend_runs_clusters_on_one_postgres(tmp_path: Path) -> None:
    """ferretdb-pg: one PostgreSQL, a database each; kill, restart, pause and stop act per cluster."""
    clusters = LocalClusters(2, base_dir=tmp_path, backend="ferretdb-pg")
    assert clusters.backend == "ferretdb-pg"
    try:
        clusters.start()
        pg = clusters.postgres
        assert pg is not None and pg.alive
        assert clusters.server_description == f"FerretDB {FERRETDB_VERSION} (PostgreSQL {pg.version})"
        first, second = clusters.servers
        for server in (first, second):  # each FerretDB talks to the one PostgreSQL, own database
            assert server.backend == "ferretdb-pg"
            assert f"--handler=postgresql --postgresql-url=postgres://postgres@127.0.0.1:{pg.port}/{server.name}?" in _cmdline(server.pid)
        assert "-D " + str(pg.data_dir) in _cmdline(pg.pid)

        with _client(first.uri) as one, _client(second.uri) as two:
            one.shared_name.items.insert_one({"_id": 1, "text": "only in cluster_1"})
            assert two.shared_name.items.find_one({"_id": 1}) is None
            assert "shared_name" not in two.list_database_names()
            two.shared_name.items.insert_one({"_id": 1, "text": "only in cluster_2"})
            assert one.shared_name.items.find_one({"_id": 1}) == {"_id": 1, "text": "only in cluster_1"}

        first.kill()
        assert not first.alive and second.alive and pg.alive
        with _client(second.uri) as two:
            assert two.shared_name.items.count_documents({}) == 1
        first.restart()
        with _client(first.uri) as one:
            assert one.shared_name.items.find_one({"_id": 1}) == {"_id": 1, "text": "only in cluster_1"}

        first.pause()
        try:
            with _client(first.uri, timeout_ms=1000) as one, pytest.raises(pymongo.errors.PyMongoError):
                one.admin.command("ping")
            with _client(second.uri) as two:
                assert two.admin.command("ping")["ok"] == 1
        finally:
            first.resume()
        with _client(first.uri) as one:
            assert one.admin.command("ping")["ok"] == 1

        pids = [server.pid for server in clusters.servers] + [pg.pid]
    finally:
        clusters.stop()
    assert all(pid is not None and _pid_gone(pid) for pid in pids)
    assert not pg.alive
    assert _pids_naming(tmp_path, pg.data_dir) == []
    clusters.stop()  # idempotent


def test_ferretdb2_runs_each_cluster_on_its_own_postgres(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """ferretdb2 (the default): a PostgreSQL with DocumentDB and a FerretDB 2 per cluster; faults hit FerretDB only."""
    monkeypatch.delenv("FEED_TEST_BACKEND", raising=False)
    clusters = LocalClusters(2, base_dir=tmp_path)
    assert clusters.backend == "ferretdb2"  # no mongod on this machine: auto is FerretDB 2
    try:
        clusters.start()
        assert clusters.postgres is None and len(clusters.postgres_servers) == 2
        first, second = clusters.servers
        pg1, pg2 = clusters.postgres_servers
        assert clusters.server_description == f"FerretDB {FERRETDB2_VERSION} (DocumentDB 0.107-0, PostgreSQL {pg1.version})"
        assert f"--postgresql-url=postgres://postgres@127.0.0.1:{pg1.port}/postgres?" in _cmdline(first.pid)
        assert f"--postgresql-url=postgres://postgres@127.0.0.1:{pg2.port}/postgres?" in _cmdline(second.pid)
        assert "shared_preload_libraries=pg_cron,pg_documentdb_core,pg_documentdb" in _cmdline(pg1.pid)
        # autovacuum analyzes within a second but never vacuums (RUM's posting-tree spin, docs/servers.md)
        shown = pg1.run_sql("SELECT current_setting('autovacuum_naptime'), current_setting('autovacuum_vacuum_threshold'),"
                            " current_setting('autovacuum_vacuum_insert_threshold'), current_setting('autovacuum')")
        assert shown.strip() == "1s|2000000000|-1|on"
        # test speed: no JIT, lz4 for large documents, DocumentDB's index-queue jobs every 30 s (docs/servers.md)
        shown = pg1.run_sql("SELECT current_setting('jit'), current_setting('default_toast_compression')")
        assert shown.strip() == "off|lz4"
        schedules = pg2.run_sql("SELECT schedule FROM cron.job WHERE command LIKE '%build_index_concurrently%'")
        assert schedules.split() == ["30", "seconds", "30", "seconds"]
        with _client(first.uri) as one, _client(second.uri) as two:
            assert one.admin.command("buildInfo")["ferretdb"]["version"] == FERRETDB2_VERSION
            one.shared_name.items.insert_one({"_id": 1, "text": "only in cluster_1"})
            assert two.shared_name.items.find_one({"_id": 1}) is None
        # test speed: every collection's table and indexes unlogged (no write-ahead log), kept through FerretDB's kill
        persistence = pg1.run_sql("SELECT DISTINCT c.relpersistence FROM pg_class c JOIN pg_namespace n ON n.oid = "
                                  "c.relnamespace WHERE n.nspname = 'documentdb_data' AND c.relkind IN ('r', 'i')")
        assert persistence.split() == ["u"]
        first.kill()
        assert not first.alive and second.alive and pg1.alive
        first.restart()
        with _client(first.uri) as one:  # durable: PostgreSQL kept it
            assert one.shared_name.items.find_one({"_id": 1}) == {"_id": 1, "text": "only in cluster_1"}
        first.pause()
        try:
            with _client(first.uri, timeout_ms=1000) as one, pytest.raises(pymongo.errors.PyMongoError):
                one.admin.command("ping")
        finally:
            first.resume()
        pids = [server.pid for server in clusters.servers] + [pg.pid for pg in clusters.postgres_servers]
    finally:
        clusters.stop()
    assert all(pid is not None and _pid_gone(pid) for pid in pids)
    assert _pids_naming(tmp_path, pg1.data_dir, pg2.data_dir) == []


def test_ferretdb2_serves_clients_with_and_without_users(tmp_path: Path) -> None:
    """ferretdb2 runs --no-auth: no credentials are served; given credentials are checked (SCRAM) against create_user's."""
    with LocalClusters(1, base_dir=tmp_path, backend="ferretdb2") as clusters:
        host = clusters.uris[0].removeprefix("mongodb://")
        with _client(f"mongodb://feed:it%27s%20S3cret@{host}/", timeout_ms=3000) as client:
            with pytest.raises(pymongo.errors.OperationFailure):  # no such user yet
                client.own_db.items.find_one({})
        clusters.create_user("feed", "it's S3cret")
        clusters.create_user("feed", "it's S3cret")  # again: updated, not an error
        with _client(f"mongodb://feed:it%27s%20S3cret@{host}/") as client:
            client.own_db.items.insert_one({"_id": 1})
        with _client(clusters.uris[0]) as anonymous:
            assert anonymous.own_db.items.find_one({"_id": 1}) == {"_id": 1}
        with _client(f"mongodb://feed:wrong@{host}/", timeout_ms=3000) as client:
            with pytest.raises(pymongo.errors.OperationFailure):
                client.own_db.items.find_one({})


def test_pg_backend_checks_passwords(tmp_path: Path) -> None:
    """ferretdb-pg: a role made by create_user logs in with PLAIN; a wrong password is refused."""
    with LocalClusters(1, base_dir=tmp_path, backend="ferretdb-pg") as clusters:
        clusters.create_user("feed", "it's S3cret")
        clusters.create_user("feed", "it's S3cret")  # again: updated, not an error
        host = clusters.uris[0].removeprefix("mongodb://")
        good = f"mongodb://feed:it%27s%20S3cret@{host}/?authMechanism=PLAIN"
        with _client(good) as client:
            client.own_db.items.insert_one({"_id": 1})
            assert client.own_db.items.find_one({"_id": 1}) == {"_id": 1}
        with _client(clusters.uris[0]) as superuser:  # what a role makes, the superuser sees
            assert superuser.own_db.items.count_documents({}) == 1
            superuser.made_by_superuser.items.insert_one({"_id": 2})
        with _client(good) as client:  # and the role may read and write the superuser's data
            assert client.made_by_superuser.items.find_one({"_id": 2}) == {"_id": 2}
            client.made_by_superuser.items.insert_one({"_id": 3})
        with _client(f"mongodb://feed:wrong@{host}/?authMechanism=PLAIN") as client:
            # Refused (FerretDB answers with PostgreSQL's own error, whose wording is not ours to
            # assert), where the same call with the right password read the document above.
            with pytest.raises(pymongo.errors.OperationFailure):
                client.own_db.items.find_one({})


def _run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = checkout_env()
    return subprocess.run(
        [sys.executable, "-m", "harness.localservers", *args],
        capture_output=True, text=True, env=env, timeout=300, check=False,
    )  # fmt: skip


def test_cli_start_and_stop_on_pg(tmp_path: Path) -> None:
    """`start --backend ferretdb-pg` leaves servers and PostgreSQL running; `stop` ends them all."""
    folder = tmp_path / "cli"
    started = _run_cli("start", "--count", "2", "--backend", "ferretdb-pg", "--dir", str(folder))
    assert started.returncode == 0, started.stderr
    uris = started.stdout.split()
    assert len(uris) == 2
    entries = json.loads((folder / "servers.json").read_text())
    kinds = sorted(entry["kind"] for entry in entries)
    assert kinds == ["postgres", "server", "server"]
    postgres = next(entry for entry in entries if entry["kind"] == "postgres")
    for uri in uris:
        with _client(uri) as client:
            client.cli_test.items.insert_one({"_id": uri})
            assert client.cli_test.items.count_documents({}) == 1  # one database per cluster
    pids = [int(entry["pid"]) for entry in entries]
    assert not any(_pid_gone(pid) for pid in pids)

    stopped = _run_cli("stop", "--dir", str(folder))
    assert stopped.returncode == 0, stopped.stderr
    assert all(_pid_gone(pid) for pid in pids)
    assert not (folder / "servers.json").exists()
    assert _pids_naming(folder, Path(postgres["data_dir"])) == []
    if postgres["temporary"]:  # root, and pytest's folder closed to the postgres user: data went to /tmp
        assert not Path(postgres["data_dir"]).exists()
    again = _run_cli("stop", "--dir", str(folder))
    assert again.returncode == 1 and "nothing was started there" in again.stderr


def test_sqlite_backend_when_asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """FEED_TEST_BACKEND=ferretdb-sqlite selects FerretDB's SQLite handler; `ferretdb` is its alias."""
    assert LocalClusters(1, backend="ferretdb").backend == "ferretdb-sqlite"
    monkeypatch.setenv("FEED_TEST_BACKEND", "ferretdb-sqlite")
    with LocalClusters(1, base_dir=tmp_path) as clusters:
        assert clusters.backend == "ferretdb-sqlite" and clusters.postgres is None
        assert clusters.server_description == f"FerretDB {FERRETDB_VERSION} (SQLite)"
        server = clusters.servers[0]
        assert "--handler=sqlite" in _cmdline(server.pid)
        clusters.create_user("feed", "anything")  # SQLite accepts any PLAIN credentials
        host = server.uri.removeprefix("mongodb://")
        with _client(f"mongodb://feed:whatever@{host}/?authMechanism=PLAIN") as client:
            client.sqlite_test.items.insert_one({"_id": 1})
        server.kill()
        server.restart()
        with _client(server.uri) as client:
            assert client.sqlite_test.items.find_one({"_id": 1}) == {"_id": 1}
        assert list(server.data_dir.glob("sqlite_test*.sqlite"))  # the data is SQLite files
    assert _pids_naming(tmp_path) == []


def _redis(port: int, *command: str) -> bytes:
    """Send one command in RESP; return a simple reply's line (``+OK``, ``:2``) or a bulk string's data."""
    request = f"*{len(command)}\r\n".encode() + b"".join(
        f"${len(part.encode())}\r\n".encode() + part.encode() + b"\r\n" for part in command
    )
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock, sock.makefile("rb") as replies:
        sock.sendall(request)
        line = replies.readline().rstrip(b"\r\n")
        if line.startswith(b"$") and line != b"$-1":
            return replies.read(int(line[1:]) + 2)[:-2]
        return line


def test_local_redis_keeps_data_across_a_kill(tmp_path: Path) -> None:
    """LocalRedis answers PING; after SIGKILL a restart on the same port still has what was written."""
    with LocalRedis(base_dir=tmp_path / "redis") as broker:
        port = broker.port
        assert broker.url == f"redis://127.0.0.1:{port}/0"
        assert _redis(port, "PING") == b"+PONG"
        assert _redis(port, "SET", "greeting", "hello world") == b"+OK"
        assert _redis(port, "RPUSH", "queue", "job-1", "job-2") == b":2"
        broker.kill()
        assert not broker.alive
        with pytest.raises(OSError):
            _redis(port, "PING")
        broker.restart()
        assert broker.alive and broker.port == port
        assert _redis(port, "GET", "greeting") == b"hello world"
        assert _redis(port, "LPOP", "queue") == b"job-1"
        broker.pause()
        broker.resume()
        assert _redis(port, "PING") == b"+PONG"
        pid = broker.pid
    assert pid is not None and _pid_gone(pid)
    assert not broker.alive
    assert _pids_naming(tmp_path) == []


@pytest.mark.parametrize("damage", ["missing", "altered"])
def test_ferretdb2_build_names_a_missing_or_altered_archive(tmp_path: Path, damage: str) -> None:
    """Before building, scripts/build-ferretdb2 checks each pinned archive and names the one missing or altered."""
    vendor = tmp_path / "vendor"
    vendor.mkdir()
    if damage == "altered":
        for name in ("documentdb-ferretdb-3f80da90.tar.gz", "pgvector-0.8.0.tar.gz", "pg_cron-1.6.4.tar.gz"):
            (vendor / name).write_bytes(b"not the pinned archive")
    env = {**os.environ, "FEEDROUTER_VENDOR": str(vendor), "FEEDROUTER_CACHE": str(tmp_path / "cache")}
    result = subprocess.run([str(REPO / "scripts" / "build-ferretdb2")], capture_output=True, text=True, env=env,
                            timeout=120, check=False)
    assert result.returncode == 1 and result.stdout == ""
    archive = vendor / "documentdb-ferretdb-3f80da90.tar.gz"
    if damage == "missing":
        assert f"{archive} is missing: put the pinned archive there" in result.stderr
    else:
        assert f"{archive} has SHA-256 " in result.stderr and "replace it with the pinned archive" in result.stderr
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").glob("ferretdb-*/.complete"))


def test_ferretdb2_build_without_a_vendor_folder_says_where_archives_go(tmp_path: Path) -> None:
    """With no $FEEDROUTER_VENDOR and nothing built, the build stops and says which variable to set."""
    env = {k: v for k, v in os.environ.items() if k != "FEEDROUTER_VENDOR"}
    env["FEEDROUTER_CACHE"] = str(tmp_path / "cache")
    result = subprocess.run([str(REPO / "scripts" / "build-ferretdb2")], capture_output=True, text=True, env=env,
                            timeout=120, check=False)
    assert result.returncode == 1 and "FEEDROUTER_VENDOR is not set" in result.stderr


def test_children_of_lists_a_process_children_only() -> None:
    """harness.process.children_of (what LocalPostgres.stop kills after the postmaster, should a backend outlive it)."""
    from harness.process import children_of

    shell = subprocess.Popen(["sh", "-c", "sleep 30 & sleep 30 & wait"])
    try:
        deadline = time.monotonic() + 10
        while len(kids := children_of(shell.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(kids) == 2 and all("sleep" in _cmdline(pid) for pid in kids)
        assert shell.pid in children_of(os.getpid())
    finally:
        for pid in children_of(shell.pid):
            os.kill(pid, 9)
        shell.wait(timeout=10)
    assert children_of(shell.pid) == []
