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
from pathlib import Path
from typing import Any

import pytest
from pymongo import MongoClient

from router.testing.localservers import LocalClusters

REPO = Path(__file__).resolve().parents[2]


def run(*cmd: str | Path, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with the wheel of this checkout installed; returns its bin folder."""
    root = tmp_path_factory.mktemp("wheel")
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
    assert sorted(d["_id"] for d in db.migrations.find({})) == ["0001_feed_indexes", "0002_outbox_and_social", "0003_edit_fence"]
    assert db.metadata.find_one({"_id": "only"})["creator_name"] == "wheel"
    assert {"receiver_time_id", "data_key_id"} <= set(db.feed.index_information())
