"""Registered databases kept between tests, emptied, instead of made and dropped for every test.

On FerretDB 2 a database costs more than most tests that use it: registering the three standard periods (seven
migrations, eleven collections, their indexes, on three servers) took 0.8-1.1 CPU-seconds, and dropping it 0.6
(DocumentDB makes a PostgreSQL table per collection and an index per index); emptying its collections took 0.06.
So a test that registers its database before reading anything (through ``make_router``, ``sync_router``, or a
fixture that requests ``registered_database``) gets one a passed test left behind, emptied, if there is one:
registering it again then writes only its metadata, and every collection and index is already there. On FerretDB 2
a database is emptied by truncating its tables, which gives every index new files too: emptied with ``delete_many``
hundreds of times, an index of DocumentDB's (RUM) once made an insert spin for good (docs/servers.md).

A database goes back to the pool only when it is exactly what registering makes: the same collections with the
same options, the same indexes, the same migrations recorded, on every server, as a database this session
registered fresh in that layout (:meth:`DatabasePool.template`). On FerretDB 2 the collections and indexes are read
from DocumentDB's catalog in the request that empties the database (asking each collection for its indexes took
more than half of a test's teardown). Anything else (a test that created an index,
dropped a collection, registered two layouts, ran a migration of its own, or failed) is dropped, as before. What a
reused database differs in is only what no test may depend on: its migrations' ``applied_at`` and PostgreSQL's
statistics.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any

from pymongo import MongoClient

from router.admin.migrate import MIGRATIONS_COLLECTION

Clients = dict[str, MongoClient[dict[str, Any]]]
#: The migrations a database records on one server: (id, checksum) each, sorted.
Recorded = tuple[tuple[str, str], ...]
#: What registering made on every server: per server, its collections (name, type, options, indexes) and the
#: migrations recorded.
Shape = tuple[tuple[str, tuple[Any, ...], Recorded], ...]
#: The same, where the servers' catalogs say it (``LocalClusters.empty``): each server's catalog, and per server the
#: migrations recorded.
Catalogued = tuple[tuple[str, ...], tuple[tuple[str, Recorded], ...]]


def new_name() -> str:
    """A database name no test used."""
    return f"t_{uuid.uuid4().hex[:12]}"


def _index(spec: dict[str, Any]) -> tuple[str, tuple[Any, ...], str]:
    """An index as (name, key fields in order, its other options)."""
    rest = {k: v for k, v in spec.items() if k not in ("name", "key", "v", "ns")}
    return str(spec["name"]), tuple(spec["key"].items()), json.dumps(rest, sort_keys=True, default=str)


def shape(clients: Clients, name: str) -> Shape:
    """Database *name*'s collections, their options and indexes, and its migrations, on every server."""
    out = []
    for server, client in sorted(clients.items()):
        db = client[name]
        collections = []
        for info in sorted(db.list_collections(), key=lambda c: str(c["name"])):
            indexes = tuple(sorted(_index(dict(spec)) for spec in db[info["name"]].list_indexes()))
            options = json.dumps(info.get("options", {}), sort_keys=True, default=str)
            collections.append((str(info["name"]), str(info.get("type", "collection")), options, indexes))
        out.append((server, tuple(collections), recorded(client, name)))
    return tuple(out)


def recorded(client: MongoClient[dict[str, Any]], name: str) -> Recorded:
    """The migrations database *name* records on *client*'s server."""
    return tuple(sorted((str(d["_id"]), str(d.get("checksum")))
                        for d in client[name][MIGRATIONS_COLLECTION].find({}, {"checksum": 1})))


class DatabasePool:
    """Emptied registered databases, by layout, on the session's servers.

    *empty* (``LocalClusters.empty``: ``empty(name, keep=[...])``) empties a database's collections but those kept, as
    a new database is, and returns each server's catalog of it, or None when it cannot (on FerretDB 2: the tables
    and their indexes truncated, the catalog DocumentDB's); without it, or when it returned None, each collection is
    emptied with ``delete_many`` and the servers are asked for the database's :func:`shape`.

    Example::

        name = pool.take("copies", register=lambda name: register(config_for(name), layout="copies"))
        ...  # the test registers it again (cheap: everything is there), uses it
        if not pool.give_back(name):
            drop(name)
    """

    def __init__(self, clients: Clients, *, empty: Callable[..., tuple[str, ...] | None] | None = None) -> None:
        self._clients = clients
        self._empty = empty
        self._free: dict[str, list[str]] = {}
        self._templates: dict[str, Shape | Catalogued] = {}

    def template(self, layout: str) -> Shape | Catalogued | None:
        """What a database freshly registered in *layout* holds on the servers (None until one was made)."""
        return self._templates.get(layout)

    def take(self, layout: str, *, register: Callable[[str], None]) -> str:
        """A database for a test that registers it in *layout* first thing: an emptied one if the pool has one;
        else, the first time, one freshly registered by *register* (its shape is the layout's template: on FerretDB 2
        read as it is emptied, which a test that registers first thing does not see); else a new name."""
        free = self._free.get(layout)
        if free:
            return free.pop()
        name = new_name()
        if layout not in self._templates:
            register(name)
            self._templates[layout] = self._empty_and_shape(name)
        return name

    def give_back(self, name: str) -> bool:
        """Empty database *name* and keep it, if it holds exactly what registering one layout makes; False (the
        caller drops it) otherwise."""
        found = self._empty_and_shape(name)
        layout = next((layout for layout, template in self._templates.items() if template == found), None)
        if layout is None:
            return False
        self._free.setdefault(layout, []).append(name)
        return True

    def _empty_and_shape(self, name: str) -> Shape | Catalogued:
        catalogs = self._empty(name, keep=[MIGRATIONS_COLLECTION]) if self._empty is not None else None
        if catalogs is not None:
            return catalogs, tuple((server, recorded(client, name)) for server, client in sorted(self._clients.items()))
        found = shape(self._clients, name)
        for server, collections, _migrations in found:
            db = self._clients[server][name]
            for collection, *_ in collections:
                if collection != MIGRATIONS_COLLECTION:
                    db[collection].delete_many({})
        return found
