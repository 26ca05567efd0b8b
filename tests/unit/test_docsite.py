"""The docs site's generated parts: the performance tables from docs/bench.json, and docstrings as Markdown."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from harness.docsite import _number, bench_tables, markdown_docstring, render

REPO = Path(__file__).resolve().parents[2]
BENCH = json.loads((REPO / "docs" / "bench.json").read_text())


def test_every_row_of_bench_json_is_in_a_table_with_its_verdict() -> None:
    tables = bench_tables(BENCH)
    shown = "\n".join(tables[name] for name in ("main", "scale", "layouts", "erasure"))
    for row in BENCH["results"]:
        line = next((x for x in shown.splitlines() if x.startswith(f"| {row['what']}")), None)
        assert line is not None, row["name"]
        verdict = "reported" if row["target"] == "-" else "PASS" if row["passed"] else "FAIL"
        assert line.endswith(f"| {row['target']} | {verdict} |"), line
        if row["note"]:
            assert f"- `{row['name']}`: {row['note']}" in shown


def test_figures_are_the_medians_of_the_runs() -> None:
    main = bench_tables(BENCH)["main"]
    fanout = next(r for r in BENCH["results"] if r["name"] == "fanout_ratio")
    assert f"| {_number(statistics.median(fanout['router']))} [" in main
    assert "(copies/s) | 15,400 [14,700-16,200] | 10,700 [10,600-10,900] | 1.44 [1.4-1.48] | >= 0.90 | PASS |" in main
    assert "(later run) (ns/item) | 2,650 [2,550-2,750] | 1,960 [1,890-2,030] | 1.35 [1.26-1.42] | <= 1.20 | FAIL |" in main


@pytest.mark.parametrize(("value", "text"), [(1492.83, "1,490"), (45670.5, "45,700"), (7.2303, "7.23"), (0.0376, "0.0376"),
                                             (1.0, "1"), (-0.2, "-0.2"), (0, "0")])
def test_numbers_keep_three_significant_digits(value: float, text: str) -> None:
    assert _number(value) == text


def test_every_marker_of_the_pages_is_filled_and_an_unknown_one_fails() -> None:
    tables = bench_tables(BENCH)
    for page in (REPO / "docs").rglob("*.md"):
        out = render(page.read_text(), tables, page.name)
        assert not [line for line in out.splitlines() if line.startswith("<!-- bench:")], page
    with pytest.raises(ValueError, match="no bench table named 'nope'"):
        render("<!-- bench: nope -->\n", tables)


def test_docstring_roles_become_markdown() -> None:
    text = ("See :class:`~router.AsyncFeedRouter`, :meth:`refresh`, :mod:`router.core` and ``_id``\\ s.\n\n"
            "Example::\n\n    feeds.read(7)\n")
    assert markdown_docstring(text) == ("See `AsyncFeedRouter`, `refresh()`, `router.core` and ``_id``s.\n\n"
                                        "Example:\n\n    feeds.read(7)\n")
