"""Versioned, idempotent schema migrations, applied per cluster and recorded in it.

Migrations are Python files named ``NNNN_description.py`` in the ``migrations/``
folder, applied in number order. Each defines ``apply(ctx: MigrationContext)``,
with a module docstring that says what it does. They are applied to one cluster at
a time. Each one applied is recorded in that cluster's ``migrations`` collection
as ``{_id, applied_at, checksum, description}``, where ``checksum`` is the SHA-256
of the file. So:

* a re-run applies nothing;
* a file changed after it was applied is refused (write a new migration instead);
* a cluster that records a migration this code does not have is refused (the
  cluster is newer than the code).

Every step goes through :class:`MigrationContext`, so ``--dry-run`` prints the
exact commands without sending them, and MongoDB-only steps check
:class:`~router.clusters.Capabilities` first and say when they are skipped.

**Feed indexes are the layout's.** A period's ``feed`` indexes are those its layout lists
(:meth:`~router.core.layouts.Layout.indexes`), created when the period is added
(:func:`~router.admin.indexes.create_feed_indexes`). The shipped migrations' feed-index
steps (0001's ``receiver_time_id`` and ``data_key``, 0002's ``data_key_id``) predate that:
the context notes them as superseded and creates nothing (a ``buckets`` period would not
use them), and drops only an index that exists (0002's ``data_key``, left by an 0001
applied earlier). After the migrations, the indexes of the period the cluster holds are
created where missing, so a cluster migrated across that change keeps every index its
layout needs. The files themselves are unchanged: their checksums hold.

Example::

    migrations = discover()
    report = migrate_cluster(cluster, config, migrations, dry_run=True)
    print(report.steps)
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import re
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from types import ModuleType
from typing import Any

import attrs
from pymongo.errors import PyMongoError

from ..config import RouterConfig
from ..core.layouts import DEFAULT, LAYOUTS
from ..errors import MigrationError
from ..storage import finds
from ..storage.clusters import Capabilities, Cluster
from .indexes import create_feed_indexes

__all__ = ["Migration", "MigrationContext", "MigrationReport", "discover", "default_folder", "migrate_cluster", "MIGRATIONS_COLLECTION"]

log = logging.getLogger(__name__)
#: Where each cluster records the migrations applied to it.
MIGRATIONS_COLLECTION = "migrations"
_FILE = re.compile(r"^(\d{4})_[a-z0-9_]+\.py$")


def default_folder() -> Path:
    """Where the migrations are: ``$FEEDROUTER_MIGRATIONS``, else the package ``router.migrations``.

    An installed wheel carries them as ``router/migrations``; an editable install maps that
    package to the repository's top-level ``migrations/`` folder, which is also used when the
    package runs straight from a checkout (``PYTHONPATH=.``).
    """
    env = os.environ.get("FEEDROUTER_MIGRATIONS")
    if env:
        return Path(env)
    try:
        spec = importlib.util.find_spec("router.migrations")
    except ImportError:
        spec = None
    if spec is not None and spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations)))
    return Path(__file__).resolve().parents[2] / "migrations"


@attrs.frozen
class Migration:
    """One migration file: its id (the file name without ``.py``), path and checksum."""

    id: str
    path: Path
    checksum: str
    description: str

    def load(self) -> ModuleType:
        """Import the file as a module and check that it defines ``apply``."""
        spec = importlib.util.spec_from_file_location(f"feedrouter_migration_{self.id}", self.path)
        if spec is None or spec.loader is None:
            raise MigrationError(f"migration {self.id}: cannot be loaded from {self.path}")
        module = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(module)
        except Exception as exc:
            raise MigrationError(f"migration {self.id}: failed to import: {type(exc).__name__}: {exc}") from exc
        if not callable(getattr(module, "apply", None)):
            raise MigrationError(f"migration {self.id}: defines no apply(ctx) function")
        return module


def discover(folder: Path | None = None) -> list[Migration]:
    """Every migration in *folder* (default :func:`default_folder`), in order.

    Raises :class:`MigrationError` for a missing folder, a misnamed file or a
    number used twice.
    """
    folder = folder or default_folder()
    if not folder.is_dir():
        raise MigrationError(f"migrations folder {folder} not found (set FEEDROUTER_MIGRATIONS)")
    found: list[Migration] = []
    numbers: dict[str, str] = {}
    for path in sorted(folder.glob("*.py")):
        if path.name == "__init__.py":
            continue
        m = _FILE.match(path.name)
        if m is None:
            raise MigrationError(f"migration file {path.name}: must be named NNNN_lowercase_words.py")
        if m.group(1) in numbers:
            raise MigrationError(f"migration number {m.group(1)} used twice: {numbers[m.group(1)]} and {path.name}")
        numbers[m.group(1)] = path.name
        data = path.read_bytes()
        doc = re.search(rb'^\s*"""(.*?)(?:\n|""")', data, re.S)
        description = doc.group(1).decode("utf-8", "replace").strip() if doc else ""
        found.append(Migration(path.stem, path, hashlib.sha256(data).hexdigest(), description))
    return found


@attrs.define
class MigrationContext:
    """What a migration sees: the cluster, the config, the server's capabilities.

    ``config.database`` is the cluster's own database (:meth:`RouterConfig.database_for`),
    so a migration that names ``config.database`` works on the cluster's period wherever
    it lives. Every change goes through :meth:`command`, :meth:`create_index` or
    :meth:`create_collection`; in a dry run they only record what they would do.
    ``steps`` lists each step as a line of text.
    """

    cluster: Cluster
    config: RouterConfig
    capabilities: Capabilities
    dry_run: bool = False
    steps: list[str] = attrs.field(factory=list)
    commands: list[tuple[str, dict[str, Any]]] = attrs.field(factory=list)

    def note(self, text: str) -> None:
        """Record something the migration decided (e.g. a skipped MongoDB-only step)."""
        self.steps.append(text)
        log.info("cluster %s: %s", self.cluster.name, text)

    def command(self, database: str, command: dict[str, Any]) -> None:
        """Run a database command (recorded, and only recorded in a dry run); a ``dropIndexes`` of an index that is
        not there is noted instead."""
        if "dropIndexes" in command and not self._has_index(database, command["dropIndexes"], command.get("index")):
            self.note(f"index {command.get('index')} absent on {command['dropIndexes']}: nothing to drop")
            return
        self.commands.append((database, command))
        self.note(f"{'would run' if self.dry_run else 'run'} on {database}: {command}")
        if not self.dry_run:
            try:
                self.cluster.client[database].command(command)
            except PyMongoError as exc:
                raise self.cluster.error(exc, doing=f"command {next(iter(command))}") from exc

    def create_collection(self, name: str) -> None:
        """Create *name* in the feed database unless it exists."""
        db = self.cluster.db
        try:
            exists = name in db.list_collection_names(filter={"name": name})
        except PyMongoError as exc:
            raise self.cluster.error(exc, doing="listing collections") from exc
        if exists:
            self.note(f"collection {name} exists")
            return
        self.command(self.cluster.database, {"create": name})

    def _has_index(self, database: str, collection: str, name: Any) -> bool:
        coll = self.cluster.client[database][collection]
        names = self.cluster.call("listing indexes", lambda: [i["name"] for i in coll.list_indexes()])
        return name in names

    def create_index(self, collection: str, keys: Sequence[tuple[str, int | str]], *, name: str) -> None:
        """Create an index (a no-op on the server when it exists with the same spec). On the feed collection, noted
        as superseded instead: a period's feed indexes are its layout's (see the module's docstring)."""
        if collection == self.config.feed_collection:
            self.note(f"index {name} on {collection}: superseded: a period's feed indexes are its layout's, created "
                      "with the period")
            return
        self.command(
            self.cluster.database,
            {"createIndexes": collection, "indexes": [{"key": dict(keys), "name": name}]},
        )


@attrs.frozen
class MigrationReport:
    """What :func:`migrate_cluster` did (or would do) on one cluster."""

    cluster: str
    applied: tuple[str, ...]
    already: tuple[str, ...]
    steps: tuple[str, ...]
    dry_run: bool


def applied_migrations(cluster: Cluster, config: RouterConfig) -> dict[str, dict[str, Any]]:
    """The migrations recorded in *cluster*, by id."""
    coll = cluster.db[MIGRATIONS_COLLECTION]
    return cluster.call("reading migrations", lambda: {d["_id"]: d for d in finds.read(coll, {})})


def migrate_cluster(
    cluster: Cluster, config: RouterConfig, migrations: Sequence[Migration], *, dry_run: bool = False
) -> MigrationReport:
    """Apply every pending migration to *cluster*, in order, recording each.

    Raises :class:`MigrationError` when an applied migration's file changed or is
    unknown here, and :class:`~router.errors.ClusterUnavailable` when the cluster
    fails; migrations recorded before a failure stay recorded.
    """
    done = applied_migrations(cluster, config)
    known = {m.id: m for m in migrations}
    for mid, record in sorted(done.items()):
        if mid not in known:
            raise MigrationError(
                f"cluster {cluster.name!r}: has migration {mid} applied, which this code does not have; "
                "upgrade feed-router before migrating"
            )
        if record.get("checksum") != known[mid].checksum:
            raise MigrationError(
                f"cluster {cluster.name!r}: migration {mid} was changed after it was applied "
                f"(recorded checksum {str(record.get('checksum'))[:12]}, file now {known[mid].checksum[:12]}); "
                "leave applied migrations as they are and add a new one"
            )
    pending = [m for m in migrations if m.id not in done]
    steps: list[str] = []
    caps = cluster.capabilities()
    ctx = MigrationContext(cluster, attrs.evolve(config, database=cluster.database), caps, dry_run=dry_run)
    coll = cluster.db[MIGRATIONS_COLLECTION]
    for migration in pending:
        module = migration.load()
        ctx.note(f"{'would apply' if dry_run else 'applying'} {migration.id}: {migration.description}")
        module.apply(ctx)
        if not dry_run:
            record = {
                "_id": migration.id,
                "applied_at": datetime.now(timezone.utc),
                "checksum": migration.checksum,
                "description": migration.description,
            }
            try:
                coll.replace_one({"_id": migration.id}, record, upsert=True)
            except PyMongoError as exc:
                raise cluster.error(exc, doing=f"recording migration {migration.id}") from exc
    steps = ctx.steps + _period_indexes(cluster, dry_run=dry_run)
    return MigrationReport(
        cluster=cluster.name,
        applied=tuple(m.id for m in pending),
        already=tuple(sorted(done)),
        steps=tuple(steps),
        dry_run=dry_run,
    )


def _period_indexes(cluster: Cluster, *, dry_run: bool) -> list[str]:
    """Create the feed indexes missing for the period *cluster* holds (none without a period, or in a layout this
    code does not know: its operations fail naming it)."""
    own = [d for d in cluster.metadata_documents() if d.get("_id") == cluster.name]
    layout = LAYOUTS.get(str(own[0].get("layout", DEFAULT))) if own else None
    return create_feed_indexes(cluster, layout, dry_run=dry_run) if layout is not None else []
