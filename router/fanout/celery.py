"""Fan-out on Celery workers: one task per batch, on worker processes on any machine.

Use it when one post goes to more followers than one process should write (millions), or
when the fan-out must outlive the process that started it. For smaller fan-outs
``FeedRouter.fan_out`` is simpler and needs no broker. Needs the ``celery`` extra
(``pip install 'feed-router[celery]'``). It only decides *where* batches run: the
publisher reads the receivers lazily in batches (:func:`router.core.fanout.plan.batches`) and
sends one task per batch; a worker writes it with
:func:`router.core.fanout.plan.batch_program`, the write path of every engine.

Example::

    app = make_app("redis://broker.example:6379/0")              # the publisher's side
    with FeedRouter.from_yaml("clusters.yaml") as feeds:
        published = publish_fan_out(feeds, app, post, followers_of(author), active=active_ids)
        feeds.fan_out_status(published.job_id)                    # from any process, at any time

    $ feedrouter -c clusters.yaml worker --concurrency 4          # on each worker machine

**Exactly one copy per receiver.** Every copy's ``_id`` is derived from the event second,
``data_key`` and receiver, so a batch written twice (a redelivered task, a retry, a job
published again) stores nothing twice, and its record in the checkpoint counts once.

**No batch lost to a worker.** Tasks are acknowledged late (``acks_late``: after the batch
and its record are written) and ``reject_on_worker_lost`` hands a task back when its pool
process dies. A worker killed outright leaves its task unacknowledged: Redis delivers it
again after ``visibility_timeout`` (RabbitMQ as soon as the connection drops). Workers
take one task at a time (prefetch 1), so a lost worker holds back at most one task per
process. One gap is Redis's own: kombu takes a message (``BRPOP``) and records it as
unacknowledged in a second command, so a message between the two when Redis or the
worker dies is gone. The checkpoint still knows: once the queues are empty,
``fan_out_status`` lists that batch as missing, and publishing the job again sends it.

**Retries.** A batch whose cluster failed (after the core's own retries inside the
call's ``timeout``), or whose record could not be saved, raises :class:`BatchNotWritten`,
and the task is tried again ``retries`` times (clusters.yaml ``celery.retries``, default
3), after ``retry_backoff`` then twice as long each time, jittered, never longer than half
the visibility timeout. Then it fails: the batch stays missing in ``fan_out_status`` and
publishing the job again sends it (and only what is missing). Invalid receivers fail
alone and are recorded, as in every engine; they are not retried.

**Poison tasks.** A task the job cannot have (a batch number below 0, at or past the
job's batch count once it is known, absurdly large, not an int; a wrong position; more
receivers than ``batch_size``; a job never published, or another activity under its id)
writes nothing: the worker logs an error naming the job, the batch and what was wrong,
and rejects the message for good (never retried). So does a batch the job's publisher
never sent: :func:`publish_fan_out` records each batch in the checkpoint's ``fanout_sent``
before it sends the task (one insert per batch), and a worker admits only a batch recorded
there, whenever it takes the task, before or after the job's record exists, with the job's
total known or not. The checks are the core's (:func:`router.core.fanout.checkpoint.admit_batch`).

**JSON only.** Task arguments are the job (:meth:`FanOutJob.to_json`, the activity
included, so its ``data`` must be JSON: :func:`publish_fan_out` refuses anything else with
:class:`InvalidItem`), the batch number, the stream position of its first receiver, the
receiver ids and the positions to skip. No pickle; no result backend: progress is read
from the checkpoint.

**Edits and erasures.** A batch reads the post's edit fence after writing, like every engine's
(:mod:`router.core.writes.fence`): batches of a post deleted meanwhile, queued or redelivered,
remove what they wrote and are acknowledged, not retried. Each worker process remembers
the newest fence it saw per post, so its later batches of a deleted post write nothing.
The erasure records are read at the same time: a batch of an erased sender's post removes
what it wrote and the job's checkpoint, and copies for erased receivers are removed again.

Queues, and how batches are numbered when inactive receivers are included, are in
:mod:`router.fanout.celery_plan`.
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import attrs
from celery import Celery
from celery.exceptions import Reject
from kombu.exceptions import KombuError

from ..config import RouterConfig
from ..core.calls import Active, active_filter
from ..core.writes import FenceMemo, NEVER, receiver_problem
from ..core.fanout import (
    BatchOutcome, FanOutJob, NEXT_BATCH, Send, Step, batch_program, batches, drive, receiver_stream, run_loop,
)
from ..core.settings import Settings
from ..errors import ClusterError, FanOutConflict, InvalidBatch, InvalidItem, RouterError
from ..model import Activity
from ..observe import Metrics, Observer
from ..storage.clusters import Clusters
from ..uris import redact_uri
from .celery_plan import (
    ACTIVE_QUEUE,
    INACTIVE_QUEUE,
    Part,
    Published,
    PublishRun,
    check_json_data,
    inactive_job_id,
)
from .shutdown import sigterm_deferred

if TYPE_CHECKING:
    from ..sync import FeedRouter

__all__ = [
    "ACTIVE_QUEUE",
    "BATCH_TASK",
    "BatchNotWritten",
    "BrokerUnavailable",
    "DEFAULT_QUEUES",
    "INACTIVE_QUEUE",
    "Published",
    "WorkerClusters",
    "app_from_config",
    "inactive_job_id",
    "make_app",
    "publish_fan_out",
    "run_worker",
    "send_batch",
    "transport_options",
    "write_batch",
]

log = logging.getLogger(__name__)

#: The name of the batch task (what the broker carries).
BATCH_TASK = "feedrouter.fan_out_batch"
#: The queues a worker consumes by default, in priority order.
DEFAULT_QUEUES = (ACTIVE_QUEUE, INACTIVE_QUEUE)
#: The longest pause before a retry, in seconds (also capped at half the visibility timeout).
MAX_RETRY_PAUSE = 300.0


class BatchNotWritten(RouterError):
    """Raised by a batch task whose cluster failed, or whose record could not be saved, so the broker retries it.

    The message names the job, the batch and the cluster's error (never a password).
    """


class BrokerUnavailable(RouterError):
    """Raised by :func:`publish_fan_out` when the broker does not take a task (after Celery's publish retries).

    The batches sent before stay queued; publishing the same job again sends the rest.
    """


class WorkerClusters:
    """The clusters a worker process writes batches to: clients made at its first batch, kept until it exits.

    A batch names its cluster, so a worker needs no time map: it holds only the clients
    (:class:`~router.storage.clusters.Clusters`) and the settings of clusters.yaml. A
    process forked by the prefork pool makes its own clients (pymongo clients do not
    survive ``fork``).
    """

    def __init__(self, config: RouterConfig | None, *, observer: Observer | None = None,
                 event_listeners: Sequence[Any] = ()) -> None:
        self.config = config
        self.settings = Settings.from_config(config) if config is not None else None
        #: The metrics and tracing the batches report through (off unless the app was given them).
        self.observer = observer if observer is not None else Observer()
        self._extra = {"event_listeners": list(event_listeners)} if event_listeners else None
        self._lock = threading.Lock()
        self._pid: int | None = None
        self._clusters: Clusters | None = None
        #: The newest edit fence this process has seen per post, passed to its next batches.
        self.fences = FenceMemo()

    def get(self) -> tuple[Clusters, Settings]:
        """This process's clusters and settings; raises :class:`RouterError` for an app made without a config."""
        if self.config is None or self.settings is None:
            raise RouterError("this Celery app has no clusters.yaml to write batches with: make_app(..., config=...)")
        with self._lock:
            if self._clusters is None or self._pid != os.getpid():
                self._clusters = Clusters(self.config, extra_options=self._extra, metrics=self.observer.metrics,
                                          tracing=self.observer.tracing)
                self._pid = os.getpid()
                log.info("worker process %d: clients for clusters %s", self._pid, ", ".join(self._clusters.names))
            return self._clusters, self.settings

    def close(self) -> None:
        """Close this process's clients (if it made any); safe to call more than once."""
        with self._lock:
            if self._clusters is not None and self._pid == os.getpid():
                self._clusters.close()
            self._clusters = None


def make_app(
    broker: str, *, config: RouterConfig | None = None, visibility_timeout: float = 3600.0, retries: int = 3,
    retry_backoff: float = 5.0, name: str = "feedrouter", metrics: Metrics | None = None,
    tracer_provider: Any = None, event_listeners: Sequence[Any] = (),
) -> Celery:
    """A Celery app for fan-out batches: JSON only, late acknowledgement, two queues, the batch task.

    Example::

        app = make_app("redis://broker.example:6379/0")                   # to publish
        app = make_app(url, config=load_config("clusters.yaml"))          # to run workers too

    *config* is what workers write batches with (a publisher needs none). *metrics*,
    *tracer_provider* and *event_listeners* work as on the doors: each batch is a
    ``fan_out_batch`` call (span, latency, outcome) and its copies and requests are
    counted by cluster. The other arguments are clusters.yaml's ``celery`` section
    (:func:`app_from_config`).
    """
    if visibility_timeout <= 0 or retry_backoff < 0 or isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise InvalidItem("celery", f"needs visibility_timeout > 0, retry_backoff >= 0 and retries >= 0 (got "
                                    f"{visibility_timeout!r}, {retry_backoff!r}, {retries!r})")
    app = Celery(name, set_as_current=False)
    app.conf.update(
        broker_url=broker,
        task_serializer="json", result_serializer="json", accept_content=["json"],
        task_ignore_result=True, result_backend=None,
        task_acks_late=True, task_reject_on_worker_lost=True, worker_prefetch_multiplier=1,
        task_default_queue=ACTIVE_QUEUE, task_create_missing_queues=True,  # each queue: exchange and key of its name
        broker_transport_options=transport_options(broker, visibility_timeout),
        broker_connection_retry_on_startup=True,
        worker_cancel_long_running_tasks_on_connection_loss=True,  # safe: a batch is idempotent
        task_publish_retry=True,
        task_publish_retry_policy={"max_retries": 30, "interval_start": 0, "interval_step": 0.5, "interval_max": 2},
        worker_hijack_root_logger=False,
    )
    holder = WorkerClusters(config, observer=Observer(metrics, tracer_provider), event_listeners=event_listeners)
    app.feedrouter_clusters = holder
    pause_cap = min(MAX_RETRY_PAUSE, visibility_timeout / 2)

    def fan_out_batch(self: Any, job: dict[str, Any], number: int, first: int, receivers: list[Any],
                      skip: list[int] | None = None) -> dict[str, int]:
        with sigterm_deferred(f"batch {number!r:.40}"):  # a prefork pool process finishes its batch (.shutdown)
            return run_batch(self, job, number, first, receivers, skip)

    def run_batch(self: Any, job: dict[str, Any], number: int, first: int, receivers: list[Any],
                  skip: list[int] | None) -> dict[str, int]:
        clusters, settings = holder.get()
        try:
            again = bool((self.request.delivery_info or {}).get("redelivered"))
            with holder.observer.call("fan_out_batch"):
                outcome = write_batch(clusters, settings, job, number, first, receivers, skip or [], redelivered=again,
                                      fences=holder.fences)
        except (InvalidItem, FanOutConflict) as exc:  # a poison message: no delivery of it can ever be written
            text = str(exc) if isinstance(exc, InvalidBatch) else f"batch {number!r:.40}: {exc}"
            log.error("%s; the task is rejected for good (never retried)", text)
            raise Reject(text, requeue=False) from exc
        except BatchNotWritten as exc:
            tries = int(self.request.retries)
            if tries >= retries:
                log.error("%s; gave up after %d tries: publish the job again once the cluster is back", exc, tries + 1)
                raise
            pause = min(pause_cap, retry_backoff * 2.0**tries * random.uniform(0.5, 1.5))
            log.warning("%s; try %d of %d in %.1f s", exc, tries + 2, retries + 1, pause)
            raise self.retry(exc=exc, countdown=pause) from exc
        return {"written": outcome.written, "already_present": outcome.already_present, "skipped": outcome.skipped,
                "failed": outcome.failed}

    app.task(name=BATCH_TASK, bind=True, acks_late=True, reject_on_worker_lost=True, ignore_result=True, shared=False,
             max_retries=retries)(fan_out_batch)
    return app


def transport_options(broker: str, visibility_timeout: float) -> dict[str, Any]:
    """The broker transport's options: for Redis, strict queue priority and redelivery after *visibility_timeout*.

    Redis: the active queue is always asked first; a delivery not acknowledged within
    *visibility_timeout* seconds is handed out again, and workers look for such
    deliveries every fifth of it (kombu's default would be every 100 s). SQS takes the
    visibility timeout alone. RabbitMQ needs none: it redelivers when a consumer's
    connection drops, and serves every queue a worker consumes.
    """
    scheme = broker.split("://", 1)[0].lower()
    if scheme in ("redis", "rediss", "sentinel"):
        return {
            "visibility_timeout": visibility_timeout,
            "queue_order_strategy": "priority",
            "unacked_restore_interval": max(1, min(60, round(visibility_timeout / 5))),
            "unacked_restore_throttle": 1,
            "unacked_mutex_expire": max(5, min(300, round(visibility_timeout))),  # a lock left by a crash lasts this long
        }
    if scheme == "sqs":
        return {"visibility_timeout": visibility_timeout}
    return {}


def app_from_config(config: RouterConfig, *, broker: str | None = None, **observe: Any) -> Celery:
    """:func:`make_app` from clusters.yaml's ``celery`` section (*broker*, when given, wins), writing with *config*.

    *observe* passes ``metrics``, ``tracer_provider`` and ``event_listeners`` on to :func:`make_app`.

    Raises :class:`RouterError` when neither gives a broker.
    """
    section = config.celery
    url = broker or (section.broker if section is not None else None)
    if not url:
        raise RouterError(f"{config.source}: no Celery broker: add celery: {{broker: redis://host:6379/0}} or pass one")
    if section is None:
        return make_app(url, config=config, **observe)
    return make_app(url, config=config, visibility_timeout=section.visibility_timeout.total_seconds(),
                    retries=section.retries, retry_backoff=section.retry_backoff.total_seconds(), **observe)


def write_batch(
    clusters: Clusters, settings: Settings, job: Any, number: Any, first: Any, receivers: Any, skip: Sequence[Any], *,
    redelivered: bool = False, fences: FenceMemo | None = None,
) -> BatchOutcome:
    """What a task does: write batch *number* of *job* (its JSON) with ``batch_program``; raise to be retried.

    *fences* is the process's memory of edit fences: a batch of a post known deleted writes
    nothing; what a batch learns is remembered. Raises :class:`InvalidItem` for malformed
    arguments, :class:`InvalidBatch` for a batch the job cannot have and
    :class:`FanOutConflict` for another job's checkpoint, before anything is written (none
    is worth retrying); :class:`BatchNotWritten` when the cluster failed or the batch's
    record was not saved.
    """
    fanout = FanOutJob.from_json(job)
    if not isinstance(receivers, list):
        raise InvalidBatch(fanout.job_id, number, "receivers", f"must be a list of receiver ids (got {type(receivers).__name__})")
    active: Callable[[Any], bool] | None = None
    if skip:  # the receivers at these positions get no copy in this job (batch_program counts them skipped)
        left_out = {receivers[i] for i in skip if type(i) is int and 0 <= i < len(receivers)
                    and receiver_problem(receivers[i]) is None}
        active = lambda receiver: receiver not in left_out  # noqa: E731
    data = fanout.encoded_data()
    key = fanout.activity.data_key
    try:
        outcome = clusters.run(batch_program(
            fanout, number, first, receivers, policy=settings.write.policy, timeout=settings.timeout, active=active,
            data=data, admit=True, known=fences.known(key) if fences is not None else NEVER,
            pseudonyms=settings.pseudonyms,
        ))
    except ClusterError as exc:  # the checkpoint could not be read to admit the batch
        raise BatchNotWritten(f"fan-out {fanout.job_id!r}: batch {number} not written: {exc}") from exc
    if fences is not None:
        fences.learn(key, outcome.fence)
    if outcome.fence is not None and outcome.fence.deleted:  # (an erased sender's: its checkpoint went too)
        log.info("fan-out %r: batch %d: its %s; nothing of it is kept", fanout.job_id, number,
                 "sender was erased" if outcome.fence.erased else "post was deleted", extra=fanout.log_extra)
        return outcome
    trouble: RouterError | None = outcome.stopped.error if outcome.stopped is not None else None
    if trouble is None:  # a copy left in doubt by the cluster, or the record not saved: worth another try
        trouble = next((e for e in outcome.errors if isinstance(e, ClusterError)), None)
    if trouble is not None:
        raise BatchNotWritten(f"fan-out {fanout.job_id!r}: batch {number} not written: {trouble}") from trouble
    log.info("fan-out %r: batch %d%s: %d written, %d already present, %d skipped, %d failed", fanout.job_id, number,
             " (delivered again)" if redelivered else "", outcome.written, outcome.already_present, outcome.skipped,
             outcome.failed, extra=fanout.log_extra)
    return outcome


def send_batch(
    app: Celery, job: FanOutJob | dict[str, Any], number: int, first: int, receivers: Sequence[Any], *,
    skip: Sequence[int] = (), queue: str = ACTIVE_QUEUE, producer: Any = None,
) -> None:
    """Send one batch task: batch *number* of *job*, its first receiver at stream position *first*.

    :func:`publish_fan_out` sends every batch this way, after recording it as sent
    (:func:`router.core.fanout.checkpoint.announce_batch`): a worker refuses a batch with no such
    record. Sending a batch again is harmless (it finds its copies present). Raises
    :class:`BrokerUnavailable` if the broker does not take it.
    """
    payload = job.to_json() if isinstance(job, FanOutJob) else job
    try:
        app.send_task(BATCH_TASK, args=[payload, number, first, list(receivers), list(skip)], queue=queue,
                      routing_key=queue, producer=producer, add_to_parent=False)
    except KombuError as exc:
        text = redact_uri(f"{type(exc).__name__}: {exc}")
        raise BrokerUnavailable(f"fan-out {payload.get('job_id')!r}: batch {number}: the broker did not take it: {text}") from exc


def publish_fan_out(
    router: FeedRouter, app: Celery, activity: Activity, receivers: Iterable[Any], *, active: Active | None = None,
    include_inactive: bool = False, batch_size: int | None = None, job_id: str | None = None,
) -> Published:
    """Send one task per batch of receivers not yet done; return at once (workers write them).

    Example::

        published = publish_fan_out(feeds, app, post, followers_of(author), active=active_ids)
        feeds.fan_out_status(published.job_id).state     # 'running', then 'done'

    Plans the job (``router.plan_fan_out``: nothing is written if the activity is invalid
    or no cluster owns it), opens its checkpoint, reads *receivers* lazily in batches of
    *batch_size* (default ``write.batch_size``) holding at most one batch, records each
    batch as sent before sending it (workers admit no other,
    :func:`~router.core.fanout.checkpoint.announce_batch`), and records ``published`` with the
    number of batches at the end. Publishing the same job again
    (same receivers, same order, same batch size) sends exactly the batches not recorded
    done when it reaches them: a batch a worker finishes while the job is published again
    (a task still queued from the first time) is not sent again. One still queued and not
    taken yet is missing as far as the checkpoint can tell, and is sent again: harmless (the
    second writes nothing), but wasted work. Receivers outside *active* get no copy, unless *include_inactive*: then their
    copies go to a second job on the low-priority queue (see
    :mod:`router.fanout.celery_plan`). The author's outbox entry is
    :meth:`FeedRouter.publish`'s business, not this function's.

    Raises :class:`InvalidItem` (``data`` not JSON, among others), :class:`NoClusterForTime`,
    :class:`StaleMetadata`, :class:`FanOutConflict`, :class:`ClusterError`,
    :class:`~router.errors.ItemDeleted` (the post was deleted) before anything is sent; :class:`BrokerUnavailable`, or what *receivers* or *active* raised,
    while sending (the checkpoint then says ``failed``; publish again to finish).
    """
    job = router.plan_fan_out(activity, batch_size=batch_size, job_id=job_id)
    check_json_data(job.activity.data)
    predicate = active_filter(active)
    stream = receiver_stream(receivers)
    side = attrs.evolve(job, job_id=inactive_job_id(job.job_id)) if include_inactive and predicate is not None else None
    run = PublishRun([job] if side is None else [job, side], active=predicate, timeout=router.settings.timeout,
                     pseudonyms=router.settings.pseudonyms, policy=router.settings.write.policy)
    router.clusters.run(run.open())  # ItemDeleted for a deleted post, SenderErased for an erased sender's
    payloads = [j.to_json() for j in run.jobs]
    log.info("fan-out %r: publishing to cluster %r in batches of %d%s; %d batches done earlier", job.job_id, job.cluster,
             job.batch_size, f", inactive receivers as {side.job_id!r}" if side else "",
             len(run.done) + len(run.side_done), extra=job.log_extra)
    planned = batches(stream, job.batch_size)
    try:
        with app.producer_or_acquire() as producer:

            def do(step: Step) -> Any:  # the core's run loop, sending each batch's tasks at once (no slots to wait for)
                if step == NEXT_BATCH:
                    return next(planned, None)
                if isinstance(step, Send):
                    number, first, parts = step.batch
                    # Recorded as sent before it is; a part a worker finished meanwhile is not sent again.
                    for part in router.clusters.run(run.announce(number, parts)):
                        _send(app, payloads[1] if part.inactive else payloads[0], number, first, part, producer)
                        run.sent += 1
                return None

            drive(run_loop(run), do)
    except BaseException as exc:  # no producer (the broker is down), or the caller interrupted taking one
        run.stop(exc, raised=True)
    return router.clusters.run(run.finish())


def _send(app: Celery, payload: dict[str, Any], number: int, first: int, part: Part, producer: Any) -> None:
    send_batch(app, payload, number, first, part.receivers, skip=part.skip, queue=part.queue, producer=producer)


def run_worker(
    app: Celery, *, queues: Sequence[str] = DEFAULT_QUEUES, concurrency: int | None = None, pool: str = "prefork",
    hostname: str | None = None,
) -> int:
    """Run a Celery worker for *app* in this process until it is stopped; return its exit code.

    Example::

        run_worker(app_from_config(load_config("clusters.yaml")), concurrency=4)

    SIGTERM is a warm shutdown: tasks running finish and are acknowledged; tasks the
    worker took but did not start go back to the broker. A prefork pool process that gets
    SIGTERM too (sent to the whole group) finishes its batch first (:mod:`.shutdown`). *hostname* may use Celery's
    ``%h``/``%n``/``%d``. Logging stays as the caller set it up (no banner, no handler of
    Celery's). No gossip or mingle: batches need no coordination between workers. Each
    worker process makes its cluster clients at its first batch and closes them when it exits.
    """
    from celery.signals import setup_logging, worker_process_shutdown, worker_shutdown
    from celery.utils.nodenames import default_nodename, host_format

    holder: WorkerClusters = app.feedrouter_clusters

    def keep_logging(**_: Any) -> None:
        return None

    def close_clients(**_: Any) -> None:
        holder.close()

    setup_logging.connect(keep_logging, weak=False)
    worker_shutdown.connect(close_clients, weak=False)
    worker_process_shutdown.connect(close_clients, weak=False)
    try:
        worker = app.Worker(hostname=host_format(default_nodename(hostname)), pool_cls=pool, concurrency=concurrency,
                            queues=list(queues), quiet=True, without_gossip=True, without_mingle=True)
        worker.start()
        return int(worker.exitcode or 0)
    finally:
        setup_logging.disconnect(keep_logging)
        worker_shutdown.disconnect(close_clients)
        worker_process_shutdown.disconnect(close_clients)
        holder.close()
