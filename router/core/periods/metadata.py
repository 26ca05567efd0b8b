"""Loading the time map: every cluster's ``metadata`` document, checked together.

A program (see :mod:`router.core.steps`) that both front doors and the operator tools run
at start-up and on every refresh. Every problem is collected and reported at once.

Example::

    timemap = driver.run(load_timemap(names, config, deadline=deadline_in(10)))
"""

from __future__ import annotations

import logging
from collections.abc import Collection as AnyCollection
from collections.abc import Mapping, Sequence
from typing import Any

from ...config import RouterConfig
from ...errors import ClusterError, ClusterUnavailable, InvalidItem, MetadataError, RequestRefused
from ...model import ClusterMeta
from ...timemap import TimeMap
from ..layouts import LAYOUTS
from ..steps import Concurrently, Failure, Find, Program

__all__ = ["inspect_metadata", "load_timemap", "read_metadata"]

log = logging.getLogger(__name__)


def _documents(cluster: str, deadline: float) -> Program[list[dict[str, Any]] | Failure]:
    answer: list[dict[str, Any]] | Failure = yield Find(cluster, "metadata", {}, deadline, limit=10)
    return answer


def read_metadata(names: Sequence[str], *, deadline: float) -> Program[dict[str, list[dict[str, Any]] | Failure]]:
    """Every named cluster's metadata documents (at most 10 each), asked concurrently; a Failure per silent one."""
    answers = yield Concurrently([_documents(n, deadline) for n in names], names)
    return dict(zip(names, answers))


def inspect_metadata(
    answers: Mapping[str, list[dict[str, Any]] | Failure], config: RouterConfig, *, allow_missing: AnyCollection[str] = ()
) -> tuple[list[ClusterMeta], list[str], dict[str, ClusterError]]:
    """The valid metadata, every problem, and the clusters that did not answer.

    Clusters named in *allow_missing* or listed as rollover standbys may have no
    metadata yet. Problems are: no or several metadata documents, an ``_id`` that is not
    the configured name, a malformed field, and (when every document is well-formed)
    overlapping periods or more than one open-ended period.
    """
    standby = set(config.rollover.standby) if config.rollover else set()
    optional = standby | set(allow_missing)
    down = {n: a.error for n, a in answers.items() if isinstance(a, Failure)}
    problems: list[str] = []
    metas: list[ClusterMeta] = []
    databases = {c.name: config.database_for(c) for c in config.clusters}
    for name, docs in answers.items():
        if isinstance(docs, Failure):
            continue
        coll = f"{databases.get(name, config.database)}.{config.metadata_collection}"
        if not docs:
            if name not in optional:
                problems.append(f"cluster {name!r}: no metadata document in {coll}")
            continue
        if len(docs) > 1:
            ids = ", ".join(repr(d.get("_id")) for d in docs)
            problems.append(f"cluster {name!r}: {len(docs)} metadata documents in {coll} (expected one; _ids {ids})")
            continue
        doc = docs[0]
        if doc.get("_id") != name:
            problems.append(f"cluster {name!r}: metadata _id {doc.get('_id')!r} does not match the configured name {name!r}")
            continue
        try:
            metas.append(ClusterMeta.from_document(doc))
        except (InvalidItem, TypeError, ValueError) as exc:
            problems.append(f"cluster {name!r}: metadata.{exc}")
    if not problems:
        problems = TimeMap.problems(metas)
    return metas, problems, down


def load_timemap(
    names: Sequence[str],
    config: RouterConfig,
    *,
    deadline: float,
    allow_missing: AnyCollection[str] = (),
    previous: TimeMap | None = None,
) -> Program[TimeMap]:
    """Read every cluster's metadata and build the time map.

    With *previous* (a refresh), a cluster that does not answer keeps the period it had
    in *previous*, so one dead cluster does not freeze every router's map; its own
    metadata cannot have changed meanwhile without reaching it. Otherwise raises
    :class:`ClusterError` naming every cluster that did not answer (or refused), and
    :class:`MetadataError` listing every problem.
    """
    answers = yield from read_metadata(names, deadline=deadline)
    metas, problems, down = inspect_metadata(answers, config, allow_missing=allow_missing)
    if down and previous is not None:
        kept = [m for m in previous.periods if m.name in down]
        log.warning("metadata refresh: %s did not answer; keeping their last known periods", ", ".join(sorted(down)))
        metas += kept
        problems = problems or TimeMap.problems(metas)
        down = {}
    if down:
        first = next(iter(down.values()))
        if len(down) == 1:
            raise first
        unreachable = any(isinstance(e, ClusterUnavailable) for e in down.values())
        kind = ClusterUnavailable if unreachable else RequestRefused
        raise kind(", ".join(down), ("unreachable: " if unreachable else "refused: ")
                   + "; ".join(str(e) for e in down.values())) from first
    if problems:
        raise MetadataError(problems)
    timemap = TimeMap(metas)
    for meta in metas:
        if meta.layout not in LAYOUTS:
            log.warning("cluster %s: its period's layout %r is not one this router knows: every operation that touches "
                        "it fails (UnknownLayout); upgrade feed-router", meta.name, meta.layout)
    for end, start in timemap.gaps:
        log.warning("time map has a gap from %s to %s: writes in it will fail", end.isoformat(), start.isoformat())
    return timemap
