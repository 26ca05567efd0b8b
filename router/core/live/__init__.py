"""Live feeds, without I/O: what writers push after a write is stored, and how a subscriber's stream stays gap-free.

Owns the protocol between writers and subscribers and the rules both ends follow:

* :mod:`~router.core.live.push`: the push requests every writer's program yields once its
  write is stored (:class:`~router.core.live.push.Push`, answered by the driver, never failing
  the write), the presence members and channels they address, and the messages on the wire;
* :mod:`~router.core.live.stream`: the events a subscriber receives, the gap-free protocol
  (subscribe first, then catch up from storage from the given cursor, then drop by id what
  came both ways), the bounded backlog, and the catch-up program built on ``read``.

May import the model, cursors, ids, :mod:`router.core.steps` (stream only) and the outbox's
pulled items; never a client (no ``redis``, no ``pymongo``): the Redis I/O is in
:mod:`router.storage.push` (publishing) and :mod:`router.live` (subscribing). This package's
``__init__`` imports nothing, so :mod:`router.core.steps` may name :class:`Push` without a circle.
"""
