"""A private PostgreSQL server on loopback, the storage behind the ``ferretdb-pg`` backend.

One :class:`LocalPostgres` is one ``postgres`` process with its own data folder (made by
``initdb`` the first time), listening on 127.0.0.1 only, on a free port, with its Unix
socket inside its own folder, tuned for tests rather than durability (``fsync=off``). It
never touches a system cluster (``/var/lib/postgresql``) or port 5432.

PostgreSQL refuses to run as root. When this process is root, ``initdb`` and ``postgres``
run as the ``postgres`` system user (made by Debian's ``postgresql`` package) through
``setpriv``, which execs in place, so the pid we hold is the postmaster's; the data
folder belongs to that user. If that user cannot reach the folder asked for (pytest's
``/tmp/pytest-of-root`` is mode 0700), the data goes to a temporary folder under ``/tmp``
instead, with a symlink at the place asked for; such a folder is removed on :meth:`stop`.

Authentication: the superuser ``postgres`` is trusted on loopback (FerretDB connects as
it for clients that do not authenticate); every other role must give its password
(``scram-sha-256``), so credentials that FerretDB passes through are really checked.

Example::

    >>> pg = LocalPostgres.create(Path("/tmp/x/postgres"), log_path=Path("/tmp/x/pg.log"))  # doctest: +SKIP
    >>> pg.start(databases=["cluster_1"])  # doctest: +SKIP
    >>> pg.url("cluster_1")  # doctest: +SKIP
    'postgres://postgres@127.0.0.1:40321/cluster_1?sslmode=disable'
    >>> pg.stop()  # doctest: +SKIP
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import logging
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from urllib.parse import quote

import attrs
from pymongo.saslprep import saslprep

from .errors import HarnessError
from .pgfind import SEARCH_GLOB, PostgresBinaries, find_postgres, is_program
from .process import (DEFAULT_TIMEOUT, POLL_INTERVAL, children_of, free_ports, log_tail, pid_alive, spawn_logged,
                      stop_process, tail)

__all__ = [
    "RESERVED_DATABASES",
    "SUPERUSER",
    "LocalPostgres",
    "PostgresBinaries",
    "find_postgres",
    "scram_verifier",
]

logger = logging.getLogger(__name__)

SUPERUSER = "postgres"
"""The superuser made by ``initdb``; trusted on loopback, so it has no password."""

SYSTEM_USER = "postgres"
"""The account ``initdb`` and ``postgres`` run as when this process is root."""

RESERVED_DATABASES = frozenset({"postgres", "template0", "template1"})
"""Database names ``initdb`` makes; no cluster may use them."""

CONNECTIONS_PER_DATABASE = 100
"""Connection slots per FerretDB database: its pools hold up to 50, one pool per role."""

_SOCKET_PATH_MAX = 107  # sun_path is 108 bytes with the trailing NUL
_HBA = """\
# Written by harness.postgres on every start.
# The superuser is trusted on loopback; every other role must give its password.
local   all   {superuser}                   trust
host    all   {superuser}   127.0.0.1/32    trust
local   all   all                           scram-sha-256
host    all   all           127.0.0.1/32    scram-sha-256
"""


def scram_verifier(password: str, *, iterations: int = 4096, salt: bytes | None = None) -> str:
    """The ``SCRAM-SHA-256`` verifier PostgreSQL stores for ``password`` (RFC 5802, 7677).

    Sending this instead of the password keeps the password itself out of the server's
    logs and error messages; PostgreSQL stores a verifier it is given as it is.

    Example::

        >>> scram_verifier("pw", salt=b"0123456789abcdef")[:32]
        'SCRAM-SHA-256$4096:MDEyMzQ1Njc4O'
    """
    salt = secrets.token_bytes(16) if salt is None else salt
    try:  # as PostgreSQL's pg_saslprep: a password SASLprep refuses is used as it is
        prepared = str(saslprep(password, prohibit_unassigned_code_points=False))
    except ValueError:
        prepared = password
    salted = hashlib.pbkdf2_hmac("sha256", prepared.encode(), salt, iterations)
    client_key = hmac.digest(salted, b"Client Key", "sha256")
    stored_key = hashlib.sha256(client_key).digest()
    server_key = hmac.digest(salted, b"Server Key", "sha256")

    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode()

    return f"SCRAM-SHA-256${iterations}:{b64(salt)}${b64(stored_key)}:{b64(server_key)}"


def quote_identifier(name: str) -> str:
    """``name`` as an SQL identifier: ``"a""b"``."""
    return '"' + name.replace('"', '""') + '"'


def quote_literal(text: str) -> str:
    """``text`` as an SQL string literal (``standard_conforming_strings`` is on)."""
    return "'" + text.replace("'", "''") + "'"


@attrs.define(eq=False)
class LocalPostgres:
    """One PostgreSQL server process on loopback, with its data folder and log.

    Make it with :meth:`create`, which prepares the data folder; :meth:`start` runs
    ``initdb`` if the folder is empty, starts the server, waits until it accepts
    connections and creates the databases asked for.

    Example::

        >>> pg = LocalPostgres.create(Path("/tmp/x/postgres"), log_path=Path("/tmp/x/pg.log"))  # doctest: +SKIP
        >>> pg.start(databases=["a", "b"])  # doctest: +SKIP
        >>> pg.create_user("feed", "secret", databases=["a", "b"])  # doctest: +SKIP
        >>> pg.stop()  # doctest: +SKIP
    """

    binaries: PostgresBinaries
    data_dir: Path
    """The PostgreSQL data folder (``PGDATA``); the server's command line names it."""
    log_path: Path
    port: int
    temporary: bool = False
    """True when ``data_dir`` is a stand-in under ``/tmp`` (see the module docstring)."""
    link: Path | None = None
    """The symlink to a temporary ``data_dir``, at the place that was asked for."""
    detached: bool = attrs.field(default=False, repr=False)
    max_connections: int = attrs.field(default=CONNECTIONS_PER_DATABASE, repr=False)
    settings: Mapping[str, str] = attrs.field(factory=dict, repr=False)
    """Server settings besides the harness's own (``shared_preload_libraries`` for DocumentDB)."""
    library_path: Path | None = attrs.field(default=None, repr=False)
    """A folder the server's shared libraries are looked for in first (``LD_LIBRARY_PATH``)."""
    extensions: tuple[str, ...] = attrs.field(default=(), repr=False)
    """Extensions created (with their requirements) in the ``postgres`` database after the first start."""
    setup_sql: str = attrs.field(default="", repr=False)
    """SQL run in the ``postgres`` database after the first start, once the extensions exist."""
    _process: subprocess.Popen[bytes] | None = attrs.field(default=None, repr=False, alias="process")

    @classmethod
    def create(
        cls,
        data_dir: Path,
        *,
        log_path: Path,
        binaries: PostgresBinaries | None = None,
        port: int | None = None,
        detached: bool = False,
        max_connections: int = CONNECTIONS_PER_DATABASE,
        settings: Mapping[str, str] | None = None,
        library_path: Path | None = None,
        extensions: Sequence[str] = (),
        setup_sql: str = "",
    ) -> LocalPostgres:
        """Prepare ``data_dir`` (owned by the ``postgres`` user when we are root).

        ``binaries`` default to :func:`find_postgres`; ``port`` to a free port. ``settings``,
        ``library_path``, ``extensions`` and ``setup_sql`` serve servers with extensions (DocumentDB, see
        :mod:`harness.documentdb`).
        """
        binaries = binaries or find_postgres()
        if binaries is None:
            raise HarnessError(
                "no PostgreSQL server found (initdb, pg_ctl and postgres on PATH or in "
                f"{SEARCH_GLOB}); install it (Debian: apt-get install postgresql, or run "
                "scripts/bootstrap as root) or choose another backend"
            )
        real_dir, link = _prepare_data_dir(data_dir)
        return cls(
            binaries=binaries,
            data_dir=real_dir,
            log_path=log_path,
            port=port if port is not None else free_ports(1)[0],
            temporary=link is not None,
            link=link,
            detached=detached,
            max_connections=max_connections,
            settings=dict(settings or {}),
            library_path=library_path,
            extensions=tuple(extensions),
            setup_sql=setup_sql,
        )

    @property
    def pid(self) -> int | None:
        """The postmaster's process id, or None before :meth:`start`."""
        return None if self._process is None else self._process.pid

    @property
    def alive(self) -> bool:
        """True while the server process exists."""
        return self._process is not None and self._process.poll() is None

    @property
    def version(self) -> str:
        """The server's version, e.g. ``15.18``."""
        return self.binaries.version

    def url(self, database: str) -> str:
        """A ``postgres://`` URL of ``database`` as the superuser, for FerretDB.

        TLS is turned off: the server has none, and pgx would try it first on every
        new connection.
        """
        return f"postgres://{SUPERUSER}@127.0.0.1:{self.port}/{quote(database, safe='')}?sslmode=disable"

    def start(self, *, databases: Sequence[str] = (), timeout: float = DEFAULT_TIMEOUT) -> None:
        """Run ``initdb`` if needed, start the server, wait for it, create ``databases``."""
        if self.alive:
            raise HarnessError(f"PostgreSQL in {self.data_dir} is already running")
        for name in databases:
            _check_database_name(name)
        fresh = not (self.data_dir / "PG_VERSION").exists()
        if fresh:
            self._initdb()
        (self.data_dir / "pg_hba.conf").write_text(_HBA.format(superuser=SUPERUSER))
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._process = spawn_logged(
            self._command(),
            self.log_path,
            detached=self.detached,
            cwd="/",  # the postgres user may not be able to enter ours
            env=self._server_environment(),
        )
        logger.info(
            "started PostgreSQL %s: pid %d on port %d, data in %s",
            self.version,
            self._process.pid,
            self.port,
            self.data_dir,
        )
        try:
            self._wait_ready(timeout=timeout)
            if fresh and (self.extensions or self.setup_sql):  # one psql for both
                self._psql("".join(f"CREATE EXTENSION IF NOT EXISTS {quote_identifier(e)} CASCADE;\n" for e in self.extensions)
                           + self.setup_sql)
            self.create_databases(databases)
        except BaseException:
            self.stop()
            raise

    def create_databases(self, names: Iterable[str]) -> None:
        """Create each database that does not exist yet (UTF-8, C locale, as FerretDB needs)."""
        names = list(names)
        for name in names:
            _check_database_name(name)
        existing = set(self._psql("SELECT datname FROM pg_database").split("\n"))
        missing = [name for name in names if name not in existing]
        if missing:
            self._psql("".join(f"CREATE DATABASE {quote_identifier(name)};\n" for name in missing))
            logger.info("created PostgreSQL databases %s", ", ".join(missing))

    def create_user(self, name: str, password: str, *, databases: Iterable[str]) -> None:
        """Create (or update) a login role that FerretDB clients can authenticate as.

        The role may connect to and create schemas (MongoDB databases) in each of
        ``databases``, and read and write every table (``pg_read_all_data`` and
        ``pg_write_all_data``, PostgreSQL 14+), so it sees collections that other roles
        made; DDL on those (an index, a drop) stays with their owner. Only a verifier of
        the password is sent to the server; the password appears in no log or error.
        """
        if not name or name == SUPERUSER or len(name.encode()) > 63:
            raise ValueError(f"name: must be a role name of 1 to 63 bytes other than {SUPERUSER!r} (got {name!r})")
        role = quote_identifier(name)
        verifier = scram_verifier(password)
        exists = self._psql(f"SELECT 1 FROM pg_roles WHERE rolname = {quote_literal(name)}") == "1"
        statements = [
            f"{'ALTER' if exists else 'CREATE'} ROLE {role} LOGIN NOSUPERUSER PASSWORD {quote_literal(verifier)};",
            *(
                f"GRANT CONNECT, CREATE, TEMPORARY ON DATABASE {quote_identifier(db)} TO {role};"
                for db in databases
            ),
        ]
        if self.binaries.version_key >= (14,):
            statements.append(f"GRANT pg_read_all_data, pg_write_all_data TO {role};")
        self._psql("\n".join(statements) + "\n", redact=verifier)
        logger.info("%s PostgreSQL role %s", "updated" if exists else "created", name)

    def stop(self) -> None:
        """Stop the server (fast shutdown) and, if temporary, remove its data; repeatable."""
        name = f"PostgreSQL on port {self.port}"
        process = self._process
        # A backend stuck where it never looks at its signals (docs/servers.md: an index insert spinning in RUM) keeps
        # running after the postmaster is killed: the postmaster's children are known first, and killed after it.
        backends = children_of(process.pid) if process is not None and process.poll() is None else []
        if process is not None and stop_process(process, name=name, sig=signal.SIGINT):
            logger.info("stopped PostgreSQL on port %d", self.port)
        for pid in backends:
            if pid_alive(pid):
                logger.warning("a backend of %s (pid %d) outlived it; killing it", name, pid)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        if self.temporary:
            remove_data(self.data_dir, link=self.link)

    def _command(self) -> list[str]:
        socket_dir = str(self.data_dir)
        if len(socket_dir) + len(f"/.s.PGSQL.{self.port}") > _SOCKET_PATH_MAX or "," in socket_dir:
            socket_dir = ""  # too long for a Unix socket path: TCP only (we use nothing else)
        settings = {
            "listen_addresses": "127.0.0.1",
            "port": str(self.port),
            "unix_socket_directories": socket_dir,
            "max_connections": str(self.max_connections),
            "cluster_name": "feedrouter",
            # Client errors (FerretDB turns every duplicate _id of an insert into one, three
            # lines each with the statement) go back to the client; the log keeps LOG, FATAL
            # and PANIC: start, stop, checkpoints, failed logins.
            "log_min_messages": "log",
            "log_min_error_statement": "panic",
            # a test server: speed over durability
            "fsync": "off",
            "synchronous_commit": "off",
            "full_page_writes": "off",
        }
        settings.update(self.settings)
        options = [item for key, value in settings.items() for item in ("-c", f"{key}={value}")]
        return [*_run_as(), str(self.binaries.postgres), "-D", str(self.data_dir), *options]

    def _server_environment(self) -> dict[str, str]:
        env = _environment()
        if self.library_path is not None:
            env["LD_LIBRARY_PATH"] = ":".join(filter(None, [str(self.library_path), env.get("LD_LIBRARY_PATH")]))
        return env

    def _initdb(self) -> None:
        command = [
            *_run_as(),
            str(self.binaries.initdb),
            "-D", str(self.data_dir),
            "-U", SUPERUSER,
            "--encoding=UTF8",
            "--locale=C",  # FerretDB accepts C, POSIX, C.UTF8 and en_US.UTF8 only
            "--auth=trust",  # replaced by our pg_hba.conf before the first start
            "--no-sync",
        ]  # fmt: skip
        logger.info("initdb PostgreSQL %s into %s", self.version, self.data_dir)
        result = subprocess.run(
            command, cwd="/", env=_environment(), capture_output=True, text=True, check=False
        )
        if result.returncode != 0:
            raise HarnessError(
                f"initdb into {self.data_dir} failed (exit code {result.returncode}):\n"
                + tail(result.stderr + result.stdout)
            )

    def _wait_ready(self, *, timeout: float) -> None:
        """Block until the server runs a query; fail fast if it exits."""
        deadline = time.monotonic() + timeout
        error: Exception
        while True:
            if self._process is None or self._process.poll() is not None:
                code = None if self._process is None else self._process.returncode
                raise HarnessError(
                    f"PostgreSQL exited with code {code} before accepting connections on "
                    f"port {self.port}; last lines of its log:\n{log_tail([self.log_path])}"
                )
            if _port_open(self.port):
                try:
                    self._psql("SELECT 1", timeout=5)
                    return
                except HarnessError as exc:
                    error = exc  # e.g. "the database system is starting up"
            else:
                error = ConnectionRefusedError(f"port {self.port} is not open yet")
            if time.monotonic() >= deadline:
                raise HarnessError(
                    f"PostgreSQL on port {self.port} did not accept connections within "
                    f"{timeout:.0f} s ({error}); last lines of its log:\n{log_tail([self.log_path])}"
                )
            time.sleep(POLL_INTERVAL)

    def run_sql(self, sql: str, *, database: str = "postgres") -> str:
        """Run *sql* as the superuser (tests and tools that look under a wire server); return the rows as text."""
        return self._psql(sql, database=database)

    def _psql(self, sql: str, *, database: str = "postgres", timeout: float = 60, redact: str = "") -> str:
        """Run ``sql`` (given on stdin, so no argument shows it) as the superuser; return the rows."""
        command = [
            str(self.binaries.psql),
            "--no-psqlrc", "--quiet", "--no-align", "--tuples-only",
            "--set=ON_ERROR_STOP=1",
            "--host=127.0.0.1", f"--port={self.port}",
            f"--username={SUPERUSER}", f"--dbname={database}",
        ]  # fmt: skip
        env = _environment()
        env["PGCONNECT_TIMEOUT"] = str(max(1, int(timeout)))
        try:
            result = subprocess.run(
                command, input=sql, env=env, capture_output=True, text=True, timeout=timeout, check=False
            )
        except subprocess.TimeoutExpired:
            raise HarnessError(f"psql on port {self.port} took more than {timeout:.0f} s") from None
        if result.returncode != 0:
            message = tail(result.stderr + result.stdout)
            if redact:
                message = message.replace(redact, "***")
            raise HarnessError(f"psql on port {self.port} failed (exit code {result.returncode}): {message}")
        return result.stdout.strip()


def remove_data(data_dir: Path, *, link: Path | None) -> None:
    """Remove a temporary data folder and the symlink that points to it."""
    shutil.rmtree(data_dir, ignore_errors=True)
    if link is not None and link.is_symlink():
        link.unlink(missing_ok=True)


def _check_database_name(name: str) -> None:
    if name in RESERVED_DATABASES or not name or len(name.encode()) > 63:
        raise HarnessError(
            f"{name!r} cannot be a PostgreSQL database name: 1 to 63 bytes, not one of "
            f"{', '.join(sorted(RESERVED_DATABASES))}"
        )


def _port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def _environment() -> dict[str, str]:
    """Our environment without ``PG*`` variables, which would redirect the programs."""
    return {key: value for key, value in os.environ.items() if not key.startswith("PG")}


def _account() -> pwd.struct_passwd | None:
    """The account to run PostgreSQL as: None means ourselves (we are not root)."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam(SYSTEM_USER)
    except KeyError:
        raise HarnessError(
            f"PostgreSQL refuses to run as root and there is no {SYSTEM_USER!r} user to run "
            "it as (Debian's postgresql package creates it; or: useradd --system postgres)"
        ) from None


def _run_as() -> list[str]:
    """The command prefix that drops root for PostgreSQL's programs (empty when not root)."""
    account = _account()
    if account is None:
        return []
    setpriv = shutil.which("setpriv") or ("/usr/bin/setpriv" if is_program(Path("/usr/bin/setpriv")) else None)
    if setpriv is None:
        raise HarnessError("running PostgreSQL as root needs `setpriv` (util-linux) to drop to the postgres user")
    return [setpriv, f"--reuid={account.pw_uid}", f"--regid={account.pw_gid}", "--init-groups", "--"]


def _prepare_data_dir(wanted: Path) -> tuple[Path, Path | None]:
    """Make the data folder; return it and, if it had to move under /tmp, the symlink to it."""
    account = _account()
    if wanted.is_symlink():  # left by an earlier run whose stand-in folder is gone or stale
        wanted.unlink()
    wanted.mkdir(parents=True, exist_ok=True)
    if account is None:
        os.chmod(wanted, 0o700)
        return wanted, None
    if not (wanted / "PG_VERSION").exists():
        os.chown(wanted, account.pw_uid, account.pw_gid)
        os.chmod(wanted, 0o700)
    if _reachable(wanted):
        return wanted, None
    if any(wanted.iterdir()):
        raise HarnessError(
            f"the {SYSTEM_USER} user cannot reach {wanted} (a folder above it is closed to "
            "it) and it is not empty, so it cannot be replaced by a temporary folder"
        )
    wanted.rmdir()
    stand_in = Path(tempfile.mkdtemp(prefix="feedrouter-postgres-"))
    os.chown(stand_in, account.pw_uid, account.pw_gid)
    wanted.symlink_to(stand_in, target_is_directory=True)
    logger.info(
        "the %s user cannot reach %s; PostgreSQL data goes to %s instead (removed on stop)",
        SYSTEM_USER,
        wanted,
        stand_in,
    )
    return stand_in, wanted


def _reachable(folder: Path) -> bool:
    """Whether the account PostgreSQL runs as can enter and write ``folder``."""
    result = subprocess.run(
        [*_run_as(), "test", "-w", str(folder), "-a", "-x", str(folder)],
        cwd="/",
        capture_output=True,
        check=False,
    )
    return result.returncode == 0
