"""The public operations as programs: argument checks and the program to run, one function each.

``FeedRouter`` and ``AsyncFeedRouter`` call these and only run what they return, so an
argument rule or an operation cannot exist in one door and differ in the other.

Example (what a door method amounts to)::

    def read(self, receiver_id, **kwargs):
        return self._run(calls.read(self._view(), receiver_id, **kwargs))
"""

from __future__ import annotations

from collections.abc import Callable, Container, Iterable, Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

import attrs
from bson import ObjectId

from ..config import RouterConfig
from ..cursor import CursorState, Position, check_state, decode_state
from ..errors import InvalidItem
from ..model import TEXT_RULE, Activity, FeedItem, Page, identity, is_text
from .fanout import DEFAULT_CONCURRENCY, FanOutJob, JobStatus, fenced_status, find_job, plan_job, positive_int
from .writes import (
    NEVER, check_data, check_ids, check_senders, delete_program, read_fences, unfollow_program, update_program,
    write_program,
)
from .privacy import (
    ErasurePlan, ErasureResult, ErasureStatus, ExportPlan, ExportSummary, Sink, erase_program, export_program,
    status_program,
)
from .notify import (
    ALL, DEFAULT_GROUP_BY, Group, GroupBy, GroupCursor, GroupPage, GroupPlan, MAX_CAP, MAX_GROUP_PAGE, MAX_MARKS,
    MAX_NEWEST, Mark, Unseen, UnseenGroups, UnseenPlan, check_group, decode_group_cursor, decode_key,
    groups_program, mark_program, mark_read_program, marker_of, marker_program, unseen_groups_program,
    unseen_program,
)
from .policy import deadline_in
from .reads import ReadPlan, read_program
from .periods import Routing, routed
from .settings import MAX_PAGE, MAX_TYPES, Settings, pseudonyms_of
from .social import MAX_BACKFILL, BackfillResult, Publishing, backfill_program, publish_program
from .steps import Concurrently, Failure, Program

__all__ = [
    "Active", "View", "active_filter", "backfill", "concurrency", "delete", "erase_user", "erasure_status",
    "export_user", "fan_out_status", "follow", "mark_read", "mark_seen", "plan_fan_out", "read", "read_groups",
    "seen_position", "unfollow", "unseen_count", "unseen_groups", "update", "user", "write_many",
]

#: Which receivers get a copy: a predicate, or a container (usually a set) of active ids.
Active = Callable[[Any], bool] | Container[Any]


@attrs.frozen
class View:
    """What a call sees of its router: the config, the routing in use, the configured clusters and "now"."""

    config: RouterConfig
    settings: Settings
    routing: Routing
    names: tuple[str, ...]
    now: datetime


def write_many(view: View, items: Iterable[FeedItem], *, indexed: bool = True) -> Program[list[ObjectId]]:
    """``write_many``: check and route every item first, then write; see :func:`router.core.writes.insert.write_program`."""
    if not isinstance(items, (list, tuple)):
        try:
            items = list(items)
        except TypeError:
            raise InvalidItem("items", f"must be an iterable of FeedItem (got {type(items).__name__})") from None
    return write_program(items, view.routing, view.settings.write, indexed=indexed)


def _receiver(value: object, field: str = "receiver_id") -> int | str:
    return identity(value, field)


def _data_key(value: object) -> str:
    if not is_text(value):
        raise InvalidItem("data_key", f"{TEXT_RULE} (got {value!r:.80})")
    return value


def read(
    view: View, receiver_id: object, *, limit: object = 50, cursor: object = None, on_unavailable: object = None,
    pull: Sequence[object] | None = None, types: Sequence[object] | None = None,
) -> Program[Page]:
    """``read``: one page, newest first; see :mod:`router.core.reads.pages`."""
    receiver = _receiver(receiver_id)
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_PAGE:
        raise InvalidItem("limit", f"must be an int from 1 to {MAX_PAGE} (got {limit!r})")
    policy = view.config.on_unavailable if on_unavailable is None else on_unavailable
    if policy not in ("raise", "partial"):
        raise InvalidItem("on_unavailable", f"must be 'raise' or 'partial' (got {policy!r})")
    timemap = view.routing.timemap
    if cursor is None:
        state = CursorState()
    else:
        state = check_state(decode_state(cursor), {m.name: m.start_date for m in timemap.periods})  # type: ignore[arg-type]
    plan = ReadPlan(
        receiver_id=receiver, limit=limit, state=state, timemap=timemap, now=view.now, window=view.config.read_window,
        on_unavailable=policy, deadline=deadline_in(view.settings.timeout),
        pull=check_senders(pull, field="pull", limit=view.settings.max_pull, per="read"),
        types=check_ids(types, field="types", noun="types", limit=MAX_TYPES, too_many="distinct types", empty=False),
        deployments=view.settings.deployments, max_periods=view.settings.max_periods,
    )
    return read_program(plan)


def mark_seen(view: View, receiver_id: object, position: object) -> Program[Position]:
    """``mark_seen``: record *position* (a :class:`Position`, or a :class:`FeedItem` from a page) as seen."""
    receiver = _receiver(receiver_id)
    marked = marker_of(receiver, position)
    when = marked.event_time
    deadline = deadline_in(view.settings.timeout)

    def program() -> Program[Position]:
        cluster = yield from routed(
            lambda r: r.locate(when.timestamp())[0], view.routing, where=lambda _past: (when, "position.event_time")
        )
        return (yield from mark_program(receiver, marked, cluster, deadline=deadline))

    return program()


def _window(view: View) -> tuple[str, ...]:
    return tuple(view.routing.timemap.clusters_for_read(now=view.now, window=view.config.read_window))


def seen_position(view: View, receiver_id: object) -> Program[Position | None]:
    """``seen_position``: the receiver's seen marker, or ``None``."""
    receiver = _receiver(receiver_id)

    def program() -> Program[Position | None]:
        marker, _at = yield from marker_program(receiver, _window(view), deadline=deadline_in(view.settings.timeout))
        return marker

    return program()


def unseen_count(view: View, receiver_id: object, *, cap: object = 99, pull: Sequence[object] | None = None) -> Program[Unseen]:
    """``unseen_count``: items newer than the seen marker, up to *cap*; see :mod:`router.core.notify.seen`."""
    receiver = _receiver(receiver_id)
    limit = positive_int("cap", cap, maximum=MAX_CAP)
    plan = UnseenPlan(receiver_id=receiver, names=_window(view), cap=limit, deadline=deadline_in(view.settings.timeout),
                      timemap=view.routing.timemap,
                      pull=check_senders(pull, field="pull", limit=view.settings.max_pull, per="read"))
    return unseen_program(plan)


def delete(view: View, data_key: object) -> Program[int]:
    """``delete``: every copy and the outbox entry, every configured cluster."""
    return delete_program(_data_key(data_key), view.names, view.settings.edit, view.routing.timemap)


def update(view: View, data_key: object, data: object) -> Program[int]:
    """``update``: new ``data`` in every copy and the outbox entry, every configured cluster."""
    key = _data_key(data_key)
    if not isinstance(data, Mapping):
        raise InvalidItem("data", f"must be a mapping (got {type(data).__name__})")
    check_data(data, None)
    return update_program(key, dict(data), view.names, view.settings.edit, view.routing.timemap,
                          pseudonyms=view.settings.pseudonyms)


def unfollow(view: View, receiver_id: object, sender_id: object) -> Program[int]:
    """``unfollow``: the sender's copies out of the receiver's feed, every cluster of the read window."""
    receiver, sender = _receiver(receiver_id), _receiver(sender_id, "sender_id")
    names = view.routing.timemap.clusters_for_read(now=view.now, window=view.config.read_window)
    return unfollow_program(receiver, sender, names, view.settings.edit, view.routing.timemap)


def backfill(
    view: View, receiver_id: object, senders: Sequence[object], *, since: datetime | None = None, limit: object = 200,
) -> Program[BackfillResult]:
    """``backfill``: the senders' newest outbox entries copied into the receiver's feed.

    At most ``read.max_pull`` distinct senders (the same bound as a pulled read's).
    """
    receiver = _receiver(receiver_id)
    chosen = check_senders(senders, field="senders", limit=view.settings.max_pull, per="backfill")
    if not chosen:
        raise InvalidItem("senders", f"must be a non-empty list of sender ids (got {senders!r:.80})")
    count = positive_int("limit", limit, maximum=MAX_BACKFILL)
    return backfill_program(
        receiver, chosen, timemap=view.routing.timemap, now=view.now, window=view.config.read_window, since=since,
        limit=count, policy=view.settings.write.policy, timeout=view.settings.timeout,
        pseudonyms=view.settings.pseudonyms,
    )


def follow(view: View, receiver_id: object, sender_id: object, *, limit: object = 50) -> Program[BackfillResult]:
    """``follow``: a :func:`backfill` of one newly followed sender, whose errors name ``sender_id``."""
    receiver, sender = _receiver(receiver_id), _receiver(sender_id, "sender_id")
    return backfill(view, receiver, [sender], limit=limit)


def active_filter(active: object) -> Callable[[Any], bool] | None:
    """The ``active`` argument of a fan-out as a predicate (None: everyone gets a copy)."""
    if active is None:
        return None
    if callable(active):
        return active
    if isinstance(active, Container):
        return active.__contains__
    raise InvalidItem("active", f"must be a predicate or a set of receiver ids (got {type(active).__name__})")


def plan_fan_out(view: View, activity: Activity, *, batch_size: object = None, job_id: str | None = None) -> Program[FanOutJob]:
    """``plan_fan_out``: check and route a fan-out job (refreshing once past the horizon); nothing is written.
    (A deleted post is refused when a run starts: :func:`~router.core.fanout.checkpoint.start_job`.)"""
    size = view.config.batch_size if batch_size is None else batch_size
    return plan_job(activity, view.routing, batch_size=size, job_id=job_id)  # type: ignore[arg-type]


def publish(
    view: View, activity: Activity, followers: Iterable[Any], *, pull: bool | None, batch_size: object = None,
    job_id: str | None = None,
) -> Program[Publishing]:
    """``publish`` up to the push (see :func:`~router.core.social.publish.publish_program`); the door pushes."""
    size = view.config.batch_size if batch_size is None else batch_size
    return publish_program(activity, followers, view.routing, pull=pull, threshold=view.settings.pull_threshold,
                           batch_size=size, job_id=job_id, policy=view.settings.write.policy,  # type: ignore[arg-type]
                           timeout=view.settings.timeout, pseudonyms=view.settings.pseudonyms)


def concurrency(value: object) -> int:
    """The batches a fan-out may have in flight (default :data:`~router.core.fanout.plan.DEFAULT_CONCURRENCY`)."""
    return positive_int("concurrency", DEFAULT_CONCURRENCY if value is None else value)


def fan_out_status(view: View, job_id: object) -> Program[JobStatus]:
    """``fan_out_status``: a job's progress from its checkpoint, looked up in every configured cluster; a job whose
    post was deleted is ``cancelled`` with reason ``deleted`` (:func:`~router.core.fanout.checkpoint.fenced_status`)."""
    if not isinstance(job_id, str) or not job_id:
        raise InvalidItem("job_id", f"must be a non-empty str (got {job_id!r:.80})")
    deadline = deadline_in(view.settings.timeout)
    names = list(view.names)
    answers = yield Concurrently([find_job(n, job_id, deadline=deadline) for n in names], names)
    failures = [a.error for a in answers if isinstance(a, Failure)]
    for name, answer in zip(names, answers):
        if answer is not None and not isinstance(answer, Failure):
            status, key = answer
            fences = yield from read_fences(name, [key], deadline)
            if isinstance(fences, Failure):
                raise fences.error
            return fenced_status(status, fences.get(key, NEVER))
    if failures:
        raise failures[0]
    raise InvalidItem("job_id", f"no cluster has a fan-out job {job_id!r:.80}")


# -- a user's data -----------------------------------------------------------------------------


def user(user_id: object) -> int | str:
    """*user_id* checked: a user id is what a receiver or sender id is (:class:`InvalidItem` naming ``user_id``)."""
    return _receiver(user_id, "user_id")


def erase_user(view: View, user_id: object, *, requested_by: object, progress: object = None) -> Program[ErasureResult]:
    """``erase_user``: everything of the user, in every configured cluster; see :mod:`router.core.privacy.erasure`."""
    who = user(user_id)
    if not is_text(requested_by):
        raise InvalidItem("requested_by", f"{TEXT_RULE}: who asked for the erasure, e.g. a ticket "
                                          f"(got {requested_by!r:.80})")
    plan = ErasurePlan(user_id=who, names=view.names, timemap=view.routing.timemap, settings=view.settings.edit,
                       pseudonyms=view.settings.pseudonyms or pseudonyms_of(view.config), requested_by=requested_by,
                       request_id=str(ObjectId()), now=datetime.now(timezone.utc), progress=callback(progress))
    return erase_program(plan)


def callback(progress: object) -> Callable[[Any], None] | None:
    """A *progress* argument checked: None, or something to call (:class:`InvalidItem` naming ``progress``)."""
    if progress is not None and not callable(progress):
        raise InvalidItem("progress", f"must be a callable or None (got {type(progress).__name__})")
    return progress


def erasure_status(view: View, user_id: object) -> Program[ErasureStatus]:
    """``erasure_status``: the user's erasure records, in every configured cluster."""
    pseudonyms = view.settings.pseudonyms or pseudonyms_of(view.config)
    return status_program(pseudonyms.of(user(user_id)), view.names, deadline=deadline_in(view.settings.timeout))


def export_user(view: View, user_id: object, sink: Sink) -> Program[ExportSummary]:
    """``export_user``: what the router holds about the user, to *sink*; see :mod:`router.core.privacy.export`."""
    plan = ExportPlan(user_id=user(user_id), timemap=view.routing.timemap, timeout=view.settings.timeout)
    return export_program(plan, sink)


# -- aggregated notifications (groups) --------------------------------------------------------


def _group_by(key: object) -> GroupBy:
    if key is None:
        return DEFAULT_GROUP_BY
    if isinstance(key, str):
        return GroupBy.parse(key)
    if not isinstance(key, GroupBy):
        raise InvalidItem("key", f"must be a GroupBy or its text, as in 'type,data.target/1d' (got {key!r:.80})")
    return key


def _group_plan(view: View, receiver_id: object, key: object, pull: Sequence[object] | None,
                types: Sequence[object] | None, *, limit: int = 1, newest: int = 1,
                cursor: GroupCursor | None = None) -> GroupPlan:
    return GroupPlan(
        receiver_id=_receiver(receiver_id), by=_group_by(key), limit=limit, newest=newest, cursor=cursor,
        timemap=view.routing.timemap, now=view.now, window=view.config.read_window,
        deadline=deadline_in(view.settings.timeout),
        pull=check_senders(pull, field="pull", limit=view.settings.max_pull, per="read"),
        types=check_ids(types, field="types", noun="types", limit=MAX_TYPES, too_many="distinct types", empty=False),
        deployments=view.settings.deployments,
    )


def read_groups(
    view: View, receiver_id: object, *, key: object = None, limit: object = 20, newest: object = 3,
    cursor: object = None, pull: Sequence[object] | None = None, types: Sequence[object] | None = None,
) -> Program[GroupPage]:
    """``read_groups``: a page of groups newest first; see :mod:`router.core.notify.group_reads`."""
    plan = _group_plan(view, receiver_id, key, pull, types, limit=positive_int("limit", limit, maximum=MAX_GROUP_PAGE),
                       newest=positive_int("newest", newest, maximum=MAX_NEWEST))
    if cursor is not None:
        plan = attrs.evolve(plan, cursor=decode_group_cursor(cursor, plan.by.fingerprint(plan.types)))
    return groups_program(plan)


def unseen_groups(view: View, receiver_id: object, *, cap: object = 99, key: object = None,
                  pull: Sequence[object] | None = None, types: Sequence[object] | None = None) -> Program[UnseenGroups]:
    """``unseen_groups``: groups with an item newer than the seen marker, up to *cap*."""
    plan = _group_plan(view, receiver_id, key, pull, types)
    return unseen_groups_program(plan, positive_int("cap", cap, maximum=MAX_CAP))


def mark_read(view: View, receiver_id: object, groups: object) -> Program[int]:
    """``mark_read``: record *groups* (``Group`` values, their keys, or ``"all"``) as read."""
    receiver = _receiver(receiver_id)
    now = Position(view.now, ObjectId(b"\xff" * 12))
    marks: list[Mark] = []
    if isinstance(groups, str) and groups == "all":
        marks.append(Mark(ALL, now))
    elif isinstance(groups, (str, bytes)) or not isinstance(groups, Iterable):
        raise InvalidItem("groups", f"must be 'all' or an iterable of groups or group keys (got {groups!r:.80})")
    else:
        for i, g in enumerate(groups):
            if i >= MAX_MARKS:
                raise InvalidItem("groups", f"at most {MAX_MARKS} groups per call (mark more with 'all')")
            if isinstance(g, Group):
                marks.append(Mark(g.key, check_group(g, field=f"groups[{i}]")))
            else:
                decode_key(g, field=f"groups[{i}]")
                marks.append(Mark(str(g), now))
    if not marks:
        return _nothing()
    deadline = deadline_in(view.settings.timeout)

    def program() -> Program[int]:
        placed: list[tuple[Mark, str]] = []
        for m in marks:  # each mark in the cluster that owns its own position (one group may come in two forms)
            when = m.through.event_time
            cluster = yield from routed(lambda r: r.locate(when.timestamp())[0], view.routing,
                                        where=lambda _past: (when, "groups"))
            placed.append((m, cluster))
        return (yield from mark_read_program(receiver, placed, deadline=deadline))

    return program()


def _nothing() -> Program[int]:
    return 0
    yield  # a program that asks nothing
