"""Benchmarks: what the router costs on top of the driver, as ratios measured in one run.

Run ``scripts/bench`` (``python -m harness.bench``). It starts three local servers
(or reuses ``--uris``). Each measurement has a warm-up and several repetitions with
the router run and the raw pymongo run alternating, so machine drift cancels out (the
small run, ``--small``, makes one repetition and no warm-up: it checks that they run).
It prints a markdown table of medians with min and max, writes every raw figure to
JSON, and draws a PNG chart when matplotlib is installed (the ``bench`` extra).
The last line is the summary, PASS or FAIL per target. The test suite only checks
that a small run works; the targets are judged here.
"""

from .common import Result
from .report import main, run_bench

__all__ = ["Result", "main", "run_bench"]
