"""Shared setup of the erasure tests: periods of one layout on the session's servers (the ``layout``, ``config`` and
``router`` fixtures, imported by the test files that use them), and the plain-pymongo scan that says whether any
document of any collection of any period still names a user."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from pymongo import MongoClient

from router import RouterConfig
from router.admin.migrate import discover
from router.admin.periods import apply_period, plan_period
from router.storage import finds
from router.storage.clusters import Clusters

from .conftest import NAMES, NOW, PERIODS, register

Clients = dict[str, MongoClient[dict[str, Any]]]
#: The user the tests erase (an int id) and another whose data must stay.
USER = 1000765
#: A user whose id needs 64 bits: stored as a BSON int64, it is read back as ``bson.Int64``, not ``int``.
BIG_USER = 2**40 + 765
#: The users the erasure tests run with: one id that fits in 32 bits, and one that does not.
USERS = pytest.mark.parametrize("user", [USER, BIG_USER], ids=["small-id", "64-bit-id"])
#: The heavy races' users and doors: both users through the sync door, the small id through the async door too. The
#: async door runs the same erasure program and its driver decodes ids with the same bson; the lighter erasure tests
#: (test_erasure, test_erasure_ids, test_erasure_faults) run the 64-bit id through both doors.
DOORS_AND_USERS = pytest.mark.parametrize(("door", "user"), [("sync", USER), ("async", USER), ("sync", BIG_USER)],
                                          ids=["sync-small-id", "async-small-id", "sync-64-bit-id"], indirect=["door"])
#: Calls get a minute: an erasure racing a fan-out on FerretDB under load contends for the same documents.
PATIENT = timedelta(seconds=60)


def layout_config(make_config: Callable[..., RouterConfig], layout: str, **kwargs: Any) -> RouterConfig:
    """The test's config, its three standard periods given *layout* by the operator path (migrations included)."""
    config = make_config(timeout=PATIENT, **kwargs)
    with Clusters(config) as clusters:
        for name, (start, end) in zip(NAMES, PERIODS):
            change = plan_period(clusters, name=name, start=start, end=end, creator="tests", now=start, layout=layout)
            apply_period(clusters, change, migrations=discover())
    return config


def same_user(stored: Any, user: Any) -> bool:
    """Whether a stored id is *user*: an int id and a str id are different users; an int read back as ``bson.Int64``
    (any id stored as a 64-bit int) is the int."""
    return (not isinstance(stored, bool) and isinstance(stored, (int, str)) and isinstance(stored, str) == isinstance(user, str)
            and stored == user)


@pytest.fixture(params=["copies", "buckets"])
def layout(request: pytest.FixtureRequest) -> str:
    """Every erasure test runs in both layouts."""
    return str(request.param)


@pytest.fixture
def config(registered_database: None, make_config: Callable[..., RouterConfig], layout: str) -> RouterConfig:
    """The test's three periods, of its layout, registered first thing (:func:`register`: the migrations, metadata
    and indexes the operator path makes, in a database that may be an emptied one from the pool: conftest's
    ``db_name``). A test that needs the operator path itself, or other servers, takes :func:`layout_config`."""
    config = make_config(timeout=PATIENT)
    register(config, layout=layout)
    return config


@pytest.fixture
def router(config: RouterConfig, open_router: Callable[..., Any]) -> Any:
    """A router on the test's periods (of the test's layout) through the test's door, at NOW."""
    return open_router(config, clock=lambda: NOW)


def names(value: Any, user: Any) -> bool:
    """Whether a stored *value* names *user* as a sender or receiver, at any depth (a bucket's items too)."""
    if isinstance(value, dict):
        return any((key in ("sender_id", "receiver_id") and same_user(sub, user)) or names(sub, user)
                   for key, sub in value.items())
    if isinstance(value, list):
        return any(names(sub, user) for sub in value)
    return False


def documents(clients: Clients, config: RouterConfig) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """Every document of every collection of every period, read with plain pymongo: (cluster, collection, doc).

    Each collection is read in whole first batches (:func:`router.storage.finds.read`): FerretDB 2 continues a
    cursor wrongly once documents were updated (``docs/ferretdb2-cursor-bug.md``), and a scan that skipped a
    document would miss one naming the user.
    """
    for spec in config.clusters:
        db = clients[spec.name][config.database_for(spec)]
        for collection in sorted(db.list_collection_names()):
            for doc in finds.read(db[collection], {}):
                yield spec.name, collection, doc


def naming(clients: Clients, config: RouterConfig, user: Any = USER) -> list[tuple[str, str, Any]]:
    """Where any document still names *user* as sender or receiver: (cluster, collection, _id) of each."""
    return [(cluster, collection, doc["_id"]) for cluster, collection, doc in documents(clients, config)
            if names(doc, user)]


def copies_sent(clients: Clients, config: RouterConfig, user: Any = USER) -> int:
    """Copies of *user*'s posts in every feed of every period (a bucket's items counted one by one)."""
    total = 0
    for cluster, collection, doc in documents(clients, config):
        if collection == config.feed_collection:
            items = doc.get("items", [doc])
            total += sum(1 for i in items if same_user(i.get("sender_id"), user))
    return total
