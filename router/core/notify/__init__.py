"""Notification feeds: seen markers, unseen counts and grouped notifications.

Owns seen markers and unseen counts (:mod:`.seen`), group keys and windows (:mod:`.groups`), the aggregates that
rank and count groups per layout (:mod:`.grouping`), pages of groups (:mod:`.group_reads`) and read marks with the
unseen-groups badge (:mod:`.group_marks`).

May import the kernel, ``layouts``, ``reads`` and ``settings``.
"""

from __future__ import annotations

from . import seen
from .group_marks import ALL, Mark, mark_read_program, unseen_groups_program
from .group_reads import GroupPlan, groups_program
from .groups import (
    DEFAULT_GROUP_BY, Group, GroupBy, GroupCursor, GroupPage, MAX_GROUP_PAGE, MAX_MARKS, MAX_NEWEST, UnseenGroups,
    check_group, decode_group_cursor, decode_key,
)
from .seen import MAX_CAP, Unseen, UnseenPlan, mark_program, marker_of, marker_program, unseen_program

__all__ = ["ALL", "check_group", "decode_group_cursor", "decode_key", "DEFAULT_GROUP_BY", "Group", "GroupBy",
           "GroupCursor", "GroupPage", "GroupPlan", "groups_program", "Mark", "mark_program", "mark_read_program",
           "marker_of", "marker_program", "MAX_CAP", "MAX_GROUP_PAGE", "MAX_MARKS", "MAX_NEWEST", "seen", "Unseen",
           "unseen_groups_program", "unseen_program", "UnseenGroups", "UnseenPlan"]
