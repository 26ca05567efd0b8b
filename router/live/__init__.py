"""Live feeds: subscribe to a receiver's feed and get what is stored for it as it is stored.

The pure half (the push requests every writer yields, the events, the gap-free protocol) is
:mod:`router.core.live`; publishing is :mod:`router.storage.push`; this package is the
subscribing side: the hub (:mod:`~router.live.hub`, one Redis pub/sub connection per router,
presence, reconnection), the subscriptions (:mod:`~router.live.subscription`) and each door's
``subscribe`` (:mod:`~router.live.doors`). The "Live feeds" page of the docs has the protocol,
what each writer pushes, the costs measured and what happens when Redis is down.

Example::

    page = feeds.read(7, limit=20)
    with feeds.subscribe(7, cursor=live_cursor(page)) as live:
        for event in live:
            ...
"""

from ..core.live import DeletedItem, LiveEvent, NewItem, Resync, UpdatedItem, live_cursor
from .subscription import AsyncSubscription, Subscription

__all__ = ["AsyncSubscription", "DeletedItem", "LiveEvent", "NewItem", "Resync", "Subscription", "UpdatedItem",
           "live_cursor"]
