"""Aggregated notifications: a page of 20 groups, one of them of 100,000 items, against a plain page of 20 items.

One receiver gets one group of ``big`` likes of one post and 19 smaller groups (5 likes of
another post each) on one day in the newest period. Measured, in the same run:

* ``groups_page_latency``: ``read_groups(limit=20)`` against ``read(limit=20)`` of the same
  receiver (median of *rounds* calls per repetition, ms; judged: at most 5 times);
* ``groups_page_requests``: the commands each sends, per cluster at most (judged: a page of
  groups in one window sends at most 5 to a cluster, 6 without $topN), and the documents the client receives
  (finds and aggregates together: the walk's first 120 items, the rank's row per group and one more, and the
  newest items shown that those 120 lack, by id): a group's count never brings its items;
* ``group_count_cost``: what counting the big group costs the server alone: one raw
  ``aggregate`` of its items and actors (``$match`` on the receiver, its day and its key, two
  ``$group``), against a raw ``count_documents`` of the receiver's day (the page index's
  range), and the plan ``explain`` gives for the count.

Example::

    rows = bench_groups(uris, big=100_000, reps=3, rounds=7)
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import attrs
from pymongo import MongoClient, monitoring
from pymongo.errors import PyMongoError

from router.core.notify.groups import ACTORS_COUNTED
from router.errors import GroupsUnsupported
from router.ids import data_key
from router.model import FeedItem
from router.sync import FeedRouter
from ..commands import CommandLog
from .common import NOW, P2, Result, bench_config, interleave, register, timed
from .plans import plan_summary

__all__ = ["bench_groups"]

RECEIVER = 4_000_000
DAY = P2 + timedelta(days=30)


class _Rows(monitoring.CommandListener):
    """Counts the documents every read command's replies carry (find, getMore and aggregate), while ``on``."""

    def __init__(self) -> None:
        self.on = False
        self.rows = 0

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        pass

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        if self.on and event.command_name in ("find", "getMore", "aggregate"):
            cursor = event.reply.get("cursor", {})
            self.rows += len(cursor.get("firstBatch", cursor.get("nextBatch", [])))

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass


def _likes(big: int) -> list[FeedItem]:
    items = [FeedItem(receiver_id=RECEIVER, sender_id=10_000_000 + i, event_time=DAY + timedelta(seconds=i % 40_000),
                      type="like", data={"target": 0}, data_key=data_key("like", i)) for i in range(big)]
    items += [FeedItem(receiver_id=RECEIVER, sender_id=500 + j, event_time=DAY + timedelta(hours=12, minutes=t, seconds=j),
                       type="like", data={"target": t + 1}, data_key=data_key("like", f"small-{t}-{j}"))
              for t in range(19) for j in range(5)]
    return items


def _per_cluster(log: CommandLog) -> int:
    counts: dict[int, int] = {}
    for command in log.commands:
        counts[command.port] = counts.get(command.port, 0) + 1
    return max(counts.values(), default=0)


def bench_groups(uris: Sequence[str], *, big: int, reps: int, rounds: int) -> list[Result]:
    """The three rows of the module docstring (reported without figures on a server that cannot group: FerretDB 1)."""
    try:
        return _bench_groups(uris, big=big, reps=reps, rounds=rounds)
    except GroupsUnsupported as exc:
        note = f"not measured: {exc}"
        return [Result(name, what, unit, [], [], [], "-", True, note) for name, what, unit in (
            ("groups_page_latency", "a page of 20 groups vs a page of 20 items", "ms"),
            ("groups_page_requests", "commands per cluster: a page of 20 groups vs a page of 20 items", "commands"),
            ("group_count_cost", "counting a big group on the server vs counting the receiver's day", "ms"))]


def _bench_groups(uris: Sequence[str], *, big: int, reps: int, rounds: int) -> list[Result]:
    log, rows = CommandLog(), _Rows()
    base = bench_config(uris, "bench_groups")
    config = attrs.evolve(base, clusters=tuple(attrs.evolve(c, options={"event_listeners": [log, rows]})
                                               for c in base.clusters))
    register(config)
    raw: MongoClient[dict[str, Any]] = MongoClient(uris[2], tz_aware=True)
    db = raw["bench_groups"]
    with FeedRouter(config, clock=lambda: NOW, refresh=False) as router:
        items = _likes(big)
        for i in range(0, len(items), 2_000):  # (not measured; batches a loaded server writes within the timeout)
            router.write_many(items[i:i + 2_000])
        first = router.read_groups(RECEIVER, limit=20)
        assert len(first.groups) == 20 and first.groups[-1].count == big, [(g.values, g.count) for g in first.groups]
        shown = sum(len(g.items) for g in first.groups)

        def counted(call: Any) -> tuple[int, int]:
            log.commands.clear()
            log.on = rows.on = True
            rows.rows = 0
            call()
            log.on = rows.on = False
            return _per_cluster(log), rows.rows

        groups_requests, groups_rows = counted(lambda: router.read_groups(RECEIVER, limit=20))
        page_requests, page_rows = counted(lambda: router.read(RECEIVER, limit=20))

        def run_groups() -> float:
            return statistics.median(timed(lambda: router.read_groups(RECEIVER, limit=20)) for _ in range(rounds)) * 1e3

        def run_page() -> float:
            return statistics.median(timed(lambda: router.read(RECEIVER, limit=20)) for _ in range(rounds)) * 1e3

        g_ms, p_ms = interleave(reps, run_groups, run_page)

    day = {"receiver_id": RECEIVER, "event_time": {"$gte": DAY, "$lt": DAY + timedelta(days=1)}}
    count: list[dict[str, Any]] = [{"$match": {**day, "type": "like", "data.target": 0}},
             {"$group": {"_id": "$sender_id", "n": {"$sum": 1}}},
             {"$group": {"_id": None, "n": {"$sum": "$n"}, "a": {"$sum": 1}}}]

    def run_count() -> float:
        return statistics.median(timed(lambda: list(db.feed.aggregate(count))) for _ in range(rounds)) * 1e3

    def run_range() -> float:
        return statistics.median(timed(lambda: db.feed.count_documents(day)) for _ in range(rounds)) * 1e3

    c_ms, r_ms = interleave(reps, run_count, run_range)
    try:
        plan = plan_summary(db.command("explain", {"aggregate": "feed", "pipeline": count, "cursor": {}}))
    except PyMongoError as exc:
        plan = f"explain refused: {str(exc)[:80]}"
    raw.drop_database("bench_groups")
    raw.close()
    ratios = [a / b for a, b in zip(g_ms, p_ms)]
    note_page = (f"a page of 20 groups (one of {big:,} likes, 19 of 5; the big one's actors counted among "
                 f"{ACTORS_COUNTED:,} of its items) against a page of 20 items of the same receiver; "
                 f"median {statistics.median(g_ms):.1f} ms against {statistics.median(p_ms):.1f} ms")
    note_requests = (f"read_groups: at most {groups_requests} commands to a cluster, {groups_rows} documents returned "
                     f"(finds and aggregates); read: {page_requests} and {page_rows}")
    note_count = (f"counting the group of {big:,} on the server (items and distinct actors, one aggregate): median "
                  f"{statistics.median(c_ms):.1f} ms; a count_documents of the receiver's day (page index range): "
                  f"{statistics.median(r_ms):.1f} ms; plan of the count: {plan}")
    return [
        Result("groups_page_latency", f"a page of 20 groups (one of {big:,} items) vs a page of 20 items", "ms",
               g_ms, p_ms, ratios, "<= 5", statistics.median(ratios) <= 5, note_page),
        Result("groups_page_requests", "commands per cluster: a page of 20 groups vs a page of 20 items", "commands",
               [float(groups_requests)], [float(page_requests)], [float(groups_rows)], "<= 6 commands",
               groups_requests <= 6 and groups_rows <= 2 * 20 * 3 + 21 + shown + 2, note_requests),
        Result("group_count_cost", f"counting a group of {big:,} on the server vs counting the receiver's day", "ms",
               c_ms, r_ms, [a / b for a, b in zip(c_ms, r_ms)], "-", True, note_count),
    ]
