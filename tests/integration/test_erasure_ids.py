"""One user is one identity whatever integer type carries the id: erasure, its records and the writers that read them,
on real servers, both doors, both layouts.

pymongo reads every int stored as a 64-bit BSON int back as ``bson.Int64`` (an ``int`` subclass): the ids of a user
above 2**31 come back so from every read (a page's items, an outbox entry, a registry entry), and a service passes them
on. The erasure's keyed hash, the registry's ids, the writers' check of the erasure records and ``mark_seen``'s check
of the item's owner must take ``Int64(u)`` for ``u``; a str id stays another user (``"5"`` is not ``5``).
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from bson import ObjectId
from bson.int64 import Int64

from router import Activity, FeedItem, RouterConfig, SenderErased, data_key
from router.core.settings import pseudonyms_of

from .conftest import P2
from .erasure import USERS, Clients, copies_sent, naming
from .erasure import config, layout, router  # noqa: F401 - fixtures

#: Others: a follower who follows the user, and another sender.
FOLLOWER, OTHER = 77, 78


def post(sender: Any, n: int) -> Activity:
    return Activity(sender_id=sender, event_time=P2 + timedelta(days=3, minutes=n), type=1, data={"n": n},
                    data_key=data_key("ids", f"{int(sender)}/{n}"))


@USERS
def test_the_same_user_whatever_int_type_carries_the_id(router: Any, raw_clients: Clients, config: RouterConfig,
                                                        user: int) -> None:
    """The user marks their own page's item seen (its receiver_id read back); ``erase_user(Int64(u))`` files its
    records under ``u`` (erasure_status of either finds them) and leaves nothing naming them; a fan-out, publish
    or backfill of their post given ``Int64(u)`` as its sender is refused afterwards, and a str id of the same digits
    is another user."""
    router.publish(post(user, 1), range(1, 40), pull=False)
    router.write_many([FeedItem(receiver_id=user, sender_id=OTHER, event_time=P2 + timedelta(days=4), type=1,
                                data={"hello": 1}, data_key=data_key("ids", "letter"))])
    page = router.read(user, limit=5)
    assert page.items and page.items[0].receiver_id == user
    assert router.mark_seen(user, page.items[0]).id == page.items[0].id  # their own item, its id read back
    assert router.unseen_count(user).count == 0
    result = router.erase_user(Int64(user), requested_by="tests")
    assert result.totals["feed_sent"] == 39 and result.totals["feed_received"] == 1 and result.totals["seen"] == 1
    assert naming(raw_clients, config, user) == []
    for asked in (user, Int64(user)):
        status = router.erasure_status(asked)
        assert status.finished and {r.request_id for r in status.records} == {result.request_id}
    assert router.erasure_status(str(user)).records == ()  # a str id is another user
    with pytest.raises(SenderErased):
        router.fan_out(post(Int64(user), 2), range(1, 10))
    with pytest.raises(SenderErased):
        router.publish(post(Int64(user), 3), range(1, 10))
    assert copies_sent(raw_clients, config, user) == 0 and naming(raw_clients, config, user) == []


@USERS
def test_writers_that_read_the_user_back_meet_the_record(router: Any, raw_clients: Clients, config: RouterConfig,
                                                         user: int) -> None:
    """With the erasure's records in place (an erasure that stopped after them, before its sweep), the writers that
    take the user's id as a read returned it remove what they wrote for them: ``follow`` and ``backfill`` of their
    outbox (entries read back with ``Int64`` senders), a fan-out with ``Int64(u)`` among its receivers, and one with
    ``Int64(u)`` as its sender. The erasure, called again, then finishes with nothing left."""
    for n in range(4):
        router.publish(post(user, 10 + n), [], pull=True)  # their outbox only
    names = pseudonyms_of(config)
    record = {"user": names.of(user), "requested_by": "tests", "requested_at": datetime.now(timezone.utc),
              "clusters": [c.name for c in config.clusters], "state": "running", "counts": {}, "finished_at": None}
    for spec in config.clusters:  # what erase_user stores first, in every cluster
        raw_clients[spec.name][config.database_for(spec)]["erasures"].insert_one({**record, "_id": str(ObjectId())})
    router.follow(FOLLOWER, user)
    router.backfill(FOLLOWER + 1, [Int64(user)])
    skipped = router.fan_out(post(OTHER, 20), [1, Int64(user), 2])
    assert skipped.skipped == 1 and skipped.written == 2
    with pytest.raises(SenderErased):
        router.fan_out(post(Int64(user), 14), range(100, 110))
    feeds = [raw_clients[s.name][config.database_for(s)]["feed"] for s in config.clusters]
    mine = {"$or": [{"receiver_id": user}, {"sender_id": user}, {"items.sender_id": user}]}
    assert sum(f.count_documents(mine) for f in feeds) == 0  # nothing written for them stayed
    router.erase_user(user, requested_by="tests, again")
    assert router.erasure_status(user).finished
    assert naming(raw_clients, config, user) == []
