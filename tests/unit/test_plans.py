"""plan_summary: an explain answer as its chain of plan nodes and the indexes they use."""

from __future__ import annotations

from harness.bench.plans import plan_summary


def test_a_postgresql_plan_from_ferretdb2() -> None:
    """FerretDB 2 answers with PostgreSQL's plan: node types outermost first, the index a scan uses in brackets."""
    explained = {"queryPlanner": {"Plan": {"Node Type": "Limit", "Plans": [{"Node Type": "Sort", "Plans": [
        {"Node Type": "Bitmap Heap Scan", "Plans": [{"Node Type": "Bitmap Index Scan", "Index Name": "receiver_time_id"}]}]}]}}}
    assert plan_summary(explained) == "Limit <- Sort <- Bitmap Heap Scan <- Bitmap Index Scan [receiver_time_id]"


def test_a_bitmap_and_names_both_indexes() -> None:
    """Two index scans under one node are joined with +."""
    explained = {"queryPlanner": {"Plan": {"Node Type": "BitmapAnd", "Plans": [
        {"Node Type": "Bitmap Index Scan", "Index Name": "a"}, {"Node Type": "Bitmap Index Scan", "Index Name": "b"}]}}}
    assert plan_summary(explained) == "BitmapAnd <- Bitmap Index Scan [a] + Bitmap Index Scan [b]"


def test_a_mongodb_winning_plan() -> None:
    """MongoDB answers with stages: LIMIT <- FETCH <- IXSCAN [name]."""
    explained = {"queryPlanner": {"winningPlan": {"stage": "LIMIT", "inputStage": {"stage": "FETCH", "inputStage": {
        "stage": "IXSCAN", "indexName": "receiver_time_id"}}}}}
    assert plan_summary(explained) == "LIMIT <- FETCH <- IXSCAN [receiver_time_id]"


def test_an_answer_without_a_plan_says_so() -> None:
    assert plan_summary({"ok": 1}).startswith("(no plan in the answer")
