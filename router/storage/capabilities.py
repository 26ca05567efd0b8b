"""What a server can do, read from what it reports about itself; MongoDB-only steps check these.

None of the local servers is MongoDB, and the router runs on each: steps that only a
mongos, a replica set or MongoDB's query planner can take are chosen by these flags, so
they are skipped (and said to be) rather than failing at random. Each flag comes from the
server's own answers (``hello``, ``buildInfo``, and ``serverStatus`` where ``buildInfo``
does not say), never from a URI or a configured name:

* ``server`` and ``version``: ``ferretdb`` when ``buildInfo`` has ``ferretdb.version``
  (FerretDB 2) or ``ferretdbVersion`` (FerretDB 1), with that version; ``mongo-java-server``
  when ``buildInfo`` has no ``gitVersion`` (every mongod and mongos build reports one) and
  ``serverStatus`` says ``process: "java"``; else ``mongodb`` with ``buildInfo.version``.
* ``sharded``: ``hello`` (or ``isMaster``) answers ``msg: "isdbgrid"``: a mongos.
* ``atomic_updates``: one document's filter and update are applied as one step, so
  concurrent ``update_one({..., "n": {"$lt": 50}}, {"$push": ...})`` calls neither lose an
  append nor overshoot the filter. True for MongoDB, for mongo-java-server (each collection
  applies writes one at a time) and for FerretDB 2 (DocumentDB updates a row in one
  PostgreSQL statement under its row lock; 900 of 900 concurrent guarded appends kept);
  false for FerretDB 1 (it reads the document, changes it in Go and writes it back: 185-221
  of 900 kept).
* ``transactions`` and ``change_streams``: MongoDB offers both on a replica set (``hello``
  names a ``setName``) or through a mongos; FerretDB (``commitTransaction`` is not a
  command, change streams are "not supported yet") and mongo-java-server offer neither.
* ``index_ordered_sorts``: a sort on an indexed key is served in index order, so a page
  reads only its own documents. MongoDB does; FerretDB 1 sorts in Go, FerretDB 2 sorts all
  of a filter's matches in PostgreSQL (a Sort node over the index scan), and
  mongo-java-server scans.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

__all__ = ["Capabilities"]


def _major(version: str) -> int:
    digits = version.lstrip("vV").split(".")[0]
    return int(digits) if digits.isdecimal() and digits.isascii() else 0


@attrs.frozen
class Capabilities:
    """What one server can do (see the module docstring for where each flag comes from).

    The flags after ``version`` follow from the server and its version unless given (a test
    can describe a server that is not running).

    Example::

        >>> Capabilities(sharded=False, server="ferretdb", version="v1.24.2").atomic_updates
        False
        >>> Capabilities(sharded=False, server="ferretdb", version="v2.7.0").atomic_updates
        True
    """

    sharded: bool
    server: str
    version: str
    atomic_updates: bool = attrs.field()
    replica_set: bool = attrs.field(default=False, kw_only=True)
    """``hello`` names a replica set (``setName``)."""
    transactions: bool = attrs.field(kw_only=True)
    change_streams: bool = attrs.field(kw_only=True)
    index_ordered_sorts: bool = attrs.field(kw_only=True)

    @atomic_updates.default
    def _atomic_updates_of_server(self) -> bool:
        return self.server != "ferretdb" or _major(self.version) >= 2

    @transactions.default
    def _transactions_of_server(self) -> bool:
        return self.server == "mongodb" and (self.replica_set or self.sharded)

    @change_streams.default
    def _change_streams_of_server(self) -> bool:
        return self.server == "mongodb" and (self.replica_set or self.sharded)

    @index_ordered_sorts.default
    def _index_sorts_of_server(self) -> bool:
        return self.server == "mongodb"

    @classmethod
    def from_replies(cls, hello: Mapping[str, Any], build_info: Mapping[str, Any], process: str | None) -> Capabilities:
        """The capabilities of a server that answered ``hello`` (or ``isMaster``), ``buildInfo`` and, where asked,
        ``serverStatus`` with *process* (None when not asked or refused).

        Example::

            >>> Capabilities.from_replies({"maxWireVersion": 21}, {"version": "7.0.77", "ferretdb": {"version": "v2.7.0"}},
            ...                           None).server
            'ferretdb'
        """
        ferret = build_info.get("ferretdb")
        if isinstance(ferret, Mapping) and "version" in ferret:
            server, version = "ferretdb", ferret["version"]
        elif "ferretdbVersion" in build_info:
            server, version = "ferretdb", build_info["ferretdbVersion"]
        elif "gitVersion" not in build_info and process == "java":
            server, version = "mongo-java-server", build_info.get("version")
        else:
            server, version = "mongodb", build_info.get("version")
        return cls(sharded=hello.get("msg") == "isdbgrid", server=server, version=str(version),
                   replica_set=bool(hello.get("setName")))

    def describe(self) -> str:
        """One line for ``feedrouter check``: ``ferretdb v2.7.0: atomic updates yes, transactions no, ...``."""
        flags = {"sharded (mongos)": self.sharded, "atomic updates": self.atomic_updates,
                 "transactions": self.transactions, "change streams": self.change_streams,
                 "index-ordered sorts": self.index_ordered_sorts}
        return f"{self.server} {self.version}: " + ", ".join(f"{k} {'yes' if v else 'no'}" for k, v in flags.items())

    def to_json(self) -> dict[str, Any]:
        """The flags as a JSON object, for ``feedrouter --json check``."""
        return attrs.asdict(self)
