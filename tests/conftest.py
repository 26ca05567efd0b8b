"""Suite-wide rules: under CI=true a skipped test fails the run, so storage tests can never be skipped silently;
the summary names the servers the storage tests ran on (under pytest-xdist, what each worker's servers were);
property tests have no per-example time limit."""

from __future__ import annotations

import os

import pytest
from hypothesis import settings

# Hypothesis fails an example slower than 200 ms by default: a timing assertion, which a loaded
# 2-core machine trips at random. Speed is the benchmark's business, not the tests'.
settings.register_profile("feed-router", deadline=None)
settings.load_profile("feed-router")

_skipped: list[str] = []
#: What served the storage tests (set by the integration ``servers`` fixture), shown in the summary.
SERVED_BY = pytest.StashKey[str]()


#: Where to write when each test ran and on which worker (scripts/test sets it): (worker, start, stop, test) per line.
_TIMELINE = os.environ.get("FEED_TEST_TIMELINE")
_started: dict[str, float] = {}


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist the controller writes the timeline (it sees every worker's reports), not the workers."""
    global _TIMELINE
    if hasattr(config, "workerinput"):
        _TIMELINE = None


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Remember every skipped test; with FEED_TEST_TIMELINE, add each finished test's span to that file."""
    if report.skipped:
        _skipped.append(report.nodeid)
    if _TIMELINE and report.when == "setup":
        _started[report.nodeid] = report.start
    elif _TIMELINE and report.when == "teardown":
        node = getattr(report, "node", None)  # under pytest-xdist (in the controller): the worker that ran it
        worker = getattr(getattr(node, "gateway", None), "id", "main")
        with open(_TIMELINE, "a", encoding="utf-8") as out:
            out.write(f"{worker}\t{_started.pop(report.nodeid, report.start):.2f}\t{report.stop:.2f}\t{report.nodeid}\n")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """With CI=true, turn any skip into a failed run and say which tests were skipped (an xdist worker hands what served
    its storage tests to the controller instead, which sees every report)."""
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        served_by = session.config.stash.get(SERVED_BY, None)
        if served_by is not None:
            workeroutput["served_by"] = served_by
        return
    if os.environ.get("CI", "").lower() in ("1", "true", "yes") and _skipped:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(f"CI=true: {len(_skipped)} tests were skipped, which CI does not allow:", red=True)
            for nodeid in _skipped:
                reporter.write_line(f"  {nodeid}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


#: The integration files that take longest (test-seconds of a full run: .cache/test-times/), longest first. Under pytest-xdist
#: (scripts/test: ``--dist loadfile --no-loadscope-reorder``) files are handed out in collection order as workers
#: free up, so these go first and the short ones fill in at the end, instead of a worker starting a two-minute file
#: while the others run out of work (xdist's own order, most tests first, put test_bench's one test last). Only the
#: order depends on this list: a stale one costs minutes, never a result.
LONGEST_FIRST = ("test_fanout.py", "test_erasure_races.py", "test_faults.py", "test_fence.py", "test_social.py",
                 "test_celery.py", "test_rollover.py", "test_buckets_moves.py", "test_router.py", "test_bench.py",
                 "test_groups.py", "test_edits.py", "test_shared_deployment.py", "test_cli.py", "test_operator.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Put the files of :data:`LONGEST_FIRST` first, in its order; every other file, and the tests within each file,
    keep their order."""
    rank = {f"integration/{name}": i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(f"{item.path.parent.name}/{item.path.name}", len(rank)))


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: object, error: object) -> None:
    """Under pytest-xdist: keep what served a finished worker's storage tests, for the summary."""
    config: pytest.Config = getattr(node, "config")
    served_by = getattr(node, "workeroutput", {}).get("served_by")
    if served_by is not None:
        known = config.stash.get(SERVED_BY, None)
        config.stash[SERVED_BY] = served_by if known in (None, served_by) else f"{known}; {served_by}"


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    """Say which servers the storage tests ran on, so a CI log shows the backend (and any SQLite fallback)."""
    served_by = config.stash.get(SERVED_BY, None)
    if served_by is not None:
        terminalreporter.write_line(f"storage tests ran on local {served_by} servers")
