"""A fan-out job and a batch's outcome: the plain values the fan-out engines, the checkpoint and the workers share.

Kept apart from :mod:`router.core.fanout.plan` (the programs) so that the checkpoint, which
records jobs and batches, and the fan-out, which writes them, import values from here
rather than from each other.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs
import bson
from bson.raw_bson import RawBSONDocument

from ...errors import InvalidItem, RouterError
from ...model import Activity, from_millis, to_millis
from ..writes import Fence, check_activity
from ..layouts import DEFAULT, layout_named
from ..steps import Failure

__all__ = [
    "BatchOutcome", "DEFAULT_CONCURRENCY", "FanOutJob", "MAX_BATCH_SIZE", "MAX_ERRORS", "MAX_FAILED_RECEIVERS",
    "positive_int",
]

#: Batches in flight per job when ``concurrency`` is not given.
DEFAULT_CONCURRENCY = 4
#: The most failed receivers a result lists; ``FanOutResult.failed`` is always the full count.
MAX_FAILED_RECEIVERS = 10_000
#: The most distinct errors a result keeps (every one is logged).
MAX_ERRORS = 100
#: The largest ``batch_size`` accepted (a batch of copies must fit one 48 MB wire message).
MAX_BATCH_SIZE = 100_000


def positive_int(name: str, value: object, *, maximum: int | None = None) -> int:
    """*value* if it is an int from 1 (to *maximum*), else :class:`InvalidItem` naming *name*."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1 or (maximum is not None and value > maximum):
        bound = f"from 1 to {maximum}" if maximum is not None else "of at least 1"
        raise InvalidItem(name, f"must be an int {bound} (got {value!r})")
    return value


@attrs.frozen
class FanOutJob:
    """One fan-out, planned: the activity, its owner cluster, the batch size and the job id.

    Plain values only, so it travels as JSON (:meth:`to_json`) to workers on other machines.
    """

    job_id: str
    cluster: str
    activity: Activity
    batch_size: int
    #: How the owner cluster's period stores copies (its metadata's ``layout``).
    layout: str = DEFAULT

    @property
    def log_extra(self) -> dict[str, str]:
        """``job_id`` and ``cluster``: the ``extra=`` of every log record about this job."""
        return {"job_id": self.job_id, "cluster": self.cluster}

    @property
    def seconds(self) -> int:
        """The event second every copy's ``_id`` carries."""
        return int(self.activity.event_time.timestamp())

    def encoded_data(self) -> RawBSONDocument:
        """The activity's ``data`` encoded once, for every copy of every batch to share."""
        return RawBSONDocument(bson.encode(self.activity.data))

    def to_json(self) -> dict[str, Any]:
        """A JSON-safe description (``data`` must be JSON-safe too, as it is for Celery's JSON serializer)."""
        a = self.activity
        return {
            "job_id": self.job_id, "cluster": self.cluster, "batch_size": self.batch_size, "layout": self.layout,
            "activity": {"sender_id": a.sender_id, "event_time_ms": to_millis(a.event_time), "type": a.type,
                         "data": dict(a.data), "data_key": a.data_key},
        }

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> FanOutJob:
        """The job :meth:`to_json` described; :class:`InvalidItem` if it is malformed."""
        try:
            a = value["activity"]
            activity = Activity(
                sender_id=a["sender_id"], event_time=from_millis(int(a["event_time_ms"])),
                type=a["type"], data=a["data"], data_key=a["data_key"],
            )
            job = cls(job_id=str(value["job_id"]), cluster=str(value["cluster"]), activity=activity,
                      batch_size=positive_int("batch_size", value["batch_size"], maximum=MAX_BATCH_SIZE),
                      layout=layout_named(str(value.get("layout", DEFAULT))).name)
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidItem("job", f"is not a fan-out job description ({type(exc).__name__}: {exc})") from None
        check_activity(job.activity)
        return job


@attrs.frozen
class BatchOutcome:
    """What writing one batch did. ``complete``: every valid receiver has its copy and none was invalid.

    ``stopped`` is set when the cluster itself failed: an engine should stop sending batches.
    ``fence`` is the post's edit fence as the batch last read it (:mod:`router.core.writes.fence`):
    when it says ``deleted``, the batch's copies are gone and the engine should stop.
    """

    number: int
    receivers: int
    written: int
    already_present: int
    skipped: int
    failed_receivers: tuple[int | str, ...]
    invalid: int
    errors: tuple[RouterError, ...]
    stopped: Failure | None = None
    fence: Fence | None = None

    @property
    def failed(self) -> int:
        """Receivers of this batch left without a confirmed copy (invalid ones included)."""
        return len(self.failed_receivers) + self.invalid

    @property
    def complete(self) -> bool:
        return self.failed == 0
