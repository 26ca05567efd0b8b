"""Fuzzed clusters.yaml: every input ends in a RouterConfig or a ConfigError with positions, never a raw exception."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from router import ConfigError, RouterConfig, parse_config
from router.cli import main

scalars = st.none() | st.booleans() | st.integers(-5, 10**6) | st.floats(allow_nan=False) | st.text(max_size=12) | st.dates()
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3), max_leaves=6)
uris = st.sampled_from(["mongodb://127.0.0.1:9", "mongodb://127.0.0.1:9", "localhost", "mongodb://u:p@127.0.0.1:9",
                        "${NOPE}", "${NOPE:-mongodb://127.0.0.1:8}", "", "mongodb://"]) | st.text(max_size=10)
names = st.sampled_from(["c1", "c2", "c1", "bad name", ""]) | st.text(max_size=6) | st.integers()
clusters = st.lists(
    st.fixed_dictionaries({"name": names, "uri": uris}, optional={"options": st.dictionaries(
        st.sampled_from(["serverSelectionTimeoutMS", "tls", "maxPoolSize", "w", "bogus"]), scalars, max_size=3)}),
    max_size=4,
) | values
documents = st.fixed_dictionaries(
    {"clusters": clusters},
    optional={
        "database": values, "collections": values, "read_window": st.fixed_dictionaries({}, optional={
            "clusters": scalars, "max_age": st.sampled_from(["90d", "0d", "x", "12h"]) | scalars}),
        "write": st.fixed_dictionaries({}, optional={"batch_size": scalars, "retries": scalars, "retry_backoff": scalars}),
        "read": st.fixed_dictionaries({}, optional={"on_unavailable": st.sampled_from(["raise", "partial", "maybe"])}),
        "rollover": st.fixed_dictionaries({}, optional={"period": st.sampled_from(["monthly", "3d", "0w", "weekly"]),
                                                        "lead_time": st.sampled_from(["7d", "40d", "1s"]) | scalars,
                                                        "standby": st.lists(names, max_size=3) | scalars}),
        "refresh_interval": st.sampled_from(["60s", "250ms", "-1s"]) | scalars,
        "surprise": values,
    },
)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(documents)
def test_structured_junk(doc: dict[str, Any]) -> None:
    """Plausible-looking but wrong documents: a config or a ConfigError naming line, column and field."""
    text = yaml.safe_dump(doc, sort_keys=False)
    try:
        config = parse_config(text, env={})
    except ConfigError as exc:
        assert exc.problems
        for p in exc.problems:
            assert p.source == "clusters.yaml"
            assert p.line >= 0 and p.column >= 0
            assert "p@" not in str(p) and ":p@" not in str(p)  # the fuzzed password never shows
        return
    assert isinstance(config, RouterConfig) and config.clusters


@settings(max_examples=300)
@given(st.text(max_size=200))
def test_arbitrary_text(text: str) -> None:
    """Any text at all: a config or a ConfigError."""
    try:
        parse_config(text, env={})
    except ConfigError as exc:
        assert exc.problems


@settings(max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow], deadline=None)
@given(doc=documents)
def test_cli_exit_code_two_for_bad_configs(doc: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """feedrouter check on a broken config exits 2 with the problems and no traceback."""
    path = tmp_path / "clusters.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    try:
        parse_config(path.read_text(), env={})
    except ConfigError:
        code = main(["-c", str(path), "check"])
        captured = capsys.readouterr()
        assert code == 2
        assert "configuration error" in captured.err and "Traceback" not in captured.err
