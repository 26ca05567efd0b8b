"""Erasing a user: everything they sent and everything addressed to them, in every cluster, with a record of it.

:func:`erase_program` works on every configured cluster at once (every period, in the read
window or not, retired ones included, and standbys). In each cluster, in this order:

1. **The record first.** It inserts the request's erasure record into ``erasures``:
   ``{_id: request_id, user: <pseudonym>, requested_by, requested_at, clusters, state:
   "running"}``. The record holds the user's pseudonym (:mod:`router.core.pseudonyms`), never
   the id. Every writer of copies reads these records after writing
   (:mod:`router.core.writes.fence`), so a fan-out batch, Celery task, backfill or publish still
   running removes what it writes for the user, and later ones of the user's posts are
   refused (:class:`~router.errors.SenderErased`): only inserts decide, as for the edit fence.
2. **What they sent**, a page of posts at a time: the ``data_key``\\ s of their posts (a page
   of their registry documents, :mod:`router.core.layouts.posts`, and their ``outbox``
   entries), then every copy of those posts in every receiver's feed, a few posts at a time
   (:meth:`Layout.remove_sent`), the fan-out job records of those posts (``fanouts``,
   ``fanout_batches``, ``fanout_sent``), their edit records in every cluster (``edits``: an
   update's record holds the post's data, and an edit leaves one in each cluster; counted
   where the post was found), and last the page's ``outbox`` entries and registry documents
   (``posts`` counts documents). What names a post is removed only after everything found
   by it, so an erasure stopped half-way is finished by calling it again. Each page's
   data_keys are remembered first, in ``erasures`` under the user's pseudonym (``{_id:
   "<pseudonym hex>/<request id>/<page>", keys, at}``: no ``user`` field, so no reader of
   records meets it), and once no registered post is left, every post any erasure of the
   user remembered in this cluster is swept once more (with the registry documents that
   list one of those posts alone). A writer whose insert landed but whose read of the
   records never happened (its cluster was killed between the two and the answer lost, or
   the read timed out) reports those receivers failed and stops, and leaves its copies;
   without the memory, nothing could find them once the post's entries were gone.
3. **What was addressed to them**: their feed (:meth:`Layout.remove_received`) and their
   seen markers.
4. **The proof.** The record is marked ``done`` with this cluster's counts per collection.

The result (and the log) gives counts per cluster and collection, never the user's data.
A cluster that fails leaves its record ``running`` (``feedrouter check`` reports it) and
:class:`~router.errors.ErasureFailed` is raised once the others have finished: call it
again. Not fenced, as for the edit fence: ``write``/``write_many`` of items naming the user,
``mark_seen``, and ``update`` of their posts, made while the erasure runs, store what they
are asked (stop them first, or erase again once they stopped).

Example::

    result = driver.run(erase_program(ErasurePlan(user_id=1000765, names=("c1", "c2", "c3"), ...)))
    result.totals["feed_sent"]     # copies of their posts removed, every cluster
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timezone
from typing import Any, ClassVar

import attrs

from ...errors import ClusterError, ClusterUnavailable, ErasureFailed, RouterError
from ...timemap import TimeMap
from ..fanout import checkpoint
from ..writes import ERASURES_COLLECTION, fence, insert_program
from ..notify import seen
from ..layouts import EditSettings, Writer, layout_for, outbox, posts
from ..push import PushEdit
from ..policy import deadline_in
from ..pseudonyms import Pseudonyms
from ..steps import Collection, Concurrently, Delete, Failure, Find, Insert, Program, Request, Update, ask

__all__ = ["COUNTED", "ClusterErasure", "ErasurePlan", "ErasureProgress", "ErasureRecord", "ErasureResult",
           "ErasureStatus", "erase_program", "status_program", "unsettled"]

log = logging.getLogger(__name__)
#: The request time of a record that has none (read from a document written by hand): before every other.
_NEVER = datetime.min.replace(tzinfo=timezone.utc)
#: What an erasure counts in each cluster, in the order it removes them (``feed_sent``: copies of the user's posts
#: in any feed; ``feed_received``: copies in the user's feed).
COUNTED = ("feed_sent", "fanouts", "fanout_batches", "fanout_sent", "edits", "outbox", "posts", "feed_received", "seen")
#: Posts one step of an erasure takes (their copies may be millions; those are removed in steps of their own).
PAGE = 500
#: Posts whose copies the first step of a page removes (see :func:`_copies_of`).
FIRST_GROUP = 8


@attrs.frozen
class ErasureProgress:
    """How far an erasure is in one cluster, as ``erase_user``'s *progress* callback hears it: the documents removed
    there so far (a ``buckets`` period's bucket counts once per statement that pulled copies from it; the result's
    counts are exact), and whether that cluster is ``finished`` (``failed``: it stopped, and ``ErasureFailed`` follows
    once the others finish). Nothing here names the user."""

    cluster: str
    removed: int
    finished: bool = False
    failed: bool = False


#: What hears an erasure's progress: called after every statement that removed something, and once per cluster at the
#: end, from whichever thread or task runs that cluster's share (keep it quick).
ProgressCallback = Callable[[ErasureProgress], None]


@attrs.frozen
class ErasurePlan:
    """An erasure's inputs: the user, every configured cluster, the time map (each period's layout), the edit
    settings (steps, timeout, retries), the pseudonyms, who asked, the request's id and "now", and what hears its
    progress (None: nothing)."""

    user_id: int | str
    names: tuple[str, ...]
    timemap: TimeMap | None
    settings: EditSettings
    pseudonyms: Pseudonyms
    requested_by: str
    request_id: str
    now: datetime
    progress: ProgressCallback | None = None


@attrs.frozen
class ClusterErasure:
    """What an erasure removed from one cluster, by collection (:data:`COUNTED`)."""

    cluster: str
    counts: Mapping[str, int]


@attrs.frozen
class ErasureResult:
    """What ``erase_user`` did: the request (its id, who asked, when) and the counts of each cluster.
    Nothing here names the user."""

    request_id: str
    requested_by: str
    requested_at: datetime
    clusters: tuple[ClusterErasure, ...]

    @property
    def totals(self) -> dict[str, int]:
        """Counts by collection, every cluster added up."""
        return {what: sum(c.counts.get(what, 0) for c in self.clusters) for what in COUNTED}

    @property
    def removed(self) -> int:
        """Every document (and bucket copy) removed."""
        return sum(self.totals.values())

    def to_json(self) -> dict[str, Any]:
        """The result as plain JSON values."""
        return {"request_id": self.request_id, "requested_by": self.requested_by,
                "requested_at": self.requested_at.isoformat(), "totals": self.totals,
                "clusters": {c.cluster: dict(c.counts) for c in self.clusters}}


@attrs.frozen
class ErasureRecord:
    """One cluster's erasure record, as ``erase-status`` shows it: the request, its state there (``running`` or
    ``done``), that cluster's counts, and when it finished."""

    cluster: str
    request_id: str
    requested_by: str
    requested_at: datetime | None
    state: str
    counts: Mapping[str, int]
    finished_at: datetime | None

    @classmethod
    def from_document(cls, cluster: str, doc: Mapping[str, Any]) -> ErasureRecord:
        counts = doc.get("counts")
        when, finished = doc.get("requested_at"), doc.get("finished_at")
        return cls(cluster=cluster, request_id=str(doc.get("_id")), requested_by=str(doc.get("requested_by") or ""),
                   requested_at=when if isinstance(when, datetime) else None, state=str(doc.get("state") or "running"),
                   counts={str(k): int(v) for k, v in counts.items()} if isinstance(counts, Mapping) else {},
                   finished_at=finished if isinstance(finished, datetime) else None)

    def to_json(self) -> dict[str, Any]:
        out = attrs.asdict(self)
        for field in ("requested_at", "finished_at"):
            out[field] = out[field].isoformat() if out[field] is not None else None
        return out


_Outcome = tuple[dict[str, int], RouterError | None]


class _Records(Writer[list[dict[str, Any]]]):
    """Erasure records, stored as they are (one per request and cluster, under the request's id: a duplicate is
    the same record, stored by an earlier attempt)."""

    collection: ClassVar[Collection] = ERASURES_COLLECTION

    def documents(self, batch: list[dict[str, Any]]) -> list[Any]:
        return batch

    def store(self, cluster: str, documents: Sequence[Any], deadline: float, *, again: bool = False) -> Request:
        return Insert(cluster, ERASURES_COLLECTION, documents, deadline)


_RECORDS = _Records()


def erase_program(plan: ErasurePlan) -> Program[ErasureResult]:
    """Erase ``plan.user_id`` from every named cluster, concurrently (see the module's docs); return the counts.

    Raises :class:`ErasureFailed` naming the clusters that did not finish (the others' counts in it).
    """
    names = list(plan.names)
    shares = [_cluster(plan, name) if plan.progress is None else _watched(_cluster(plan, name), name, plan.progress)
              for name in names]
    outcomes = yield Concurrently(shares, names)
    counts = {name: done for name, (done, _error) in zip(names, outcomes)}
    failed = {name: error for name, (_done, error) in zip(names, outcomes) if error is not None}
    for name in names:
        shown = ", ".join(f"{what} {n}" for what, n in counts[name].items() if n) or "nothing"
        state = f"FAILED: {failed[name]}" if name in failed else "done"
        log.info("erasure %s: cluster %s: %s; removed %s", plan.request_id, name, state, shown,
                 extra={"cluster": name, "request_id": plan.request_id})
    if failed:
        raise ErasureFailed(plan.request_id, counts, failed)
    return ErasureResult(plan.request_id, plan.requested_by, plan.now,
                         tuple(ClusterErasure(name, counts[name]) for name in names))


def _watched(share: Program[_Outcome], cluster: str, progress: ProgressCallback) -> Program[_Outcome]:
    """*share* (one cluster's), telling *progress* the documents its statements removed as they go (deletes, and
    updates that pull copies from buckets; not the erasure's own record), then that it finished."""
    removed = 0
    try:
        request = next(share)
        while True:
            answer = yield request
            if isinstance(request, (Delete, Update)) and request.collection != ERASURES_COLLECTION:
                changed = answer if isinstance(answer, int) else getattr(answer, "modified", 0)
                if changed:
                    removed += changed
                    progress(ErasureProgress(cluster, removed))
            request = share.send(answer)
    except StopIteration as stop:
        outcome: _Outcome = stop.value
        progress(ErasureProgress(cluster, removed, finished=True, failed=outcome[1] is not None))
        return outcome


def _cluster(plan: ErasurePlan, cluster: str) -> Program[_Outcome]:
    """One cluster's share: the record, what they sent, what was addressed to them, the record marked done."""
    counts = dict.fromkeys(COUNTED, 0)
    record = {"_id": plan.request_id, "user": plan.pseudonyms.of(plan.user_id), "requested_by": plan.requested_by,
              "requested_at": plan.now, "clusters": list(plan.names), "state": "running", "counts": {},
              "finished_at": None}
    stored = yield from insert_program(cluster, _RECORDS, [record], policy=plan.settings.policy,
                                       deadline=deadline_in(plan.settings.timeout), duplicates="present")
    if stored.failed:
        return counts, next(iter(stored.failed.values()))
    try:
        layout = layout_for(plan.timemap, cluster)
    except RouterError as exc:  # a period of a layout this router does not know
        return counts, exc
    error = yield from _sent(plan, cluster, layout.remove_sent, counts)
    if error is None:
        removed, error = yield from layout.remove_received(cluster, plan.user_id, plan.settings)
        counts["feed_received"] += removed
    if error is None:
        error = yield from _count(seen.forget(cluster, plan.user_id, deadline_in(plan.settings.timeout)), counts, "seen")
    if error is None:
        done = {"state": "done", "counts": counts, "finished_at": datetime.now(plan.now.tzinfo)}
        answer = yield Update(cluster, ERASURES_COLLECTION, {"_id": plan.request_id}, {"$set": done},
                              deadline_in(plan.settings.timeout), one=True)
        if isinstance(answer, Failure):
            error = answer.error
    return counts, error


def _sent(plan: ErasurePlan, cluster: str, remove_sent: Callable[..., Program[tuple[int, Any]]],
          counts: dict[str, int]) -> Program[RouterError | None]:
    """Everything of the user's posts in *cluster*: a page of registered posts at a time (each page remembered
    first, and what names a post removed last: the page's outbox entries, then its registry documents), then once
    more every post an erasure of the user ever remembered in *cluster* (:func:`_remembered`)."""
    user, settings = plan.user_id, plan.settings
    pages = 0
    while True:
        deadline = deadline_in(settings.timeout)
        registered, sent = yield Concurrently([posts.page(cluster, user, deadline),
                                               outbox.sent_keys(cluster, user, deadline, limit=PAGE)], [cluster, cluster])
        for answer in (registered, sent):
            if isinstance(answer, Failure):
                return answer.error
        keys = sorted({key for _t, key in registered.posts} | set(sent))
        if not keys and not registered.ids:
            break
        if keys:
            kept = {"_id": _remembered_id(plan, pages), "keys": keys, "at": plan.now}
            stored = yield from insert_program(cluster, _RECORDS, [kept], policy=settings.policy,
                                               deadline=deadline_in(settings.timeout), duplicates="present")
            if stored.failed:
                return next(iter(stored.failed.values()))
            pages += 1
        error = yield from _page(plan, cluster, keys, remove_sent, counts, documents=registered.ids)
        if error is not None:
            return error
    after: str | None = None
    while True:  # every post remembered here, this erasure's own pages included: copies may have landed since
        found_keys = yield from _remembered(plan, cluster, after)
        if isinstance(found_keys, RouterError):
            return found_keys
        after, keys = found_keys
        if after is None:
            return None
        for i in range(0, len(keys), PAGE):
            error = yield from _page(plan, cluster, keys[i:i + PAGE], remove_sent, counts)
            if error is not None:
                return error


#: Pages of remembered posts one find reads (each lists up to :data:`PAGE` data_keys).
REMEMBERED_PAGES = 64


def _remembered_id(plan: ErasurePlan, page: int) -> str:
    """The ``_id`` of the document that remembers page *page* of the posts this erasure found in a cluster: the
    user's pseudonym in hex first, so the documents of every erasure of the user are one range of ``_id``."""
    return f"{plan.pseudonyms.of(plan.user_id).hex()}/{plan.request_id}/{page}"


def _remembered(plan: ErasurePlan, cluster: str, after: str | None) -> Program[tuple[str | None, list[str]] | RouterError]:
    """The data_keys remembered in *cluster* by erasures of the user (documents after *after*, in ``_id`` order):
    the last ``_id`` read (None: no more) and the keys, distinct, in order."""
    prefix = plan.pseudonyms.of(plan.user_id).hex()
    low = {"$gt": after if after is not None else prefix + "/"}  # (no _id is the prefix and "/" alone)
    docs = yield Find(cluster, ERASURES_COLLECTION, {"_id": {**low, "$lt": prefix + "0"}},  # ("0" follows "/")
                      deadline_in(plan.settings.timeout), sort=[("_id", 1)], limit=REMEMBERED_PAGES,
                      projection={"keys": 1})
    if isinstance(docs, Failure):
        return docs.error
    keys = dict.fromkeys(k for d in docs for k in d.get("keys", ()) if isinstance(k, str))
    return (str(docs[-1]["_id"]) if docs else None), list(keys)


def _page(plan: ErasurePlan, cluster: str, keys: Sequence[str], remove_sent: Callable[..., Program[tuple[int, Any]]],
          counts: dict[str, int], *, documents: Sequence[str] = ()) -> Program[RouterError | None]:
    """Everything of the posts *keys* in *cluster*: their copies, job records, edit records (every cluster), outbox
    entries, in that order, and last the registry *documents* that listed them (a page's), or else (a sweep of
    remembered posts) the registry documents that list one of *keys* alone (:func:`posts.remove_alone`: a document
    listing other posts too waits for the page that finds it)."""
    user, settings = plan.user_id, plan.settings
    error = None
    steps: list[tuple[str, Delete]] = []
    if keys:
        error = yield from _copies_of(cluster, user, keys, settings, remove_sent, counts)
        if error is None:
            yield PushEdit(keys)  # their copies are gone: live subscribers
            error = yield from _jobs(cluster, keys, counts, settings.timeout)
        steps += [("edits", fence.forget(name, keys, deadline_in(settings.timeout))) for name in plan.names]  # every cluster
        steps.append(("outbox", outbox.remove(cluster, user, keys, deadline_in(settings.timeout))))
    steps.append(("posts", posts.remove(cluster, user, documents, deadline_in(settings.timeout)) if documents
                  else posts.remove_alone(cluster, user, keys, deadline_in(settings.timeout))))
    for counted, request in steps if error is None else ():
        error = error or (yield from _count(request, counts, counted))
    return error


def _copies_of(cluster: str, user: int | str, keys: Sequence[str], settings: EditSettings,
               remove_sent: Callable[..., Program[tuple[int, Any]]], counts: dict[str, int]) -> Program[RouterError | None]:
    """Every copy of the posts *keys*, a few posts at a time: as many as hold about half a sample of copies, judged
    from the copies per post the group before held (the first group has :data:`FIRST_GROUP` posts).

    One statement over every key of a page would make the server gather the index entries of all their copies for
    each step (a bitmap of 3.3 million entries per step on DocumentDB, which ran out of time); a group of posts
    that have few copies each is still one find and one delete."""
    target = max(1, settings.sample // 2)
    size, i = FIRST_GROUP, 0
    while i < len(keys):
        group = keys[i:i + size]
        removed, trouble = yield from remove_sent(cluster, user, group, settings)
        counts["feed_sent"] += removed
        if trouble is not None:
            return trouble if isinstance(trouble, RouterError) else ClusterUnavailable(cluster, str(trouble))
        i += len(group)
        per_post = removed / len(group)
        size = max(1, min(2 * size, PAGE, int(target / per_post) if per_post else PAGE))
    return None


def _jobs(cluster: str, keys: Sequence[str], counts: dict[str, int], timeout: float) -> Program[RouterError | None]:
    """The fan-out job records of the posts *keys*: batch records, sent-batch records, then the jobs."""
    jobs = yield from checkpoint.jobs_of(cluster, keys, deadline_in(timeout))
    if isinstance(jobs, Failure):
        return jobs.error
    for collection, request in checkpoint.drop_jobs(cluster, jobs, deadline_in(timeout)) if jobs else ():
        error = yield from _count(request, counts, collection)
        if error is not None:
            return error
    return None


def _count(request: Delete, counts: dict[str, int], counted: str) -> Program[ClusterError | None]:
    """Send a delete, adding what it removed to *counted*; the error that stopped it, or None."""
    answer = yield request
    if isinstance(answer, Failure):
        return answer.error
    counts[counted] += int(answer)
    return None


@attrs.frozen
class ErasureStatus:
    """A user's erasure records in every cluster (``erase-status``), oldest request first; nothing names the user.

    ``finished``: in every cluster that holds a record of the user, each ``running`` one is
    followed by a ``done`` one (an erasure stopped part-way and called again is finished);
    ``unfinished`` lists the others.
    ``records`` is empty for a user never erased.
    """

    records: tuple[ErasureRecord, ...]

    @property
    def unfinished(self) -> tuple[str, ...]:
        """Clusters with a record of the user that no later ``done`` one settles (:func:`unsettled`)."""
        return tuple(dict.fromkeys(r.cluster for r in unsettled(self.records)))

    @property
    def finished(self) -> bool:
        return bool(self.records) and not self.unfinished

    def to_json(self) -> dict[str, Any]:
        return {"finished": self.finished, "unfinished": list(self.unfinished),
                "records": [r.to_json() for r in self.records]}


def unsettled(records: Iterable[ErasureRecord]) -> list[ErasureRecord]:
    """The ``running`` records among one user's *records* that no ``done`` record of the same cluster, requested at
    or after them, settles: erasures that stopped part-way and were not called again since. Ordered by when they
    were asked, not by id: two processes' ids of the same second are in no particular order."""
    records = list(records)
    done: dict[str, datetime] = {}
    for r in records:
        if r.state == "done":
            done[r.cluster] = max(done.get(r.cluster, _NEVER), r.requested_at or _NEVER)
    return [r for r in records
            if r.state != "done" and (r.cluster not in done or done[r.cluster] < (r.requested_at or _NEVER))]


def status_program(pseudonym: bytes, names: Sequence[str], *, deadline: float) -> Program[ErasureStatus]:
    """The erasure records of the user whose pseudonym is *pseudonym*, in every named cluster; raises the first
    unreachable cluster's error."""
    finds = [ask(Find(name, ERASURES_COLLECTION, {"user": pseudonym}, deadline)) for name in names]
    answers = yield Concurrently(finds, list(names))
    records: list[ErasureRecord] = []
    for name, answer in zip(names, answers):
        if isinstance(answer, Failure):
            raise answer.error
        records.extend(ErasureRecord.from_document(name, doc) for doc in answer)
    order = {name: i for i, name in enumerate(names)}
    oldest_first = sorted(records, key=lambda r: (r.requested_at or _NEVER, r.request_id, order[r.cluster]))
    return ErasureStatus(tuple(oldest_first))
