"""Edits of what is stored: delete an item everywhere, change its data everywhere, drop a followee's copies.

Each works in bounded steps, so no single request grows with the number of copies (a
fan-out to millions): a step edits the matching documents up to an ``_id`` pivot, and the
pivot is chosen from a sample of matching ids (one cheap, unsorted ``find``) so that a
step edits about ``step`` documents. The share adapts from step to step to what was
actually edited, so it suits random ids (fan-out copies) and sequential ones alike. A
step the server refuses as too large (FerretDB's statement parameter limits: 32,766 on
SQLite, 65,535 on PostgreSQL) is retried at a quarter of the size. Every request gets
its own ``timeout``; a call that fails part-way is finished by calling it again.
Clusters are edited concurrently; big jobs log their progress.

``delete`` and ``update`` first leave their record in each cluster's edit fence
(:mod:`router.core.fence`), then edit the copies: a fan-out batch, backfill or publish
still running writes, reads the fence, and removes (or updates) what it just wrote.

On MongoDB each step is an index scan. On FerretDB, which filters ranges after fetching
every match, a step costs time in proportion to the matches left.

Example::

    deleted = driver.run(delete_program("243594d857def216113909cc6956dd08", names, settings))
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from ..errors import ClusterUnavailable, DeleteFailed, UpdateFailed
from .fence import mark_deleted, mark_updated
from .policy import RetryPolicy, deadline_in
from .steps import Collection, Concurrently, Delete, Failure, Find, Program, Update, UpdateOutcome

__all__ = ["EditSettings", "delete_program", "unfollow_program", "update_program"]

log = logging.getLogger(__name__)
#: Steps between two progress lines in the log.
PROGRESS_EVERY = 10


@attrs.frozen
class EditSettings:
    """Documents per step (a target), ids sampled to place each step, the timeout (seconds) of each request,
    and the retries of the edit's fence record (an insert)."""

    step: int = 10_000
    sample: int = 10_000
    timeout: float = 10.0
    policy: RetryPolicy = RetryPolicy()


_Outcome = tuple[int, ClusterUnavailable | None]
#: What an edit leaves in a cluster's fence before it edits any copy there.
_Fence = Callable[[str], Program[ClusterUnavailable | None]]


def _in_steps(
    cluster: str,
    collection: Collection,
    match: Mapping[str, Any],
    settings: EditSettings,
    *,
    update: Mapping[str, Any] | None = None,
    what: str,
) -> Program[_Outcome]:
    """Delete (or, with *update*, update) every document matching *match*, about ``step`` at a time.

    *match* must stop matching a document once it is edited (an update excludes its own
    result), so the loop ends. Returns how many were changed, and the error that stopped it.
    When the first sample holds every match, that is one ``find`` and one edit; a copy
    written after the edit is a race every edit has, and calling it again removes it.
    """
    done = steps = 0
    size = settings.sample
    left: float = 10.0 * size  # matching documents left: a guess, then what each step suggests
    while True:
        sample = yield Find(cluster, collection, match, deadline_in(settings.timeout), projection={"_id": 1}, limit=size)
        if isinstance(sample, Failure):
            return done, sample.error
        if not sample:
            return done, None
        ids = sorted(d["_id"] for d in sample)
        position = len(ids)
        target: Mapping[str, Any] = match  # fewer than a sample left: every one of them, in one statement
        if len(ids) == size:
            position = min(len(ids), max(1, int(len(ids) * settings.step / max(left, 1.0))))
            target = {**match, "_id": {"$lte": ids[position - 1]}}
            if steps == 0:
                log.info("cluster %s: %s: more than %d documents, in steps of about %d", cluster, what, size, settings.step)
        deadline = deadline_in(settings.timeout)
        if update is None:
            answer = yield Delete(cluster, collection, target, deadline)
        else:
            answer = yield Update(cluster, collection, target, update, deadline)
        if isinstance(answer, Failure):
            if answer.kind == "too_large" and position > 1:
                left = max(left, 1.0) * 4 * max(1.0, len(ids) / position)  # the range held far more: narrow it
                continue
            return done, answer.error
        edited = answer.modified if isinstance(answer, UpdateOutcome) else answer
        done += edited
        steps += 1
        if target is match:  # every match was in the sample, and that statement edited them all
            return done, None
        if edited:  # the sample's share of the range, scaled to what the range really held
            left = max(edited * len(ids) / position - edited, 0.0)
        if steps % PROGRESS_EVERY == 0:
            log.info("cluster %s: %s: %d documents so far, about %d left, %d steps", cluster, what, done, left, steps)


def _outbox(cluster: str, match: Mapping[str, Any], settings: EditSettings, *,
            update: Mapping[str, Any] | None) -> Program[ClusterUnavailable | None]:
    """Edit a data_key's outbox entries in one request: one per second it was published at, not one per copy."""
    deadline = deadline_in(settings.timeout)
    answer = yield (Delete(cluster, "outbox", match, deadline) if update is None
                    else Update(cluster, "outbox", match, update, deadline))
    return answer.error if isinstance(answer, Failure) else None


def _everywhere(
    names: Sequence[str], match: Mapping[str, Any], settings: EditSettings, *, outbox: Mapping[str, Any] | None,
    update: Mapping[str, Any] | None, what: str, fence: _Fence | None = None,
) -> Program[tuple[int, dict[str, ClusterUnavailable]]]:
    """Apply one edit to the feed (and, with *outbox*, the outbox) of every named cluster, concurrently;
    with *fence*, each cluster's fence record first."""

    def one(cluster: str) -> Program[_Outcome]:
        if fence is not None:
            fenced = yield from fence(cluster)
            if fenced is not None:
                return 0, fenced
        count, error = yield from _in_steps(cluster, "feed", match, settings, update=update, what=what)
        if error is None and outbox is not None:  # the outbox entry is edited too, but not counted
            error = yield from _outbox(cluster, outbox, settings, update=update)
        return count, error

    outcomes = yield Concurrently([one(n) for n in names], names)
    total = sum(count for count, _ in outcomes)
    failed = {n: error for n, (_, error) in zip(names, outcomes) if error is not None}
    return total, failed


def delete_program(data_key: str, names: Sequence[str], settings: EditSettings) -> Program[int]:
    """Remove every copy of *data_key*, and its outbox entry, from every named cluster; return how many copies.

    Each cluster gets the key's tombstone first, so no fan-out, backfill or publish brings
    a copy back (:mod:`router.core.fence`). Raises :class:`DeleteFailed` (``deleted``, ``failed`` by cluster) when a cluster fails; run it again.
    """
    match = {"data_key": data_key}
    deleted, failed = yield from _everywhere(
        names, match, settings, outbox=match, update=None, what=f"delete {data_key}",
        fence=lambda cluster: mark_deleted(cluster, data_key, policy=settings.policy, timeout=settings.timeout),
    )
    if failed:
        raise DeleteFailed(deleted, failed)
    return deleted


def update_program(data_key: str, data: Mapping[str, Any], names: Sequence[str], settings: EditSettings) -> Program[int]:
    """Replace ``data`` in every copy of *data_key* and in its outbox entry, every named cluster; return how many
    copies changed.

    Each cluster records the update in its fence first, so a copy written later by a
    fan-out still running gets the new data too (:mod:`router.core.fence`). Raises :class:`UpdateFailed` (``updated``, ``failed`` by cluster) when a cluster fails; run it again.
    """
    match = {"data_key": data_key, "data": {"$ne": data}}
    updated, failed = yield from _everywhere(
        names, match, settings, outbox=match, update={"$set": {"data": data}}, what=f"update {data_key}",
        fence=lambda cluster: mark_updated(cluster, data_key, data, policy=settings.policy, timeout=settings.timeout),
    )
    if failed:
        raise UpdateFailed(updated, failed)
    return updated


def unfollow_program(
    receiver_id: int | str, sender_id: int | str, names: Sequence[str], settings: EditSettings
) -> Program[int]:
    """Remove *sender_id*'s copies from *receiver_id*'s feed in every named cluster; return how many.

    The query uses the page index's ``receiver_id`` prefix (see ``migrations/0002``).
    Raises :class:`DeleteFailed` when a cluster fails; run it again.
    """
    match = {"receiver_id": receiver_id, "sender_id": sender_id}
    deleted, failed = yield from _everywhere(names, match, settings, outbox=None, update=None, what="unfollow")
    if failed:
        raise DeleteFailed(deleted, failed)
    return deleted
