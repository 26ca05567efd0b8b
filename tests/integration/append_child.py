"""Append to shared documents from a process of its own, for the concurrent-append race.

Usage: ``python append_child.py '{"uri": "mongodb://...", "database": "t_x", "documents": [0, 1],
"appends": 300, "tag": "a", "cap": 1000}'``. It connects, prints ``ready``, waits for a line
on stdin (so every child starts appending at once), then makes ``appends`` bucket-style
appends, round robin over ``documents``: ``update_one({"_id": d, "items": {"$ne": v},
"n": {"$lt": cap}}, {"$push": {"items": v}, "$inc": {"n": 1}})`` with a value of its own
(``tag-i``); it prints ``{"modified": ...}``, the appends the server said it made.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence

from pymongo import MongoClient

COLLECTION = "buckets"


def main(argv: Sequence[str]) -> int:
    spec = json.loads(argv[0])
    client: MongoClient[dict[str, object]] = MongoClient(spec["uri"], serverSelectionTimeoutMS=30_000)
    try:
        client.admin.command("ping")
        print("ready", flush=True)
        sys.stdin.readline()
        buckets = client[spec["database"]][COLLECTION]
        documents = spec["documents"]
        modified = 0
        for i in range(spec["appends"]):
            value = f"{spec['tag']}-{i}"
            result = buckets.update_one(
                {"_id": documents[i % len(documents)], "items": {"$ne": value}, "n": {"$lt": spec["cap"]}},
                {"$push": {"items": value}, "$inc": {"n": 1}},
            )
            modified += result.modified_count
        print(json.dumps({"modified": modified}), flush=True)
    finally:
        client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
