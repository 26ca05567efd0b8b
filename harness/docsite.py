"""What the docs site adds to mkdocs: the performance tables built from ``docs/bench.json``, and
docstrings whose Sphinx roles read as Markdown.

mkdocs loads this file twice, by path (``mkdocs.yml``): as a hook module, whose
:func:`on_page_markdown` replaces each ``<!-- bench: NAME -->`` marker of a page with the table
:func:`bench_tables` renders from the benchmark's JSON, so the tables are never typed by hand
and cannot drift from the figures; and as a griffe extension (:class:`SphinxRoles`) for
mkdocstrings, which rewrites ``:class:`~router.Page``` and ``Example::`` in docstrings into
Markdown before they are rendered. It imports nothing from the checkout, so ``mkdocs build``
needs no PYTHONPATH.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import griffe

#: A page asks for a table with this marker, alone on its line: ``<!-- bench: main -->``.
MARKER = re.compile(r"^<!-- bench: ([a-z]+) -->$", re.MULTILINE)

#: The rows of what erasing costs (``harness/bench/erase.py``), run on their own: the ``erasure`` table.
ERASURE_ROWS = ("sender_index", "registry_write_many", "registry_write_many_shared", "erasure_check_fanout", "erase_user")
#: Rows whose figures are one per case (a page in one period and over three; 10, 100 and
#: 1,000 periods), not repetitions of one measure: shown as a list, not as a median.
_PER_CASE = ("commands_per_page", "layout_page_documents")


def _number(x: float) -> str:
    """Three significant digits, thousands separated, no trailing zeros: 1,490; 45,700; 7.23; 0.0376."""
    if x == 0:
        return "0"
    decimals = 2 - math.floor(math.log10(abs(x)))
    if decimals <= 0:
        return f"{round(x, decimals):,.0f}"
    return f"{round(x, decimals):,.{decimals}f}".rstrip("0").rstrip(".")


def _spread(xs: Sequence[float]) -> str:
    """``median [min-max]`` of repetitions; the value alone when there is one."""
    if not xs:
        return "-"
    if len(xs) == 1:
        return _number(xs[0])
    return f"{_number(statistics.median(xs))} [{_number(min(xs))}-{_number(max(xs))}]"


def _cases(xs: Sequence[float]) -> str:
    return " / ".join(_number(x) for x in xs) if xs else "-"


def _per_case(row: Mapping[str, Any]) -> bool:
    return row["name"] in _PER_CASE or str(row["name"]).startswith("scale_")


def _verdict(row: Mapping[str, Any]) -> str:
    if row["target"] == "-":
        return "reported"
    return "PASS" if row["passed"] else "FAIL"


def _table(rows: Sequence[Mapping[str, Any]], header: Sequence[str], later: Sequence[str] = ()) -> str:
    """One Markdown table of *rows* (columns: measure (unit), router, raw, ratio, target, result), then their notes."""
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for row in rows:
        values = _cases if _per_case(row) else _spread
        mark = " (later run)" if row["name"] in later else ""
        ratios = "-" if not any(row["ratios"]) else _spread(row["ratios"])  # all 0: the row has no ratio
        cells = [f"{row['what']}{mark} ({row['unit']})", values(row["router"]), values(row["raw"]),
                 ratios, row["target"], _verdict(row)]
        lines.append("| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |")
    notes = [f"- `{row['name']}`: {row['note']}" for row in rows if row["note"]]
    return "\n".join(lines) + ("\n\nNotes recorded with the rows:\n\n" + "\n".join(notes) if notes else "") + "\n"


def _environment(env: Mapping[str, Any]) -> str:
    return "\n".join(f"- {key}: {value}" for key, value in env.items() if not isinstance(value, Mapping)) + "\n"


def bench_tables(bench: Mapping[str, Any]) -> dict[str, str]:
    """The Markdown a page can ask for, by marker name, from the JSON ``scripts/bench`` writes.

    ``main``: every row of the main run (``later_rows`` marked as from the later run);
    ``scale``: the ``scale_*`` rows (figures at 10 / 100 / 1,000 periods); ``layouts``: the
    ``layout_*`` rows (router = buckets, raw = copies); ``erasure``: the :data:`ERASURE_ROWS`
    (router = with, raw = without; the run in ``erasure_environment``, shown under the table);
    ``environment``, ``scale_environment``, ``layouts_environment``: what each run ran on.
    """
    results: list[Mapping[str, Any]] = bench["results"]
    env: Mapping[str, Any] = bench["environment"]
    later: Mapping[str, Any] = env.get("later_rows", {})
    main = [r for r in results if not str(r["name"]).startswith(("scale_", "layout_")) and r["name"] not in ERASURE_ROWS]
    erasure = [r for r in results if r["name"] in ERASURE_ROWS]
    scale = [r for r in results if str(r["name"]).startswith("scale_")]
    layouts = [r for r in results if str(r["name"]).startswith("layout_")]
    ratio = "ratio router/raw, median [min-max]"
    out = {
        "main": _table(main, ["measure (unit)", "router", "raw pymongo", ratio, "target", "result"], later.get("rows", ())),
        "scale": _table(scale, ["measure (unit)", "router at 10 / 100 / 1,000 periods", "by hand on pymongo",
                                "ratio at 1,000", "target", "result"]),
        "layouts": _table(layouts, ["measure (unit)", "buckets", "copies", "buckets / copies, median [min-max]",
                                    "target", "result"]),
        "erasure": _table(erasure, ["measure (unit)", "with", "without (erase_user: requests)",
                                    "with / without, median [min-max]", "target", "result"])
        + "\nThe run:\n\n" + _environment(bench.get("erasure_environment", {})),
        "environment": _environment(env),
    }
    if later:
        out["environment"] += f"- later rows ({', '.join(later['rows'])}):\n" + "".join(
            f"    - {key}: {value}\n" for key, value in later.items() if key != "rows")
    for key in ("scale_environment", "layouts_environment"):
        out[key.replace("_", "")] = _environment(bench.get(key, {}))
    return out


def render(markdown: str, tables: Mapping[str, str], page: str = "page") -> str:
    """*markdown* with each marker replaced by its table; an unknown marker is an error, not a blank."""

    def table(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in tables:
            raise ValueError(f"{page}: no bench table named {name!r} (known: {', '.join(sorted(tables))})")
        return tables[name]

    return MARKER.sub(table, markdown)


def on_page_markdown(markdown: str, *, page: Any, config: Any, files: Any) -> str:
    """mkdocs hook: fill the bench markers of a page from ``docs/bench.json``."""
    if not MARKER.search(markdown):
        return markdown
    bench = json.loads((Path(config["docs_dir"]) / "bench.json").read_text())
    return render(markdown, bench_tables(bench), page.file.src_path)


# Docstrings: the package writes reStructuredText roles; the site renders Markdown.
_ROLE = re.compile(r":(?:py:)?(?:class|meth|func|mod|attr|exc|data|obj|const):`(~?)([^`<]+?)(?:\s*<([^`>]+)>)?`")
_LITERAL_BLOCK = re.compile(r"(\S)::$", re.MULTILINE)


def markdown_docstring(text: str) -> str:
    """``:class:`~router.Page``` -> ```Page```, ``:meth:`refresh``` -> ```refresh()```, ``Example::`` -> ``Example:``."""

    def role(match: re.Match[str]) -> str:
        short, target, explicit = match.group(1), match.group(2).strip(), match.group(3)
        name = explicit or target
        if short:
            name = name.rsplit(".", 1)[-1]
        if match.group(0).startswith((":meth:", ":func:", ":py:meth:", ":py:func:")) and not name.endswith(")"):
            name += "()"
        return f"`{name}`"

    text = _ROLE.sub(role, text)
    text = text.replace("\\ ", "")
    return _LITERAL_BLOCK.sub(r"\1:", text)


class SphinxRoles(griffe.Extension):
    """A griffe extension: every docstring's roles and literal-block markers, as Markdown."""

    def on_object(self, *, obj: griffe.Object, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = markdown_docstring(obj.docstring.value)


__all__: Sequence[str] = ["ERASURE_ROWS", "SphinxRoles", "bench_tables", "markdown_docstring", "on_page_markdown", "render"]
