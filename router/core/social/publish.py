"""The social half: the author's outbox, pushed or pulled authors, and inboxes rebuilt from outboxes.

* **publish** stores the activity once in its author's outbox (the cluster owning its
  ``event_time``, collection ``outbox``, ``_id`` :func:`~router.ids.outbox_id`, so a
  repeat stores nothing new), then either fans it out to the followers or, for an author
  who is *pulled*, writes no copies: followers' reads merge the outbox in
  (``read(..., pull=[author])``).
* **Pull or push.** ``pull=True``/``False`` per call decides. Otherwise, with
  ``fanout.pull_threshold`` set, the followers are counted: ``len()`` when the caller
  passes a sequence, else while streaming, holding at most ``threshold + 1`` ids (the
  decision must come before the first copy is written, and this needs no separate
  follower count from the caller). More than the threshold: pulled.
* **backfill** copies the senders' outbox entries (newest first, newer than ``since``,
  at most ``limit``) into one receiver's feed with the same derived ``_id``\\ s fan-out
  uses, so racing a live fan-out, or running twice, leaves one copy each. It rebuilds a
  dormant user's inbox and backs ``follow``.

Both read the edit fence after writing (:func:`~router.core.writes.fence.settle`): an outbox
entry or a copy of a post deleted meanwhile is removed again (``publish`` then raises
:class:`~router.errors.ItemDeleted`), one of a post updated meanwhile gets the new data.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any, Literal

import attrs

from ...errors import InvalidItem, ItemDeleted, SenderErased
from ...ids import copy_ids, outbox_id
from ...model import to_utc
from ...timemap import ReadWindow, TimeMap
from ...model import Activity
from ..fanout import FanOutJob, FanOutResult, plan_job
from ..writes import Parties, insert_program, settle
from ..layouts import Copy, CopyList, EditSettings, Post, layout_for, outbox, posts
from ..push import PushItems, PushPost, cleanups
from ..policy import RetryPolicy, deadline_in
from ..pseudonyms import Pseudonyms
from ..periods import Routing
from ..steps import Concurrently, Failure, Program

__all__ = ["BackfillResult", "PublishResult", "Publishing", "backfill_program", "choose_path", "publish_program",
           "store_outbox"]

log = logging.getLogger(__name__)
#: The most outbox entries one backfill copies.
MAX_BACKFILL = 10_000


def store_outbox(job: FanOutJob, *, policy: RetryPolicy, timeout: float, pseudonyms: Pseudonyms | None = None) -> Program[bool]:
    """Store the job's activity in its author's outbox, and register it by its sender (:mod:`router.core.layouts.posts`),
    both at once; True if the entry is new, False if it was there already.

    Raises the cluster's error if it cannot be stored, and :class:`ItemDeleted` (the entry
    removed again) for a post deleted before or while it was stored, :class:`SenderErased`
    for one whose sender was erased: nothing is fanned out then.
    """
    a = job.activity
    oid = outbox_id(job.seconds, a.data_key)
    deadline = deadline_in(timeout)
    post = posts.Registered(a.sender_id, a.data_key, a.event_time)
    results = yield Concurrently([
        insert_program(job.cluster, outbox.OUTBOX, [Post(oid, a)], policy=policy, deadline=deadline,
                       duplicates="present"),
        insert_program(job.cluster, posts.REGISTRY, [post.entry()], policy=policy, deadline=deadline,
                       duplicates="present"),
    ], [job.cluster, job.cluster])
    for result in results:
        if result.failed:
            raise result.failed[0]
    yield PushPost(a)  # stored: subscribers pulling the author (router.core.live)
    settled = yield from settle(job.cluster, outbox.fix, {a.data_key: [oid]}, timeout=timeout,
                                parties=Parties({a.data_key: a.sender_id}), pseudonyms=pseudonyms)
    if isinstance(settled, Failure):
        raise settled.error
    yield from cleanups(settled.fences, {})
    fence = settled.fences[a.data_key]
    if fence.deleted:
        # (left behind if this fails: the sender's erasure, or a later publish, removes it)
        yield posts.forget(job.cluster, post, deadline_in(timeout))
        raise SenderErased(a.data_key) if fence.erased else ItemDeleted(a.data_key)
    return bool(results[0].written == 1)


def choose_path(
    followers: Iterable[Any], *, pull: bool | None, threshold: int | None
) -> tuple[Literal["push", "pull"], Iterable[Any], int | None]:
    """Push or pull, the receivers to push to, and the follower count the decision used (None when not counted)."""
    if pull is not None:
        if not isinstance(pull, bool):
            raise InvalidItem("pull", f"must be True, False or None (got {pull!r})")
        return ("pull" if pull else "push"), followers, None
    if threshold is None:
        return "push", followers, None
    if isinstance(followers, Sequence):
        count = len(followers)
        return ("pull" if count > threshold else "push"), followers, count
    stream = iter(followers)
    head = list(itertools.islice(stream, threshold + 1))
    if len(head) > threshold:
        return "pull", (), None
    return "push", head, len(head)


@attrs.frozen(kw_only=True)
class PublishResult:
    """What :meth:`publish` did: the path taken (``"push"`` or ``"pull"``), whether the outbox entry is new,
    the follower count the decision used (``None`` when not counted), and for a push the fan-out's
    result (``fan_out``) or, in background mode, its handle (``handle``)."""

    job_id: str
    cluster: str
    path: Literal["push", "pull"]
    outbox_new: bool
    followers: int | None = None
    fan_out: FanOutResult | None = None
    handle: Any = None

    @classmethod
    def of(cls, job: FanOutJob, path: Literal["push", "pull"], *, outbox_new: bool, followers: int | None,
           pushed: Any = None) -> PublishResult:
        """The result for *job*: *pushed* is the fan-out's result, or its handle in background mode."""
        fan_out = pushed if isinstance(pushed, FanOutResult) else None
        handle = pushed if pushed is not None and fan_out is None else None
        return cls(job_id=job.job_id, cluster=job.cluster, path=path, outbox_new=outbox_new, followers=followers,
                   fan_out=fan_out, handle=handle)


@attrs.frozen
class Publishing:
    """A publish as far as the core takes it: the job, the path, the receivers to push to (a door's engine runs
    the push), the follower count the decision used, and whether the outbox entry is new."""

    job: FanOutJob
    path: Literal["push", "pull"]
    receivers: Iterable[Any]
    followers: int | None
    outbox_new: bool

    def result(self, pushed: Any = None) -> PublishResult:
        """The :class:`PublishResult`, with the push's result (or its handle in background mode)."""
        return PublishResult.of(self.job, self.path, outbox_new=self.outbox_new, followers=self.followers, pushed=pushed)


def publish_program(
    activity: Activity, followers: Iterable[Any], routing: Routing, *, pull: bool | None, threshold: int | None,
    batch_size: int, job_id: str | None, policy: RetryPolicy, timeout: float, pseudonyms: Pseudonyms | None = None,
) -> Program[Publishing]:
    """``publish`` up to the push: plan the job, choose push or pull, store the outbox entry (raising
    :class:`ItemDeleted` for a deleted post). The door then pushes ``receivers`` when the path is ``push``."""
    job = yield from plan_job(activity, routing, batch_size=batch_size, job_id=job_id)
    path, receivers, counted = choose_path(followers, pull=pull, threshold=threshold)
    fresh = yield from store_outbox(job, policy=policy, timeout=timeout, pseudonyms=pseudonyms)
    return Publishing(job=job, path=path, receivers=receivers, followers=counted, outbox_new=fresh)


@attrs.frozen
class BackfillResult:
    """What a backfill did: copies stored now, copies there already, clusters read."""

    written: int
    already_present: int
    clusters: tuple[str, ...]

    @property
    def copied(self) -> int:
        """Outbox entries now in the receiver's feed, stored by this call or earlier."""
        return self.written + self.already_present


def backfill_program(
    receiver_id: int | str,
    senders: Sequence[int | str],
    *,
    timemap: TimeMap,
    now: datetime,
    window: ReadWindow | None,
    since: datetime | None,
    limit: int,
    policy: RetryPolicy,
    timeout: float,
    pseudonyms: Pseudonyms | None = None,
) -> Program[BackfillResult]:
    """Copy *senders*' newest outbox entries into *receiver_id*'s feed, newest cluster first, each cluster in one step.

    Raises the failing cluster's :class:`ClusterUnavailable` (copies stored so far stay;
    running it again completes it, with no second copy).
    """
    after = to_utc(since, field="since") if since is not None else None
    written = present = 0
    read: list[str] = []
    remaining = limit
    for cluster in timemap.clusters_for_read(now=now, window=window):
        if remaining <= 0:
            break
        deadline = deadline_in(timeout)
        found = yield from outbox.find(cluster, senders, deadline, after=after, limit=remaining)
        if isinstance(found, Failure):
            raise found.error
        read.append(cluster)
        remaining -= len(found)
        keys: list[str] = []
        copies: list[Copy] = []
        written_ids: dict[str, list[Any]] = {}
        sent_by: dict[str, int | str] = {}
        for post in found:
            a = post.activity
            (oid,) = copy_ids(int(a.event_time.timestamp()), a.data_key, [receiver_id])
            copies.append(Copy(oid, receiver_id, a.sender_id, a.event_time, a.type, a.data, a.data_key))
            keys.append(a.data_key)
            written_ids.setdefault(a.data_key, []).append(oid)
            sent_by[a.data_key] = a.sender_id
        if copies:
            layout = layout_for(timemap, cluster)
            result = yield from insert_program(cluster, layout, CopyList(copies), policy=policy, deadline=deadline,
                                               duplicates="present")
            if result.failed:
                raise next(iter(result.failed.values()))
            yield PushItems(copies, [c.id for c in copies])  # stored: live subscribers (router.core.live)
            parties = Parties(sent_by, {key: [receiver_id] * len(ids) for key, ids in written_ids.items()},
                              forget=lambda name, who: layout.remove_received(name, who, EditSettings(timeout=timeout)))
            settled = yield from settle(cluster, layout.fix, written_ids, timeout=timeout, parties=parties,
                                        pseudonyms=pseudonyms)
            if isinstance(settled, Failure):
                raise settled.error
            fences = settled.fences
            yield from cleanups(fences, {})
            # deleted meanwhile, or its sender or this receiver erased: removed
            gone = {p for p, key in enumerate(keys) if fences[key].deleted or receiver_id in settled.erased}
            present_now = set(result.present)
            written += result.written - len(gone - present_now)
            present += len(present_now - gone)
        period = next(m for m in timemap.periods if m.name == cluster)
        if after is not None and period.start_date <= after:
            break  # older clusters hold nothing newer than `since`
    log.info("backfill of %r from %d senders: %d copied, %d there already, clusters %s",
             receiver_id, len(senders), written, present, ", ".join(read) or "-")
    return BackfillResult(written=written, already_present=present, clusters=tuple(read))
