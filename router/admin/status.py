"""What ``feedrouter check`` and ``feedrouter status`` report, gathered from the clusters.

The data only; the CLI formats it. ``check`` asks whether the deployment is consistent
(metadata, periods, migrations); ``status`` shows each cluster as it is now.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ..config import RouterConfig
from ..errors import ClusterError, InvalidItem
from ..model import ClusterMeta
from ..storage.clusters import Cluster, Clusters
from ..timemap import TimeMap
from ..core.privacy import ErasureRecord, unsettled
from ..core.layouts import DEFAULT
from ..storage import finds
from .migrate import applied_migrations, discover
from .periods import layout_problem

__all__ = ["check_report", "status_rows", "unfinished_erasures"]


def check_report(config: RouterConfig) -> tuple[dict[str, Any], TimeMap | None]:
    """``{"ok", "problems", "capabilities", "clusters", "gaps"}`` for every configured cluster, and the time map if it
    is sound. ``capabilities`` maps each reachable cluster to what its server can do (:class:`Capabilities`)."""
    migrations = discover()
    problems: list[str] = []
    with Clusters(config) as clusters:
        metas, meta_problems, down = clusters.inspect_metadata()
        problems += [str(e) for e in down.values()]
        problems += meta_problems
        reachable = [n for n in clusters.names if n not in down]
        applied = clusters.each(lambda c: applied_migrations(c, config), reachable)
        for name, done in applied.items():
            if isinstance(done, ClusterError):
                problems.append(str(done))
                continue
            missing = [m.id for m in migrations if m.id not in done]
            if missing:
                problems.append(f"cluster {name!r}: migrations not applied: {', '.join(missing)} (run feedrouter migrate)")
        for name, found in clusters.each(unfinished_erasures, reachable).items():
            problems += [str(found)] if isinstance(found, ClusterError) else found
        capabilities = clusters.each(lambda c: c.capabilities(), reachable)
        for name, caps in capabilities.items():
            if isinstance(caps, ClusterError):
                problems.append(str(caps))
        for meta in metas:
            if meta.name in reachable and meta.layout != DEFAULT:
                problem = layout_problem(clusters, meta.name, meta.layout)
                if problem is not None:
                    problems.append(problem)
    timemap = TimeMap(metas) if not meta_problems else None
    report: dict[str, Any] = {"ok": not problems, "problems": problems, "capabilities": {
        name: caps.to_json() for name, caps in capabilities.items() if not isinstance(caps, ClusterError)}}
    if timemap is not None:
        report["clusters"] = [{"name": m.name, "start_date": m.start_date, "end_date": m.end_date, "layout": m.layout}
                              for m in timemap.periods]
        report["gaps"] = [[a, b] for a, b in timemap.gaps]
    return report, timemap


def unfinished_erasures(cluster: Cluster) -> list[str]:
    """A problem for each erasure record of *cluster* still ``running`` that no ``done`` erasure of the same user,
    requested at or after it, settles (an ``erase_user`` that stopped part-way and was not called again:
    :func:`~router.core.privacy.erasure.unsettled`)."""
    records = cluster.db["erasures"]
    running = cluster.call("reading erasure records", lambda: finds.read(records, {"state": "running"}))
    if not running:
        return []
    users = list({r["user"]: None for r in running if "user" in r})
    theirs = cluster.call("reading erasure records", lambda: finds.read(records, {"user": {"$in": users}}))
    by_user: dict[Any, list[ErasureRecord]] = {}
    for doc in theirs + [r for r in running if "user" not in r]:
        by_user.setdefault(doc.get("user"), []).append(ErasureRecord.from_document(cluster.name, doc))
    problems = []
    for record in (r for user_records in by_user.values() for r in unsettled(user_records)):
        when = record.requested_at
        problems.append(
            f"cluster {cluster.name!r}: erasure {record.request_id} (asked by {record.requested_by!r} at "
            f"{when.isoformat() if when is not None else '?'}) did not finish: call erase_user "
            "(feedrouter erase) again for the same user; feedrouter erase-status USER shows it")
    return problems


def _cluster_status(cluster: Cluster, config: RouterConfig) -> dict[str, Any]:
    t0 = time.perf_counter()
    cluster.ping()
    rtt = (time.perf_counter() - t0) * 1000
    docs = cluster.metadata_documents()
    meta = docs[0] if len(docs) == 1 else None
    count = cluster.call("counting feed", lambda: cluster.feed.estimated_document_count())
    applied = sorted(applied_migrations(cluster, config))
    return {"rtt_ms": round(rtt, 2), "meta": meta, "metadata_documents": len(docs), "feed_documents": count, "migrations": applied}


def status_rows(config: RouterConfig, on_done: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """One row per configured cluster: reachability, round trip, period, feed size, migrations, any error.

    A row with an ``error`` key is a problem: the cluster is down or its metadata is
    unusable. *on_done* is called with each cluster's name as its row completes.
    """
    standby = set(config.rollover.standby) if config.rollover else set()
    rows: list[dict[str, Any]] = []
    with Clusters(config) as clusters:
        results = clusters.each(lambda c: _cluster_status(c, config), on_done=on_done)
        for name, result in results.items():
            row: dict[str, Any] = {"cluster": name, "uri": clusters[name].spec.display_uri}
            if isinstance(result, ClusterError):
                row.update(reachable=False, error=str(result), period=None)
            else:
                doc = result.pop("meta")
                meta, problem = None, None
                if doc is not None:
                    try:
                        meta = ClusterMeta.from_document(doc)
                    except (InvalidItem, TypeError, ValueError) as exc:
                        problem = f"cluster {name!r}: bad metadata document: {exc}"
                elif result["metadata_documents"] > 1:
                    problem = f"cluster {name!r}: {result['metadata_documents']} metadata documents (expected one)"
                row["period"] = {"start_date": meta.start_date, "end_date": meta.end_date} if meta else None
                row.update(reachable=True, standby=name in standby, retired=bool(meta and meta.retired), **result)
                if problem is not None:
                    row["error"] = problem
            rows.append(row)
    return rows
