"""The package as a user gets it: a wheel built from this checkout, pip-installed into a fresh venv.

The fresh venv installs the wheel and its dependencies with pip, and the commands run
from an empty folder with no PYTHONPATH and no FEEDROUTER_MIGRATIONS, so nothing can come
from the checkout. They talk to one of the session's real servers.
"""

from __future__ import annotations

import os
import subprocess
import sys
import venv
import zipfile
from pathlib import Path
from typing import Any

import pytest
from pymongo import MongoClient

from router.admin.migrate import discover
from harness.localservers import LocalClusters

REPO = Path(__file__).resolve().parents[2]


def run(*cmd: str | Path, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module")
def wheel_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("wheel")


@pytest.fixture(scope="module")
def installed(wheel_root: Path) -> Path:
    """A fresh venv with the wheel of this checkout installed; returns its bin folder."""
    root = wheel_root
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "FEEDROUTER_MIGRATIONS", "VIRTUAL_ENV")}
    built = run(sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", root / "dist", REPO, cwd=root, env=env)
    assert built.returncode == 0, built.stderr
    (wheel,) = (root / "dist").glob("feed_router-*.whl")
    venv.create(root / "venv", with_pip=True)
    pip = run(root / "venv" / "bin" / "python", "-m", "pip", "install", "-q", "--disable-pip-version-check", wheel,
              cwd=root, env=env)
    assert pip.returncode == 0, pip.stderr
    return root / "venv" / "bin"


def test_installed_wheel_migrates_adds_clusters_and_checks(
    installed: Path, servers: LocalClusters, raw_clients: dict[str, MongoClient[dict[str, Any]]], db_name: str,
    tmp_path: Path,
) -> None:
    """migrate, add-cluster and check work from the wheel alone: the migrations ship inside it."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "FEEDROUTER_MIGRATIONS", "VIRTUAL_ENV")}
    config = tmp_path / "clusters.yaml"
    config.write_text(f"database: {db_name}\nclusters:\n  - name: only\n    uri: {servers.uris[0]}\n")
    where = run(installed / "python", "-c", "import router, router.admin.migrate as m; print(router.__file__); print(m.default_folder())",
                cwd=tmp_path, env=env)
    assert where.returncode == 0, where.stderr
    module, folder = where.stdout.split()
    assert str(installed.parent) in module and str(REPO) not in module
    assert folder.endswith("site-packages/router/migrations")
    feedrouter = installed / "feedrouter"
    migrate = run(feedrouter, "-c", config, "migrate", cwd=tmp_path, env=env)
    assert migrate.returncode == 0, migrate.stderr
    add = run(feedrouter, "-c", config, "add-cluster", "only", "--start", "2024-01-01", "--force", "--creator", "wheel",
              cwd=tmp_path, env=env)
    assert add.returncode == 0, add.stderr
    check = run(feedrouter, "-c", config, "check", cwd=tmp_path, env=env)
    assert check.returncode == 0, check.stdout + check.stderr
    assert check.stdout.rstrip().endswith("ok") and "[2024-01-01T00:00:00Z, open)" in check.stdout
    db = raw_clients["cluster_1"][db_name]
    assert sorted(d["_id"] for d in db.migrations.find({})) == [m.id for m in discover()]
    assert db.metadata.find_one({"_id": "only"})["creator_name"] == "wheel"
    assert {"receiver_time_id", "data_key_id"} <= set(db.feed.index_information())


def test_the_wheel_holds_the_library_and_no_lab(installed: Path, wheel_root: Path) -> None:
    """The wheel holds router/ only: no harness, benchmark, demo, server launcher or Maven POM; router.testing holds the
    scripted store alone; every installed module imports without the checkout."""
    (wheel,) = (wheel_root / "dist").glob("feed_router-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        code = "\n".join(archive.read(n).decode() for n in names if n.endswith(".py"))
    packages = {n.split("/")[0] for n in names if not n.startswith("feed_router-")}
    assert packages == {"router"}, packages
    assert sorted(n for n in names if n.startswith("router/testing/")) == ["router/testing/__init__.py",
                                                                           "router/testing/scripted.py"]
    for lab in ("harness", "bench", "demo", "javaserver", "localservers", "ferretdb", "postgres", "redis"):
        assert not any(lab in n for n in names), (lab, [n for n in names if lab in n])
    for marker in ("<groupId>", "MemoryBackend", "go install", "initdb", "import harness", "from harness"):
        assert marker not in code, marker
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "FEEDROUTER_MIGRATIONS", "VIRTUAL_ENV")}
    modules = sorted(n[:-3].replace("/", ".").removesuffix(".__init__") for n in names
                     if n.endswith(".py") and n.startswith("router/") and "/migrations/" not in n
                     and not n.endswith("__main__.py"))
    script = (
        "import importlib, sys\n"
        f"for m in {modules!r}:\n"
        "    try:\n"
        "        importlib.import_module(m)\n"
        "    except ImportError as e:  # an optional extra (celery, prometheus, otel) the base install lacks\n"
        "        if e.name is None or e.name.split('.')[0] not in ('celery', 'kombu', 'prometheus_client', 'opentelemetry'):\n"
        "            raise\n"
        "print(any(m == 'harness' or m.startswith('harness.') for m in sys.modules))\n"
    )
    imported = run(installed / "python", "-c", script, cwd=wheel_root, env=env)
    assert imported.returncode == 0, imported.stderr
    assert imported.stdout.strip() == "False"
