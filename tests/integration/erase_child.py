"""Run one erasure in a process of its own, so a test can SIGKILL it halfway.

Usage: ``python erase_child.py '{"clusters": [{"name", "uri", "database"}, ...], "database": "t_x", "user": 1000765,
"step": 200, "erasure_key": "..."}'`` (with the repository root on ``PYTHONPATH``). Edits go in steps of ``step`` copies (the default is
10,000), so the erasure takes long enough to be stopped part-way.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence

import attrs

from router import ClusterConfig, FeedRouter, RouterConfig


def main(argv: Sequence[str]) -> int:
    spec = json.loads(argv[0])
    config = RouterConfig(
        database=spec["database"],
        clusters=tuple(ClusterConfig(name=c["name"], uri=c["uri"], database=c.get("database")) for c in spec["clusters"]),
        erasure_key=spec.get("erasure_key"),
    )
    with FeedRouter(config, refresh=False) as router:
        edit = attrs.evolve(router.settings.edit, step=spec["step"], sample=spec["step"])
        router.settings = attrs.evolve(router.settings, edit=edit)
        print("erasing", flush=True)
        router.erase_user(spec["user"], requested_by="erase_child.py")
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
