"""The Celery scaling measure as a benchmark row: two workers against one, and what the machine ran out of.

Runs :func:`harness.bench_celery.run_celery_bench` (a fan-out in-process, on one
``feedrouter worker`` and on two, a local Redis as the broker) *reps* times on the
benchmark's servers. The target, two workers at least 1.6 times one, holds only where the
servers are not the bottleneck; on a machine whose cores the servers share with the
workers, the note says how busy the machine was during the one-worker run and how much of
it the servers, the workers and the publisher used, measured from ``/proc``.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from .common import Result

__all__ = ["bench_celery_scaling"]

#: Two workers against one, where the servers are not the bottleneck.
TARGET = 1.6


def _shares(run: dict[str, Any]) -> dict[str, float]:
    """Each group's share of the machine's CPU over a run, and ``other`` (busy, by anything else on the machine)."""
    cpu = run["cpu"]
    total = run["seconds"] * cpu["cores"]
    shares = {name: cpu[f"{name}_s"] / total for name in ("servers", "workers", "publisher", "broker")}
    return {**shares, "other": max(cpu["busy_share"] - sum(shares.values()), 0.0)}


def _described(run: dict[str, Any]) -> str:
    parts = ", ".join(f"{share:.0%} {name}" for name, share in _shares(run).items())
    return f"machine {run['cpu']['busy_share']:.0%} busy ({parts})"


def _reason(run: dict[str, Any]) -> str:
    """Why a second worker could not double the rate, from the one-worker run's CPU figures."""
    busy, shares = run["cpu"]["busy_share"], _shares(run)
    ours = shares["workers"] + shares["publisher"]
    if busy < 0.85:
        return f"with one worker {1 - busy:.0%} of the machine was idle: the bottleneck is not CPU (not measured here)"
    return (f"with one worker the machine was already {busy:.0%} busy, {1 - busy:.0%} idle for a second worker: the cores "
            f"are the bottleneck; the servers used {shares['servers']:.0%} of them ({shares['servers'] / ours:.1f} times the "
            f"worker and publisher), other processes on the machine {shares['other']:.0%}")


def bench_celery_scaling(uris: Sequence[str], receivers: int, reps: int) -> Result:
    """Copies per second of one fan-out of *receivers* on two Celery workers vs one, *reps* times."""
    from ..bench_celery import run_celery_bench  # it imports the benchmark's helpers: import it when run

    runs = [run_celery_bench(receivers=receivers, uris=uris) for _ in range(reps)]
    two = [r["celery_2_workers"]["copies_per_second"] for r in runs]
    one = [r["celery_1_worker"]["copies_per_second"] for r in runs]
    ratios = [a / b for a, b in zip(two, one)]
    speedup = statistics.median(ratios)
    middle = sorted(runs, key=lambda r: r["speedup_2_vs_1_workers"])[len(runs) // 2]
    note = (f"{receivers:,} receivers, batches of {middle['batch_size']:,}, {middle['cpus']} cores shared by servers, Redis, "
            f"workers and publisher: in-process {statistics.median(r['in_process']['copies_per_second'] for r in runs):,.0f}"
            f" copies/s, 1 worker {statistics.median(one):,.0f}, 2 workers {statistics.median(two):,.0f} "
            f"(x{speedup:.2f}); median run: with 1 worker {_described(middle['celery_1_worker'])}; "
            f"with 2 workers {_described(middle['celery_2_workers'])}")
    if speedup < TARGET:
        note += ". Missed: " + _reason(middle["celery_1_worker"])
    return Result("celery_scaling", f"fan-out copies/s: 2 Celery workers vs 1 ({receivers:,} receivers; target where "
                  "the servers are not the bottleneck)", "copies/s", two, one, ratios, f">= {TARGET}", speedup >= TARGET, note)
