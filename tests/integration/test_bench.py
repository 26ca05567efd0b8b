"""The benchmark runs at a small size and reports every measure; its targets are judged by its own summary."""

from __future__ import annotations

import io
import json
import re
from collections.abc import Callable
from pathlib import Path

from harness.bench import run_bench
from harness.localservers import LocalClusters


def test_small_benchmark_runs(servers: LocalClusters, tmp_path: Path, record_property: Callable[[str, object], None]) -> None:
    """A small run prints the table and the summary, and writes the raw figures."""
    out = io.StringIO()
    results = run_bench(out, size="small", uris=servers.uris, results_dir=tmp_path)
    text = out.getvalue()
    for step, seconds in re.findall(r"^running (\S+) \.\.\. ([\d,.]+) s$", text, re.MULTILINE):
        record_property(f"seconds_{step}", float(seconds.replace(",", "")))  # what each step cost (the JUnit XML shows it)
    names = {r.name for r in results}
    assert {"cpu_ratio", "write_ratio", "write_again_ratio", "commands_per_page", "read_ratio", "async_reads", "pull_pages", "delete_ratio",
            "fanout_ratio", "fanout_memory", "scale_startup_sync", "scale_threads_async", "scale_rss_sync",
            "scale_commands_sync", "scale_commands_async", "celery_scaling", "async_door_ratio", "read_cpu_async",
            "read_cpu_sync", "layout_page_documents", "layout_page_latency", "layout_fanout", "layout_bytes_per_item",
            "page_vs_feed_size_copies", "page_vs_feed_size_buckets", "delete_big", "update_during_fanout", "plan_page",
            "plan_delete_step", "plan_fence", "plan_bucket_append", "sparse_page_latency", "sparse_page_commands",
            "sparse_page_budget", "sender_index", "registry_write_many", "registry_write_many_shared",
            "erasure_check_fanout", "erase_user", "groups_page_latency", "groups_page_requests",
            "group_count_cost", "live_fanout_idle", "live_fanout_1pct", "live_write_idle", "live_latency_20", "live_latency_100",
            "live_idle_memory"} <= names
    assert "| measure | router | raw pymongo |" in text
    judged = [r for r in results if r.judged]
    assert text.rstrip().splitlines()[-1].startswith(f"SUMMARY: {sum(r.passed for r in judged)} of {len(judged)} targets met")
    data = json.loads((tmp_path / "bench.json").read_text())
    plans = [r for r in data["results"] if r["unit"] == "plan"]  # what explain said: a note, no figures
    assert len(data["results"]) == len(results) and all(r["router"] for r in data["results"] if r not in plans)
    assert len(plans) == 4 and all(r["note"] and "refused" not in r["note"].split(";")[-1] for r in plans)
    assert next(r for r in results if r.name == "plan_page").note.count("[") >= 1  # the page query uses an index
    big = [r for r in results if r.name in ("delete_big", "update_during_fanout", "erase_user")]
    assert all(r.passed for r in big), [r.note for r in big]  # nothing of the deleted post left, no old data, nothing of the erased user
    for exact in ("commands_per_page", "pull_pages", "scale_commands_sync", "scale_commands_async", "layout_page_documents",
                  "groups_page_requests"):  # counts, not timings: these must hold at any size
        result = next(r for r in results if r.name == exact)
        assert result.passed, result.note
    layouts = [r for r in results if r.name.startswith("layout_")]  # buckets vs copies, on the run's own server
    assert [r.name for r in layouts] == ["layout_page_documents", "layout_page_latency", "layout_fanout", "layout_bytes_per_item"]
    assert all(r.router and r.raw and len(r.ratios) == len(r.router) for r in layouts)
    assert layouts[0].raw == [50.0, 50.0]  # a page of 50 in copies: 50 documents, newest page and deep page
    celery = next(r for r in results if r.name == "celery_scaling")  # in-process, one worker and two workers in one run
    assert celery.router and celery.raw and all(v > 0 for v in [*celery.router, *celery.raw, *celery.ratios]), celery
    assert "1,000 receivers" in celery.note and not re.search(r"in-process 0 copies/s", celery.note), celery.note
