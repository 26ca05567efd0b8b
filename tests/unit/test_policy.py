"""The retry policy and the deadline rules."""

from __future__ import annotations

from router.core.policy import code_kind


def test_time_running_out_is_its_own_kind() -> None:
    """MaxTimeMSExpired (50) is a timeout, neither retried as transient nor refused for the item itself."""
    assert code_kind(50) == "timeout"
    assert code_kind(11000) == "duplicate"
    assert code_kind(91) == "transient"
    assert code_kind(2) == "refused"
