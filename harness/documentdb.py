"""FerretDB 2 on DocumentDB, the default local server: where its build lives and how one cluster of it runs.

FerretDB 2 keeps no storage of its own: it translates the wire protocol for DocumentDB,
a PostgreSQL extension (the engine of Azure Cosmos DB for MongoDB vCore). One cluster is
one PostgreSQL 15 server with the extension created in its ``postgres`` database, and one
``ferretdb`` process in front of it. Each cluster needs a server of its own: pg_cron, which
DocumentDB requires, schedules jobs only from one database per server.

``scripts/build-ferretdb2`` builds everything once into a cache folder outside the
checkout, named by every version in it: a private copy of the machine's PostgreSQL 15 with
pgvector, pg_cron and DocumentDB installed into it (PostgreSQL finds its ``lib/`` and
``share/`` relative to its own binary, so nothing is installed into the system's
PostgreSQL) and the ``ferretdb`` binary. Three of its sources come from no package
registry; the folder holding their pinned archives is named by ``$FEEDROUTER_VENDOR``.

Authentication: the server runs with ``--no-auth``, so clients without credentials are
served; a client that sends credentials is still checked (SCRAM-SHA-256) against the
users made with ``createUser`` (:meth:`LocalClusters.create_user`), and PLAIN is refused.
"""

from __future__ import annotations

import logging
import subprocess
from collections.abc import Iterable
from pathlib import Path

import attrs

from .errors import HarnessError
from .pgfind import PostgresBinaries, server_version
from .postgres import LocalPostgres, quote_literal
from .process import tail

__all__ = [
    "DOCUMENTDB_SETTINGS",
    "DOCUMENTDB_VERSION",
    "FERRETDB2_VERSION",
    "VENDOR_ENV",
    "DocumentDBTree",
    "ensure_ferretdb2",
    "ferretdb2_command",
    "vacuum_collection",
]

logger = logging.getLogger(__name__)

FERRETDB2_VERSION = "v2.7.0"
"""The FerretDB release the ``ferretdb2`` backend runs."""

DOCUMENTDB_VERSION = "0.107-0"
"""The DocumentDB extension version FerretDB v2.7.0 expects (FerretDB's fork, commit 3f80da90)."""

VENDOR_ENV = "FEEDROUTER_VENDOR"
"""Names the folder holding the pinned source archives the build needs (see ``scripts/build-ferretdb2``)."""

BUILD_SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "build-ferretdb2"

DOCUMENTDB_SETTINGS = {
    "shared_preload_libraries": "pg_cron,pg_documentdb_core,pg_documentdb",
    "cron.database_name": "postgres",
    "cron.log_run": "off",  # pg_cron would log every run of DocumentDB's 2-second jobs
    "cron.log_statement": "off",
    "log_min_messages": "warning",  # DocumentDB logs each collection it looks up at LOG
    # A collection PostgreSQL never analyzed gets plans that scan it whole: from about 164,000 buckets until the first
    # autoanalyze (up to a minute later at the default naptime), each upsert of a buckets append walked the _id index
    # (measured: 39 s per 1,000 appends instead of 0.45 s). Tests fill new collections within seconds; see servers.md.
    "autovacuum_naptime": "1s",
    # ... but autovacuum only analyzes: RUM 1.3.13 (every DocumentDB index but _id) can leave a posting tree whose
    # pages VACUUM deleted reachable, and a later insert or VACUUM then loops for good (servers.md). Tests that need the
    # space of dead versions freed VACUUM the one collection themselves (LocalClusters.vacuum).
    "autovacuum_vacuum_threshold": "2000000000",
    "autovacuum_vacuum_insert_threshold": "-1",
    # Test speed (measured with DOCUMENTDB_SETUP in docs/servers.md): no JIT compiling of plans over large
    # collections, and documents too large to keep inline compressed with lz4, not pglz (pglz_decompress was 4% of
    # the suite's CPU: buckets are large documents).
    "jit": "off",
    "default_toast_compression": "lz4",
}
"""The PostgreSQL settings DocumentDB needs, besides the harness's own (port, test-speed settings)."""

DOCUMENTDB_SETUP = """SELECT cron.alter_job(jobid, schedule => '30 seconds') FROM cron.job
WHERE command LIKE '%build_index_concurrently%';
CREATE FUNCTION public.feedrouter_unlogged_collections() RETURNS event_trigger LANGUAGE plpgsql AS $$
DECLARE created record;
BEGIN
    FOR created IN SELECT objid FROM pg_event_trigger_ddl_commands()
                   WHERE command_tag = 'CREATE TABLE' AND schema_name = 'documentdb_data' LOOP
        IF (SELECT relpersistence FROM pg_class WHERE oid = created.objid) = 'p' THEN
            EXECUTE format('ALTER TABLE %s SET UNLOGGED', created.objid::regclass);
        END IF;
    END LOOP;
END $$;
CREATE EVENT TRIGGER feedrouter_unlogged_collections ON ddl_command_end WHEN TAG IN ('CREATE TABLE')
    EXECUTE FUNCTION public.feedrouter_unlogged_collections();"""
"""Run once on a new test server, in the ``postgres`` database FerretDB uses:

* DocumentDB's two jobs that build queued indexes run every 30 s instead of every 2 s. Each run is a new PostgreSQL
  connection (a forked backend); at 2 s the two cost an idle server 1.6% of a core, and the suite runs six servers at
  once. FerretDB builds indexes in its own request (100,000 documents: 0.45 s, no job), so the jobs find nothing queued.
* Every collection's table (and so its indexes) is made ``UNLOGGED`` as DocumentDB creates it (an event trigger): no
  write-ahead log for the documents. RUM, DocumentDB's index, logs each page it changes as a generic WAL record, whose
  page diffing was 18% of PostgreSQL's CPU in a fan-out; three fan-outs of 20,000 copies took PostgreSQL 21.6 and 20.5
  CPU-s logged, 11.9 and 16.7 unlogged (the fan-outs 3.7-4.3 s against 2.0-3.3 s). An unlogged table keeps its rows
  through a clean stop (the harness stops PostgreSQL with a fast shutdown, and kills and restarts only FerretDB) and
  loses them in a crash of PostgreSQL: a test server's, like ``fsync=off``."""


@attrs.frozen
class DocumentDBTree:
    """One build of FerretDB 2 on DocumentDB: a folder holding PostgreSQL with the extensions, and ``bin/ferretdb``.

    Example::

        >>> tree = ensure_ferretdb2()  # doctest: +SKIP
        >>> tree.binaries.version, tree.ferretdb.name  # doctest: +SKIP
        ('15.18', 'ferretdb')
    """

    root: Path

    @property
    def ferretdb(self) -> Path:
        """The FerretDB 2 binary."""
        return self.root / "bin" / "ferretdb"

    @property
    def library_path(self) -> Path:
        """PostgreSQL's library folder in the tree: ``pg_documentdb.so`` finds its core library there
        only through ``LD_LIBRARY_PATH``."""
        return self.root / "usr" / "lib" / "postgresql" / "15" / "lib"

    @property
    def binaries(self) -> PostgresBinaries:
        """The tree's own PostgreSQL programs (they find the tree's extensions)."""
        bin_dir = self.root / "usr" / "lib" / "postgresql" / "15" / "bin"
        version = server_version(bin_dir / "postgres")
        if version is None:
            raise HarnessError(f"{bin_dir / 'postgres'} does not run; remove {self.root} to rebuild it")
        return PostgresBinaries(bin_dir=bin_dir, version=version)


def ensure_ferretdb2() -> DocumentDBTree:
    """Return the built tree, building it first if it is missing (1-5 minutes, once per machine and versions).

    Runs ``scripts/build-ferretdb2``, which installs Debian's build packages as root where
    they are missing, checks the archives in ``$FEEDROUTER_VENDOR`` against their SHA-256
    sums and says which one is missing or altered, and builds under a file lock.

    Example::

        >>> ensure_ferretdb2().root.name  # doctest: +SKIP
        'ferretdb-v2.7.0-documentdb-3f80da90-pg15.18-vector0.8.0-cron1.6.4'
    """
    if not BUILD_SCRIPT.is_file():
        raise HarnessError(f"{BUILD_SCRIPT} is missing: the ferretdb2 backend needs this project's checkout")
    try:
        result = subprocess.run([str(BUILD_SCRIPT)], capture_output=True, text=True, check=False, timeout=3600)
    except subprocess.TimeoutExpired as exc:
        raise HarnessError(f"{BUILD_SCRIPT} took more than an hour") from exc
    if result.stderr.strip():
        logger.info("%s", result.stderr.strip())
    lines = result.stdout.strip().splitlines()
    if result.returncode != 0 or not lines:
        raise HarnessError(
            f"{BUILD_SCRIPT.name} failed (exit code {result.returncode}):\n" + tail(result.stderr + result.stdout)
        )
    tree = DocumentDBTree(Path(lines[-1]))
    if not tree.ferretdb.is_file():
        raise HarnessError(f"{BUILD_SCRIPT.name} printed {tree.root}, which holds no bin/ferretdb")
    return tree


def ferretdb2_command(binary: Path, *, port: int, state_dir: Path, postgresql_url: str) -> list[str]:
    """The command line of one FerretDB 2 process on 127.0.0.1:``port`` over ``postgresql_url``.

    ``--no-auth``: clients without credentials are served (see the module docstring);
    ``--debug-addr=-`` turns the HTTP debug listener off; ``--log-level=warn``, because at
    ``info`` it logs every command.

    Example::

        >>> ferretdb2_command(Path("ferretdb"), port=27018, state_dir=Path("/d"),
        ...                   postgresql_url="postgres://postgres@127.0.0.1:5433/postgres")[:2]
        ['ferretdb', '--postgresql-url=postgres://postgres@127.0.0.1:5433/postgres']
    """
    return [
        str(binary),
        f"--postgresql-url={postgresql_url}",
        f"--listen-addr=127.0.0.1:{port}",
        f"--state-dir={state_dir}",
        "--no-auth",
        "--debug-addr=-",
        "--telemetry=disable",
        "--log-level=warn",
    ]


def vacuum_collection(pg: LocalPostgres, database: str, collection: str) -> None:
    """``VACUUM`` the table DocumentDB keeps the collection *database*.*collection* in, on the PostgreSQL *pg* behind
    one cluster: the space of its dead document versions is then free for the next writes (as autovacuum makes it,
    when it chooses).

    Example::

        >>> vacuum_collection(clusters.postgres_servers[0], "feeds", "feed")  # doctest: +SKIP
    """
    found = pg.run_sql("SELECT collection_id FROM documentdb_api_catalog.collections WHERE database_name = "
                       f"{quote_literal(database)} AND collection_name = {quote_literal(collection)}")
    if not found.isdigit():
        raise HarnessError(f"vacuum: no collection {database}.{collection} on PostgreSQL port {pg.port}")
    pg.run_sql(f"VACUUM documentdb_data.documents_{found};")


def empty_database(pg: LocalPostgres, database: str, *, keep: Iterable[str] = ()) -> str:
    """Empty every collection of *database* but those in *keep*, on the PostgreSQL *pg* behind one cluster, as a new
    database is; return what the database is made of there: one line per collection (its name and options) and per
    index (its collection and its whole spec), sorted, from DocumentDB's catalog.

    One ``TRUNCATE`` of the tables DocumentDB keeps the collections in gives each table and every index on it new,
    empty files; a table whose file is empty already (never written since) is left out (truncating all ten tables of
    a registered database took 0.2-0.5 s; most tests write to one or two). A ``delete_many({})`` instead leaves each
    index its dead entries; the test pool's databases went through that hundreds of times, and an insert into such
    an index then spun in RUM for good (``docs/servers.md``, known server bugs). The catalog comes in the same
    request: the test pool compares it, instead of asking each collection for its indexes.

    Example::

        >>> print(empty_database(clusters.postgres_servers[0], "feeds", keep=["migrations"]))  # doctest: +SKIP
        collection feed ...
    """
    kept = ", ".join(quote_literal(name) for name in keep) or "NULL"
    named = quote_literal(database)
    return pg.run_sql(f"""SET lock_timeout = '30s';
DO $$
DECLARE tables text;
BEGIN
    SELECT string_agg(format('documentdb_data.%I', 'documents_' || collection_id), ', ') INTO tables
    FROM documentdb_api_catalog.collections
    WHERE database_name = {named} AND collection_name NOT IN ({kept})
      AND pg_relation_size(format('documentdb_data.%I', 'documents_' || collection_id)::regclass) > 0;
    IF tables IS NOT NULL THEN
        EXECUTE 'TRUNCATE ' || tables;
    END IF;
END
$$;
SELECT line FROM (
    SELECT concat_ws(' ', 'collection', c.collection_name, c.view_definition::text, c.validator::text,
                     c.validation_level, c.validation_action) AS line
    FROM documentdb_api_catalog.collections c WHERE c.database_name = {named}
    UNION ALL
    SELECT concat_ws(' ', 'index', c.collection_name, i.index_spec::text, i.index_is_valid::text)
    FROM documentdb_api_catalog.collections c JOIN documentdb_api_catalog.collection_indexes i USING (collection_id)
    WHERE c.database_name = {named}
) lines ORDER BY line;""")
