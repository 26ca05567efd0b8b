"""The scale plan: every figure follows from its inputs, and the script takes the operator's own numbers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from router.admin.capacity import Inputs, document_bytes, main, plan, pulled_share


def rows(inputs: Inputs) -> dict[str, float]:
    return {r.what: r.value for r in plan(inputs)}


def test_copies_bytes_and_rates_follow_from_the_inputs() -> None:
    """Copies = posts x followers x (1 - pulled link share); bytes, per-shard rates and workers follow from them."""
    i = Inputs(posts_per_day=1e6, mean_followers=100, pull_threshold=1e9, shards=4, peak_factor=2, worker_copies_per_s=1000)
    _, links = pulled_share(i)
    got = rows(i)
    copies = 1e6 * 100 * (1 - links)
    assert got["feed copies written"] == pytest.approx(copies)
    copy_b, outbox_b = document_bytes(i.payload_bytes)
    assert got["bytes written"] == pytest.approx((copies * copy_b + 1e6 * outbox_b) / 1e12)
    assert got["peak copies per shard"] == pytest.approx(copies / 86_400 * 2 / 4)
    assert got["Celery workers at peak"] == -(-copies / 86_400 * 2 // 1000)
    assert got["periods in the read window"] == 15 and got["periods configured"] == 120


def test_a_lower_pull_threshold_moves_copies_to_outboxes() -> None:
    """Under the heavy tail, lowering the threshold pulls more authors and writes fewer copies."""
    high, low = rows(Inputs(pull_threshold=1e6)), rows(Inputs(pull_threshold=1e4))
    assert low["feed copies written"] < high["feed copies written"]
    assert low["outbox entries of pulled authors"] > high["outbox entries of pulled authors"]
    assert pulled_share(Inputs(pull_threshold=1)) == (1.0, 1.0)


def test_the_script_takes_flags_and_a_bench_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--posts-per-day and --bench change the figures; --json gives rows."""
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps({"results": [{"name": "fanout_ratio", "router": [10_000.0, 30_000.0, 20_000.0]}]}))
    assert main(["--posts-per-day", "1e6", "--bench", str(bench), "--json"]) == 0
    out = {r["what"]: r for r in json.loads(capsys.readouterr().out)}
    assert out["outbox entries written"]["value"] == 1e6
    assert "20,000 copies/s" in out["fan-out processes at peak (in-process)"]["how"]
    assert main([]) == 0
    assert capsys.readouterr().out.startswith("| quantity | value | unit | how |")
