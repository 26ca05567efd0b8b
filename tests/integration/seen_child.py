"""Mark positions seen from a process of its own, so a test can race two processes' marks.

Usage: ``python -m tests.integration.seen_child CONFIG RECEIVER NOW`` with a JSON list of
``[event_time ISO, ObjectId hex]`` on stdin (the repository root on ``PYTHONPATH``); prints
``{"marked": N}``.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from datetime import datetime

from bson import ObjectId

from router import FeedRouter, Position


def main(argv: Sequence[str]) -> int:
    path, receiver, now = argv[0], int(argv[1]), datetime.fromisoformat(argv[2])
    marks = [Position(datetime.fromisoformat(t), ObjectId(oid)) for t, oid in json.loads(sys.stdin.read())]
    with FeedRouter.from_yaml(path, clock=lambda: now, refresh=False) as router:
        for position in marks:
            router.mark_seen(receiver, position)
    print(json.dumps({"marked": len(marks)}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
