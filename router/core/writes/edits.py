"""Edits of what is stored: delete an item everywhere, change its data everywhere, drop a followee's copies.

Each cluster's copies are edited by its period's layout (:mod:`router.core.layouts`), in
bounded steps (a delete tries them all at once first, for a quarter of ``timeout``), so no
single request grows with the number of copies beyond what finishes in time; a post's
outbox entries are edited in one request. Every request gets its own ``timeout``; a call that
fails part-way is finished by calling it again. Clusters are edited concurrently; big
jobs log their progress.

``delete`` and ``update`` first leave their record in each cluster's edit fence
(:mod:`router.core.writes.fence`), then edit the copies: a fan-out batch, backfill or publish
still running writes, reads the fence, and removes (or updates) what it just wrote. An
update that writes a copy anew (in ``buckets``, a copy that no longer fits its bucket
moves to another) is such a writer too: it reads the fence and the erasure records after
writing it (:func:`_landed`), so a delete, a newer update or an erasure that ran meanwhile
reaches the copy in its new place. A ``delete`` is two round trips per cluster, every
cluster at once: the tombstones, then the copies (at once when that is quick), the outbox
entry and the superseded records together.

On MongoDB each step is an index scan. On FerretDB, which filters ranges after fetching
every match, a step costs time in proportion to the matches left.

Example::

    deleted = driver.run(delete_program("243594d857def216113909cc6956dd08", names, settings))
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ...errors import ClusterError, DeleteFailed, UpdateFailed
from ...timemap import TimeMap
from .fence import Parties, drop_superseded, mark_deleted, mark_updated, settle
from ..layouts import Copy, EditSettings, Landed, Layout, layout_for, outbox
from ..push import PushEdit
from ..pseudonyms import Pseudonyms
from ..steps import Concurrently, Failure, Program

__all__ = ["EditSettings", "delete_program", "unfollow_program", "update_program"]

log = logging.getLogger(__name__)

_Outcome = tuple[int, ClusterError | None]
#: What an edit leaves in a cluster's fence before it edits any copy there.
_Fence = Callable[[str], Program[ClusterError | None]]
#: One cluster's share of an edit of copies, by its layout.
_Copies = Callable[[Layout, str], Program[_Outcome]]


def _outbox(cluster: str, data_key: str, data: Mapping[str, Any] | None,
            settings: EditSettings) -> Program[ClusterError | None]:
    """Edit a data_key's outbox entries (:func:`~router.core.layouts.outbox.edit`)."""
    answer = yield from outbox.edit(cluster, data_key, data, settings)
    return answer.error if answer is not None else None


def _everywhere(
    names: Sequence[str], timemap: TimeMap | None, copies: _Copies, settings: EditSettings, *,
    post: tuple[str, Mapping[str, Any] | None] | None = None, fence: _Fence | None = None,
) -> Program[tuple[int, dict[str, ClusterError]]]:
    """Apply one edit to the copies (and, with *post*: its data_key and new data, the outbox) of every named
    cluster, concurrently; with *fence*, each cluster's fence record first."""

    def one(cluster: str) -> Program[_Outcome]:
        if fence is not None:
            fenced = yield from fence(cluster)
            if fenced is not None:
                return 0, fenced
        count, error = yield from copies(layout_for(timemap, cluster), cluster)
        if error is None and post is not None:  # the outbox entry is edited too, but not counted
            error = yield from _outbox(cluster, post[0], post[1], settings)
        return count, error

    outcomes = yield Concurrently([one(n) for n in names], names)
    total = sum(count for count, _ in outcomes)
    failed = {n: error for n, (_, error) in zip(names, outcomes) if error is not None}
    return total, failed


def delete_program(data_key: str, names: Sequence[str], settings: EditSettings, timemap: TimeMap | None = None) -> Program[int]:
    """Remove every copy of *data_key*, and its outbox entry, from every named cluster; return how many copies.

    Two rounds, each sent to every cluster at once: the key's tombstone in each cluster's
    fence, so no fan-out, backfill or publish brings a copy back (:mod:`router.core.writes.fence`);
    then, where the tombstone is stored, the copies (one request when they can go at once,
    else in steps: :func:`~router.core.layouts.queries.in_steps`), the outbox entry and the
    update records the tombstone supersedes, at the same time. So a cluster sees two round
    trips one after the other. Raises :class:`DeleteFailed` (``deleted``, ``failed`` by
    cluster) when a cluster fails; run it again.
    """
    policy, timeout, what = settings.policy, settings.timeout, f"delete {data_key}"
    fenced = yield Concurrently([mark_deleted(n, data_key, policy=policy, timeout=timeout) for n in names], names)
    errors: dict[str, ClusterError | None] = dict(zip(names, fenced))
    ready = [n for n in names if errors[n] is None]
    sweeps: list[Program[Any]] = []
    for n in ready:
        sweeps += [layout_for(timemap, n).edit_key(n, data_key, None, settings, what=what),
                   _outbox(n, data_key, None, settings), drop_superseded(n, data_key, timeout=timeout)]
    outcomes = yield Concurrently(sweeps, [n for n in ready for _ in range(3)])
    deleted = 0
    for i, n in enumerate(ready):
        (count, error), outbox_error, _ = outcomes[3 * i:3 * i + 3]
        deleted += count
        errors[n] = error or outbox_error
    failed = {n: error for n, error in errors.items() if error is not None}
    yield PushEdit([data_key])  # removed (where a cluster failed, at the call that finishes): live subscribers
    if failed:
        raise DeleteFailed(deleted, failed)
    return deleted


def _landed(layout: Layout, settings: EditSettings, pseudonyms: Pseudonyms | None) -> Landed:
    """What an update does with copies it wrote anew: what every writer does (:func:`~router.core.writes.fence.settle`), the
    erasure records read too when *pseudonyms* are given."""

    def landed(cluster: str, data_key: str, copies: Sequence[Copy]) -> Program[Failure | None]:
        parties = None
        if pseudonyms is not None and copies:
            parties = Parties({data_key: copies[0].sender_id}, {data_key: [c.receiver_id for c in copies]},
                              forget=lambda name, who: layout.remove_received(name, who, settings))
        settled = yield from settle(cluster, layout.fix, {data_key: [c.id for c in copies]}, timeout=settings.timeout,
                                    parties=parties, pseudonyms=pseudonyms)
        return settled if isinstance(settled, Failure) else None

    return landed


def update_program(
    data_key: str, data: Mapping[str, Any], names: Sequence[str], settings: EditSettings, timemap: TimeMap | None = None,
    *, pseudonyms: Pseudonyms | None = None,
) -> Program[int]:
    """Replace ``data`` in every copy of *data_key* and in its outbox entry, every named cluster; return how many
    copies changed.

    Each cluster records the update in its fence first, so a copy written later by a
    fan-out still running gets the new data too (:mod:`router.core.writes.fence`). A copy the update
    writes anew (moved to another bucket) is brought up to the fence, and with *pseudonyms*
    to the erasure records, as such a fan-out's are. Raises :class:`UpdateFailed` (``updated``, ``failed`` by cluster) when a cluster fails; run it again.
    """
    updated, failed = yield from _everywhere(
        names, timemap, lambda layout, cluster: layout.edit_key(cluster, data_key, data, settings, what=f"update {data_key}",
                                                               landed=_landed(layout, settings, pseudonyms)),
        settings, post=(data_key, data),
        fence=lambda cluster: mark_updated(cluster, data_key, data, policy=settings.policy, timeout=settings.timeout),
    )
    yield PushEdit([data_key], data)  # changed: live subscribers
    if failed:
        raise UpdateFailed(updated, failed)
    return updated


def unfollow_program(
    receiver_id: int | str, sender_id: int | str, names: Sequence[str], settings: EditSettings,
    timemap: TimeMap | None = None,
) -> Program[int]:
    """Remove *sender_id*'s copies from *receiver_id*'s feed in every named cluster; return how many.

    Raises :class:`DeleteFailed` when a cluster fails; run it again.
    """
    deleted, failed = yield from _everywhere(
        names, timemap, lambda layout, cluster: layout.remove_sender(cluster, receiver_id, sender_id, settings), settings)
    if failed:
        raise DeleteFailed(deleted, failed)
    return deleted
