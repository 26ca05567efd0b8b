"""Writes and edits: an item stored once per receiver, and changed or removed everywhere.

Owns the input rules (:mod:`.checks`), ``write``/``write_many`` (:mod:`.insert`: route, id, ``data_key``,
document, the posts registry), ``update``/``delete``/``unfollow`` of every copy (:mod:`.edits`) and the edit fence
(:mod:`.fence`): the records every writer of copies reads after writing, so an edit wins over a running fan-out.

May import the kernel, ``layouts`` and ``periods``.
"""

from __future__ import annotations

from . import fence
from .checks import check_activity, check_data, check_ids, check_senders, receiver_problem
from .edits import delete_program, unfollow_program, update_program
from .fence import ERASURES_COLLECTION, Fence, FenceMemo, NEVER, Parties, read_fences, refuse_deleted, settle
from .insert import InsertResult, Prepared, WriteSettings, insert_program, prepare_or_stale, write_program

__all__ = ["check_activity", "check_data", "check_ids", "check_senders", "delete_program", "ERASURES_COLLECTION",
           "Fence", "fence", "FenceMemo", "insert_program", "InsertResult", "NEVER", "Parties", "prepare_or_stale",
           "Prepared", "read_fences", "receiver_problem", "refuse_deleted", "settle", "unfollow_program",
           "update_program", "write_program", "WriteSettings"]
