"""A user leaves: erasure and export.

Owns ``erase_user`` (:mod:`.erasure`: records first, then every copy, outbox entry, registry entry, job and edit
record of the user, in every cluster) and ``export_user`` (:mod:`.export`).

May import the kernel, ``layouts``, ``writes`` (the fence's records), ``fanout`` (job records) and ``notify``
(seen markers and read marks).
"""

from __future__ import annotations

from .erasure import (
    COUNTED, ErasurePlan, ErasureProgress, ErasureRecord, ErasureResult, ErasureStatus, erase_program,
    status_program, unsettled,
)
from .export import ExportPlan, ExportProgress, ExportSummary, STREAMS, Sink, export_program

__all__ = ["COUNTED", "erase_program", "ErasurePlan", "ErasureProgress", "ErasureRecord", "ErasureResult",
           "ErasureStatus", "export_program", "ExportPlan", "ExportProgress", "ExportSummary", "Sink",
           "status_program", "STREAMS", "unsettled"]
