"""Local MongoDB-wire servers ("clusters") on loopback, for tests, the demo and benchmarks.

This is the public face of the harness: :class:`LocalClusters` (several servers started and
stopped together; the backends are described in :mod:`harness.clusters`),
:class:`LocalServer` (one of them, with the faults tests inject), :func:`ensure_ferretdb`,
:func:`ensure_ferretdb2`, :func:`ensure_javaserver` and the command line. Each cluster is one server process with its
own free port: mongod, or FerretDB v2.7.0 on DocumentDB over a PostgreSQL of its own (the
default without mongod; see :mod:`harness.documentdb`), or FerretDB v1.24.2 over one
local PostgreSQL or over SQLite, or mongo-java-server in memory. The servers are built or
fetched into a cache folder outside the checkout the first time they are needed
(:func:`cache_dir`).

Use it when you need real servers on this machine; do not use it to run anything that
must outlive a test session unattended (the CLI ``start``/``stop`` pair is the closest
thing to that, and it is still a development tool). It is not part of the ``RouterError``
hierarchy: failures raise :class:`HarnessError`.

Example::

    with LocalClusters(2) as clusters:
        client = pymongo.MongoClient(clusters.uris[0])
        client.admin.command("ping")

From a shell: ``python -m harness.localservers run --count 3 -- pytest tests/integration``
runs the command with ``FEEDROUTER_URIS`` set to the comma-separated URIs.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .clusters import BACKEND_ENV, BACKENDS, LocalClusters
from .documentdb import FERRETDB2_VERSION, ensure_ferretdb2
from .errors import HarnessError
from .ferretdb import CACHE_ENV, FERRETDB_VERSION, cache_dir, ensure_ferretdb
from .javaserver import JAVASERVER_VERSION, LocalJavaServer, ensure_javaserver
from .postgres import remove_data
from .process import DEFAULT_TIMEOUT, pid_alive, pid_is_server, stop_pids
from .server import LocalServer

__all__ = [
    "BACKENDS",
    "BACKEND_ENV",
    "CACHE_ENV",
    "FERRETDB2_VERSION",
    "FERRETDB_VERSION",
    "JAVASERVER_VERSION",
    "HarnessError",
    "LocalClusters",
    "LocalJavaServer",
    "LocalServer",
    "cache_dir",
    "ensure_ferretdb",
    "ensure_ferretdb2",
    "ensure_javaserver",
    "main",
]

logger = logging.getLogger(__name__)

URIS_ENV = "FEEDROUTER_URIS"
STATE_FILE = "servers.json"


def _stop_recorded(entries: list[dict[str, Any]], *, sig: signal.Signals) -> None:
    """Stop each recorded process that is still the one recorded (its folder is on its command line)."""
    running: dict[int, str] = {}
    for entry in entries:
        pid, name = int(entry["pid"]), str(entry["name"])
        if pid_alive(pid) and pid_is_server(pid, str(entry["data_dir"])):
            running[pid] = name
        else:
            logger.info("%s (pid %d) is not running", name, pid)
    stop_pids(running, sig=sig)


def _cmd_build(args: argparse.Namespace) -> int:
    if args.server == "javaserver":
        print(ensure_javaserver())
    elif args.server == "ferretdb2":
        print(ensure_ferretdb2().root)
    else:
        print(ensure_ferretdb())
    return 0


def _cmd_start(args: argparse.Namespace) -> int:
    folder: Path = args.dir.resolve()
    state = folder / STATE_FILE
    if state.exists():
        raise HarnessError(f"{state} exists: servers may be running; run `stop --dir {args.dir}`")
    ports = None if args.first_port is None else list(range(args.first_port, args.first_port + args.count))
    clusters = LocalClusters(
        args.count, base_dir=folder, backend=args.backend, timeout=args.timeout, detached=True, ports=ports
    )
    clusters.start()
    entries: list[dict[str, Any]] = [
        {
            "kind": "server",
            "name": server.name,
            "port": server.port,
            "uri": server.uri,
            "pid": server.pid,
            "backend": server.backend,
            "data_dir": str(server.data_dir),
        }
        for server in clusters.servers
    ]
    for pg in clusters.postgres_servers:
        entries.append(
            {
                "kind": "postgres",
                "name": f"PostgreSQL on port {pg.port}",
                "port": pg.port,
                "pid": pg.pid,
                "version": pg.version,
                "data_dir": str(pg.data_dir),
                "temporary": pg.temporary,
                "link": None if pg.link is None else str(pg.link),
            }
        )
    partial = state.with_suffix(".json.tmp")
    partial.write_text(json.dumps(entries, indent=2) + "\n")
    os.replace(partial, state)
    for uri in clusters.uris:
        print(uri)
    return 0


def _cmd_stop(args: argparse.Namespace) -> int:
    state = args.dir / STATE_FILE
    try:
        entries: list[dict[str, Any]] = json.loads(state.read_text())
    except FileNotFoundError:
        raise HarnessError(f"{state} not found: nothing was started there") from None
    except (OSError, ValueError) as exc:
        raise HarnessError(f"{state}: cannot read it: {exc}") from exc
    servers = [entry for entry in entries if entry.get("kind", "server") == "server"]
    databases = [entry for entry in entries if entry.get("kind") == "postgres"]
    _stop_recorded(servers, sig=signal.SIGTERM)
    _stop_recorded(databases, sig=signal.SIGINT)  # PostgreSQL's fast shutdown, after its clients
    for entry in databases:
        if entry.get("temporary"):
            link = entry.get("link")
            remove_data(Path(entry["data_dir"]), link=Path(link) if link else None)
    state.unlink()
    logger.info("stopped %s", ", ".join(str(entry["name"]) for entry in entries))
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    command: list[str] = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        raise _UsageError("run: give the command to run after --")
    with LocalClusters(args.count, backend=args.backend, timeout=args.timeout) as clusters:
        env = dict(os.environ)
        env[URIS_ENV] = ",".join(clusters.uris)
        try:
            completed = subprocess.run(command, env=env, check=False)
        except FileNotFoundError:
            print(f"run: command not found: {command[0]}", file=sys.stderr)
            return 127
        except KeyboardInterrupt:
            return 130
    code = completed.returncode
    return 128 - code if code < 0 else code


class _UsageError(Exception):
    pass


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m harness.localservers",
        description="Start and stop local MongoDB-wire servers for tests and the demo.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logs, tracebacks")
    sub = parser.add_subparsers(dest="action", required=True)

    build = sub.add_parser(
        "build",
        help=f"build FerretDB {FERRETDB2_VERSION} on DocumentDB (or FerretDB {FERRETDB_VERSION}, or fetch "
        f"mongo-java-server {JAVASERVER_VERSION}); print its path",
    )
    build.add_argument(
        "server",
        nargs="?",
        choices=("ferretdb2", "ferretdb", "javaserver"),
        default="ferretdb2",
        help="ferretdb2 (default): PostgreSQL with DocumentDB and FerretDB 2, by scripts/build-ferretdb2; "
        "ferretdb: FerretDB 1 with Go; javaserver: fetch the jars with Maven and compile the launcher with javac",
    )
    build.set_defaults(handler=_cmd_build)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--count", type=int, default=3, help="number of servers (default 3)")
        p.add_argument(
            "--backend",
            choices=BACKENDS,
            default=None,
            help=f"default: ${BACKEND_ENV}, else auto (mongod if on PATH, else ferretdb2; ferretdb = ferretdb-sqlite)",
        )
        p.add_argument(
            "--timeout",
            type=float,
            default=DEFAULT_TIMEOUT,
            help="seconds to wait for each server to answer ping",
        )

    start = sub.add_parser("start", help="start detached servers; print their URIs")
    common(start)
    start.add_argument("--dir", type=Path, required=True, help="folder for data and servers.json")
    start.add_argument(
        "--first-port",
        type=int,
        default=None,
        help="listen on FIRST_PORT, FIRST_PORT+1, ... (default: free ports chosen at random)",
    )
    start.set_defaults(handler=_cmd_start)

    stop = sub.add_parser("stop", help="stop the servers recorded in DIR/servers.json")
    stop.add_argument("--dir", type=Path, required=True)
    stop.set_defaults(handler=_cmd_stop)

    run = sub.add_parser(
        "run", help=f"start servers, run a command with ${URIS_ENV} set, stop them"
    )
    common(run)
    run.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ARGS...")
    run.set_defaults(handler=_cmd_run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: ``build [ferretdb|javaserver]``, ``start``, ``stop`` and ``run``; returns the exit code.

    Exit codes: 0 ok, 1 the servers could not be built, started or stopped, 2 usage; ``run``
    exits with its command's code.

    Example::

        $ python -m harness.localservers run --count 2 -- sh -c 'echo $FEEDROUTER_URIS'
        mongodb://127.0.0.1:40123,mongodb://127.0.0.1:40125
    """
    parser = _parser()
    args = parser.parse_args(argv)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    package_logger = logging.getLogger("harness")  # this module, ferretdb, postgres
    previous_level = package_logger.level
    package_logger.addHandler(handler)
    package_logger.setLevel(logging.DEBUG if args.verbose else logging.INFO)
    try:
        return int(args.handler(args))
    except _UsageError as exc:
        parser.error(str(exc))
    except (HarnessError, ValueError) as exc:
        if args.verbose:
            logger.exception("failed")
        else:
            print(f"error: {exc}", file=sys.stderr)
        return 1 if isinstance(exc, HarnessError) else 2
    finally:
        package_logger.removeHandler(handler)
        package_logger.setLevel(previous_level)


if __name__ == "__main__":
    # Run the imported module's main so loggers are named harness.localservers, not __main__.
    from harness.localservers import main as _main

    sys.exit(_main())
