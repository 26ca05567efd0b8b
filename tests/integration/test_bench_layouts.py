"""The layouts benchmark runs at a tiny size on mongo-java-server and gives its four rows."""

from __future__ import annotations

from router.testing.bench.layouts import bench_layouts
from router.testing.javaserver import LocalJavaServer


def test_layouts_bench_gives_four_rows() -> None:
    """Four rows with figures for both layouts; the page-documents row, a count, holds at any size."""
    with LocalJavaServer() as server:
        rows = bench_layouts(server.uri, items=2_000, receivers=2, deep=20, fanout=300, reps=2, rounds=2, prefix="t_layouts")
    assert [r.name for r in rows] == ["layout_page_documents", "layout_page_latency", "layout_fanout", "layout_bytes_per_item"]
    assert all(r.router and r.raw and len(r.ratios) == len(r.router) for r in rows)
    documents = rows[0]
    assert documents.passed, documents.note
    assert documents.raw == [50.0, 50.0]
