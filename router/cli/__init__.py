"""The ``feedrouter`` command line. Results go to stdout, logs to stderr.

Exit codes: 0 ok, 1 operational error (a cluster down, a failed check, a refused
change), 2 usage or configuration error. No traceback unless ``-v``.
"""

from __future__ import annotations

import argparse
import getpass
import json
import logging
import os
import socket
import sys
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

import attrs

from ..admin.migrate import discover, migrate_cluster
from ..admin.periods import apply_period, plan_period, retire
from ..admin.rollover import RolloverScheduler, default_owner, do_rollover
from ..admin.scrape import ClusterStats, scrape
from ..admin.status import check_report, status_rows
from ..storage.capabilities import Capabilities
from ..config import RouterConfig, load_config
from ..core.fanout import JobStatus
from ..core.privacy import COUNTED
from ..core.notify import DEFAULT_GROUP_BY
from ..errors import ClusterError, ConfigError, InvalidItem, RouterError
from ..storage.clusters import Clusters
from ..timemap import format_period
from ..uris import broker_problem, redact_uri
from .parser import build_parser
from .progress import Progress
from .tail import run_tail

__all__ = ["main"]

log = logging.getLogger(__name__)
UTC = timezone.utc


class _UsageError(Exception):
    """Bad arguments: exit code 2."""


class _Failed(Exception):
    """The command ran and found problems, already printed: exit code 1."""


def _emit(args: argparse.Namespace, data: Any, text: str) -> None:
    print(json.dumps(data, indent=2, default=str) if args.json else text)


# -- commands ---------------------------------------------------------------------------


def _cmd_check(args: argparse.Namespace, config: RouterConfig) -> int:
    report, timemap = check_report(config)
    problems: list[str] = report["problems"]
    lines = []
    if timemap is not None:
        lines.append(f"{config.source}: {len(timemap)} periods:")
        lines.append(timemap.describe())
        lines += [f"warning: gap from {a.isoformat()} to {b.isoformat()}: writes in it fail" for a, b in timemap.gaps]
    lines += [f"server of {name}: {Capabilities(**caps).describe()}" for name, caps in report["capabilities"].items()]
    lines += [f"problem: {p}" for p in problems]
    lines.append("ok" if not problems else f"{len(problems)} problems")
    _emit(args, report, "\n".join(lines))
    if problems:
        raise _Failed
    return 0


def _cmd_status(args: argparse.Namespace, config: RouterConfig) -> int:
    progress = Progress(args, len(config.clusters))
    rows = status_rows(config, on_done=progress.step)
    progress.close()
    seen = _scraped(args.metrics) if args.metrics else None
    if seen is not None:
        for row in rows:
            row["metrics"] = seen.get(row["cluster"], ClusterStats()).to_json()
    header = f"{'cluster':<14} {'period':<50} {'reachable':<9} {'rtt ms':>7} {'feed docs':>10}  migrations"
    lines = [header]
    for row in rows:
        if row["period"]:
            period = format_period(row["period"]["start_date"], row["period"]["end_date"])
            if row.get("retired"):
                period += " retired"
        elif row.get("error") and row["reachable"]:
            period = "(bad metadata)"
        elif row.get("standby"):
            period = "(standby, no period yet)"
        else:
            period = "(no metadata)" if row["reachable"] else "?"
        if row["reachable"]:
            lines.append(
                f"{row['cluster']:<14} {period:<50} {'yes':<9} {row['rtt_ms']:>7.1f} {row['feed_documents']:>10}  "
                f"{', '.join(row['migrations']) or '-'}"
            )
        else:
            lines.append(f"{row['cluster']:<14} {period:<50} {'NO':<9} {'-':>7} {'-':>10}  -")
    if seen is not None:
        lines += ["", f"seen by the service at {redact_uri(args.metrics)}:",
                  f"{'cluster':<14} {'requests':>9} {'failed':>7} {'mean ms':>8}  answered last"]
        for row in rows:
            m = row["metrics"]
            mean = "-" if m["mean_ms"] is None else f"{m['mean_ms']:.1f}"
            answered = {True: "yes", False: "NO", None: "-"}[m["up"]]
            lines.append(f"{row['cluster']:<14} {m['requests']:>9} {m['errors']:>7} {mean:>8}  {answered}")
    lines += [f"error: {row['error']}" for row in rows if row.get("error")]
    _emit(args, rows, "\n".join(lines))
    if any(row.get("error") for row in rows):
        raise _Failed
    return 0


def _scraped(url: str) -> dict[str, ClusterStats]:
    """The per-cluster figures at a service's Prometheus endpoint; usage error without prometheus_client."""
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        raise _UsageError("--metrics needs prometheus_client: pip install 'feed-router[prometheus]'") from None
    return scrape(url)


def _cmd_migrate(args: argparse.Namespace, config: RouterConfig) -> int:
    migrations = discover(args.migrations)
    if args.cluster is not None and args.cluster not in [c.name for c in config.clusters]:
        raise _UsageError(f"--cluster: {args.cluster!r} is not in {config.source}")
    reports: list[dict[str, Any]] = []
    failed = False
    with Clusters(config) as clusters:
        names = [args.cluster] if args.cluster else clusters.names
        progress = Progress(args, len(names))
        for name in names:  # one cluster at a time, in configuration order
            progress.step(name)
            try:
                report = migrate_cluster(clusters[name], config, migrations, dry_run=args.dry_run)
            except ClusterError as exc:
                reports.append({"cluster": name, "error": str(exc)})
                failed = True
                continue
            reports.append({"cluster": name, "applied": list(report.applied), "already": list(report.already),
                            "steps": list(report.steps), "dry_run": report.dry_run})
        progress.close()
    lines = []
    for r in reports:
        if "error" in r:
            lines.append(f"{r['cluster']}: FAILED: {r['error']}")
            continue
        verb = "would apply" if r["dry_run"] else "applied"
        lines.append(f"{r['cluster']}: {verb} {', '.join(r['applied']) or 'nothing'} ({len(r['already'])} already applied)")
        lines += [f"  {step}" for step in r["steps"]]
    _emit(args, reports, "\n".join(lines))
    if failed:
        raise _Failed
    return 0


def _cmd_add_cluster(args: argparse.Namespace, config: RouterConfig) -> int:
    migrations = discover(args.migrations)
    with Clusters(config) as clusters:
        notice = None if args.force else config.refresh_interval
        change = plan_period(
            clusters, name=args.name, start=args.start, end=args.end, creator=args.creator,
            close_previous=args.close_previous, min_notice=notice, layout=args.layout,
        )
        plan = change.describe()
        done = apply_period(clusters, change, migrations=migrations, dry_run=args.dry_run)
        timemap = change.timemap if args.dry_run else clusters.load_timemap(allow_missing=clusters.names)
        unassigned = [n for n in clusters.names if n not in timemap.all_clusters()]
    lines = [("dry run, nothing changed: " if args.dry_run else "") + "plan:", *[f"  {p}" for p in plan], "steps:",
             *[f"  {d}" for d in done], ("current" if args.dry_run else "new") + " time map:", timemap.describe()]
    lines += [f"  {n:<16} (listed in {config.source}, no period yet)" for n in unassigned]
    data = {"dry_run": args.dry_run, "plan": plan, "steps": done,
            "time_map": [{"name": m.name, "start_date": m.start_date, "end_date": m.end_date} for m in timemap.periods]}
    _emit(args, data, "\n".join(lines))
    return 0


def _cmd_rollover(args: argparse.Namespace, config: RouterConfig) -> int:
    with Clusters(config) as clusters:
        lines = do_rollover(clusters, config, now=datetime.now(UTC), owner=default_owner(), at=args.at, dry_run=args.dry_run)
        timemap = clusters.load_timemap(allow_missing=clusters.names)
    text = "\n".join([("dry run, nothing changed: " if args.dry_run else "") + "rollover:", *[f"  {x}" for x in lines],
                      "time map:", timemap.describe()])
    _emit(args, {"dry_run": args.dry_run, "steps": lines}, text)
    return 0


def _cmd_scheduler(args: argparse.Namespace, config: RouterConfig) -> int:
    runner = RolloverScheduler(config)
    if args.once:
        try:
            lines = runner.tick()
        finally:
            runner.close()
        _emit(args, {"ok": runner.last_error is None, "steps": lines, "error": str(runner.last_error or "")},
              "\n".join(lines) or ("ok" if runner.last_error is None else f"failed: {runner.last_error}"))
        return 0 if runner.last_error is None else 1
    log.warning("rollover scheduler %s checking every %s", runner.owner, runner.interval)
    runner.run()
    return 0


def _cmd_retire(args: argparse.Namespace, config: RouterConfig) -> int:
    with Clusters(config) as clusters:
        meta = retire(clusters, args.name, dry_run=args.dry_run)
    text = f"{'would retire' if args.dry_run else 'retired'} cluster {meta.name!r} {format_period(meta.start_date, meta.end_date)}"
    _emit(args, {"dry_run": args.dry_run, "cluster": meta.name, "retired": True}, text)
    return 0


def _cmd_worker(args: argparse.Namespace, config: RouterConfig) -> int:
    try:
        from ..fanout.celery import DEFAULT_QUEUES, app_from_config, run_worker
    except ImportError as exc:
        raise _UsageError(f"worker: Celery is not installed ({exc}); pip install 'feed-router[celery]'") from None
    if args.broker is not None and broker_problem(args.broker) is not None:
        raise _UsageError(f"--broker: {broker_problem(args.broker)}")
    if args.broker is None and config.celery is None:
        raise _UsageError(f"worker: no broker: pass --broker URL or add a celery: {{broker: URL}} section to {config.source}")
    if args.concurrency is not None and args.concurrency < 1:
        raise _UsageError(f"--concurrency: must be at least 1 (got {args.concurrency})")
    queues = list(DEFAULT_QUEUES)
    if args.queues is not None:
        queues = [q.strip() for q in args.queues.split(",") if q.strip()]
        unknown = [q for q in queues if q not in DEFAULT_QUEUES]
        if not queues or unknown:
            raise _UsageError(f"--queues: must name {' and/or '.join(DEFAULT_QUEUES)} (got {args.queues!r})")
    if not args.verbose:  # one line per task from Celery itself only with -v
        for name in ("celery.app.trace", "celery.worker.strategy"):
            logging.getLogger(name).setLevel(logging.WARNING)
    app = app_from_config(config, broker=args.broker)
    log.info("fan-out worker: broker %s, queues %s, clusters from %s", redact_uri(app.conf.broker_url), ",".join(queues),
             config.source)
    sys.stdout.flush()
    stdout = os.dup(1)
    os.dup2(2, 1)  # Celery writes its shutdown notices to the process's stdout: they are logs, so stderr
    try:
        return run_worker(app, queues=queues, concurrency=args.concurrency, pool=args.pool, hostname=args.hostname)
    finally:
        os.dup2(stdout, 1)
        os.close(stdout)


def _describe_job(status: JobStatus) -> list[str]:
    total = "?" if status.batches_total is None else str(status.batches_total)
    reason = f" ({status.reason})" if status.reason else ""
    lines = [
        f"{status.job_id}: {status.state}{reason} in cluster {status.cluster!r}: {status.batches_done} of {total} "
        f"batches done ({status.recorded}, {status.runs} runs)",
        f"  copies: {status.written} written, {status.already_present} already present, {status.skipped} skipped",
    ]
    if status.failed_batches:
        shown = ", ".join(map(str, status.failed_batches[:20])) + (" ..." if len(status.failed_batches) > 20 else "")
        lines.append(f"  failed batches ({len(status.failed_batches)}): {shown}")
    if status.batches_missing:
        shown = ", ".join(map(str, status.missing_batches[:20])) + (" ..." if status.batches_missing > 20 else "")
        hint = (": still queued or running, or given up by a worker; publish the job again to resend them"
                if status.recorded == "published" and status.reason is None else "")
        lines.append(f"  missing batches ({status.batches_missing}){hint}: {shown}")
    if status.batches_ignored:
        lines.append(f"  ignored: {status.batches_ignored} batch records outside the job's batches (not counted)")
    if status.error:
        lines.append(f"  error: {status.error}")
    if status.updated_at is not None:
        lines.append(f"  updated at {status.updated_at.isoformat()}")
    return lines


def _cmd_fanout_status(args: argparse.Namespace, config: RouterConfig) -> int:
    from ..fanout.celery_plan import inactive_job_id
    from ..sync import FeedRouter

    with FeedRouter(config, refresh=False) as router:
        statuses = [router.fan_out_status(args.job)]
        try:
            statuses.append(router.fan_out_status(inactive_job_id(args.job)))
        except InvalidItem:  # no inactive receivers' job
            pass
    lines = [line for s in statuses for line in _describe_job(s)]
    _emit(args, [s.to_json() for s in statuses], "\n".join(lines))
    if any(s.state in ("failed", "cancelled") for s in statuses):
        raise _Failed
    return 0


def _cmd_unseen(args: argparse.Namespace, config: RouterConfig) -> int:
    from ..sync import FeedRouter

    with FeedRouter(config, refresh=False) as router:
        unseen = router.unseen_count(args.receiver, cap=args.cap)
    marker = unseen.marker
    shown = f"{unseen.count}+" if unseen.capped else str(unseen.count)
    seen = f"marked seen up to {marker.event_time.isoformat()} (item {marker.id})" if marker else "nothing marked seen"
    _emit(args, {
        "receiver_id": args.receiver, "unseen": unseen.count, "capped": unseen.capped,
        "marker": {"event_time": marker.event_time.isoformat(), "id": str(marker.id)} if marker else None,
        "queried": list(unseen.queried),
    }, f"receiver {args.receiver!r}: {shown} unseen; {seen}; asked {', '.join(unseen.queried) or 'no cluster'}")
    return 0


def _cmd_erase(args: argparse.Namespace, config: RouterConfig) -> int:
    from ..sync import FeedRouter

    who = args.by if args.by is not None else f"{getpass.getuser()}@{socket.gethostname()} (feedrouter erase)"
    progress = Progress(args, len(config.clusters))
    with FeedRouter(config, refresh=False) as router:
        try:
            result = router.erase_user(args.user, requested_by=who, progress=progress.erasure)
        finally:
            progress.close()
    lines = [f"erasure {result.request_id}: erased in {len(result.clusters)} clusters, requested by {who!r}",
             f"  {'cluster':<14} " + " ".join(f"{what:>14}" for what in COUNTED)]
    lines += [f"  {c.cluster:<14} " + " ".join(f"{c.counts.get(what, 0):>14}" for what in COUNTED) for c in result.clusters]
    lines.append(f"  {'total':<14} " + " ".join(f"{n:>14}" for n in result.totals.values()))
    _emit(args, result.to_json(), "\n".join(lines))
    return 0


def _cmd_erase_status(args: argparse.Namespace, config: RouterConfig) -> int:
    from ..sync import FeedRouter

    with FeedRouter(config, refresh=False) as router:
        status = router.erasure_status(args.user)
    lines: list[str] = []
    for record in status.records:
        when = record.requested_at.isoformat() if record.requested_at else "?"
        done = f"done at {record.finished_at.isoformat()}" if record.finished_at else record.state
        counts = ", ".join(f"{what} {n}" for what, n in record.counts.items() if n) or "-"
        lines.append(f"erasure {record.request_id} in {record.cluster}: {done}; asked by {record.requested_by!r} at "
                     f"{when}; removed {counts}")
    if not status.records:
        lines.append("no erasure of this user is recorded in any cluster")
    elif status.unfinished:
        lines.append(f"NOT finished in {', '.join(status.unfinished)}: run feedrouter erase again")
    else:
        lines.append("finished in every cluster that holds a record")
    _emit(args, status.to_json(), "\n".join(lines))
    if not status.finished:
        raise _Failed
    return 0


def _cmd_export(args: argparse.Namespace, config: RouterConfig) -> int:
    from ..sync import FeedRouter

    progress = Progress(args)
    with FeedRouter(config, refresh=False) as router:
        try:
            result = router.export_user(args.user, args.dir, progress=progress.export)
        except InvalidItem as exc:
            raise _UsageError(str(exc)) from None
        finally:
            progress.close()
    files = {f.name: attrs.asdict(f) for f in result.files.values()}
    lines = [f"exported to {result.folder} from {len(result.periods)} periods; manifest {result.manifest}"]
    lines += [f"  {f.name}: {f.records} records, sha256 {f.sha256}" for f in result.files.values()]
    _emit(args, {"folder": str(result.folder), "files": files, "periods": [p[0] for p in result.periods]},
          "\n".join(lines))
    return 0


def _group_json(g: Any) -> dict[str, Any]:
    return {"key": g.key, "values": [_plain(v) for v in g.values], "window_start": g.window_start.isoformat(),
            "count": g.count, "actor_count": g.actor_count, "actors_capped": g.actors_capped,
            "actors": [_plain(a) for a in g.actors],
            "shown": [str(i.id) for i in g.items], "first_time": g.first_time.isoformat(),
            "last_time": g.last_time.isoformat(), "seen": g.seen, "read": g.read}


def _plain(value: Any) -> Any:
    return value if isinstance(value, (int, float, str, bool)) or value is None else str(value)


def _cmd_groups(args: argparse.Namespace, config: RouterConfig) -> int:
    from ..errors import InvalidCursor
    from ..sync import FeedRouter

    with FeedRouter(config, refresh=False) as router:
        try:
            page = router.read_groups(args.receiver, key=args.key, limit=args.limit, cursor=args.cursor, pull=args.pull)
        except InvalidCursor as exc:
            raise _UsageError(f"--cursor: {exc}") from None
        badge = router.unseen_groups(args.receiver, key=args.key, pull=args.pull)
    lines = [f"receiver {args.receiver!r}: {len(page.groups)} groups"
             f"{'' if page.next_cursor is None else ' (more: --cursor ' + page.next_cursor + ')'}; "
             f"{badge.count}{'+' if badge.capped else ''} unseen groups"]
    for g in page.groups:
        fields = ", ".join(f"{f}={v!r}" for f, v in zip((args.key or DEFAULT_GROUP_BY).fields, g.values))
        actors = ", ".join(repr(a) for a in g.actors)
        lines.append(f"  {g.last_time.isoformat()}  {fields} from {g.window_start.isoformat()}: {g.count} items from "
                     f"{g.actor_count}{'+' if g.actors_capped else ''} actors (newest: {actors}); "
                     f"first {g.first_time.isoformat()}; "
                     f"{'seen' if g.seen else 'unseen'}, {'read' if g.read else 'unread'}")
    _emit(args, {"receiver_id": args.receiver, "groups": [_group_json(g) for g in page.groups],
                 "next_cursor": page.next_cursor, "unseen_groups": badge.count, "capped": badge.capped,
                 "queried": list(page.queried)}, "\n".join(lines))
    return 0


# -- entry point ------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``feedrouter``; return the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    default = logging.INFO if args.command in ("scheduler", "worker") else logging.WARNING
    level = logging.ERROR if args.quiet else {0: default, 1: logging.INFO}.get(args.verbose, logging.DEBUG)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    previous = root.level  # given back on return: a caller running main() in its own process keeps its logging
    root.addHandler(handler)
    root.setLevel(level)
    try:
        config = load_config(args.config)
        commands = {
            "check": _cmd_check,
            "status": _cmd_status,
            "migrate": _cmd_migrate,
            "add-cluster": _cmd_add_cluster,
            "rollover": _cmd_rollover,
            "scheduler": _cmd_scheduler,
            "retire": _cmd_retire,
            "worker": _cmd_worker,
            "fanout-status": _cmd_fanout_status,
            "unseen": _cmd_unseen,
            "erase": _cmd_erase,
            "erase-status": _cmd_erase_status,
            "export": _cmd_export,
            "groups": _cmd_groups,
            "tail": run_tail,
        }
        return commands[args.command](args, config)
    except _Failed:
        return 1
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
        root.setLevel(previous)

