"""Running the measures, and reporting them: a markdown table, JSON, a chart and a PASS/FAIL summary."""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, TextIO

import attrs
import pymongo
from pymongo import MongoClient
from pymongo.errors import PyMongoError

from router import __version__
from router.errors import RouterError
from ..localservers import LocalClusters
from .common import NAMES, SIZES, UTC, Result
from .doors import bench_doors
from .edits import bench_big_edits, bench_delete
from .erase import bench_erase, bench_registry, bench_sender_index
from .feedsize import bench_feed_size
from .groups import bench_groups
from .fanout import bench_fanout, bench_fanout_memory
from .layouts import bench_layouts
from .live import LIVE_SIZES, bench_live, bench_live_write
from .notify import bench_type_index, bench_unseen
from .plans import bench_plans
from .reads import bench_async_reads, bench_pages, bench_pull_pages, bench_read
from .scale import SIZES as SCALE_SIZES
from .scale import SMALL_SIZES as SMALL_SCALE_SIZES
from .scale import bench_scale
from .sparse import SIZES as SPARSE_SIZES
from .sparse import SMALL_SIZES as SMALL_SPARSE_SIZES
from .sparse import bench_sparse
from .workers import bench_celery_scaling
from .writes import bench_cpu, bench_handwritten, bench_write_again, bench_write_batches, bench_writes

log = logging.getLogger(__name__)


def _save(results_dir: Path, environment: Mapping[str, Any], results: list[Result]) -> None:
    """Write ``bench.json``: the run's environment and every row so far."""
    (results_dir / "bench.json").write_text(json.dumps(
        {"environment": dict(environment), "results": [attrs.asdict(r) for r in results]}, indent=2))


def _chart(results: list[Result], path: Path) -> str:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "chart skipped: matplotlib is not installed (pip install 'feed-router[bench]')"
    shown = [r for r in results if r.ratios and r.judged and not r.name.startswith(("scale_", "layout_", "sparse_")) and r.name not in ("commands_per_page", "fanout_memory", "pull_pages", "type_index", "groups_page_requests")]
    if not shown:
        return "chart skipped: no ratio measured in this run"
    fig, ax = plt.subplots(figsize=(8, 3.2 + 0.35 * len(shown)))
    names = [r.name for r in shown]
    med = [statistics.median(r.ratios) for r in shown]
    lo = [m - min(r.ratios) for m, r in zip(med, shown)]
    hi = [max(r.ratios) - m for m, r in zip(med, shown)]
    colors = ["#2e7d32" if r.passed else "#c62828" for r in shown]
    ax.barh(names, med, xerr=[lo, hi], color=colors, capsize=4)
    for i, r in enumerate(shown):
        target = float(r.target.split()[-1])
        ax.plot([target, target], [i - 0.4, i + 0.4], color="black", linestyle="--")
        ax.text(max(med[i] + hi[i], target) + 0.05, i, f"{med[i]:.2f} (target {r.target})", va="center", fontsize=8)
    ax.set_xlabel("router / raw pymongo (median, min-max whiskers; dashed = target)")
    ax.set_title("feed-router overhead vs raw pymongo, same run")
    ax.set_xlim(0, max(max(med) + max(hi), 1.3) * 1.45)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return f"chart: {path}"


def _environment(uris: Sequence[str], backend: str, server: str | None = None) -> dict[str, Any]:
    """The run's context for the report header; ``server`` as LocalClusters.server_description gives it."""
    if server is None:  # servers we did not start: the wire protocol does not say which FerretDB backend
        client: MongoClient[dict[str, Any]]
        with MongoClient(uris[0]) as client:
            info = client.admin.command("buildInfo")
        ferret = info.get("ferretdb", {}).get("version") or info.get("ferretdbVersion")
        server = f"FerretDB {ferret}" if ferret else f"MongoDB {info.get('version')}"
    return {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "pymongo": pymongo.version,
        "feed_router": __version__,
        "server": server,
        "backend": backend,
    }


def run_bench(out: TextIO, *, size: str = "full", uris: Sequence[str] | None = None, results_dir: Path = Path("bench-results"),
              only: Sequence[str] | None = None) -> list[Result]:
    """Run the measurements and report them; return the results."""
    s = SIZES[size]
    results_dir.mkdir(parents=True, exist_ok=True)
    local: LocalClusters | None = None
    if uris is None:
        local = LocalClusters(3, names=list(NAMES))
        uris = local.start()
    try:
        servers = list(uris)
        env = _environment(servers, local.backend if local else "reused", local.server_description if local else None)
        out.write(f"# feed-router benchmark ({size})\n\n" + "\n".join(f"- {k}: {v}" for k, v in env.items()) + "\n\n")
        out.flush()
        steps: list[tuple[str, Callable[[], Result | list[Result]]]] = [
            ("cpu_ratio", lambda: bench_cpu(s.cpu, s.reps)),
            ("write_ratio", lambda: bench_writes(servers, s.writes, s.reps)),
            ("write_again_ratio", lambda: bench_write_again(servers, s.writes, s.reps)),
            ("write_batches", lambda: bench_write_batches(servers, s.writes, s.reps)),
            ("handwritten_ratio", lambda: bench_handwritten(servers, s.writes, s.reps)),
            ("commands_per_page", lambda: bench_pages(servers)),
            ("read_ratio", lambda: bench_read(servers, s.reps, s.reads)),
            ("async_reads", lambda: bench_async_reads(servers, s.reps, s.readers)),
            ("doors", lambda: bench_doors(servers, s.reps, s.readers)),
            ("pull_pages", lambda: bench_pull_pages(servers)),
            ("delete_ratio", lambda: bench_delete(servers, s.reps, s.deletes, s.delete_round)),
            ("fanout_ratio", lambda: bench_fanout(servers, s.fanout, 2 if size == "full" else s.reps)),
            ("fanout_memory", lambda: bench_fanout_memory(servers[0], s.memory)),
            ("celery_scaling", lambda: bench_celery_scaling(servers, *s.celery)),
            ("unseen_count", lambda: bench_unseen(servers, s.reps, s.reads)),
            ("type_index", lambda: bench_type_index(servers, s.writes, s.reps, s.reads)),
            ("groups", lambda: bench_groups(servers, big=s.group, reps=s.reps, rounds=7 if size == "full" else 3)),
            ("scale", lambda: bench_scale(servers, SCALE_SIZES if size == "full" else SMALL_SCALE_SIZES)),
            ("sparse_pages", lambda: bench_sparse(servers, SPARSE_SIZES if size == "full" else SMALL_SPARSE_SIZES, s.reps)),
            ("layouts", lambda: bench_layouts(servers[-1], items=s.layouts[0], receivers=s.layouts[1], fanout=s.layouts[2],
                                              reps=s.layouts[3], rounds=7 if size == "full" else 2)),
            ("feed_size", lambda: bench_feed_size(servers, sizes=s.feed_sizes, rounds=15 if size == "full" else 3,
                                                  reps=3 if size == "full" else 1)),
            ("big_edits", lambda: bench_big_edits(servers, copies=s.big_edits[0], during=s.big_edits[1])),
            ("plans", lambda: bench_plans(servers, items=20_000 if size == "full" else 2_000)),
            ("sender_index", lambda: bench_sender_index(servers, copies=s.fanout // 20, writes=s.writes, reps=s.reps)),
            ("registry", lambda: bench_registry(servers, writes=s.writes, copies=s.fanout // 20, reps=s.reps)),
            ("erase_user", lambda: bench_erase(servers, followers=s.erase[0], posts=s.erase[1], inbox=s.erase[2])),
            ("live", lambda: bench_live(servers, LIVE_SIZES[size])),
            ("live_write", lambda: bench_live_write(servers, LIVE_SIZES[size])),
        ]
        results: list[Result] = []
        for name, step in steps:
            if only and name not in only:
                continue
            out.write(f"running {name} ...")
            out.flush()
            began = time.monotonic()
            try:
                result = step()
            except (RouterError, PyMongoError) as exc:  # one row's failure is reported, not the end of the run
                log.exception("benchmark %s failed", name)
                result = Result(name, f"{name} (failed)", "-", [], [], [], "runs", False, f"failed: {exc}")
            out.write(f" {time.monotonic() - began:,.1f} s\n")  # what each step costs a run (and the test suite)
            results += result if isinstance(result, list) else [result]
            # Written after every row too, so a run stopped part-way keeps the rows it finished.
            _save(results_dir, {**env, "partial": f"{len(results)} rows, stopped after {name}"}, results)
        out.write("\n| measure | router | raw pymongo | unit | ratio router/raw | target | result |\n"
                  "| --- | --- | --- | --- | --- | --- | --- |\n")
        out.write("\n".join(r.row() for r in results) + "\n\n")
        for r in results:
            if r.note:
                out.write(f"- {r.name}: {r.note}\n")
        _save(results_dir, env, results)
        out.write(f"\nraw figures: {results_dir / 'bench.json'}\n{_chart(results, results_dir / 'bench.png')}\n")
        judged = [r for r in results if r.judged]
        verdicts = ", ".join(f"{r.name} {r.verdict}" for r in results)
        out.write(f"SUMMARY: {sum(r.passed for r in judged)} of {len(judged)} targets met: {verdicts}\n")
        return results
    finally:
        if local is not None:
            local.stop()


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m harness.bench [--small] [--uris U1,U2,U3] [--out DIR] [--only NAME ...] [--strict]``."""
    parser = argparse.ArgumentParser(prog="scripts/bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", action="store_true", help="tiny sizes: checks the benchmark runs (used by the tests)")
    parser.add_argument("--uris", help="reuse three running servers (comma-separated) instead of starting them")
    parser.add_argument("--out", type=Path, default=Path("bench-results"), help="folder for bench.json and bench.png")
    parser.add_argument("--only", nargs="*", help="run only these measures")
    parser.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    args = parser.parse_args(argv)
    uris = args.uris.split(",") if args.uris else None
    results = run_bench(sys.stdout, size="small" if args.small else "full", uris=uris, results_dir=args.out, only=args.only)
    return 1 if args.strict and not all(r.passed for r in results if r.judged) else 0
