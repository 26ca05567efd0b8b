"""Fan-out on write: one copy of an activity per receiver, streamed, bounded, idempotent and resumable.

Use it to deliver one post to every follower of its author: a generator over millions of
receivers is the normal case. Do not use it for a handful of unrelated items: that is
``FeedRouter.write_many``, which draws fresh ids and does not checkpoint.

Example::

    activity = Activity(sender_id=1000765, event_time=now, type=1,
                        data={"fabula_id": 1000983}, data_key=data_key("fabula", 1000983))
    result = fan_out(router.clusters, router.timemap, activity, followers_of(1000765))
    result.written, result.already_present, result.skipped     # 999_812, 0, 188

    with FanOutExecutor(router.clusters, lambda: router.timemap, workers=2) as fanouts:
        handle = fanouts.submit(activity, followers_of(1000765), active=active_ids)
        handle.progress.written                                  # grows while it runs
        handle.result()                                          # FanOutResult, or FanOutFailed

How it works, and why
---------------------
**Where.** Every copy of one activity has the same ``event_time``, so the whole fan-out
goes to one cluster, ``timemap.lookup(event_time)``. That is decided before anything is
written, and a time no period owns, or one owned by a retired cluster, is refused with
:class:`~router.errors.NoClusterForTime`. The activity is checked once with
:func:`router.model.check_item`; each receiver costs only a type test (a 64-bit int or a
non-empty str, not a bool). A bad receiver cannot be refused up front
without reading the whole iterable into memory, so it is counted ``failed``, and
``errors`` names its position in the stream and its value; the other receivers still get
their copy.

**Streaming with bounded memory.** The receivers are read lazily and cut into batches of
``batch_size`` consecutive receivers (default ``write.batch_size`` from clusters.yaml).
Each batch is one unordered ``insert_many``. A semaphore admits at most ``concurrency``
batches at a time, one worker thread each, so memory is bounded by
``batch_size * concurrency`` documents, never by the number of followers. Documents are
plain dicts built in one comprehension, ``data`` is encoded to BSON once and shared, and
the per-receiver cost is about 3 µs of Python (id hash, dict, BSON encoding).

**Idempotent ids.** A copy's ``_id`` is :func:`router.ids.copy_id`: 4 bytes of the event
second, then the first 8 bytes of MurmurHash3_x64_128 of ``(data_key, receiver_id)``. A
copy written a second time (after a crash, a timeout, a retry, or a second run of the same
fan-out, even concurrently) is refused with duplicate key error 11000 and counted
``already_present``: exactly one copy per receiver, whatever happens. In a sharded
cluster ``_id`` is unique only per shard, but the shard key starts with ``receiver_id``,
and every attempt at one copy carries the same ``receiver_id`` and ``event_time`` along
with the same ``_id``. So every attempt reaches the same shard, where the unique ``_id``
index stops the duplicate. Two *different* copies can only collide if
they share the event second (the first 4 bytes) and their 64-bit hashes: with ``n``
copies stamped with one second in one cluster the chance is about ``n**2 / 2**65``:
``2.7e-8`` for a 1M-follower post, ``2.7e-6`` for ten of them in the same second. The
duplicate would be reported ``already_present`` and that receiver would miss the item.
Checking every duplicate against the stored document would close that gap, but on
FerretDB a find by ``_id`` scans the whole collection, so it is not done.

**Checkpoints.** Each fan-out is a job with an id (default ``f"{data_key}:{event_time in
UTC ms}"``, so re-running the same activity resumes it; pass ``job_id`` to choose one). The
owning cluster's database holds one document per job in the ``fanouts`` collection::

    {_id: job_id, data_key, event_time, batch_size, status: "running"|"done"|"failed"|"cancelled",
     done: [{from: 0, to: 812}, {from: 815, to: 990}], batches_done, runs, counts: {...},
     error, created_at, updated_at}

``done`` holds the finished batch numbers as merged half-open ranges (its length is the
number of holes, not of batches). A batch is recorded only after every receiver in it
has its copy or was skipped. The document is updated once per finished batch; updates
that pile up while one is in flight are merged into the next. A resumed run reads the
receivers again from the start and does not re-send the batches recorded done. Batch
numbers are positions in the receiver stream, so a resume must be given the same
receivers in the same order and the same ``batch_size`` (a different one raises
:class:`FanOutConflict`). Receiver filtering (``active``) happens inside a batch, so a
receiver that became inactive in between does not shift the batches. A lost checkpoint
update only makes a resume redo batches, which the ids make harmless. For the record to
survive a server crash, give the cluster a majority write concern (``w: majority`` in its
clusters.yaml ``options``).

**Failures.** Retries follow ``FeedRouter``'s rule for inserts: a connection lost
mid-batch and the transient write error codes (not primary, step-down, shutdown,
interrupted) are retried, up to ``attempts`` tries in all (default ``write.retries`` + 1),
with jittered exponential backoff from ``write.retry_backoff``; a retry re-sends the
whole batch, and copies the lost attempt had stored come back as ``already_present``. A
server that cannot be selected, or does not answer within the socket timeout, is not
retried: that timeout was the wait. When a batch gives up, its receivers are counted
``failed``, the error is logged at error level and kept, and the job stops reading
receivers (the cluster is evidently down; hammering it helps nobody): batches in flight
finish, the checkpoint is saved, and the result has ``complete=False``. A copy refused
for itself (a write error other than 11000) fails only that receiver.
:func:`fan_out` and :meth:`FanOutHandle.result` return a :class:`FanOutResult` only for
a job that read every receiver and left none without a copy. Otherwise they raise
:class:`FanOutFailed` carrying the result: the counts, the first
:data:`MAX_FAILED_RECEIVERS` failed receivers and the errors. This mirrors
``write_many``, which raises ``WriteFailed`` for a partial failure, so a caller that never
looks at the result still cannot miss one. Nothing written is undone, and re-running
with the same job id completes the job.

**Background.** :class:`FanOutExecutor` runs jobs on a bounded pool of ``workers`` threads
(each job with its own ``concurrency`` batch threads), so ``submit`` returns a
:class:`FanOutHandle` at once, after the activity is checked and routed. The handle shows
progress and errors while the job runs; :meth:`FanOutExecutor.close` drains the jobs or
cancels them. A cancelled job stops between batches and stays resumable.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import logging
import random
import threading
import time
from bisect import bisect_right
from collections.abc import Callable, Container, Iterable, Iterator, Mapping
from datetime import datetime, timedelta, timezone
from typing import Any, TypeAlias

import attrs
import bson
from bson.errors import BSONError
from bson.raw_bson import RawBSONDocument
from pymongo.errors import (
    AutoReconnect,
    BulkWriteError,
    DuplicateKeyError,
    NetworkTimeout,
    PyMongoError,
    ServerSelectionTimeoutError,
)

from .clusters import DUPLICATE_KEY, TRANSIENT_WRITE_CODES, Cluster, Clusters
from .errors import ClusterUnavailable, FanOutConflict, FanOutFailed, InvalidItem, RouterError
from .ids import copy_ids
from .model import ID_RULE, MAX_ID_CHARS, FeedItem, check_item, to_utc
from .timemap import TimeMap

__all__ = [
    "Activity",
    "DEFAULT_CONCURRENCY",
    "DoneBatches",
    "FANOUTS_COLLECTION",
    "FanOutConflict",
    "FanOutExecutor",
    "FanOutFailed",
    "FanOutHandle",
    "FanOutProgress",
    "FanOutResult",
    "MAX_ERRORS",
    "MAX_FAILED_RECEIVERS",
    "fan_out",
]

log = logging.getLogger(__name__)
UTC = timezone.utc
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

#: The collection, in the owning cluster's database, that holds one checkpoint per job.
FANOUTS_COLLECTION = "fanouts"
#: Batches in flight per job when ``concurrency`` is not given.
DEFAULT_CONCURRENCY = 4
#: The most failed receivers a result lists; ``FanOutResult.failed`` is always the full count.
MAX_FAILED_RECEIVERS = 10_000
#: The most distinct errors a result keeps (every one is logged).
MAX_ERRORS = 100
#: The largest ``batch_size`` accepted (a batch of copies must fit one 48 MB wire message).
MAX_BATCH_SIZE = 100_000
#: The longest pause before a retry (``write.retry_backoff`` doubles per retry up to this).
BACKOFF_CAP_SECONDS = 5.0

_DUPLICATE_KEY = DUPLICATE_KEY
_TRANSIENT_CODES = TRANSIENT_WRITE_CODES
_INT64_MIN = -(2**63)
_INT64_END = 2**63

#: Which receivers get a copy: a predicate, or a container (usually a set) of active ids.
Active: TypeAlias = Callable[[Any], bool] | Container[Any]


@attrs.frozen(kw_only=True, slots=True)
class Activity:
    """What every receiver gets a copy of: a :class:`~router.model.FeedItem` without its receiver.

    Example::

        activity = Activity(sender_id=1000765, event_time=datetime.now(timezone.utc), type=1,
                            data={"fabula_id": 1000983}, data_key=data_key("fabula", 1000983))
        activity.for_receiver(1000386)     # the FeedItem one receiver gets

    Fields are checked when the fan-out starts, with the same rules as a FeedItem.
    """

    sender_id: int | str
    event_time: datetime
    type: int | str
    data: Mapping[str, Any]
    data_key: str

    def for_receiver(self, receiver_id: int | str) -> FeedItem:
        """The feed item *receiver_id* gets (``id`` unset)."""
        return FeedItem(
            receiver_id=receiver_id,
            sender_id=self.sender_id,
            event_time=self.event_time,
            type=self.type,
            data=self.data,
            data_key=self.data_key,
        )

    @classmethod
    def from_item(cls, item: FeedItem) -> Activity:
        """The activity of an item already written for one receiver (say, the author's own copy)."""
        return cls(
            sender_id=item.sender_id,
            event_time=item.event_time,
            type=item.type,
            data=item.data,
            data_key=item.data_key,
        )


@attrs.frozen(kw_only=True)
class FanOutProgress:
    """Counts so far of a running fan-out (see :class:`FanOutResult` for what each means)."""

    written: int
    already_present: int
    skipped: int
    failed: int
    resumed: int
    batches: int
    batches_resumed: int
    elapsed_seconds: float

    @property
    def receivers(self) -> int:
        """Receivers accounted for so far."""
        return self.written + self.already_present + self.skipped + self.failed + self.resumed


@attrs.frozen(kw_only=True)
class FanOutResult:
    """What one run of a fan-out did; every receiver read is counted exactly once.

    * ``written``: copies this run stored.
    * ``already_present``: copies that were there already (an earlier or concurrent run of
      the same fan-out, or an attempt of this run whose acknowledgement was lost).
    * ``skipped``: inactive receivers (``active`` said no); they get no copy.
    * ``failed``: receivers with no confirmed copy: invalid ids, or a batch that failed
      after every attempt. ``failed_receivers`` lists the first
      :data:`MAX_FAILED_RECEIVERS` valid ones; invalid ones are named in ``errors``.
    * ``resumed``: receivers in batches the checkpoint recorded done, not sent again.
    * ``batches`` / ``batches_resumed``: batches sent / not sent for that reason.
    * ``errors``: the first :data:`MAX_ERRORS` distinct errors, including checkpoint
      updates that failed (those alone do not fail the job).
    * ``complete``: every receiver was read and every batch sent; ``cancelled``: stopped
      by :meth:`FanOutHandle.cancel` or :meth:`FanOutExecutor.close`.
    """

    job_id: str
    cluster: str
    written: int
    already_present: int
    skipped: int
    failed: int
    resumed: int
    failed_receivers: tuple[int | str, ...]
    errors: tuple[RouterError, ...]
    batches: int
    batches_resumed: int
    elapsed_seconds: float
    complete: bool
    cancelled: bool = False

    @property
    def ok(self) -> bool:
        """True when every receiver was read and none is left without a copy."""
        return self.complete and not self.cancelled and self.failed == 0

    @property
    def receivers(self) -> int:
        """Receivers read by this run."""
        return self.written + self.already_present + self.skipped + self.failed + self.resumed


class DoneBatches:
    """A set of batch numbers, kept as sorted, merged, half-open ranges.

    Example::

        done = DoneBatches.from_document([{"from": 0, "to": 3}])
        done.add(4); done.add(3)
        done.to_document()                 # [{'from': 0, 'to': 5}]
        4 in done, 5 in done               # (True, False)
    """

    __slots__ = ("_starts", "_ends")

    def __init__(self, ranges: Iterable[tuple[int, int]] = ()) -> None:
        self._starts: list[int] = []
        self._ends: list[int] = []
        for start, end in sorted(r for r in ranges if r[0] < r[1]):
            if self._ends and start <= self._ends[-1]:
                self._ends[-1] = max(self._ends[-1], end)
            else:
                self._starts.append(start)
                self._ends.append(end)

    def __contains__(self, number: object) -> bool:
        if not isinstance(number, int):
            return False
        i = bisect_right(self._starts, number) - 1
        return i >= 0 and number < self._ends[i]

    def add(self, number: int) -> None:
        """Record batch *number* done, merging it with its neighbours."""
        starts, ends = self._starts, self._ends
        i = bisect_right(starts, number)  # ranges before i start at or below number
        if i and number < ends[i - 1]:
            return
        joins_left = i > 0 and ends[i - 1] == number
        joins_right = i < len(starts) and starts[i] == number + 1
        if joins_left and joins_right:
            ends[i - 1] = ends[i]
            del starts[i], ends[i]
        elif joins_left:
            ends[i - 1] = number + 1
        elif joins_right:
            starts[i] = number
        else:
            starts.insert(i, number)
            ends.insert(i, number + 1)

    def __len__(self) -> int:
        return sum(e - s for s, e in zip(self._starts, self._ends))

    def ranges(self) -> list[tuple[int, int]]:
        """The ``[from, to)`` ranges, in order."""
        return list(zip(self._starts, self._ends))

    def to_document(self) -> list[dict[str, int]]:
        """The checkpoint's ``done`` field (sub-documents: FerretDB stores no nested arrays)."""
        return [{"from": s, "to": e} for s, e in zip(self._starts, self._ends)]

    @classmethod
    def from_document(cls, value: object) -> DoneBatches:
        """Parse a checkpoint's ``done`` field; raise :class:`ValueError` if it is malformed."""
        if value is None:
            return cls()
        if not isinstance(value, list):
            raise ValueError(f"done: must be a list of {{from, to}} (got {type(value).__name__})")
        ranges = []
        for i, r in enumerate(value):
            lo = r.get("from") if isinstance(r, Mapping) else None
            hi = r.get("to") if isinstance(r, Mapping) else None
            if type(lo) is not int or type(hi) is not int or not 0 <= lo <= hi:
                raise ValueError(f"done[{i}]: must be {{from: int, to: int}} with 0 <= from <= to (got {r!r:.80})")
            ranges.append((lo, hi))
        return cls(ranges)

    def __repr__(self) -> str:
        return f"DoneBatches({self.ranges()!r})"


def _millis(t: datetime) -> int:
    return (to_utc(t) - _EPOCH) // timedelta(milliseconds=1)


def _positive_int(name: str, value: object, *, maximum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1 or (maximum is not None and value > maximum):
        bound = f"from 1 to {maximum}" if maximum is not None else "of at least 1"
        raise InvalidItem(name, f"must be an int {bound} (got {value!r})")
    return value


def _is_receiver(value: object) -> bool:
    if isinstance(value, str):
        return 0 < len(value) <= MAX_ID_CHARS
    return isinstance(value, int) and not isinstance(value, bool) and _INT64_MIN <= value < _INT64_END


class _Job:
    """One fan-out run: the checked activity, its owner cluster, counters and checkpoint.

    Built (and so checked and routed) in the caller's thread; :meth:`run` does the I/O.
    """

    def __init__(
        self,
        clusters: Clusters,
        timemap: TimeMap,
        activity: Activity,
        *,
        active: Active | None,
        batch_size: int | None,
        concurrency: int | None,
        job_id: str | None,
        attempts: int | None,
    ) -> None:
        if type(activity) is not Activity:
            raise InvalidItem("activity", f"must be an Activity (got {type(activity).__name__})")
        ts = check_item(activity.for_receiver(0))
        name = timemap.lookup(ts)
        if name is None or name in timemap.retired:
            raise timemap.no_cluster(activity.event_time)
        self.activity = activity
        self.event_time = to_utc(activity.event_time)
        self.seconds = int(ts)
        self.batch_size = _positive_int(
            "batch_size", clusters.config.batch_size if batch_size is None else batch_size, maximum=MAX_BATCH_SIZE
        )
        self.concurrency = _positive_int("concurrency", DEFAULT_CONCURRENCY if concurrency is None else concurrency)
        config = clusters.config
        self.attempts = _positive_int("attempts", config.write_retries + 1 if attempts is None else attempts)
        self.backoff = config.retry_backoff.total_seconds()
        if job_id is None:
            job_id = f"{activity.data_key}:{_millis(self.event_time)}"
        elif not isinstance(job_id, str) or not job_id or len(job_id) > 1024:
            raise InvalidItem("job_id", f"must be a non-empty str of at most 1024 characters (got {job_id!r:.80})")
        self.job_id = job_id
        self.is_active: Callable[[Any], bool] | None
        if active is None:
            self.is_active = None
        elif callable(active):
            self.is_active = active
        elif isinstance(active, Container):
            self.is_active = active.__contains__
        else:
            raise InvalidItem("active", f"must be a predicate or a set of receiver ids (got {type(active).__name__})")
        self.cluster_name = name
        self.cluster: Cluster = clusters[name]
        self.checkpoints = self.cluster.feed.database[FANOUTS_COLLECTION]
        # Encoded once: every copy shares it, and later changes to activity.data do not leak in.
        self.data = RawBSONDocument(bson.encode(activity.data))

        self._lock = threading.Lock()
        self._cancel = threading.Event()
        self._stopping = threading.Event()  # cancel, a batch that gave up, or a broken receiver stream
        self._started = time.monotonic()
        self._finished: float | None = None
        self._written = self._already = self._skipped = self._failed = self._resumed = 0
        self._batches = self._batches_resumed = 0
        self._failed_receivers: list[int | str] = []
        self._errors: list[RouterError] = []
        self._error_texts: set[str] = set()
        self._gave_up: RouterError | None = None
        self._fatal: BaseException | None = None
        self._done = DoneBatches()
        self._checkpoint_lock = threading.Lock()
        self._dirty = False
        self._opened = False

    # -- observing ----------------------------------------------------------------------

    def _counts(self) -> dict[str, Any]:
        """The counters both a progress snapshot and the result carry (call under ``_lock``)."""
        end = self._finished if self._finished is not None else time.monotonic()
        return {
            "written": self._written,
            "already_present": self._already,
            "skipped": self._skipped,
            "failed": self._failed,
            "resumed": self._resumed,
            "batches": self._batches,
            "batches_resumed": self._batches_resumed,
            "elapsed_seconds": end - self._started,
        }

    def progress(self) -> FanOutProgress:
        with self._lock:
            return FanOutProgress(**self._counts())

    def errors(self) -> tuple[RouterError, ...]:
        with self._lock:
            return tuple(self._errors)

    @property
    def cancel_requested(self) -> bool:
        return self._cancel.is_set()

    def cancel(self) -> None:
        self._cancel.set()
        self._stopping.set()

    def _note_error(self, error: RouterError) -> None:
        """Keep *error* (first MAX_ERRORS distinct messages). Call with the lock held."""
        text = str(error)
        if text not in self._error_texts and len(self._errors) < MAX_ERRORS:
            self._error_texts.add(text)
            self._errors.append(error)

    # -- running ------------------------------------------------------------------------

    def run(self, receivers: Iterable[int | str]) -> FanOutResult:
        """Fan out to every receiver; return the result or raise (see the module docstring)."""
        self._started = time.monotonic()
        if self._cancel.is_set():  # cancelled while queued: nothing read, nothing touched
            return self._end(complete=False, raised=None)
        try:
            stream: Iterator[int | str] = iter(receivers)
        except TypeError:
            raise InvalidItem("receivers", f"must be an iterable of receiver ids (got {type(receivers).__name__})") from None
        try:
            self._open_checkpoint()
        except BaseException as exc:
            with self._lock:
                self._finished = time.monotonic()
            log.error("fan-out %r could not start: %s", self.job_id, exc)
            raise
        log.info(
            "fan-out %r: data_key %s at %s to cluster %r, batches of %d, %d in flight, %d batches done earlier",
            self.job_id, self.activity.data_key, self.event_time.isoformat(), self.cluster_name,
            self.batch_size, self.concurrency, len(self._done),
        )
        complete = False
        raised: BaseException | None = None
        slots = threading.BoundedSemaphore(self.concurrency)
        pool = concurrent.futures.ThreadPoolExecutor(self.concurrency, thread_name_prefix="feed-router-fanout-batch")
        size = self.batch_size
        number = position = 0
        try:
            while not self._stopping.is_set():
                slots.acquire()
                if self._stopping.is_set():
                    slots.release()
                    break
                try:
                    chunk = list(itertools.islice(stream, size))
                except BaseException:
                    slots.release()
                    raise
                if not chunk:
                    slots.release()
                    complete = True
                    break
                if self._stopping.is_set():  # stopped while the stream was read: leave this batch for a resume
                    slots.release()
                    break
                with self._lock:  # workers add to _done meanwhile
                    resumed = number in self._done
                    if resumed:
                        self._resumed += len(chunk)
                        self._batches_resumed += 1
                if resumed:
                    slots.release()
                else:
                    pool.submit(self._send, slots, number, position, chunk)
                number += 1
                position += len(chunk)
        except BaseException as exc:  # the receiver stream raised, or the caller was interrupted
            raised = exc
            self._stopping.set()
        finally:
            pool.shutdown(wait=True)
        return self._end(complete=complete, raised=raised)

    def _end(self, *, complete: bool, raised: BaseException | None) -> FanOutResult:
        with self._lock:
            if raised is None:
                raised = self._fatal
            complete = complete and self._gave_up is None and raised is None
            cancelled = self._cancel.is_set() and not complete
            ok = complete and self._failed == 0
            status = "done" if ok else "cancelled" if cancelled and raised is None else "failed"
            if raised is not None:
                error_text: str | None = f"{type(raised).__name__}: {raised}"
            elif self._errors and not ok:
                error_text = str(self._errors[0])
            else:
                error_text = None
            update = self._state_update(status, error_text)
            self._finished = time.monotonic()
        if self._opened:
            with self._checkpoint_lock:
                self._save(update)
        with self._lock:
            result = FanOutResult(
                job_id=self.job_id,
                cluster=self.cluster_name,
                failed_receivers=tuple(self._failed_receivers),
                errors=tuple(self._errors),
                complete=complete,
                cancelled=cancelled,
                **self._counts(),
            )
        if raised is not None:
            log.error("fan-out %r stopped: %s: %s", self.job_id, type(raised).__name__, raised, exc_info=raised)
            raise raised
        if not result.ok:
            error = FanOutFailed(result)
            log.error("%s", error)
            raise error
        log.info(
            "fan-out %r done in %.1f s: %d written, %d already present, %d skipped, %d in batches done earlier",
            self.job_id, result.elapsed_seconds, result.written, result.already_present, result.skipped, result.resumed,
        )
        return result

    # -- one batch ----------------------------------------------------------------------

    def _send(self, slots: threading.BoundedSemaphore, number: int, first: int, chunk: list[Any]) -> None:
        """Write one batch (in a worker thread); always frees its slot."""
        try:
            self._write_batch(number, first, chunk)
        except BaseException as exc:  # a bug, or the `active` predicate raised: stop and re-raise from run()
            with self._lock:
                if self._fatal is None:
                    self._fatal = exc
                self._failed += len(chunk)
            self._stopping.set()
        finally:
            slots.release()

    def _write_batch(self, number: int, first: int, chunk: list[Any]) -> None:
        is_active = self.is_active
        valid: list[int | str] = []
        append = valid.append
        invalid: list[RouterError] = []
        skipped = 0
        for pos, r in enumerate(chunk, first):
            kind = type(r)
            if not ((kind is int and _INT64_MIN <= r < _INT64_END) or (kind is str and 0 < len(r) <= MAX_ID_CHARS) or _is_receiver(r)):
                invalid.append(InvalidItem(f"receivers[{pos}]", f"{ID_RULE} (got {r!r:.80})"))
            elif is_active is not None and not is_active(r):
                skipped += 1
            else:
                append(r)
        seconds, key = self.seconds, self.activity.data_key
        try:
            ids = copy_ids(seconds, key, valid)
        except UnicodeEncodeError:  # a str receiver that is not valid Unicode: sort them out one by one
            kept: list[int | str] = []
            for r in valid:
                try:
                    copy_ids(seconds, key, [r])
                except UnicodeEncodeError as exc:
                    invalid.append(InvalidItem(f"receivers[{first + chunk.index(r)}]", f"must be valid Unicode text ({exc.reason})"))
                else:
                    kept.append(r)
            valid = kept
            ids = copy_ids(seconds, key, valid)
        sender, event_time, kind_, data = self.activity.sender_id, self.event_time, self.activity.type, self.data
        docs = [
            {
                "_id": oid,
                "data_key": key,
                "receiver_id": r,
                "sender_id": sender,
                "event_time": event_time,
                "type": kind_,
                "data": data,
            }
            for oid, r in zip(ids, valid)
        ]
        written, already, failed, trouble = self._insert(number, docs) if docs else (0, 0, [], [])
        with self._lock:
            self._written += written
            self._already += already
            self._skipped += skipped
            self._failed += len(failed) + len(invalid)
            self._batches += 1
            room = MAX_FAILED_RECEIVERS - len(self._failed_receivers)
            if room > 0:
                self._failed_receivers.extend(failed[:room])
            for error in itertools.chain(trouble, invalid):
                self._note_error(error)
            if not failed and not invalid and not trouble:
                self._done.add(number)
            self._dirty = True
        if invalid:
            log.warning(
                "fan-out %r: batch %d: %d invalid receivers, e.g. %s", self.job_id, number, len(invalid), invalid[0]
            )
        self._flush()

    def _insert(
        self, number: int, docs: list[dict[str, Any]]
    ) -> tuple[int, int, list[int | str], list[RouterError]]:
        """Insert *docs*, retrying transient failures; return (written, already present, failed receivers, errors).

        The retry rule is ``FeedRouter``'s: a connection lost mid-batch (``AutoReconnect``) and
        the transient write error codes are retried, up to ``attempts`` tries in all, with
        jittered exponential backoff from ``write.retry_backoff``. A server that cannot be
        selected, or does not answer within the socket timeout, is not retried: that timeout
        was the wait. A batch that gives up on a driver error stops the job; a copy refused
        for itself (or a batch BSON cannot encode) fails alone.
        """
        feed = self.cluster.feed
        name = self.cluster_name
        written = already = 0
        failed: list[int | str] = []
        trouble: list[RouterError] = []
        pending = docs
        attempt = 0
        while pending:
            attempt += 1
            last = attempt >= self.attempts or self._stopping.is_set()
            give_up: BaseException | None = None
            try:
                feed.insert_many(pending, ordered=False)
                written += len(pending)
                pending = []
            except BulkWriteError as exc:
                details = exc.details
                written += int(details.get("nInserted", 0))
                retry: list[dict[str, Any]] = []
                for werr in details.get("writeErrors", []):
                    doc = pending[werr["index"]]
                    code = werr.get("code")
                    if code == _DUPLICATE_KEY:
                        already += 1  # same _id = same (data_key, receiver): the copy is there
                    elif code in _TRANSIENT_CODES and not last:
                        retry.append(doc)
                    else:
                        failed.append(doc["receiver_id"])
                        trouble.append(
                            ClusterUnavailable(
                                name,
                                f"copy for receiver {doc['receiver_id']!r:.80} refused (code {code}): "
                                f"{str(werr.get('errmsg', ''))[:200]}",
                            )
                        )
                if details.get("writeConcernErrors"):
                    # Stored, but not as durably as asked: keep the batch out of the checkpoint so a
                    # resume sends it again (harmlessly), and report it.
                    wce = details["writeConcernErrors"][0]
                    trouble.append(ClusterUnavailable(name, f"write concern not met: {str(wce.get('errmsg', ''))[:200]}"))
                pending = retry
            except (ServerSelectionTimeoutError, NetworkTimeout) as exc:
                give_up = exc
            except AutoReconnect as exc:  # connection lost mid-batch: outcome unknown, resend it all
                if last:
                    give_up = exc
            except (PyMongoError, BSONError) as exc:
                give_up = exc
            if give_up is not None:
                error = self.cluster.error(give_up, doing=f"insert_many of batch {number}")
                error.__cause__ = give_up
                failed.extend(doc["receiver_id"] for doc in pending)
                trouble.append(error)
                log.error(
                    "fan-out %r: batch %d: %d receivers not written after %d attempt(s): %s",
                    self.job_id, number, len(pending), attempt, error,
                )
                if not isinstance(give_up, BSONError):  # the cluster, not this batch: stop the job
                    with self._lock:
                        if self._gave_up is None:
                            self._gave_up = error
                    self._stopping.set()
                break
            if pending:
                delay = min(BACKOFF_CAP_SECONDS, self.backoff * 2 ** (attempt - 1)) * random.uniform(0.5, 1.5)
                log.warning(
                    "fan-out %r: batch %d: %d copies hit a transient error (attempt %d of %d); retrying in %.2f s",
                    self.job_id, number, len(pending), attempt, self.attempts, delay,
                )
                self._stopping.wait(delay)
        return written, already, failed, trouble

    # -- checkpoint ---------------------------------------------------------------------

    def _open_checkpoint(self) -> None:
        """Load (or create) this job's checkpoint; raise :class:`FanOutConflict` if it is another job's."""
        now = datetime.now(UTC)
        coll = self.checkpoints
        try:
            doc = coll.find_one({"_id": self.job_id})
            if doc is None:
                fresh = {
                    "_id": self.job_id,
                    "data_key": self.activity.data_key,
                    "event_time": self.event_time,
                    "batch_size": self.batch_size,
                    "status": "running",
                    "done": [],
                    "batches_done": 0,
                    "runs": 1,
                    "counts": None,
                    "error": None,
                    "created_at": now,
                    "updated_at": now,
                }
                try:
                    coll.insert_one(fresh)
                    self._opened = True
                    return
                except DuplicateKeyError:  # another run of this job created it a moment ago
                    doc = coll.find_one({"_id": self.job_id})
                    if doc is None:
                        raise FanOutConflict(self.job_id, "its checkpoint was removed while this run opened it") from None
            self._check_checkpoint(doc)
            coll.update_one(
                {"_id": self.job_id},
                {"$set": {"status": "running", "error": None, "updated_at": now}, "$inc": {"runs": 1}},
            )
            self._opened = True
        except PyMongoError as exc:
            raise self.cluster.error(exc, doing=f"opening fan-out checkpoint {self.job_id!r}") from exc

    def _check_checkpoint(self, doc: Mapping[str, Any]) -> None:
        if doc.get("data_key") != self.activity.data_key:
            raise FanOutConflict(
                self.job_id, f"its checkpoint is for data_key {doc.get('data_key')!r:.80}, not {self.activity.data_key!r:.80}"
            )
        stored = doc.get("event_time")
        if not isinstance(stored, datetime) or _millis(stored) != _millis(self.event_time):
            raise FanOutConflict(
                self.job_id, f"its checkpoint is for event_time {stored!r}, not {self.event_time.isoformat()}"
            )
        if doc.get("batch_size") != self.batch_size:
            raise FanOutConflict(
                self.job_id,
                f"its checkpoint counts batches of {doc.get('batch_size')!r} receivers; resuming with "
                f"batch_size={self.batch_size} would skip the wrong receivers (pass batch_size="
                f"{doc.get('batch_size')!r}, or a new job_id to start over)",
            )
        try:
            self._done = DoneBatches.from_document(doc.get("done"))
        except ValueError as exc:
            raise FanOutConflict(self.job_id, f"its checkpoint is malformed: {exc}") from None

    def _state_update(self, status: str, error: str | None = None) -> dict[str, Any]:
        """The checkpoint update for the current state. Call with the lock held."""
        return {
            "$set": {
                "status": status,
                "done": self._done.to_document(),
                "batches_done": len(self._done),
                "counts": {k: v for k, v in self._counts().items() if k != "elapsed_seconds"},
                "error": error,
                "updated_at": datetime.now(UTC),
            }
        }

    def _flush(self) -> None:
        """Save the state if it changed; a write already in flight picks up later changes instead."""
        while self._dirty:
            if not self._checkpoint_lock.acquire(blocking=False):
                return  # the holder loops until nothing is dirty
            try:
                while self._dirty:
                    with self._lock:
                        self._dirty = False
                        update = self._state_update("running")
                    self._save(update)
            finally:
                self._checkpoint_lock.release()

    def _save(self, update: Mapping[str, Any]) -> None:
        """Write *update* to the checkpoint. A failure costs only redone batches on resume: report it, go on."""
        try:
            self.checkpoints.update_one({"_id": self.job_id}, update)
        except PyMongoError as exc:
            error = self.cluster.error(exc, doing=f"saving fan-out checkpoint {self.job_id!r}")
            error.__cause__ = exc
            log.warning("fan-out %r: %s (a resume may redo batches, harmlessly)", self.job_id, error)
            with self._lock:
                self._note_error(error)


def fan_out(
    clusters: Clusters,
    timemap: TimeMap,
    activity: Activity,
    receivers: Iterable[int | str],
    *,
    active: Active | None = None,
    batch_size: int | None = None,
    concurrency: int | None = None,
    job_id: str | None = None,
    attempts: int | None = None,
) -> FanOutResult:
    """Write one copy of *activity* per receiver into the cluster owning its ``event_time``.

    Example::

        activity = Activity(sender_id=7, event_time=now, type=1, data={"fabula_id": 42},
                            data_key=data_key("fabula", 42))
        result = fan_out(router.clusters, router.timemap, activity, (f for f in followers()),
                         active=active_ids)
        print(result.written, result.skipped, result.elapsed_seconds)

    Runs in the caller's thread, with at most *concurrency* (default 4) batches of
    *batch_size* (default ``write.batch_size``) in flight on worker threads. *active* is a
    predicate or a container of receiver ids; other receivers get no copy and count as
    skipped (a predicate is called from the worker threads). Running it again, with the
    same *job_id* (by default one derived from ``data_key`` and ``event_time``), skips the
    batches the checkpoint recorded done and never doubles a copy.

    Raises, before anything is written: :class:`InvalidItem` (the activity or an argument),
    :class:`NoClusterForTime`, :class:`ClusterUnavailable` (the checkpoint cannot be read),
    :class:`FanOutConflict`. Afterwards: :class:`FanOutFailed` (with ``.result``) when some
    receivers have no copy or the job stopped early; an exception raised by *receivers* or
    *active* propagates unchanged once the batches in flight are done.
    """
    job = _Job(
        clusters, timemap, activity, active=active, batch_size=batch_size, concurrency=concurrency,
        job_id=job_id, attempts=attempts,
    )
    return job.run(receivers)


class FanOutHandle:
    """A fan-out running in a :class:`FanOutExecutor`: watch it, wait for it, cancel it.

    Example::

        handle = executor.submit(activity, followers())
        while not handle.wait(timeout=1.0):
            print(handle.progress.written, "so far")
        result = handle.result()           # FanOutResult, or raises FanOutFailed
    """

    def __init__(self, job: _Job, future: concurrent.futures.Future[FanOutResult]) -> None:
        self._job = job
        self._future = future

    @property
    def job_id(self) -> str:
        """The job id (its checkpoint's ``_id``)."""
        return self._job.job_id

    @property
    def cluster(self) -> str:
        """The cluster the copies go to."""
        return self._job.cluster_name

    @property
    def progress(self) -> FanOutProgress:
        """Counts so far; final once :meth:`done`."""
        return self._job.progress()

    @property
    def errors(self) -> tuple[RouterError, ...]:
        """Errors so far (failed batches, invalid receivers, checkpoint updates that failed)."""
        return self._job.errors()

    def done(self) -> bool:
        """True once the job has finished, failed or been cancelled."""
        return self._future.done()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait up to *timeout* seconds (forever if None) for the job to end; return :meth:`done`."""
        concurrent.futures.wait([self._future], timeout=timeout)
        return self._future.done()

    def result(self, timeout: float | None = None) -> FanOutResult:
        """Wait for the job and return its result.

        Returns only for a job that read every receiver and left none without a copy; raises
        :class:`FanOutFailed` (with ``.result``) otherwise, including after :meth:`cancel`;
        raises what the job raised when it could not start (:class:`ClusterUnavailable`,
        :class:`FanOutConflict`) or what the receivers or *active* raised;
        :class:`TimeoutError` if it is still running after *timeout* seconds.
        """
        return self._future.result(timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """What :meth:`result` would raise, or None."""
        return self._future.exception(timeout)

    @property
    def cancel_requested(self) -> bool:
        """True once :meth:`cancel` (or ``close(drain=False)``) asked the job to stop."""
        return self._job.cancel_requested

    def cancel(self) -> bool:
        """Ask the job to stop between batches (batches in flight finish); True if it had not ended.

        The checkpoint stays, so submitting the same fan-out again resumes it.
        """
        self._job.cancel()
        return not self._future.done()

    def __repr__(self) -> str:
        state = "done" if self.done() else "running"
        p = self.progress
        return f"<FanOutHandle {self.job_id!r} to {self.cluster!r} {state}: {p.written} written, {p.failed} failed>"


class FanOutExecutor:
    """A bounded pool that runs fan-outs in the background.

    Example::

        fanouts = FanOutExecutor(router.clusters, lambda: router.timemap, workers=2)
        handle = fanouts.submit(activity, followers(), active=active_ids)
        ...
        fanouts.close(drain=True)          # wait for every job; drain=False cancels them

    ``workers`` jobs run at once, each with up to its ``concurrency`` batches in flight;
    later jobs wait in a queue, their receivers not yet read. *timemap_provider* is called
    at each submit, so a refreshed time map is used from then on. ``attempts`` is the
    number of tries per batch.
    """

    def __init__(
        self,
        clusters: Clusters,
        timemap_provider: Callable[[], TimeMap],
        *,
        workers: int = 2,
        attempts: int | None = None,
    ) -> None:
        self._clusters = clusters
        self._timemap = timemap_provider
        self.workers = _positive_int("workers", workers)
        self.attempts = None if attempts is None else _positive_int("attempts", attempts)
        self._pool = concurrent.futures.ThreadPoolExecutor(self.workers, thread_name_prefix="feed-router-fanout")
        self._lock = threading.Lock()
        self._handles: set[FanOutHandle] = set()
        self._closed = False

    def submit(
        self,
        activity: Activity,
        receivers: Iterable[int | str],
        *,
        active: Active | None = None,
        batch_size: int | None = None,
        concurrency: int | None = None,
        job_id: str | None = None,
    ) -> FanOutHandle:
        """Queue a fan-out (arguments as for :func:`fan_out`) and return its handle at once.

        The activity is checked and routed now: :class:`InvalidItem` and
        :class:`NoClusterForTime` raise here, before anything is queued. *receivers* is read
        later, from a worker thread. Raises :class:`RouterError` after :meth:`close`.
        """
        job = _Job(
            self._clusters, self._timemap(), activity, active=active, batch_size=batch_size,
            concurrency=concurrency, job_id=job_id, attempts=self.attempts,
        )
        with self._lock:
            if self._closed:
                raise RouterError("this FanOutExecutor is closed; it accepts no new fan-outs")
            handle = FanOutHandle(job, self._pool.submit(job.run, receivers))
            self._handles.add(handle)
        handle._future.add_done_callback(lambda _f: self._forget(handle))
        return handle

    def _forget(self, handle: FanOutHandle) -> None:
        with self._lock:
            self._handles.discard(handle)

    @property
    def pending(self) -> tuple[FanOutHandle, ...]:
        """The jobs queued or running."""
        with self._lock:
            return tuple(self._handles)

    def close(self, *, drain: bool = True) -> None:
        """Stop accepting jobs; wait for every job (*drain*) or cancel them first, then return.

        Cancelled jobs stop between batches and keep their checkpoints; each is logged with
        its job id so it can be resumed. Safe to call more than once.
        """
        with self._lock:
            self._closed = True
            handles = list(self._handles)
        if not drain:
            for handle in handles:
                if handle.cancel():
                    log.warning("fan-out %r cancelled by close(); submit it again to resume", handle.job_id)
        self._pool.shutdown(wait=True)

    def __enter__(self) -> FanOutExecutor:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        self.close(drain=exc_type is None)
