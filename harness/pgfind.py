"""Finding a PostgreSQL installation: the newest folder holding its server programs.

Debian's packages put each major version in ``/usr/lib/postgresql/N/bin`` and leave only
the client on PATH, so both places are searched.
"""

from __future__ import annotations

import functools
import glob
import logging
import os
import re
import shutil
import subprocess
from pathlib import Path

import attrs

from .errors import HarnessError

__all__ = ["SEARCH_GLOB", "PostgresBinaries", "find_postgres", "is_program", "server_version"]

logger = logging.getLogger(__name__)

SEARCH_GLOB = "/usr/lib/postgresql/*/bin"
"""Where Debian and Ubuntu install each PostgreSQL major version (not on PATH)."""

_SERVER_PROGRAMS = ("initdb", "pg_ctl", "postgres")


@attrs.frozen
class PostgresBinaries:
    """One PostgreSQL installation: its server programs, its client and its version.

    Example::

        >>> find_postgres()  # doctest: +SKIP
        PostgresBinaries(bin_dir=PosixPath('/usr/lib/postgresql/15/bin'), version='15.18')
    """

    bin_dir: Path
    version: str
    """``major.minor`` as ``postgres --version`` reports it, e.g. ``15.18``."""

    @property
    def initdb(self) -> Path:
        """The ``initdb`` program."""
        return self.bin_dir / "initdb"

    @property
    def postgres(self) -> Path:
        """The server program."""
        return self.bin_dir / "postgres"

    @property
    def psql(self) -> Path:
        """The ``psql`` client: beside the server, else on PATH."""
        beside = self.bin_dir / "psql"
        if is_program(beside):
            return beside
        found = shutil.which("psql")
        if found is None:
            raise HarnessError(
                f"PostgreSQL's client `psql` is neither in {self.bin_dir} nor on PATH "
                "(Debian: apt-get install postgresql-client)"
            )
        return Path(found)

    @property
    def version_key(self) -> tuple[int, ...]:
        """The version as numbers, for comparisons."""
        return tuple(int(part) for part in self.version.split("."))


def find_postgres() -> PostgresBinaries | None:
    """The newest PostgreSQL whose server programs are all found, or None.

    It looks in the folders of ``initdb``, ``pg_ctl`` and ``postgres`` on PATH (symlinks
    resolved) and in ``/usr/lib/postgresql/*/bin``; a folder counts when it holds all
    three. The answer is cached per value of PATH.

    Example::

        >>> find_postgres().version  # doctest: +SKIP
        '15.18'
    """
    return _find_postgres(os.environ.get("PATH", ""))


@functools.lru_cache(maxsize=8)
def _find_postgres(path_env: str) -> PostgresBinaries | None:
    folders: list[Path] = []
    for name in _SERVER_PROGRAMS:
        found = shutil.which(name, path=path_env)
        if found:
            folders.append(Path(found).resolve().parent)
    folders += [Path(folder) for folder in sorted(glob.glob(SEARCH_GLOB))]
    best: PostgresBinaries | None = None
    for folder in dict.fromkeys(folders):  # unique, PATH first
        if not all(is_program(folder / name) for name in _SERVER_PROGRAMS):
            continue
        version = server_version(folder / "postgres")
        if version is None:
            continue
        found_binaries = PostgresBinaries(bin_dir=folder, version=version)
        if best is None or found_binaries.version_key > best.version_key:
            best = found_binaries
    return best


def is_program(path: Path) -> bool:
    """True if *path* is a file this process may execute."""
    return path.is_file() and os.access(path, os.X_OK)


def server_version(postgres: Path) -> str | None:
    """``major.minor`` of the server program *postgres* (``15.18``), or None if it does not run."""
    try:
        result = subprocess.run(
            [str(postgres), "--version"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        logger.debug("cannot run %s --version: %s", postgres, exc)
        return None
    match = re.search(r"\(PostgreSQL\) (\d+(?:\.\d+)?)", result.stdout)
    return match.group(1) if match else None
