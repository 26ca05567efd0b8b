"""Run one fan-out in a process of its own, so a test can SIGKILL it halfway.

Usage: ``python fanout_child.py '{"uris": [...], "names": [...], "database": "t_x", "receivers": 100000,
"batch_size": 1000, "concurrency": 2}'`` (with the repository root on ``PYTHONPATH``).
The test imports :data:`ACTIVITY` from here, so the re-run fans out the very same item.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator, Sequence
from datetime import datetime, timezone

from router import Activity, ClusterConfig, FeedRouter, RouterConfig, data_key

UTC = timezone.utc
#: In the second standard period, [2024-04-01, 2024-07-01): cluster_2 owns it.
ACTIVITY = Activity(
    sender_id=1000765,
    event_time=datetime(2024, 5, 4, 12, 30, 15, 250000, tzinfo=UTC),
    type=1,
    data={"fabula_id": 1000983, "text": "killed halfway"},
    data_key=data_key("fabula", 1000983),
)


def receivers(count: int) -> Iterator[int]:
    """The receiver stream: a generator, as in production."""
    return (1_000_000 + i for i in range(count))


def main(argv: Sequence[str]) -> int:
    spec = json.loads(argv[0])
    config = RouterConfig(
        database=spec["database"],
        clusters=tuple(ClusterConfig(name=n, uri=u, options={}) for n, u in zip(spec["names"], spec["uris"])),
    )
    with FeedRouter(config) as router:
        router.fan_out(ACTIVITY, receivers(spec["receivers"]), batch_size=spec["batch_size"], concurrency=spec["concurrency"])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
