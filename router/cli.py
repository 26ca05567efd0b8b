"""The ``feedrouter`` command line. Results go to stdout, logs to stderr.

Exit codes: 0 ok, 1 operational error (a cluster down, a failed check), 2 usage or
configuration error. No traceback unless ``-v``.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from typing import Any

from . import __version__
from .config import load_config
from .errors import ConfigError, RouterError
from .router import FeedRouter

__all__ = ["main"]

log = logging.getLogger(__name__)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="feedrouter",
        description="Store and read social feeds across MongoDB clusters split by time.",
    )
    parser.add_argument("--version", action="version", version=f"feedrouter {__version__}")
    parser.add_argument("-c", "--config", default="clusters.yaml", help="path to clusters.yaml (default: %(default)s)")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging; -v also shows tracebacks")
    parser.add_argument("-q", "--quiet", action="store_true", help="only errors on stderr")
    parser.add_argument("--json", action="store_true", help="machine-readable output on stdout")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    demo = sub.add_parser(
        "demo",
        help="start three local clusters, write and read a feed across them, stop them",
        description="Start three local MongoDB-wire servers (mongod if on PATH, else FerretDB), register "
        "three consecutive periods, write fanned-out feed items (some late), page a feed newest first "
        "across the boundaries, delete one item everywhere, check every claim, and stop the servers.",
    )
    demo.add_argument("--posts", type=int, default=800, help="posts to fan out (default: %(default)s)")
    demo.add_argument("--backend", choices=["auto", "mongod", "ferretdb"], default=None,
                      help="server to run (default: $FEED_TEST_BACKEND, else auto)")

    sub.add_parser(
        "check",
        help="validate clusters.yaml, connect to every cluster and validate the metadata",
        description="Load the configuration, connect to every cluster and build the time map. "
        "Prints the map, or every problem found; exits 0 when all is well.",
    )
    return parser


def _cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    if args.posts < 1:
        raise _UsageError(f"--posts: must be at least 1 (got {args.posts})")
    return run_demo(sys.stdout, posts=args.posts, backend=args.backend)


def _cmd_check(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    with FeedRouter(config) as router:
        tm = router.timemap
        if args.json:
            report: dict[str, Any] = {
                "ok": True,
                "clusters": [
                    {"name": m.name, "start_date": m.start_date.isoformat(),
                     "end_date": m.end_date.isoformat() if m.end_date else None}
                    for m in tm.periods
                ],
                "gaps": [[a.isoformat(), b.isoformat()] for a, b in tm.gaps],
            }
            print(json.dumps(report, indent=2))
        else:
            print(f"{args.config}: {len(tm)} clusters, time map:")
            print(tm.describe())
            for a, b in tm.gaps:
                print(f"warning: gap from {a.isoformat()} to {b.isoformat()}: writes in it fail")
    return 0


class _UsageError(Exception):
    pass


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``feedrouter``; return the exit code."""
    parser = _parser()
    args = parser.parse_args(argv)
    level = logging.ERROR if args.quiet else (logging.DEBUG if args.verbose > 1 else logging.INFO if args.verbose else logging.WARNING)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(level)
    try:
        if args.command == "demo":
            return _cmd_demo(args)
        return _cmd_check(args)
    except _UsageError as exc:
        parser.print_usage(sys.stderr)
        print(f"feedrouter: error: {exc}", file=sys.stderr)
        return 2
    except ConfigError as exc:
        if args.verbose:
            log.exception("configuration error")
        print(f"feedrouter: configuration error:\n{exc}", file=sys.stderr)
        return 2
    except RouterError as exc:
        if args.verbose:
            log.exception("failed")
        print(f"feedrouter: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # the local-server harness and anything unforeseen
        if args.verbose:
            log.exception("failed")
        print(f"feedrouter: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    finally:
        root.removeHandler(handler)


if __name__ == "__main__":
    sys.exit(main())
