"""What the server's ``explain`` says of the router's own commands: the page query, a delete step, the fence lookup,
a bucket append.

The commands are not written here: a router runs the real operations (a page, a delete,
a fan-out batch, a fan-out into a buckets period) with a listener that keeps the command
documents it sends, and each kept command is then sent to ``explain``. The plan is reduced
to its chain of nodes and the indexes they use: PostgreSQL's plan on FerretDB 2
(``Limit <- Sort <- Bitmap Heap Scan <- Bitmap Index Scan [receiver_time_id]``), the
winning plan's stages on MongoDB and mongo-java-server.

Example::

    rows = bench_plans(uris)           # four rows, target "-": reported, not judged
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

import attrs
from pymongo import MongoClient, monitoring
from pymongo.errors import PyMongoError

from router.admin.migrate import discover
from router.admin.periods import apply_period, plan_period
from router.config import ClusterConfig, RouterConfig
from router.ids import data_key
from router.model import Activity
from router.sync import FeedRouter
from router.storage.clusters import Clusters
from .common import NAMES, NOW, P0, P1, P2, Result, make_items

__all__ = ["bench_plans", "plan_summary"]

logger = logging.getLogger(__name__)

_DROP = ("lsid", "$db", "$clusterTime", "txnNumber", "$readPreference", "maxTimeMS")


class _Keeper(monitoring.CommandListener):
    """Keeps a copy of every command document started while ``on``."""

    def __init__(self) -> None:
        self.on = False
        self.kept: list[tuple[str, dict[str, Any]]] = []

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        if self.on:
            command = {k: v for k, v in copy.deepcopy(dict(event.command)).items() if k not in _DROP}
            self.kept.append((event.database_name, command))

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass

    def first(self, name: str, collection: str, *, where: str | None = None) -> tuple[str, dict[str, Any]]:
        """The first kept *name* command on *collection* (whose filter mentions *where*, if given)."""
        for database, command in self.kept:
            if next(iter(command), None) == name and command.get(name) == collection and (where is None or where in repr(command)):
                return database, command
        raise LookupError(f"no {name} on {collection} was sent{f' mentioning {where}' if where else ''}")


def plan_summary(explained: Mapping[str, Any]) -> str:
    """An ``explain`` answer as its chain of plan nodes, outermost first, with the index each node uses."""
    planner = explained.get("queryPlanner", explained)
    if isinstance(planner.get("Plan"), Mapping):  # PostgreSQL's plan (FerretDB 2 on DocumentDB)
        return _pg_chain(planner["Plan"])
    stage = planner.get("winningPlan")
    if isinstance(stage, Mapping):
        return _mongo_chain(stage)
    return f"(no plan in the answer: {sorted(explained)})"


def _pg_chain(node: Mapping[str, Any]) -> str:
    name = str(node.get("Node Type"))
    if node.get("Index Name"):
        name += f" [{node['Index Name']}]"
    children = [c for c in node.get("Plans", ()) if isinstance(c, Mapping)]
    if not children:
        return name
    return name + " <- " + " + ".join(_pg_chain(c) for c in children)


def _mongo_chain(stage: Mapping[str, Any]) -> str:
    name = str(stage.get("stage"))
    if stage.get("indexName"):
        name += f" [{stage['indexName']}]"
    inner = stage.get("inputStage") or (stage.get("inputStages") or [None])[0] or stage.get("queryPlan")
    return name if not isinstance(inner, Mapping) else f"{name} <- {_mongo_chain(inner)}"


def _explain(raw: MongoClient[dict[str, Any]], database: str, command: dict[str, Any]) -> str:
    """The plan of *command*; for an update or delete the server will not explain (FerretDB 2 answers
    NotImplemented), the plan of a find with its first statement's filter, said so."""
    name = next(iter(command))
    if name in ("update", "delete"):  # explain takes one statement
        key = "updates" if name == "update" else "deletes"
        command = {**command, key: command[key][:1]}
        command.pop("ordered", None)
    try:
        return plan_summary(raw[database].command("explain", command, verbosity="queryPlanner"))
    except PyMongoError as exc:
        if name not in ("update", "delete"):
            return f"explain refused: {type(exc).__name__} {getattr(exc, 'code', '')}".strip()
        statement = command["updates" if name == "update" else "deletes"][0]
        find = {"find": command[name], "filter": statement["q"], "limit": 1}
        try:
            found = plan_summary(raw[database].command("explain", find, verbosity="queryPlanner"))
        except PyMongoError as again:
            return f"explain refused for {name} ({getattr(exc, 'code', '')}) and for its filter ({getattr(again, 'code', '')})"
        return f"{name} not explained by the server (code {getattr(exc, 'code', '?')}); a find with its filter: {found}"


def _router(uri: str, prefix: str, layout: str, keeper: _Keeper) -> FeedRouter:
    config = RouterConfig(
        database=prefix,
        clusters=tuple(ClusterConfig(name=n, uri=uri, options={"event_listeners": [keeper]}, database=f"{prefix}_{i}")
                       for i, n in enumerate(NAMES)),
    )
    with Clusters(config) as clusters:
        for name, (start, end) in zip(NAMES, ((P0, P1), (P1, P2), (P2, None))):
            change = plan_period(clusters, name=name, start=start, end=end, creator="bench", now=start, layout=layout)
            apply_period(clusters, change, migrations=discover())
    return FeedRouter(config, clock=lambda: NOW, refresh=False)


def bench_plans(uris: Sequence[str], *, items: int = 20_000) -> list[Result]:
    """Four rows (reported, not judged): the plan of a page, a delete step, a fence lookup and a bucket append."""
    uri = uris[-1]
    raw: MongoClient[dict[str, Any]] = MongoClient(uri, tz_aware=True)
    keeper = _Keeper()
    plans: dict[str, tuple[str, str]] = {}
    databases: list[str] = []
    try:
        with _router(uri, "bench_plans_copies", "copies", keeper) as router:
            databases += [router.config.database_for(s) for s in router.config.clusters]
            router.write_many(make_items(items, receivers=100, start=P2 + timedelta(days=1)))
            keeper.on = True
            router.read(1_000_007, limit=50)
            page = keeper.first("find", "feed", where="receiver_id")
            keeper.kept.clear()
            router.delete(data_key("fabula", 7))
            step = keeper.first("delete", "feed")
            keeper.kept.clear()
            post = Activity(sender_id=5, event_time=P2 + timedelta(days=3), type=1, data={}, data_key=data_key("post", 5))
            router.fan_out(post, range(2_000))
            fence = keeper.first("find", "edits")
            keeper.on = False
            plans["plan_page"] = ("the page query (copies: receiver_id, then (event_time, _id) newest first, limit 50)",
                                  _explain(raw, *page))
            plans["plan_delete_step"] = ("one step of delete(data_key) (copies: data_key and an _id range)",
                                         _explain(raw, *step))
            plans["plan_fence"] = ("the edit fence lookup every fan-out batch sends (edits by data_key, newest seq)",
                                   _explain(raw, *fence))
        keeper.kept.clear()
        with _router(uri, "bench_plans_buckets", "buckets", keeper) as router:
            databases += [router.config.database_for(s) for s in router.config.clusters]
            post = Activity(sender_id=6, event_time=P2 + timedelta(days=3), type=1, data={}, data_key=data_key("post", 6))
            router.fan_out(post, range(2_000))
            keeper.on = True
            second = attrs.evolve(post, event_time=post.event_time + timedelta(milliseconds=1), data_key=data_key("post", 7))
            router.fan_out(second, range(2_000))  # appends into the buckets the first post made
            append = keeper.first("update", "feed")
            keeper.on = False
            plans["plan_bucket_append"] = ("a bucket append (buckets: the receiver's bucket with room, upsert)",
                                           _explain(raw, *append))
    finally:
        for name in databases:
            try:
                raw.drop_database(name)
            except PyMongoError as exc:  # a server that cannot drop it as it is: leave it, say so
                logger.warning("could not drop %s: %s", name, exc)
        raw.close()
    return [Result(name, what, "plan", [], [], [], "-", True, summary) for name, (what, summary) in plans.items()]

