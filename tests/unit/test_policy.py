"""The retry policy and the deadline rules."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from router.core.policy import TURN_SHARE, code_kind, turn_deadline

NOW = 1000.0


def test_the_last_cluster_gets_all_that_is_left() -> None:
    """With no cluster after it, a turn ends at the call's deadline."""
    assert turn_deadline(NOW + 2.0, others=0, now=NOW) == NOW + 2.0


def test_a_turn_with_others_waiting_gets_its_share() -> None:
    """While another cluster may follow, a turn takes TURN_SHARE of what is left, however many follow."""
    for others in (1, 2, 10):
        assert turn_deadline(NOW + 2.0, others=others, now=NOW) == NOW + 2.0 * TURN_SHARE


def test_a_passed_deadline_stays_passed() -> None:
    """Once the call's deadline has passed, no turn ends after it."""
    assert turn_deadline(NOW - 1.0, others=2, now=NOW) == NOW - 1.0


@given(st.floats(min_value=-100, max_value=100, allow_nan=False), st.integers(min_value=1, max_value=50))
def test_hung_turns_leave_the_rest_for_the_last(left: float, others: int) -> None:
    """Turns that each run to their end never pass the deadline, and a hung turn leaves at least as much as it took."""
    deadline, now = NOW + left, NOW
    for waiting in range(others, 0, -1):
        end = turn_deadline(deadline, others=waiting, now=now)
        assert end <= deadline
        assert left <= 0 or deadline - end >= end - now - 1e-9  # up to float rounding
        now = max(now, end)
    assert turn_deadline(deadline, others=0, now=now) == deadline


def test_time_running_out_is_its_own_kind() -> None:
    """MaxTimeMSExpired (50) is a timeout, neither retried as transient nor refused for the item itself."""
    assert code_kind(50) == "timeout"
    assert code_kind(11000) == "duplicate"
    assert code_kind(91) == "transient"
    assert code_kind(2) == "refused"
