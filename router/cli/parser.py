"""The ``feedrouter`` command line's arguments: every subcommand, option and ``--help`` text.

Kept apart from the commands (:mod:`router.cli`) so each file stays readable.
"""

from __future__ import annotations

import argparse
import re
from datetime import datetime, timezone
from pathlib import Path

from .. import __version__
from ..core.notify import GroupBy, MAX_CAP, MAX_GROUP_PAGE
from ..errors import InvalidItem
from ..model import TEXT_RULE, is_id, is_text

__all__ = ["MIGRATIONS_HELP", "build_parser"]

UTC = timezone.utc
#: What the command line reads as an int: ASCII digits, with a minus sign or none. (``str.isdigit`` is true for
#: other Unicode digits too: ``int()`` refuses ``"²"`` and reads fullwidth ``"５"`` as 5.)
_INT = re.compile(r"-?[0-9]+")
JSON_HELP = "machine-readable output on stdout"
MIGRATIONS_HELP = "migrations folder (default: $FEEDROUTER_MIGRATIONS, else the migrations shipped with the package)"


def _when(text: str) -> datetime:
    """An ISO date or datetime; a naive value is UTC (the CLI's documented rule)."""
    try:
        value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an ISO date or datetime: {text!r} (e.g. 2026-12-01 or 2026-12-01T00:00:00Z)") from None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def build_parser() -> argparse.ArgumentParser:
    """The ``feedrouter`` argument parser."""
    parser = argparse.ArgumentParser(
        prog="feedrouter",
        description="Store and read social feeds across MongoDB clusters split by time.",
        epilog="Exit codes: 0 ok, 1 operational error, 2 usage or configuration error.",
    )
    parser.add_argument("--version", action="version", version=f"feedrouter {__version__}")
    parser.add_argument("-c", "--config", default="clusters.yaml", help="path to clusters.yaml (default: %(default)s)")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-vv for debug); shows tracebacks")
    parser.add_argument("-q", "--quiet", action="store_true", help="log errors only")
    parser.add_argument("--json", action="store_true", help=JSON_HELP)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    sub.add_parser(
        "check",
        help="validate clusters.yaml, every cluster's reachability, metadata and migrations",
        description="Load the configuration, connect to every cluster, validate the metadata documents "
        "and the time map, and check that every cluster has all migrations applied. Prints the time map, "
        "or every problem found; exits 0 only when there is none.",
    )
    status = sub.add_parser(
        "status",
        help="a table of clusters: period, reachable, round trip, documents, migrations",
        description="Show, for each configured cluster: its period, whether it answers, the round-trip "
        "time of a ping, the estimated number of feed documents and the migrations applied. With "
        "--metrics, also what a running service's router saw of each cluster: requests, failed requests, "
        "mean latency and whether it answered last. "
        "Exits 1 if any cluster is unreachable or has a malformed metadata document (marked in its row).",
    )
    status.add_argument("--metrics", metavar="URL", default=None,
                        help="a service's Prometheus endpoint (PrometheusMetrics), e.g. http://feed-1:9108/metrics")
    migrate = sub.add_parser(
        "migrate",
        help="apply pending migrations to every cluster (or one)",
        description="Apply the pending migrations to each cluster in order, recording "
        "each in the cluster's migrations collection. Re-running applies nothing; a migration changed "
        "after it was applied is refused.",
    )
    migrate.add_argument("--cluster", metavar="NAME", help="only this cluster")
    migrate.add_argument("--dry-run", action="store_true", help="print the commands without sending them")
    migrate.add_argument("--migrations", type=Path, default=None, help=MIGRATIONS_HELP)

    add = sub.add_parser(
        "add-cluster",
        help="give a cluster listed in clusters.yaml its period (migrate, write metadata)",
        description="Add NAME (already listed in clusters.yaml with its uri) as the owner of the period "
        "[--start, --end). Checks the period against the time map loaded from every cluster, runs the "
        "migrations on NAME, closes the current open-ended period at --start when --close-previous is "
        "given, writes NAME's metadata and prints the new time map. Refuses any change that overlaps "
        "another period or strands stored documents. Re-running it is harmless. Times are ISO 8601; "
        "a time without an offset is UTC.",
    )
    add.add_argument("name", metavar="NAME", help="the cluster's name in clusters.yaml")
    add.add_argument("--start", type=_when, required=True, help="first instant of the period, e.g. 2026-12-01")
    add.add_argument("--end", type=_when, default=None, help="end of the period, exclusive (default: open-ended)")
    add.add_argument("--creator", default="", help="recorded as creator_name in the metadata")
    add.add_argument("--layout", choices=("copies", "buckets"), default="copies",
                     help="how the period stores copies: one document each (copies, the default) or up to 50 of a "
                     "receiver per document (buckets; refused on a server that cannot append atomically, e.g. FerretDB)")
    add.add_argument("--close-previous", action="store_true",
                     help="end the current open-ended period at --start (refused if it holds later documents)")
    add.add_argument("--dry-run", action="store_true", help="print what would be done, change nothing")
    add.add_argument("--force", action="store_true",
                     help="allow --close-previous with a start less than refresh_interval away (no router may be "
                     "running); it waives only that notice, never the checks that no stored record is stranded")
    add.add_argument("--migrations", type=Path, default=None, help=MIGRATIONS_HELP)
    rollover = sub.add_parser(
        "rollover",
        help="do the next planned rollover now (or the one at --at)",
        description="Close the open-ended period at the next boundary (or --at) and give it to the first "
        "ready standby cluster from rollover.standby, under a lease so concurrent runs act once. "
        "Refused, exit 1, when no standby is ready or the boundary is less than lead_time away.",
    )
    rollover.add_argument("--at", type=_when, default=None, help="the boundary (default: computed from rollover.period)")
    rollover.add_argument("--dry-run", action="store_true", help="print the plan, change nothing")

    scheduler = sub.add_parser(
        "scheduler",
        help="run the rollover scheduler (APScheduler) until interrupted",
        description="Check on an interval derived from rollover.lead_time that a standby is ready for "
        "the next boundary (logging an error at once if not) and do each rollover inside its window, "
        "between two lead times and one lead time before the boundary.",
    )
    scheduler.add_argument("--once", action="store_true", help="run one check and exit (exit 1 if it failed)")

    retire_cmd = sub.add_parser(
        "retire",
        help="mark an old cluster retired: reads skip it, deletes still reach it",
        description="Set retired: true in NAME's metadata. Reads skip it, writes into its period fail, "
        "deletes by data_key still reach it until it is removed from clusters.yaml. "
        "Only a period that has ended can be retired.",
    )
    retire_cmd.add_argument("name", metavar="NAME")
    retire_cmd.add_argument("--dry-run", action="store_true", help="check, change nothing")

    worker = sub.add_parser(
        "worker",
        help="run a Celery worker that writes fan-out batches (needs feed-router[celery])",
        description="Run a Celery worker that takes fan-out batches from the broker and writes each into its "
        "cluster, until SIGTERM or Ctrl-C (a warm shutdown: running batches finish). The broker is --broker, "
        "else celery.broker in clusters.yaml. Each worker process opens its cluster clients once, at its first "
        "batch. Logs go to stderr; nothing is printed on stdout.",
    )
    worker.add_argument("--broker", metavar="URL", default=None,
                        help="Celery broker URL, e.g. redis://host:6379/0 or amqp://user:pw@host:5672// "
                        "(default: celery.broker in clusters.yaml)")
    worker.add_argument("--queues", metavar="Q[,Q]", default=None,
                        help="queues to consume, in priority order (default: feedrouter.active,feedrouter.inactive)")
    worker.add_argument("--concurrency", type=int, default=None, metavar="N",
                        help="worker processes (or threads) (default: one per CPU)")
    worker.add_argument("--pool", choices=["prefork", "solo", "threads"], default="prefork",
                        help="how batches run: processes, in the worker's own process, or threads (default: %(default)s)")
    worker.add_argument("--hostname", metavar="NAME", default=None,
                        help="the worker's node name, e.g. fanout1@%%h (default: Celery's celery@HOST)")

    status = sub.add_parser(
        "fanout-status",
        help="a fan-out job's progress, read from its checkpoint",
        description="Print the progress of fan-out job JOB (and of JOB/inactive, its inactive receivers' job, "
        "if there is one) from its checkpoint in the owning cluster: batches done, failed and missing, and the "
        "counts of copies. Only batches 0 to the job's batch count - 1 count; it is done when every one of them is. "
        "A job whose post was deleted shows 'cancelled (deleted)'. Exits 1 if a job failed or was cancelled, or no "
        "cluster has JOB.",
    )
    status.add_argument("job", metavar="JOB", help="the job id (publish_fan_out returns it)")

    unseen = sub.add_parser(
        "unseen",
        help="a receiver's unseen count and seen marker (for support staff)",
        description="Print how many items of RECEIVER's feed are newer than its seen marker (stopping past --cap, "
        "shown as e.g. 99+), and the marker's time. ASCII digits (with an optional minus sign; put -- before a negative "
        "id) mean an int id, which must fit in 64 bits; anything else is a str id (fullwidth or other Unicode digits "
        "too).",
    )
    unseen.add_argument("receiver", metavar="RECEIVER", type=_receiver_arg, help="the receiver id")
    unseen.add_argument("--cap", type=_cap, default=99, metavar="N",
                        help=f"stop counting past N, from 1 to {MAX_CAP} (default: %(default)s)")
    user_help = ("the user id: ASCII digits (an optional minus sign; put -- before a negative id) mean an int id, which "
                 "must fit in 64 bits; anything else is a str id")
    erase = sub.add_parser(
        "erase",
        help="erase a user: everything they sent and everything addressed to them, every cluster, with a record",
        description="Remove everything USER sent (copies in every feed, outbox entries, their posts' job and edit "
        "records) and everything addressed to them (their feed, seen markers, read marks), from every configured "
        "cluster, after "
        "leaving an erasure record in each (the user's keyed hash, who asked, when; then the counts), which fan-outs, "
        "Celery workers and backfills still running read. Prints the counts per cluster and collection, never the "
        "user's data. Exits 1 if a cluster did not finish: run it again.",
    )
    erase.add_argument("user", metavar="USER", type=_receiver_arg, help=user_help)
    erase.add_argument("--by", metavar="WHO", type=_requester, default=None,
                       help="who asked, kept in the record, e.g. a ticket: non-empty, at most 1,024 characters "
                       "(default: the operator's login and host)")
    erase_status = sub.add_parser(
        "erase-status",
        help="a user's erasure records: who asked, when, the counts, finished or not",
        description="Print every erasure record of USER in every cluster (looked up by the user's keyed hash). "
        "Exits 0 when every cluster holding a record of the user holds a finished one, 1 otherwise (none recorded, "
        "or one that did not finish: run feedrouter erase again).",
    )
    erase_status.add_argument("user", metavar="USER", type=_receiver_arg, help=user_help)
    export = sub.add_parser(
        "export",
        help="export what the router holds about a user into a folder (JSON Lines and a manifest)",
        description="Write USER's posts as sent, the items they received, their seen markers and read marks into DIR "
        "(an existing, empty folder) as sent.jsonl, received.jsonl, seen.jsonl and read.jsonl, each in time order "
        "across every period, then manifest.json with the periods read and each file's records and SHA-256. "
        "A DIR that is missing, a file, or not empty exits 2 before anything is read.",
    )
    export.add_argument("user", metavar="USER", type=_receiver_arg, help=user_help)
    export.add_argument("dir", metavar="DIR", type=Path, help="an existing, empty folder")
    groups = sub.add_parser(
        "groups",
        help="a receiver's notifications as groups, with seen and read (for support staff)",
        description="Print a page of RECEIVER's notification groups newest first (\"7 like data.target=5 on "
        "2026-11-26: 12 items from 9 actors\"), each with its counts, newest actors, first and last time, and whether "
        "it is seen and read, then how many groups are unseen. RECEIVER as for 'unseen'.",
    )
    groups.add_argument("receiver", metavar="RECEIVER", type=_receiver_arg, help="the receiver id")
    groups.add_argument("--key", type=_group_by, default=None, metavar="SPEC",
                        help="the aggregation key: fields, then / and a span, e.g. 'type,data.target/1d' (the default)")
    groups.add_argument("--limit", type=_group_limit, default=20, metavar="N",
                        help=f"groups per page, from 1 to {MAX_GROUP_PAGE} (default: %(default)s)")
    groups.add_argument("--cursor", default=None, help="the next_cursor a previous page printed")
    groups.add_argument("--pull", action="append", type=_receiver_arg, default=None, metavar="SENDER",
                        help="merge in the outbox of this pulled sender (repeat for more)")
    tail = sub.add_parser(
        "tail",
        help="print a receiver's live feed as it changes, until Ctrl-C (needs push: in clusters.yaml)",
        description="Subscribe to RECEIVER's feed and print one line per event as it comes: a new item, an update, a "
        "delete, or a resync (Redis was lost or a writer could not push: the items are caught up, edits may have been "
        "missed). With --cursor (a page's or an event's), every item stored after it comes first, once. Ctrl-C or "
        "SIGTERM ends it, exit 0. RECEIVER as for 'unseen'.",
    )
    tail.add_argument("receiver", metavar="RECEIVER", type=_receiver_arg, help="the receiver id")
    tail.add_argument("--cursor", default=None, help="start after this position (a page's or an event's cursor)")
    tail.add_argument("--pull", action="append", type=_receiver_arg, default=None, metavar="SENDER",
                      help="also this pulled sender's new posts (repeat for more)")
    tail.add_argument("--types", action="append", type=_receiver_arg, default=None, metavar="TYPE",
                      help="only items of this type (repeat for more)")
    for command in sub.choices.values():  # --json after the subcommand too (SUPPRESS: absent there, the top's stays)
        command.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help=JSON_HELP)
    return parser


def _receiver_arg(text: str) -> int | str:
    """A receiver id from the command line: an int when it is ASCII digits (a 64-bit one), else the text (a str id)."""
    if _INT.fullmatch(text):
        value = int(text)
        if not is_id(value):
            raise argparse.ArgumentTypeError(f"an int id must fit in 64 bits, from -2**63 to 2**63 - 1 (got {text})")
        return value
    if not is_id(text):
        raise argparse.ArgumentTypeError(f"{TEXT_RULE} (got {text!r:.80})")
    return text


def _requester(text: str) -> str:
    """``erase --by``: who asked, as ``erase_user``'s ``requested_by`` takes it (an empty one is refused, not replaced
    by the operator's login)."""
    if not is_text(text):
        raise argparse.ArgumentTypeError(f"{TEXT_RULE}: who asked for the erasure, e.g. a ticket (got {text!r:.80})")
    return text


def _cap(text: str) -> int:
    """``unseen --cap``: an int from 1 to :data:`~router.core.notify.seen.MAX_CAP`."""
    value = int(text) if _INT.fullmatch(text) else None
    if value is None or not 1 <= value <= MAX_CAP:
        raise argparse.ArgumentTypeError(f"must be an int from 1 to {MAX_CAP} (got {text if value is not None else repr(text)})")
    return value


def _group_by(text: str) -> GroupBy:
    """``groups --key``: a :class:`~router.core.notify.groups.GroupBy` as text."""
    try:
        return GroupBy.parse(text)
    except InvalidItem as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _group_limit(text: str) -> int:
    """``groups --limit``: an int from 1 to :data:`~router.core.notify.groups.MAX_GROUP_PAGE`."""
    value = int(text) if _INT.fullmatch(text) else None
    if value is None or not 1 <= value <= MAX_GROUP_PAGE:
        raise argparse.ArgumentTypeError(f"must be an int from 1 to {MAX_GROUP_PAGE} (got {text if value is not None else repr(text)})")
    return value
