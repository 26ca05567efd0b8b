"""``feedrouter tail RECEIVER``: a receiver's live feed in the terminal, until Ctrl-C.

One line per event on stdout (``--json``: one JSON object per line), flushed as it comes;
what the command is doing goes to stderr. It subscribes through the sync door
(:meth:`~router.FeedRouter.subscribe`), so it catches up from ``--cursor`` first, says
``resync`` when Redis was lost (and goes on by itself), and ends cleanly, exit 0, on
Ctrl-C (SIGINT) or SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from types import FrameType
from typing import Any

from ..config import RouterConfig
from ..core.live import DeletedItem, LiveEvent, NewItem, Resync, UpdatedItem
from ..errors import InvalidCursor, InvalidItem, PushNotConfigured

__all__ = ["line", "run_tail"]


def _plain(value: Any) -> Any:
    return value if isinstance(value, (int, float, str, bool)) or value is None else str(value)


def _json(event: LiveEvent) -> dict[str, Any]:
    out: dict[str, Any] = {"kind": event.kind, "cursor": event.cursor}
    if isinstance(event, NewItem):
        i = event.item
        out["item"] = {"id": str(i.id), "receiver_id": i.receiver_id, "sender_id": i.sender_id,
                       "event_time": i.event_time.isoformat(), "type": i.type, "data_key": i.data_key,
                       "data": json.loads(json.dumps(i.data, default=str)), "pulled": event.pulled}
    elif isinstance(event, (UpdatedItem, DeletedItem)):
        out["data_key"] = event.data_key
        if isinstance(event, UpdatedItem):
            out["data"] = json.loads(json.dumps(event.data, default=str))
    elif isinstance(event, Resync):
        out["reason"] = event.reason
    return out


def line(event: LiveEvent, *, as_json: bool = False) -> str:
    """One event as the line ``tail`` prints."""
    if as_json:
        return json.dumps(_json(event), default=str)
    if isinstance(event, NewItem):
        i = event.item
        pulled = " (pulled)" if event.pulled else ""
        return (f"{i.event_time.isoformat()}  item {i.id}{pulled} from {_plain(i.sender_id)!r} type {_plain(i.type)!r} "
                f"key {i.data_key}: {json.dumps(i.data, default=str)}")
    if isinstance(event, UpdatedItem):
        return f"updated key {event.data_key}: {json.dumps(event.data, default=str)}"
    if isinstance(event, DeletedItem):
        return f"deleted key {event.data_key}"
    return f"resync ({event.reason}): items were caught up from {event.cursor}; re-read what is shown"


def run_tail(args: argparse.Namespace, config: RouterConfig) -> int:
    """Print *args.receiver*'s live feed until SIGINT or SIGTERM; exit 0."""
    from ..sync import FeedRouter

    if config.push is None:
        raise PushNotConfigured("tail: clusters.yaml has no push: section; live feeds need a Redis, e.g. "
                                "push: {redis: 'redis://host:6379/0'}")

    def stop(signum: int, _frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        with FeedRouter(config, refresh=True) as router:
            try:
                subscription = router.subscribe(args.receiver, cursor=args.cursor, pull=args.pull, types=args.types)
            except (InvalidCursor, InvalidItem) as exc:  # what read refuses: a usage error here
                print(f"feedrouter: error: tail: {exc}", file=sys.stderr)
                return 2
            with subscription as live:
                event = live.get(timeout=0)  # subscribed and caught up: what it has at once
                print(f"tail: following {args.receiver!r} on {config.push.display_redis}; Ctrl-C ends", file=sys.stderr,
                      flush=True)
                while event is not None or (event := live.get()) is not None:  # (None: the router closed)
                    print(line(event, as_json=args.json), flush=True)
                    event = None
    except KeyboardInterrupt:
        print("tail: stopped", file=sys.stderr, flush=True)
    finally:
        signal.signal(signal.SIGTERM, previous)
    return 0
