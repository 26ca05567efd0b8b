"""Peak memory and throughput of fan-outs from a generator, one fresh process per size.

    scripts/fanout_memory                          # 100k and 1M receivers on a local server it starts
    scripts/fanout_memory --sizes 20000 100000     # other sizes
    scripts/fanout_memory --uri mongodb://127.0.0.1:27101 --json
    scripts/fanout_memory --celery                 # publish_fan_out to a local Redis instead
    python -m harness.fanout_memory ...     # the same

Each size runs in a new Python process: it imports the package, connects, registers one
open-ended period in a database of its own, records its peak RSS (VmHWM in
/proc/self/status, else ru_maxrss) as the baseline, fans one activity out to a generator
of receivers, and records the peak again. Growth = peak after - baseline: the memory the
fan-out itself needed. It stays flat as the receiver count grows because at most
batch_size x concurrency copies exist at once. The database is dropped afterwards. With
``--celery`` each row measures the publisher of a Celery fan-out instead
(:func:`~router.fanout.celery.publish_fan_out` to a local Redis it starts; no worker runs,
so "written" is the receivers sent in tasks).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import resource
import subprocess
import sys
import time
import uuid
from typing import Any


def peak_rss_bytes() -> int:
    """This process's peak resident set size so far."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # bytes on macOS, KiB elsewhere


def measure(uri: str, receivers: int, *, batch_size: int, concurrency: int, broker: str | None = None) -> dict[str, Any]:
    """One fan-out to *receivers* ids from a generator (published to *broker* when given); runs in a fresh process."""
    from datetime import datetime, timezone

    from router import Activity, ClusterConfig, ClusterMeta, FeedRouter, RouterConfig, data_key
    from router.admin.indexes import create_feed_indexes
    from router.admin.migrate import discover, migrate_cluster
    from router.core.layouts import DEFAULT, LAYOUTS
    from router.storage.clusters import Cluster
    from harness.javaserver import drop_database

    utc = timezone.utc
    database = f"fanout_memory_{uuid.uuid4().hex[:10]}"
    config = RouterConfig(
        database=database,
        clusters=(ClusterConfig(name="memory", uri=uri, options={"serverSelectionTimeoutMS": 10_000}),),
        batch_size=batch_size,
    )
    cluster = Cluster(config.clusters[0], config)
    try:
        start = datetime(2024, 1, 1, tzinfo=utc)
        migrate_cluster(cluster, config, discover())
        cluster.write_meta(ClusterMeta(name="memory", start_date=start, creator_name="fanout_memory", created_at=start))
        create_feed_indexes(cluster, LAYOUTS[DEFAULT])  # the feed indexes, as adding a period does
        with FeedRouter(config, refresh=False) as router:
            activity = Activity(
                sender_id=1000765,
                event_time=datetime(2024, 6, 1, 12, tzinfo=utc),
                type=1,
                data={"fabula_id": 1000983, "text": "fan-out memory probe"},
                data_key=data_key("fabula", 1000983),
            )
            router.clusters["memory"].ping()
            stream = (10_000_000 + i for i in range(receivers))
            if broker is None:
                baseline = peak_rss_bytes()
                began = time.perf_counter()
                written = router.fan_out(activity, stream, concurrency=concurrency).written
            else:
                from router.fanout.celery import make_app, publish_fan_out

                app = make_app(broker)
                try:
                    app.connection_for_write().ensure_connection(max_retries=3)  # imports and connects before the baseline
                    baseline = peak_rss_bytes()
                    began = time.perf_counter()
                    written = publish_fan_out(router, app, activity, stream).receivers
                finally:
                    app.close()
            seconds = time.perf_counter() - began
            peak = peak_rss_bytes()
    finally:
        if cluster.capabilities().server == "mongo-java-server":  # it cannot drop a migrated database as it is
            drop_database(cluster.client, database)
        else:
            cluster.client.drop_database(database)
        cluster.close()
    return {
        "receivers": receivers,
        "written": written,
        "batch_size": batch_size,
        "concurrency": concurrency,
        "seconds": round(seconds, 2),
        "receivers_per_second": round(receivers / seconds),
        "baseline_mb": round(baseline / 2**20, 1),
        "peak_mb": round(peak / 2**20, 1),
        "peak_growth_mb": round((peak - baseline) / 2**20, 1),
    }


def run_child(uri: str, receivers: int, args: argparse.Namespace) -> dict[str, Any]:
    command = [
        sys.executable, "-m", "harness.fanout_memory", "--child", str(receivers), "--uri", uri,
        "--batch-size", str(args.batch_size), "--concurrency", str(args.concurrency),
        *(["--broker", args.broker] if args.broker else []),
    ]
    out = subprocess.run(command, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"fan-out of {receivers} receivers failed (exit {out.returncode}):\n{out.stderr[-3000:]}")
    row: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return row


def table(rows: list[dict[str, Any]]) -> str:
    header = f"{'receivers':>10} {'written':>10} {'seconds':>8} {'receivers/s':>12} {'baseline MB':>12} {'peak MB':>8} {'peak growth MB':>15}"
    lines = [header, "-" * len(header)]
    for r in rows:
        lines.append(
            f"{r['receivers']:>10} {r['written']:>10} {r['seconds']:>8.2f} {r['receivers_per_second']:>12} "
            f"{r['baseline_mb']:>12.1f} {r['peak_mb']:>8.1f} {r['peak_growth_mb']:>15.1f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/fanout_memory", description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000], help="receiver counts (default: 100000 1000000)")
    parser.add_argument("--uri", help="use this server instead of starting a local one")
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    parser.add_argument("--celery", action="store_true", help="measure publish_fan_out to a local Redis it starts")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--broker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.child is not None:
        row = measure(args.uri, args.child, batch_size=args.batch_size, concurrency=args.concurrency, broker=args.broker)
        print(json.dumps(row))
        return 0

    with contextlib.ExitStack() as stack:
        if args.celery:
            from .redis import LocalRedis

            args.broker = stack.enter_context(LocalRedis()).url
        if args.uri:
            rows = [run_child(args.uri, n, args) for n in args.sizes]
            backend = "given server"
        else:
            from .localservers import LocalClusters

            local = stack.enter_context(LocalClusters(1, names=["memory"]))
            rows = [run_child(local.uris[0], n, args) for n in args.sizes]
            backend = local.backend
    if args.json:
        print(json.dumps(rows))
    else:
        what = "publish_fan_out (Celery, local Redis, no worker)" if args.celery else "fan-out"
        print(f"{what} of one activity to a generator of receivers ({backend}; batch_size={args.batch_size}, "
              f"concurrency={args.concurrency}; one fresh process per row)")
        print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
