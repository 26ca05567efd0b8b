"""FerretDB for the local servers: the pinned release, built from its Go module, and its command lines.

FerretDB speaks the MongoDB wire protocol over a SQL engine. The local servers run
release v1.24.2 with one of two of its handlers: ``sqlite`` (one folder of SQLite files per
cluster, nothing else to install) or ``postgresql`` (one database of a local PostgreSQL
per cluster; see :mod:`harness.postgres`). The binary is built once from the module
source into a cache folder, because ``go install`` of that release gives a binary that
panics at start (FerretDB issue #2982: ``build/version/version.txt`` is not in the module).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from .errors import HarnessError
from .process import build_once, tail

__all__ = [
    "CACHE_ENV",
    "FERRETDB_VERSION",
    "cache_dir",
    "ensure_ferretdb",
    "ferretdb_command",
]

logger = logging.getLogger(__name__)

FERRETDB_VERSION = "v1.24.2"
"""The FerretDB release built and run by the ``ferretdb-*`` backends."""

FERRETDB_MODULE = "github.com/FerretDB/FerretDB"

CACHE_ENV = "FEEDROUTER_CACHE"

def cache_dir() -> Path:
    """Return the folder, outside any checkout, where built servers are kept (shared by every checkout).

    ``$FEEDROUTER_CACHE`` if set; else ``/var/cache/feed-router`` as root (PostgreSQL's own
    user, which runs the ``ferretdb2`` servers, must read it; ``/root`` is closed to it);
    else ``${XDG_CACHE_HOME:-~/.cache}/feed-router``. ``scripts/build-ferretdb2`` uses the same rule.

    Example::

        >>> cache_dir()  # doctest: +SKIP
        PosixPath('/var/cache/feed-router')
    """
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env).expanduser()
    if os.geteuid() == 0:
        return Path("/var/cache/feed-router")
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "feed-router"


def ensure_ferretdb(*, cache: Path | None = None) -> Path:
    """Return the path of a working FerretDB binary, building it first if it is missing.

    The binary lives at ``<cache>/ferretdb-v1.24.2/ferretdb``. Building needs the Go
    toolchain and the Go module proxy, takes about a minute, and is guarded by a file lock
    so concurrent callers build it once.

    Example::

        >>> ensure_ferretdb()  # doctest: +SKIP
        PosixPath('/var/cache/feed-router/ferretdb-v1.24.2/ferretdb')
    """
    cache = cache_dir() if cache is None else cache
    binary = cache / f"ferretdb-{FERRETDB_VERSION}" / "ferretdb"
    built = build_once(
        cache / f"ferretdb-{FERRETDB_VERSION}.lock",
        built=lambda: _ferretdb_works(binary),
        build=lambda: _build_ferretdb(binary, cache=cache),
    )
    if built and not _ferretdb_works(binary):
        raise HarnessError(
            f"built {binary} but `{binary} --version` does not report {FERRETDB_VERSION}"
        )
    return binary


def _ferretdb_works(binary: Path) -> bool:
    if not binary.is_file():
        return False
    try:
        result = subprocess.run(
            [str(binary), "--version"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        logger.warning("cannot run %s --version: %s", binary, exc)
        return False
    if result.returncode != 0 or FERRETDB_VERSION not in result.stdout:
        logger.warning(
            "%s --version gave exit code %s and no %s; rebuilding",
            binary,
            result.returncode,
            FERRETDB_VERSION,
        )
        return False
    return True


def _go_executable() -> str:
    found = shutil.which("go")
    if found:
        return found
    fallback = Path("/usr/local/go/bin/go")
    if fallback.is_file():
        return str(fallback)
    raise HarnessError(
        "the Go toolchain (`go`) is not on PATH; it is needed to build FerretDB "
        f"{FERRETDB_VERSION} (or install mongod, or set $FEED_TEST_BACKEND=docker)"
    )


def _build_ferretdb(binary: Path, *, cache: Path) -> None:
    go = _go_executable()
    env = dict(os.environ)
    env.update(
        GOTOOLCHAIN="local",
        GOFLAGS="-buildvcs=false",
        GOWORK="off",
        CGO_ENABLED="0",  # the SQLite handler is pure Go; no C compiler needed
    )
    logger.info("building FerretDB %s into %s (about a minute, once)", FERRETDB_VERSION, binary)
    download = subprocess.run(
        [go, "mod", "download", "-json", f"{FERRETDB_MODULE}@{FERRETDB_VERSION}"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    try:
        info: dict[str, Any] = json.loads(download.stdout)
    except json.JSONDecodeError:
        info = {}
    if download.returncode != 0 or "Dir" not in info or info.get("Error"):
        detail = info.get("Error") or tail(download.stderr + download.stdout)
        raise HarnessError(
            f"`go mod download {FERRETDB_MODULE}@{FERRETDB_VERSION}` failed "
            f"(exit code {download.returncode}):\n{detail}"
        )
    commit = str(info.get("Origin", {}).get("Hash", ""))

    binary.parent.mkdir(parents=True, exist_ok=True)
    partial = binary.parent / f".ferretdb.{os.getpid()}.tmp"
    workdir = Path(tempfile.mkdtemp(prefix="ferretdb-build-", dir=cache))
    try:
        source = workdir / "src"
        shutil.copytree(info["Dir"], source, symlinks=True)
        _make_writable(source)
        version_dir = source / "build" / "version"
        version_dir.mkdir(parents=True, exist_ok=True)
        (version_dir / "version.txt").write_text(FERRETDB_VERSION + "\n")
        if commit:
            (version_dir / "commit.txt").write_text(commit + "\n")
        try:
            build = subprocess.run(
                [go, "build", "-trimpath", "-o", str(partial), "./cmd/ferretdb"],
                cwd=source,
                capture_output=True,
                text=True,
                env=env,
                check=False,
                timeout=1800,
            )
        except subprocess.TimeoutExpired as exc:
            raise HarnessError("`go build` of FerretDB took more than 30 minutes") from exc
        if build.returncode != 0:
            raise HarnessError(
                f"`go build ./cmd/ferretdb` failed (exit code {build.returncode}):\n"
                + tail(build.stderr + build.stdout)
            )
        os.replace(partial, binary)
    finally:
        _make_writable(workdir)
        shutil.rmtree(workdir, ignore_errors=True)
        partial.unlink(missing_ok=True)
    logger.info("built %s", binary)


def _make_writable(root: Path) -> None:
    """``chmod -R u+w``: the Go module cache is read-only."""
    for folder, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            path = os.path.join(folder, name)
            if not os.path.islink(path):
                os.chmod(path, os.stat(path).st_mode | 0o200)
    if root.exists():
        os.chmod(root, os.stat(root).st_mode | 0o700)


def ferretdb_command(
    binary: Path,
    *,
    port: int,
    state_dir: Path,
    sqlite_dir: Path | None = None,
    postgresql_url: str | None = None,
) -> list[str]:
    """The command line of one FerretDB process on 127.0.0.1:``port``.

    Give exactly one of ``sqlite_dir`` (the ``sqlite`` handler keeps one file per
    database there) or ``postgresql_url`` (the ``postgresql`` handler; every MongoDB
    database becomes a schema of that PostgreSQL database). The flag names are those of
    v1.24.2's ``cmd/ferretdb/main.go``: ``--handler`` (``postgresql`` or ``sqlite``),
    ``--postgresql-url``, ``--sqlite-url``, ``--listen-addr``, ``--state-dir``,
    ``--debug-addr`` (``-`` turns the HTTP debug listener off), ``--telemetry``, ``--log-level``.

    Example::

        >>> ferretdb_command(Path("ferretdb"), port=27018, state_dir=Path("/d"),
        ...                  postgresql_url="postgres://postgres@127.0.0.1:5433/c1")[:3]
        ['ferretdb', '--handler=postgresql', '--postgresql-url=postgres://postgres@127.0.0.1:5433/c1']
    """
    if (sqlite_dir is None) == (postgresql_url is None):
        raise ValueError("give exactly one of sqlite_dir and postgresql_url")
    if postgresql_url is not None:
        handler = ["--handler=postgresql", f"--postgresql-url={postgresql_url}"]
    else:
        # the trailing slash makes the SQLite URI a folder
        handler = ["--handler=sqlite", f"--sqlite-url=file:{sqlite_dir}/"]
    return [
        str(binary),
        *handler,
        f"--listen-addr=127.0.0.1:{port}",
        f"--state-dir={state_dir}",
        "--debug-addr=-",
        "--telemetry=disable",
        "--log-level=warn",
    ]
