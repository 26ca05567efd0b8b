"""The scale plan: copies, bytes, write rates, periods, clients and workers for a given load.

``scripts/scale_plan`` runs :func:`main`; every input is a flag, so an operator puts in
their own numbers. Measured constants (fan-out rate per process, per-worker Celery rate,
finds per page) default to this project's own runs and can be read from a
``bench.json`` with ``--bench``. Document sizes are not assumed: they are the BSON size of
the documents this router's own code builds (the default layout's and the outbox's
``documents``) for a payload of ``--payload-bytes``.

The follower counts follow a Pareto law with shape ``--tail-alpha`` and the given mean,
which sets how much of the fan-out belongs to authors above ``--pull-threshold`` (pulled,
so no copies; one outbox entry per post either way).

Example::

    python -m router.admin.capacity --daily-users 100e6 --posts-per-day 500e6 --shards 12
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from statistics import median
from typing import Any

import attrs
import bson

from ..ids import data_key
from ..core.layouts import DEFAULT, LAYOUTS, Copy, CopyList, Post, outbox
from ..model import Activity

__all__ = ["Inputs", "Row", "plan", "main"]

#: Measured defaults, from docs/bench.json (run of 2026-11-23, FerretDB 1.24 on PostgreSQL,
#: 2 shared cores) and the README's Celery scaling run (python -m harness.bench_celery).
MEASURED = {
    "fanout_copies_per_s": 43_200.0,   # bench.json fanout_ratio, router median: in-process fan_out
    "worker_copies_per_s": 15_200.0,   # README "Measured scaling": one Celery worker, lowest of four runs
    "finds_per_page": 1.0,             # bench.json commands_per_page: the newest period fills the page
    "pull_finds_per_cluster": 2.0,     # bench.json pull_pages: at most 2 finds per cluster per pulled page
    "pull_docs_per_item": 1.53,        # bench.json pull_pages: documents sent per item served
}
DAY = 86_400
TB = 1e12


@attrs.frozen(kw_only=True)
class Inputs:
    """The load and the deployment, every one a flag of :func:`main`."""

    daily_users: float = 100e6
    posts_per_day: float = 500e6
    mean_followers: float = 200.0
    tail_alpha: float = 1.2
    pull_threshold: float = 100_000.0
    payload_bytes: int = 100
    read_window_days: float = 400.0
    period_days: float = 365.25 / 12
    years: float = 10.0
    peak_factor: float = 3.0
    shards: int = 12
    batch_size: int = 1000
    pages_per_user_per_day: float = 20.0
    fanout_copies_per_s: float = MEASURED["fanout_copies_per_s"]
    worker_copies_per_s: float = MEASURED["worker_copies_per_s"]
    finds_per_page: float = MEASURED["finds_per_page"]
    pull_finds_per_cluster: float = MEASURED["pull_finds_per_cluster"]
    pull_docs_per_item: float = MEASURED["pull_docs_per_item"]


@attrs.frozen
class Row:
    """One line of the plan: what, how much, in what unit, and how it was computed."""

    what: str
    value: float
    unit: str
    how: str


def document_bytes(payload_bytes: int) -> tuple[int, int]:
    """BSON bytes of one feed copy and one outbox entry built by this router for a payload of that size."""
    activity = Activity(sender_id=10**12, event_time=datetime(2026, 1, 1, tzinfo=timezone.utc), type=1,
                        data={"p": "x" * max(payload_bytes - 8, 0)}, data_key=data_key("post", 10**12))
    a = activity
    copy = Copy(bson.ObjectId(), 10**12 + 1, a.sender_id, a.event_time, a.type, a.data, a.data_key)
    (stored,) = LAYOUTS[DEFAULT].documents(CopyList([copy]))
    (entry,) = outbox.OUTBOX.documents([Post(bson.ObjectId(), activity)])
    return len(bson.encode(stored)), len(bson.encode(entry))


def pulled_share(i: Inputs) -> tuple[float, float]:
    """Under a Pareto law (shape alpha, the given mean): the share of authors, and of follower links, above the threshold."""
    x_min = i.mean_followers * (i.tail_alpha - 1) / i.tail_alpha
    if i.pull_threshold <= x_min:
        return 1.0, 1.0
    ratio = x_min / i.pull_threshold
    return ratio**i.tail_alpha, ratio ** (i.tail_alpha - 1)


def plan(i: Inputs) -> list[Row]:
    """Every figure of the plan, computed from *i* only."""
    authors, links = pulled_share(i)
    copy_b, outbox_b = document_bytes(i.payload_bytes)
    copies = i.posts_per_day * i.mean_followers * (1 - links)
    pulled_posts = i.posts_per_day * authors
    bytes_day = copies * copy_b + i.posts_per_day * outbox_b
    peak = copies / DAY * i.peak_factor
    window_periods = math.ceil(i.read_window_days / i.period_days) + 1
    pages = i.daily_users * i.pages_per_user_per_day / DAY * i.peak_factor
    return [
        Row("authors above the pull threshold", authors, "share", f"Pareto alpha {i.tail_alpha}, mean {i.mean_followers:g}"),
        Row("follower links of pulled authors", links, "share", "(x_min / threshold)^(alpha - 1): copies not written"),
        Row("feed copies written", copies, "per day", "posts x mean followers x (1 - pulled link share)"),
        Row("outbox entries written", i.posts_per_day, "per day", "one per post, pushed or pulled (publish)"),
        Row("outbox entries of pulled authors", pulled_posts, "per day", "posts x pulled author share"),
        Row("copies per outbox entry", copies / i.posts_per_day, "ratio", "copy volume against outbox volume"),
        Row("bytes per copy / per outbox entry", copy_b, "bytes", f"BSON of this router's documents; outbox {outbox_b} B"),
        Row("bytes written", bytes_day / TB, "TB per day", "documents only: no index or storage-engine overhead"),
        Row("copies per period", copies * i.period_days, "per period", f"period of {i.period_days:.2f} days"),
        Row("bytes per period", bytes_day * i.period_days / TB, "TB per period", "documents only"),
        Row("bytes in the read window", bytes_day * i.read_window_days / TB, "TB", f"{i.read_window_days:g} days kept readable"),
        Row("peak copies written", peak, "per s", f"daily mean x peak factor {i.peak_factor:g}"),
        Row("peak copies per shard", peak / i.shards, "per s", f"{i.shards} shards, receivers spread evenly (hashed key)"),
        Row("peak insert commands per shard", peak / i.shards / i.batch_size, "per s", f"batches of {i.batch_size}"),
        Row("periods in the read window", window_periods, "periods", "ceil(window / period) + 1 partly covered"),
        Row("periods configured", math.ceil(i.years * 365.25 / i.period_days), "periods", f"after {i.years:g} years"),
        Row("hot clients per router", 2, "clients", "the write period's, and the read's newest (a page filled by it: "
            "1 find); more only for pages reading further back, at most the window's periods"),
        Row("fan-out processes at peak (in-process)", peak / i.fanout_copies_per_s, "processes",
            f"measured {i.fanout_copies_per_s:,.0f} copies/s per process"),
        Row("Celery workers at peak", math.ceil(peak / i.worker_copies_per_s), "workers",
            f"measured {i.worker_copies_per_s:,.0f} copies/s per worker"),
        Row("page reads at peak", pages, "per s", f"{i.pages_per_user_per_day:g} pages per daily user, peak factor"),
        Row("finds per page", i.finds_per_page, "finds", "measured: the newest period fills the page"),
        Row("finds per page pulling authors", i.pull_finds_per_cluster, "finds per period read",
            f"measured; {i.pull_docs_per_item:.2f} documents sent per item served"),
        Row("finds at peak", pages * i.finds_per_page, "per s", "page reads x finds per page"),
    ]


def measured_from(path: Path) -> dict[str, float]:
    """The measured inputs found in a ``bench.json`` (``scripts/bench`` output)."""
    results = {r["name"]: r for r in json.loads(path.read_text(encoding="utf-8"))["results"]}
    out: dict[str, float] = {}
    if "fanout_ratio" in results:
        out["fanout_copies_per_s"] = median(results["fanout_ratio"]["router"])
    if "commands_per_page" in results:
        out["finds_per_page"] = min(results["commands_per_page"]["router"])
    if "pull_pages" in results:
        out["pull_finds_per_cluster"] = max(results["pull_pages"]["router"])
        out["pull_docs_per_item"] = median(results["pull_pages"]["ratios"])
    return out


def table(rows: Sequence[Row]) -> str:
    """The plan as a markdown table."""
    def shown(v: float) -> str:
        return f"{v:.3g}" if v < 10 else f"{v:,.0f}"

    lines = ["| quantity | value | unit | how |", "| --- | --- | --- | --- |"]
    lines += [f"| {r.what} | {shown(r.value)} | {r.unit} | {r.how} |" for r in rows]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """``scripts/scale_plan [--FLAG VALUE ...] [--bench docs/bench.json] [--json]``: print the plan."""
    parser = argparse.ArgumentParser(prog="scripts/scale_plan", description=__doc__.split("\n\n")[0])
    defaults = Inputs()
    for field in attrs.fields(Inputs):
        kind = int if field.type in ("int", int) else float
        parser.add_argument(f"--{field.name.replace('_', '-')}", type=kind, default=getattr(defaults, field.name),
                            help=f"default {getattr(defaults, field.name):g}")
    parser.add_argument("--bench", type=Path, help="take the measured inputs from this bench.json")
    parser.add_argument("--json", action="store_true", help="rows as JSON")
    args = vars(parser.parse_args(argv))
    bench, as_json = args.pop("bench"), args.pop("json")
    inputs = Inputs(**{**args, **(measured_from(bench) if bench else {})})
    rows = plan(inputs)
    sys.stdout.write((json.dumps([attrs.asdict(r) for r in rows], indent=2) if as_json else table(rows)) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
