"""Capabilities: what a server can do, read from its replies to hello, buildInfo and serverStatus."""

from __future__ import annotations

from typing import Any

import pytest

from router.storage.capabilities import Capabilities

# The replies as the servers give them (trimmed to the fields that matter, plus one that does not).
FERRETDB2 = ({"isWritablePrimary": True, "maxWireVersion": 21},
             {"version": "7.0.77", "gitVersion": "unknown", "ferretdb": {"version": "v2.7.0", "package": "unknown"}})
FERRETDB1 = ({"isWritablePrimary": True, "maxWireVersion": 21},
             {"version": "7.0.42", "gitVersion": "0d4d1f3", "ferretdbVersion": "v1.24.2"})
JAVASERVER = ({"ismaster": True, "maxWireVersion": 13}, {"version": "5.0.0"})
MONGOD = ({"isWritablePrimary": True}, {"version": "7.0.14", "gitVersion": "ce59cfc"})
REPLICA = ({"isWritablePrimary": True, "setName": "rs0"}, {"version": "7.0.14", "gitVersion": "ce59cfc"})
MONGOS = ({"isWritablePrimary": True, "msg": "isdbgrid"}, {"version": "7.0.14", "gitVersion": "ce59cfc"})


@pytest.mark.parametrize(
    ("replies", "process", "expected"),
    [
        (FERRETDB2, None, ("ferretdb", "v2.7.0", False, True, False, False, False)),
        (FERRETDB1, None, ("ferretdb", "v1.24.2", False, False, False, False, False)),
        (JAVASERVER, "java", ("mongo-java-server", "5.0.0", False, True, False, False, False)),
        (MONGOD, None, ("mongodb", "7.0.14", False, True, False, False, True)),
        (REPLICA, None, ("mongodb", "7.0.14", False, True, True, True, True)),
        (MONGOS, None, ("mongodb", "7.0.14", True, True, True, True, True)),
    ],
    ids=["ferretdb2", "ferretdb1", "javaserver", "mongod", "replica-set", "mongos"],
)
def test_capabilities_follow_what_the_server_reports(
    replies: tuple[dict[str, Any], dict[str, Any]], process: str | None, expected: tuple[Any, ...]
) -> None:
    """Server, version, mongos, atomic updates, transactions, change streams, index-ordered sorts, per server kind."""
    caps = Capabilities.from_replies(*replies, process)
    assert (caps.server, caps.version, caps.sharded, caps.atomic_updates, caps.transactions, caps.change_streams,
            caps.index_ordered_sorts) == expected


def test_ferretdb2_is_not_taken_for_mongodb() -> None:
    """FerretDB 2 reports MongoDB 7.0.77 and no ferretdbVersion: its own version under buildInfo.ferretdb is what counts."""
    caps = Capabilities.from_replies(*FERRETDB2, None)
    assert caps.server == "ferretdb" and caps.version == "v2.7.0"
    assert "ferretdb v2.7.0: sharded (mongos) no, atomic updates yes, transactions no" in caps.describe()


@pytest.mark.parametrize(("version", "atomic"), [("v1.24.2", False), ("1.0", False), ("v2.7.0", True), ("v3.0.0", True)])
def test_ferretdb_atomic_updates_follow_its_major_version(version: str, atomic: bool) -> None:
    """FerretDB 1 loses concurrent updates of one document; FerretDB 2 (DocumentDB) does not."""
    assert Capabilities(sharded=False, server="ferretdb", version=version).atomic_updates is atomic


def test_a_java_build_info_without_a_java_process_is_mongodb() -> None:
    """No gitVersion alone does not make mongo-java-server: serverStatus must say process java."""
    assert Capabilities.from_replies(*JAVASERVER, None).server == "mongodb"


def test_flags_can_be_given() -> None:
    """An explicit value beats the rule (a test can describe a server that is not running)."""
    caps = Capabilities(sharded=False, server="mongodb", version="7.0", atomic_updates=False, transactions=True)
    assert caps.atomic_updates is False and caps.transactions is True
    assert Capabilities(**caps.to_json()) == caps
