"""FeedRouter: the synchronous front door, on ``MongoClient`` and threads.

Use it when one MongoDB cluster per period of ``event_time`` holds all feeds (fan-out
on write, one copy per receiver, plus each author's outbox). Do not use it for data
whose reads are not "newest first for one receiver": every other query would touch
every cluster. For asyncio services, :class:`~router.AsyncFeedRouter` has the same
operations as coroutines.

Every decision is made by the core (:mod:`router.core`); this class holds the clients,
the time map and its refresh thread, and runs the core's programs.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from os import PathLike
from pathlib import Path
from typing import Any, Literal, overload

from bson import ObjectId

from .config import RouterConfig, load_config
from .core import calls
from .core.fanout import FanOutJob, FanOutResult, JobStatus
from .core.privacy import ErasureProgress, ErasureResult, ErasureStatus, ExportProgress
from .core.periods import Routing
from .core.notify import Group, GroupBy, GroupPage, Unseen, UnseenGroups
from .core.settings import Settings
from .core.social import BackfillResult, PublishResult
from .core.writes import Prepared, prepare_or_stale
from .cursor import Position
from .errors import WriteFailed
from .exports import ExportFolder, ExportResult
from .fanout.threads import FanOutExecutor, FanOutHandle, FanOutRun
from .live.doors import LiveDoor
from .model import Activity, FeedItem, Page, utcnow
from .observe import Event, Metrics, Observer
from .storage.clusters import Clusters
from .sync_base import _Calls

__all__ = ["FeedRouter"]

log = logging.getLogger(__name__)


class FeedRouter(LiveDoor):
    """Routes feed writes, reads and deletes to the cluster that owns each ``event_time``.

    Example::

        with FeedRouter.from_yaml("clusters.yaml") as feeds:
            feeds.write_many(items)                   # grouped per cluster, clusters in parallel
            page = feeds.read(receiver_id, limit=50)  # newest first, fewest clusters touched

    Construction connects to every cluster and loads the time map; a bad configuration
    or metadata fails here, not at the first write. A daemon thread then reloads the map
    every ``refresh_interval`` (``refresh=False`` turns it off) until :meth:`close`.
    *clock* (for tests) tells the router what "now" is. *event_listeners* go to every
    client (pymongo command monitoring, ``opentelemetry-instrumentation-pymongo``);
    *metrics* receives the router's events (:mod:`router.observe`), and *tracer_provider*
    (OpenTelemetry) gets a span per call and per request. Every call waits at most
    ``timeout`` (clusters.yaml) for any cluster; see "Guarantees under faults" in the docs.
    """

    def __init__(
        self, config: RouterConfig, *, clock: Callable[[], datetime] = utcnow, refresh: bool = True,
        fanout_workers: int = 2, event_listeners: Sequence[Any] = (), metrics: Metrics | None = None,
        tracer_provider: Any = None,
    ) -> None:
        self.config = config
        self._observe = Observer(metrics, tracer_provider)
        self.settings = Settings.from_config(config)
        self._clock = clock
        self._calls = _Calls()
        self._refresh_lock = threading.Lock()
        extra = {"event_listeners": list(event_listeners)} if event_listeners else None
        self._clusters = Clusters(config, refresh=self._refresh_for_core, extra_options=extra,
                                  metrics=self._observe.metrics, tracing=self._observe.tracing)
        started = clock()
        try:
            timemap = self._clusters.load_timemap()
        except BaseException:
            self._clusters.close()
            raise
        self._routing = Routing(timemap, started, config.rollover.lead_time if config.rollover else None)
        self._clusters.record(Event("timemap_loaded", started.timestamp()))
        if log.isEnabledFor(logging.INFO):  # the table of a thousand periods takes a while to format
            log.info("time map loaded from %d clusters:\n%s", len(self._clusters), timemap.describe())
        self._fanouts = FanOutExecutor(workers=fanout_workers)
        self._stop = threading.Event()
        self._refresher: threading.Thread | None = None
        if refresh:
            self._refresher = threading.Thread(target=self._refresh_loop, name="feed-router-refresh", daemon=True)
            self._refresher.start()

    @classmethod
    def from_yaml(
        cls, path: str | Path = "clusters.yaml", *, clock: Callable[[], datetime] = utcnow, refresh: bool = True,
        fanout_workers: int = 2, event_listeners: Sequence[Any] = (), metrics: Metrics | None = None,
        tracer_provider: Any = None,
    ) -> FeedRouter:
        """Load ``clusters.yaml``, connect to every cluster and build the time map."""
        return cls(load_config(path), clock=clock, refresh=refresh, fanout_workers=fanout_workers,
                   event_listeners=event_listeners, metrics=metrics, tracer_provider=tracer_provider)

    # -- writes ------------------------------------------------------------------------

    def write(self, item: FeedItem) -> ObjectId:
        """Store one item in the cluster owning its ``event_time``; return its ``_id``.

        Raises :class:`InvalidItem`, :class:`NoClusterForTime`, :class:`StaleMetadata` or
        :class:`ClusterUnavailable` (``from`` the :class:`WriteFailed` that holds the id).
        """
        try:
            return self._run("write", calls.write_many(self._view(), (item,), indexed=False))[0]
        except WriteFailed as exc:
            raise exc.failed[0] from exc

    def write_many(self, items: Iterable[FeedItem]) -> list[ObjectId]:
        """Store every item; return their ``_id``\\ s in the order given.

        All items are checked and routed before anything is written: one invalid item
        (:class:`InvalidItem`) or one no period owns (:class:`NoClusterForTime`) rejects the
        whole call and changes no cluster. Items are then grouped per cluster and sent as
        unordered ``insert_many`` batches of ``write.batch_size``, clusters concurrently.
        If some are not confirmed written, :class:`WriteFailed` says which (by index) and
        why, with every item's id; the others are stored. An item with ``id`` set is
        stored under that id (a repeat of a stored item is found, not stored twice).
        """
        return self._run("write_many", calls.write_many(self._view(), items))

    def prepare(self, items: Sequence[FeedItem]) -> Prepared:
        """The write path without I/O: check, route, id and build every item (for measuring, or to inspect).

        Raises what :meth:`write_many` raises for bad input, and :class:`StaleMetadata` for
        an item past the map's horizon (:meth:`write_many` would refresh once first).
        """
        return prepare_or_stale(items, self._routing)

    # -- reads -------------------------------------------------------------------------

    def read(
        self, receiver_id: int | str, *, limit: int = 50, cursor: str | None = None, on_unavailable: str | None = None,
        pull: Sequence[int | str] | None = None, types: Sequence[int | str] | None = None,
    ) -> Page:
        """One page of *receiver_id*'s feed, newest first by ``(event_time, _id)``.

        The newest cluster in the read window is asked first; an older one only while
        the page is not full. Pass ``next_cursor`` for the next page (``None`` once the
        window is exhausted). *pull* merges in the outboxes of those senders (authors
        whose posts are not copied to followers), each post once. *on_unavailable*
        (default ``read.on_unavailable``): ``"raise"`` raises :class:`ClusterUnavailable`
        for a cluster the page needs; ``"partial"`` serves the rest, marks the page
        ``partial`` and owes that cluster's items to later pages. *types* keeps only items
        of those types (a notification feed's filter): pages stay full and cursors work as
        without it.
        """
        return self._run("read", calls.read(
            self._view(), receiver_id, limit=limit, cursor=cursor, on_unavailable=on_unavailable, pull=pull, types=types
        ))

    # -- notifications -----------------------------------------------------------------

    def mark_seen(self, receiver_id: int | str, position: Position | FeedItem) -> Position:
        """Mark everything up to *position* (an item of a page, or its :class:`Position`) as seen by *receiver_id*.

        Example::

            page = feeds.read(7, limit=20)
            feeds.mark_seen(7, page.items[0])          # the newest item shown
            feeds.unseen_count(7).count                # 0 until something newer arrives

        The marker never moves backwards: marking an older position, or two devices
        marking at once, leaves the highest one. It lives in the cluster that owns its time,
        so it survives rollovers.
        """
        return self._run("mark_seen", calls.mark_seen(self._view(), receiver_id, position))

    def seen_position(self, receiver_id: int | str) -> Position | None:
        """*receiver_id*'s seen marker, or ``None`` if nothing in the read window was marked."""
        return self._run("seen_position", calls.seen_position(self._view(), receiver_id))

    def unseen_count(self, receiver_id: int | str, *, cap: int = 99, pull: Sequence[int | str] | None = None) -> Unseen:
        """How many items are newer than the seen marker, stopping past *cap* (``capped``: show "99+").

        Asks the newest cluster first and never one older than the marker; with *pull*, the
        pulled senders' outbox posts count too, each post once.
        """
        return self._run("unseen_count", calls.unseen_count(self._view(), receiver_id, cap=cap, pull=pull))

    # -- aggregated notifications ------------------------------------------------------

    def read_groups(
        self, receiver_id: int | str, *, key: GroupBy | str | None = None, limit: int = 20, newest: int = 3,
        cursor: str | None = None, pull: Sequence[int | str] | None = None, types: Sequence[int | str] | None = None,
    ) -> GroupPage:
        """A page of *receiver_id*'s notifications as groups ("Alice and 3 others liked your post"), newest first.

        Example::

            page = feeds.read_groups(7, limit=20)                  # type + data.target, per UTC day
            for g in page.groups:
                print(g.actors[0], g.others, g.values, g.count, g.seen, g.read)
            feeds.mark_read(7, [page.groups[0]])

        *key* is a :class:`GroupBy` (or its text, ``"type,data.target/1d"``); each group carries
        its exact item count and its distinct actors (counted on the server, never by reading its
        items; exact up to 1,000 items in a period, ``actors_capped`` beyond: "999+ others"), the
        newest item of each of its *newest* newest actors, its first and last time, and
        ``seen``/``read``. Pass ``next_cursor`` for the next page: every group once per walk; a
        group that gets a new item meanwhile is not served again (it leads the next walk).
        *pull* and *types* work as in :meth:`read`. Raises :class:`ClusterUnavailable` for a
        cluster the page needs (:class:`RequestRefused` where its server refuses a request).
        """
        return self._run("read_groups", calls.read_groups(
            self._view(), receiver_id, key=key, limit=limit, newest=newest, cursor=cursor, pull=pull, types=types))

    def mark_read(self, receiver_id: int | str, groups: Iterable[Group | str] | Literal["all"]) -> int:
        """Mark *groups* read (``Group`` values from a page, their keys, or ``"all"``); returns how many marks.

        Example::

            page = feeds.read_groups(7)
            feeds.mark_read(7, [page.groups[0]])         # opened: bold until a newer item arrives
            feeds.mark_read(7, "all")                    # "mark all as read"

        A group passed as a value is read through its newest item (a newer item makes it unread
        again), and must be one a page returned (:class:`InvalidItem` naming ``groups[i]``
        otherwise); a key or ``"all"`` marks through now. Each mark is stored in the cluster that
        owns its position. Marks are inserted, never updated, so two devices marking at once lose
        nothing, on every supported server.
        """
        return self._run("mark_read", calls.mark_read(self._view(), receiver_id, groups))

    def unseen_groups(
        self, receiver_id: int | str, *, cap: int = 99, key: GroupBy | str | None = None,
        pull: Sequence[int | str] | None = None, types: Sequence[int | str] | None = None,
    ) -> UnseenGroups:
        """How many groups have an item newer than the seen marker, stopping past *cap* (the badge: "99+").

        Example::

            badge = feeds.unseen_groups(7, cap=99)
            label = f"{badge.count}+" if badge.capped else str(badge.count)

        Asks the newest cluster first and never one older than the marker; *key*, *pull* and
        *types* as in :meth:`read_groups`.
        """
        return self._run("unseen_groups", calls.unseen_groups(
            self._view(), receiver_id, cap=cap, key=key, pull=pull, types=types))

    # -- edits -------------------------------------------------------------------------

    def delete(self, data_key: str) -> int:
        """Remove every copy of the item *data_key*, and its outbox entry, from every cluster; return how many copies.

        Works in bounded steps, clusters concurrently, after leaving a tombstone in each
        cluster: fan-outs still running remove what they write afterwards and stop, and the
        key is never fanned out or published again (:class:`ItemDeleted`). If some cluster
        fails, :class:`DeleteFailed` says which and how many were removed; run it again to finish.
        """
        return self._run("delete", calls.delete(self._view(), data_key))

    def update(self, data_key: str, data: Mapping[str, Any]) -> int:
        """Replace ``data`` in every copy of *data_key* and in its outbox entry; return how many changed.

        Same steps and failure rules as :meth:`delete` (:class:`UpdateFailed`); repeatable.
        Recorded in each cluster's edit fence first, so copies that fan-outs still running
        write afterwards get the new data too.
        """
        return self._run("update", calls.update(self._view(), data_key, data))

    def unfollow(self, receiver_id: int | str, sender_id: int | str) -> int:
        """Remove *sender_id*'s copies from *receiver_id*'s feed in every cluster of the read window; return how many."""
        return self._run("unfollow", calls.unfollow(self._view(), receiver_id, sender_id))

    # -- the social half -----------------------------------------------------------------

    def backfill(
        self, receiver_id: int | str, senders: Sequence[int | str], *, since: datetime | None = None, limit: int = 200,
    ) -> BackfillResult:
        """Copy the senders' newest outbox entries (newer than *since*, at most *limit*) into *receiver_id*'s feed.

        Rebuilds a dormant user's inbox on return. Copies have fan-out's ids, so running it
        again, or while a fan-out of the same post runs, leaves one copy each. At most
        ``read.max_pull`` distinct senders (default 1,000) per call: more is
        :class:`InvalidItem` (``senders: at most 1000 senders per backfill ...``).
        """
        return self._run("backfill", calls.backfill(self._view(), receiver_id, senders, since=since, limit=limit))

    def follow(self, receiver_id: int | str, sender_id: int | str, *, limit: int = 50) -> BackfillResult:
        """Copy the *limit* newest posts of a newly followed *sender_id* into *receiver_id*'s feed (a :meth:`backfill`)."""
        return self._run("backfill", calls.follow(self._view(), receiver_id, sender_id, limit=limit))

    @overload
    def publish(
        self, activity: Activity, followers: Iterable[int | str], *, active: calls.Active | None = ...,
        pull: bool | None = ..., background: Literal[False] = ..., batch_size: int | None = ...,
        concurrency: int | None = ..., job_id: str | None = ...,
    ) -> PublishResult: ...

    @overload
    def publish(
        self, activity: Activity, followers: Iterable[int | str], *, active: calls.Active | None = ...,
        pull: bool | None = ..., background: Literal[True], batch_size: int | None = ...,
        concurrency: int | None = ..., job_id: str | None = ...,
    ) -> PublishResult: ...

    def publish(
        self, activity: Activity, followers: Iterable[int | str], *, active: calls.Active | None = None,
        pull: bool | None = None, background: bool = False, batch_size: int | None = None,
        concurrency: int | None = None, job_id: str | None = None,
    ) -> PublishResult:
        """Store *activity* in its author's outbox, then push it to the (active) followers or, for a pulled author, not.

        ``pull=True``/``False`` decides; else ``fanout.pull_threshold`` applied to the
        follower count (see :mod:`router.core.social.publish`). The push is :meth:`fan_out`
        (``background=True`` puts its handle in ``result.handle``). Raises what
        :meth:`fan_out` raises; the outbox entry stays if the push fails, and publishing
        again is safe.
        """
        with self._observe.call("publish"):
            return self._publish(activity, followers, active=active, pull=pull, background=background,
                                 batch_size=batch_size, concurrency=concurrency, job_id=job_id)

    def _publish(
        self, activity: Activity, followers: Iterable[int | str], *, active: calls.Active | None, pull: bool | None,
        background: bool, batch_size: int | None, concurrency: int | None, job_id: str | None,
    ) -> PublishResult:
        slots = calls.concurrency(concurrency)
        publishing = self._run("publish", calls.publish(self._view(), activity, followers, pull=pull,
                                                        batch_size=batch_size, job_id=job_id))
        if publishing.path == "pull":
            return publishing.result()
        return publishing.result(self._fan_out_job(publishing.job, publishing.receivers, active=active,
                                                   concurrency=slots, background=background))

    # -- fan-out -------------------------------------------------------------------------

    @overload
    def fan_out(
        self, activity: Activity, receivers: Iterable[int | str], *, background: Literal[False] = ...,
        active: calls.Active | None = ..., batch_size: int | None = ..., concurrency: int | None = ...,
        job_id: str | None = ...,
    ) -> FanOutResult: ...

    @overload
    def fan_out(
        self, activity: Activity, receivers: Iterable[int | str], *, background: Literal[True],
        active: calls.Active | None = ..., batch_size: int | None = ..., concurrency: int | None = ...,
        job_id: str | None = ...,
    ) -> FanOutHandle: ...

    def fan_out(
        self, activity: Activity, receivers: Iterable[int | str], *, background: bool = False,
        active: calls.Active | None = None, batch_size: int | None = None, concurrency: int | None = None,
        job_id: str | None = None,
    ) -> FanOutResult | FanOutHandle:
        """Write one copy of *activity* per receiver into the cluster owning its ``event_time``.

        Example::

            result = feeds.fan_out(activity, followers(author), active=active_ids)
            handle = feeds.fan_out(activity, followers(author), background=True)

        Streaming (at most ``concurrency`` batches of ``batch_size`` in flight), idempotent
        (derived ids: a rerun stores nothing twice) and resumable (a checkpoint per job in
        the owning cluster). Raises :class:`InvalidItem`, :class:`NoClusterForTime` or
        :class:`StaleMetadata` before writing anything, :class:`ItemDeleted` (from
        ``result()`` in background mode) for a post that was deleted, before or while it runs
        (``.result`` says how far it got), and :class:`FanOutFailed` (with ``.result``) if
        receivers are left without a copy.
        """
        with self._observe.call("fan_out"):
            slots = calls.concurrency(concurrency)
            job = self.plan_fan_out(activity, batch_size=batch_size, job_id=job_id)
            return self._fan_out_job(job, receivers, active=active, concurrency=slots, background=background)

    def plan_fan_out(self, activity: Activity, *, batch_size: int | None = None, job_id: str | None = None) -> FanOutJob:
        """Check *activity* and choose its cluster: the job :meth:`fan_out`, :meth:`publish` and other engines
        (:mod:`router.fanout.celery`) run. Nothing is written; raises as :meth:`fan_out` does before writing.
        """
        return self._run("plan_fan_out", calls.plan_fan_out(self._view(), activity, batch_size=batch_size, job_id=job_id))

    def _fan_out_job(
        self, job: FanOutJob, receivers: Iterable[Any], *, active: calls.Active | None, concurrency: int, background: bool,
    ) -> FanOutResult | FanOutHandle:
        run = FanOutRun(self._clusters, job, active=calls.active_filter(active), concurrency=concurrency,
                        policy=self.settings.write.policy, timeout=self.settings.timeout,
                        pseudonyms=self.settings.pseudonyms)
        if background:
            return self._fanouts.submit(run, receivers)
        with self._calls.call("fan_out"):
            return run.run(receivers)

    def fan_out_status(self, job_id: str) -> JobStatus:
        """A fan-out job's progress from its checkpoint (any process's job), looked up in every cluster.

        Raises :class:`InvalidItem` if no cluster has a job *job_id*.
        """
        return self._run("fan_out_status", calls.fan_out_status(self._view(), job_id))

    # -- a user's data (docs: "Erasing and exporting a user") -----------------------------

    def erase_user(self, user_id: int | str, *, requested_by: str,
                   progress: Callable[[ErasureProgress], None] | None = None) -> ErasureResult:
        """Remove everything *user_id* sent and everything addressed to them, from every cluster; return the counts.

        Example::

            result = feeds.erase_user(1000765, requested_by="support ticket 4411")
            result.totals["feed_sent"]          # copies of their posts removed, every cluster

        Each cluster gets the erasure's record first (the user's keyed hash, never the id;
        who asked, when, and at the end the counts), which every fan-out batch, Celery task,
        backfill and publish reads after writing, so nothing still running leaves a copy.
        Raises :class:`ErasureFailed` when a cluster did not finish: call it again.

        *progress*, when given, is called with an :class:`~router.core.privacy.erasure.ErasureProgress` (a cluster, the
        documents removed there so far, finished or not) after every statement that removed something and once per
        cluster at the end, from whatever runs that cluster's share: keep it quick. ``feedrouter erase`` shows it on a
        terminal.
        """
        return self._run("erase_user", calls.erase_user(self._view(), user_id, requested_by=requested_by,
                                                                progress=progress))

    def erasure_status(self, user_id: int | str) -> ErasureStatus:
        """*user_id*'s erasure records in every cluster: who asked, when, the counts, and whether each finished.

        Example::

            status = feeds.erasure_status(1000765)
            status.finished                     # every cluster with a record has a done one at or after it

        A record holds the user's keyed hash, never the id. Raises :class:`InvalidItem` for a
        bad id, :class:`ClusterUnavailable` when a cluster cannot be read.
        """
        return self._run("erasure_status", calls.erasure_status(self._view(), user_id))

    def export_user(self, user_id: int | str, out: str | PathLike[str], *,
                    progress: Callable[[ExportProgress], None] | None = None) -> ExportResult:
        """Write what the router holds about *user_id* (posts sent, items received, seen markers, read marks of
        groups) into the existing, empty folder *out*: JSON Lines in time order, then ``manifest.json`` with each
        file's SHA-256.

        Example::

            exported = feeds.export_user(1000765, "/srv/exports/1000765")
            exported.counts                     # {'sent': 8, 'received': 9, 'seen': 1, 'read': 1}

        Each line is a value of this API (an :class:`Activity` sent, a :class:`FeedItem`
        received, a seen marker, a read mark), field by field, with the period it was read from. Raises
        :class:`InvalidItem` for a bad id or an *out* that is not an empty folder, and
        :class:`ClusterUnavailable` when a cluster cannot be read (the partial files are
        removed).

        *progress*, when given, is called with an :class:`~router.core.privacy.export.ExportProgress` (the stream, the period
        it reads, the stream's records so far) after every record written: keep it quick. ``feedrouter export`` shows
        it on a terminal.
        """
        folder = ExportFolder(out, user_id=calls.user(user_id), progress=calls.callback(progress))
        try:
            summary = self._run("export_user", calls.export_user(self._view(), user_id, folder))
        except BaseException:
            folder.abort()
            raise
        return folder.finish(summary)

    # -- lifecycle ---------------------------------------------------------------------

    def close(self) -> None:
        """Refuse new calls, let the ones in flight finish (each is bounded by ``timeout``), cancel background
        fan-outs between batches (resumable), stop the refresh thread, close every client."""
        self._stop.set()
        self._fanouts.close(drain=False)
        if not self._calls.close(self.settings.close_wait):
            log.warning("close(): calls still running after %.0f s; closing the clients under them", self.settings.close_wait)
        self.stop_refresh()
        self._close_live()
        self._clusters.close()

    def __enter__(self) -> FeedRouter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
