"""The sender-list rule (router.core.writes.checks.check_senders): one check, the argument named as the caller gave it."""

from __future__ import annotations

import pytest

from router import InvalidItem
from router.core.writes.checks import check_senders


@pytest.mark.parametrize(("field", "per"), [("pull", "read"), ("senders", "backfill")])
def test_errors_name_the_argument(field: str, per: str) -> None:
    """A bad id, a wrong type and too many senders are each reported against the argument's own name."""
    with pytest.raises(InvalidItem, match=rf"^{field}\[2\]: must be a 64-bit int") as bad:
        check_senders([1, 2, None], field=field, limit=5, per=per)
    assert bad.value.field == f"{field}[2]"
    with pytest.raises(InvalidItem, match=rf"^{field}: must be a list of sender ids \(got str\)"):
        check_senders("alice", field=field, limit=5, per=per)
    with pytest.raises(InvalidItem, match=rf"^{field}: at most 2 senders per {per} \(read\.max_pull in clusters\.yaml\) \(got 3\)"):
        check_senders([1, 2, 3], field=field, limit=2, per=per)


def test_senders_come_back_sorted_without_repeats() -> None:
    """Repeats count once towards the limit; ints sort before strs; None is no senders."""
    assert check_senders([3, "b", 1, 3, "a"], field="pull", limit=4, per="read") == (1, 3, "a", "b")
    assert check_senders(None, field="pull", limit=1, per="read") == ()
