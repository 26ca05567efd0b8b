"""Read marks of notification groups, and the unseen-groups badge, as programs.

**Read marks** (:func:`mark_read_program`) are inserted, never updated: ``{receiver_id,
group, read_time, read_key}`` in ``seen`` (:func:`~router.core.notify.seen.read_mark_documents`: no
``event_time``, so the seen markers' queries never meet them), in the cluster owning the
marked position; ``group`` is the group's key, or ``"*"`` for every group. A group is read
when a mark of its key or ``"*"`` is at or above its newest item. A mark then deletes the
same receiver's marks below it for that key (``"*"``: for every key) in its cluster. Two
devices marking at once each insert their own; a cleanup removes only marks below its own,
so the highest survives, on servers that lose concurrent updates of one document too
(FerretDB v1).

**The badge** (:func:`unseen_groups_program`) counts the groups with an item newer than the seen
marker (:mod:`router.core.notify.seen`), asking the clusters from the newest down to the marker's.
"""

from __future__ import annotations

import logging
from collections.abc import Hashable, Sequence

import attrs

from ...cursor import Position
from ...errors import RequestRefused
from .group_reads import GroupPlan, answer_of, one
from .groups import UnseenGroups, ident, position_key
from ..layouts import grouping, layout_for, outbox
from .seen import ALL_GROUPS as ALL
from .seen import marker_program, read_mark_documents, read_marks_below
from ..steps import Concurrently, Failure, Insert, Program

__all__ = ["ALL", "Mark", "mark_read_program", "unseen_groups_program"]

log = logging.getLogger(__name__)


@attrs.frozen
class Mark:
    """One read mark to record: a group's key (or ``"*"``) read through *through*."""

    group: str
    through: Position


def mark_read_program(receiver_id: int | str, marks: Sequence[tuple[Mark, str]], *, deadline: float) -> Program[int]:
    """Insert *marks* (each in the cluster paired with it: the owner of its own position), then delete the marks they
    make redundant."""
    by_cluster: dict[str, list[Mark]] = {}
    for m, cluster in marks:
        by_cluster.setdefault(cluster, []).append(m)
    names = list(by_cluster)
    pairs = {n: [(m.group, m.through) for m in ms] for n, ms in by_cluster.items()}
    outcomes = yield Concurrently([one(Insert(n, "seen", read_mark_documents(receiver_id, pairs[n]), deadline))
                                   for n in names], names)
    for name, outcome in zip(names, outcomes):
        answer_of(outcome)
        if outcome.write_errors:  # a fresh ObjectId cannot collide; any refusal is the server's
            error = outcome.write_errors[0]
            raise RequestRefused(name, f"a read mark was refused (code {error.code}): {error.message}", code=error.code)
    cleanups = yield Concurrently([one(read_marks_below(n, receiver_id, pairs[n], deadline)) for n in names], names)
    for name, cleaned in zip(names, cleanups):
        if isinstance(cleaned, Failure):  # the marks are stored; lower ones left are harmless, and go next time
            log.warning("read marks below the new ones stay for now: %s", cleaned.error, extra={"cluster": name})
    return len(marks)


def unseen_groups_program(plan: GroupPlan, cap: int) -> Program[UnseenGroups]:
    """How many groups hold an item newer than the seen marker, up to *cap*: per cluster from the newest down to the
    marker's, one ``aggregate`` of the groups of the copies newer than it (with pulled senders, one of their outbox
    entries too, and a ``find`` of those in the marker's millisecond), stopping once past *cap*."""
    names = plan.names()
    marker, at = yield from marker_program(plan.receiver_id, names, deadline=plan.deadline)
    found: set[Hashable] = set()
    queried: list[str] = []
    for i, name in enumerate(names[: at + 1]):
        bound = marker if i == at else None
        fields, span = plan.by.fields, plan.by.span_ms
        programs = [one(grouping.unseen(layout_for(plan.timemap, name), name, plan.receiver_id,
                                         plan.timemap.start_of(name), bound, plan.types, fields, span, cap + 1,
                                         plan.deadline))]
        if plan.pull:
            after = bound.event_time if bound is not None else None
            programs.append(one(grouping.unseen_outbox(name, plan.pull, after, plan.types, fields, span, cap + 1,
                                                        plan.deadline)))
            if bound is not None:
                programs.append(outbox.find(name, plan.pull, plan.deadline, types=plan.types, at=bound.event_time))
        answers = yield Concurrently(programs, [name] * len(programs))
        queried.append(name)
        for answer in answers[:2]:
            found.update(ident(row) for row in grouping.unseen_rows(answer_of(answer), plan.by.fields))
        if len(answers) == 3 and bound is not None:
            for post in answer_of(answers[2]):
                entry = outbox.pulled_item(post, plan.receiver_id)
                if entry is not None and (entry[0], entry[1].binary) > position_key(bound):
                    found.add(ident((*plan.by.values_of(entry[2]), plan.by.window_of(entry[0]))))
        if len(found) > cap:
            break
    return UnseenGroups(min(len(found), cap), len(found) > cap, marker, tuple(queried))
