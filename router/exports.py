"""The files of ``export_user``: one JSON Lines file per stream, and a manifest with each file's SHA-256.

:class:`ExportFolder` is the :class:`~router.core.privacy.export.Sink` the doors give the export
program. Each record becomes one line of JSON as it arrives (held in memory only as long
as the file's write buffer), and is hashed on the way; a file is written under a
``.partial`` name and renamed when the export has finished, then ``manifest.json`` is
written last, so a folder with a manifest holds a complete export::

    out/sent.jsonl       {"sender_id": 7, "event_time": "2024-05-04T12:30:15.250000+00:00", "type": 1, "data": {...}, "data_key": ..., "period": "cluster_2"}
    out/received.jsonl   {"receiver_id": 7, "sender_id": 42, "event_time": ..., "type": 1, "data": {...}, "data_key": ..., "id": "66361...", "period": ...}
    out/seen.jsonl       {"event_time": ..., "item": "66361...", "period": ...}
    out/read.jsonl       {"group": "*", "read_time": ..., "item": "66361...", "period": ...}
    out/manifest.json    {"format": "feed-router export 1", "user_id": 7, "created_at": ..., "periods": [...],
                          "files": {"sent.jsonl": {"records": 3, "bytes": 512, "sha256": "..."}, ...}}

A record is the value the export read, field by field (an :class:`~router.model.Activity`
sent, a :class:`~router.model.FeedItem` received, a :class:`~router.core.notify.seen.Marker`, a
:class:`~router.core.notify.seen.ReadMark`), then its ``period``: the export names no stored field
of its own.

Every line is JSON (RFC 8259). Values JSON has no type for are written as strings: times in
ISO 8601 (UTC), ObjectIds in hex, bytes in base64; other BSON values in MongoDB's relaxed
Extended JSON, which writes a double that is NaN or infinite as ``{"$numberDouble": "NaN"}``
(``"Infinity"``, ``"-Infinity"``), where Python's ``json`` would write a bare ``NaN`` that no
JSON parser takes.

Example::

    folder = ExportFolder("/srv/exports/7", user_id=7)      # InvalidItem unless an existing, empty folder
    folder.write("received", item, "cluster_2"); ...
    result = folder.finish(summary)
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import os
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, Any

import attrs
from bson import ObjectId, json_util

from .core.privacy import STREAMS, ExportProgress, ExportSummary
from .errors import InvalidItem

__all__ = ["FORMAT", "MANIFEST", "ExportFolder", "ExportResult", "ExportedFile"]

#: What ``manifest.json`` says the files are.
FORMAT = "feed-router export 1"
#: The manifest's file name.
MANIFEST = "manifest.json"
_PARTIAL = ".partial"


@attrs.frozen
class ExportedFile:
    """One file of an export: its name, records, bytes and SHA-256 (hex)."""

    name: str
    records: int
    bytes: int
    sha256: str


@attrs.frozen
class ExportResult:
    """What ``export_user`` wrote: the folder, each file (by stream), the periods read (name, start, end), and the
    manifest's path."""

    folder: Path
    files: Mapping[str, ExportedFile]
    periods: tuple[tuple[str, str, str | None], ...]

    @property
    def manifest(self) -> Path:
        return self.folder / MANIFEST

    @property
    def counts(self) -> dict[str, int]:
        """Records per stream."""
        return {stream: f.records for stream, f in self.files.items()}


def _finite(value: Any) -> Any:
    """*value* with every float JSON cannot hold (NaN, an infinity) as relaxed Extended JSON, at any depth; the
    rest as it is (``json.dumps`` never asks ``default`` about a float)."""
    kind = type(value)
    if kind is float:
        if math.isfinite(value):
            return value
        return {"$numberDouble": "NaN" if math.isnan(value) else "Infinity" if value > 0 else "-Infinity"}
    if kind is dict or isinstance(value, Mapping):
        return {k: _finite(v) for k, v in value.items()}
    if kind is list or kind is tuple:
        return [_finite(v) for v in value]
    if isinstance(value, float):  # a float subclass
        return _finite(float(value))
    return value


def _plain(value: Any) -> Any:
    """A value JSON has no type for, as JSON."""
    if isinstance(value, datetime):
        return (value if value.tzinfo else value.replace(tzinfo=timezone.utc)).isoformat()
    if isinstance(value, ObjectId):
        return str(value)
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    return json.loads(json_util.dumps(value, json_options=json_util.RELAXED_JSON_OPTIONS))


class ExportFolder:
    """Writes an export's streams into *out*, an existing, empty folder (its files are created, never overwritten)."""

    def __init__(self, out: object, *, user_id: int | str,
                 progress: Callable[[ExportProgress], None] | None = None) -> None:
        if not isinstance(out, (str, os.PathLike)) or not str(out):
            raise InvalidItem("out", f"must be the path of a folder (got {type(out).__name__})")
        folder = Path(out)
        if not folder.is_dir():
            what = "a file" if folder.exists() else "missing"
            raise InvalidItem("out", f"must be an existing folder (got {str(folder)!r:.200}: {what})")
        held = sorted(entry.name for entry in folder.iterdir())
        if held:
            shown = ", ".join(held[:5]) + (f" and {len(held) - 5} more" if len(held) > 5 else "")
            export = " (it already holds an export)" if MANIFEST in held else ""
            raise InvalidItem("out", f"must be an empty folder (got {str(folder)!r:.200}, which holds {shown}){export}")
        self.folder = folder
        self.user_id = user_id
        self.progress = progress
        self._files: dict[str, IO[bytes]] = {}
        self._hashes = {stream: hashlib.sha256() for stream in STREAMS}
        self._sizes = dict.fromkeys(STREAMS, 0)
        self._records = dict.fromkeys(STREAMS, 0)

    def _partial(self, stream: str) -> Path:
        return self.folder / f"{stream}.jsonl{_PARTIAL}"

    def write(self, stream: str, value: Any, period: str) -> None:
        """Append *value* (an attrs value of the router's API, or a mapping) to *stream*'s file as one line of JSON: its
        fields, then ``period``."""
        record = {**(attrs.asdict(value, recurse=False) if attrs.has(type(value)) else dict(value)), "period": period}
        handle = self._files.get(stream)
        if handle is None:
            handle = self._files[stream] = open(self._partial(stream), "xb")  # noqa: SIM115 - closed by finish/abort
        text = json.dumps(_finite(record), default=_plain, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        line = (text + "\n").encode("utf-8")
        handle.write(line)
        self._hashes[stream].update(line)
        self._sizes[stream] += len(line)
        self._records[stream] += 1
        if self.progress is not None:
            self.progress(ExportProgress(stream, period, self._records[stream]))

    def finish(self, summary: ExportSummary) -> ExportResult:
        """Close the files, give them their names, and write the manifest (last); the result."""
        for stream in STREAMS:
            if stream not in self._files:
                self._files[stream] = open(self._partial(stream), "xb")  # an empty stream is an empty file  # noqa: SIM115
        for stream, handle in self._files.items():
            handle.close()
            os.replace(self._partial(stream), self.folder / f"{stream}.jsonl")
        files = {stream: ExportedFile(f"{stream}.jsonl", self._records[stream], self._sizes[stream],
                                      self._hashes[stream].hexdigest()) for stream in STREAMS}
        manifest = {
            "format": FORMAT, "user_id": self.user_id, "created_at": datetime.now(timezone.utc).isoformat(),
            "periods": [{"name": n, "start": s, "end": e} for n, s, e in summary.periods],
            "files": {f.name: {"records": f.records, "bytes": f.bytes, "sha256": f.sha256} for f in files.values()},
        }
        partial = self.folder / f"{MANIFEST}{_PARTIAL}"
        partial.write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        os.replace(partial, self.folder / MANIFEST)
        return ExportResult(self.folder, files, summary.periods)

    def abort(self) -> None:
        """Close and remove the partial files (the export failed part-way)."""
        for stream, handle in self._files.items():
            handle.close()
            self._partial(stream).unlink(missing_ok=True)
        self._files.clear()
