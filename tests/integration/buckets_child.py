"""Fan one post out to shared receivers in a process of its own (the buckets race of test_buckets).

Usage: ``python buckets_child.py '{"config": {...}, "post": 1, "receivers": 300}'``; prints ``ready``, waits for a
line on stdin, fans out, prints the result's written count as JSON. With ``"posts": [1, 4, 7]`` instead of ``post``,
fans those posts out one after another (written: their sum).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from datetime import datetime, timedelta, timezone

from router import Activity, ClusterConfig, FeedRouter, RouterConfig, data_key

UTC = timezone.utc
#: Inside the buckets period of test_buckets ([2024-07-01, open)).
BASE = datetime(2024, 7, 10, tzinfo=UTC)


def activity(post: int) -> Activity:
    """Post *post*'s activity (the test computes the same keys)."""
    return Activity(sender_id=9000 + post, event_time=BASE + timedelta(minutes=post), type=1, data={"post": post},
                    data_key=data_key("race", post))


def main(argv: Sequence[str]) -> int:
    spec = json.loads(argv[0])
    config = RouterConfig(
        database=spec["database"],
        clusters=tuple(ClusterConfig(name=c["name"], uri=c["uri"], options={}, database=c["database"])
                       for c in spec["clusters"]),
    )
    with FeedRouter(config, clock=lambda: BASE + timedelta(days=30)) as router:
        print("ready", flush=True)
        sys.stdin.readline()
        written = 0
        for post in spec.get("posts", [spec.get("post")]):
            result = router.fan_out(activity(post), range(1, spec["receivers"] + 1), batch_size=spec.get("batch", 50),
                                    concurrency=2)
            written += result.written
        print(json.dumps({"written": written}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
