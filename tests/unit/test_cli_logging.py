"""The ``feedrouter`` entry point run in-process (as tests and embedding services do) leaves logging as it found it."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from router.cli import main


@pytest.mark.parametrize("argv", [["scheduler", "--once"], ["-v", "check"], ["-q", "status"]])
def test_main_gives_the_root_loggers_level_and_handlers_back(tmp_path: Path, argv: list[str]) -> None:
    """main() sets the root logger's level for its command (INFO for the scheduler, DEBUG with -vv, ...) and adds a
    handler; on return both are as before, whatever it returned. (A test that ran the scheduler in-process once left
    the root at INFO, and a later test in the same process saw INFO records it did not ask for.)"""
    root = logging.getLogger()
    before = (root.level, list(root.handlers))
    assert main(["-c", str(tmp_path / "missing.yaml"), *argv]) == 2  # no such file: a configuration error
    assert (root.level, list(root.handlers)) == before
