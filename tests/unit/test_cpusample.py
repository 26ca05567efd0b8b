"""harness.cpusample: the kinds of the processes a test run starts, the summary line, and a real sampling run."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from harness.cpusample import kind, summary

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("comm", "cmdline", "expected"), [
    ("postgres", "/usr/lib/postgresql/15/bin/postgres -D /tmp/x -c port=5432", "postgres"),
    ("postgres", "postgres: feedrouter: postgres postgres 127.0.0.1(57104) idle", "postgres"),
    ("ferretdb", "/var/cache/feed-router/ferretdb-v2.7.0/bin/ferretdb --listen-addr=127.0.0.1:1", "ferretdb"),
    ("java", "/usr/bin/java -Xmx1g -jar mongo-java-server.jar", "java"),
    ("redis-server", "redis-server 127.0.0.1:6379", "redis"),
    ("python", "/x/.venv/bin/python -m celery -A router.fanout.celery worker", "celery"),
    ("python", "/x/.venv/bin/python -m pytest -n 3 --dist loadfile", "tests"),
    ("python", "/x/.venv/bin/python -u -c import sys;exec(eval(sys.stdin.readline()))", "tests"),
    ("python3.11", "/x/.venv/bin/python -m router.cli status", "python"),
    ("bash", "bash scripts/test", "other"),
])
def test_each_process_has_its_kind(comm: str, cmdline: str, expected: str) -> None:
    assert kind(comm, cmdline) == expected


def test_the_summary_puts_the_largest_first_with_shares() -> None:
    line = summary({"tests": 300.0, "postgres": 1100.0, "redis": 0.2, "java": 100.0})
    assert line == "cpu by process kind: postgres 1,100 s (73%), tests 300 s (20%), java 100 s (7%)"
    assert summary({}) == "cpu by process kind: nothing measured"


def test_a_run_counts_a_busy_child_and_writes_its_totals(tmp_path: Path) -> None:
    """A process started after the sampler's first look and using 1.5 s of CPU is counted under its kind, whatever
    else loads the machine: it idles after its work until the sampler has looked again. SIGTERM ends the run."""
    out = tmp_path / "cpu.tsv"
    sampler = subprocess.Popen([sys.executable, "-m", "harness.cpusample", str(out)], cwd=REPO, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        assert sampler.stderr is not None and sampler.stderr.readline().strip() == "cpusample: sampling"
        # perl's own CPU time (user + system) passes 1.5 s, then it sleeps past the sampler's next look (every 2 s; a
        # look may wait for the CPU)
        busy = subprocess.run(["perl", "-e", "1 while (times)[0] + (times)[1] < 1.5; sleep 4"], timeout=120,
                              check=False)
        assert busy.returncode == 0
    finally:
        sampler.send_signal(signal.SIGTERM)
        printed, _ = sampler.communicate(timeout=30)
    assert sampler.returncode == 0
    totals = {k: float(v) for k, v in (line.split("\t") for line in out.read_text().splitlines())}
    assert totals.get("other", 0) >= 1.4, totals
    assert printed.startswith("cpu by process kind: ")
