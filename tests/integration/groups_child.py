"""Mark groups read from a process of its own, so a test can race two processes' marks.

Usage: ``python -m tests.integration.groups_child CONFIG RECEIVER NOW`` with a JSON list of
``{"key", "t", "id", "value"}`` on stdin (the repository root on ``PYTHONPATH``): each group is
marked alone, as a value (read through its newest item ``t``/``id``) or by its key; prints
``{"marked": N}``.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from datetime import datetime

from bson import ObjectId

from router import FeedRouter, Group, Position
from router.core.notify.groups import decode_key
from router.model import from_millis


def main(argv: Sequence[str]) -> int:
    path, receiver, now = argv[0], int(argv[1]), datetime.fromisoformat(argv[2])
    marks = json.loads(sys.stdin.read())
    with FeedRouter.from_yaml(path, clock=lambda: now, refresh=False) as router:
        for m in marks:
            if m["value"]:  # the Group a page returns, as far as mark_read looks (it refuses any other)
                t = datetime.fromisoformat(m["t"])
                _fields, span_ms, window, values = decode_key(m["key"])
                group = Group(key=m["key"], values=values, window_start=from_millis(window * span_ms), count=1,
                              actor_count=1, items=(), first_time=t, last_time=t, newest=Position(t, ObjectId(m["id"])),
                              seen=False, read=False)
                router.mark_read(receiver, [group])
            else:
                router.mark_read(receiver, [m["key"]])
    print(json.dumps({"marked": len(marks)}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
