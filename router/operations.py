"""What each operation of the two doors does, written once for both.

``FeedRouter`` (:mod:`router.sync`) and ``AsyncFeedRouter`` (:mod:`router.aio`) take the
docstrings of their shared operations from here (:func:`documented`), so ``help()`` on
either door shows the whole text: on the async door with its examples awaited and its own
notes added. ``tests/unit/test_doors.py`` checks that every public member of both doors
has a docstring and that the two summaries agree.

Example::

    @documented("write")
    def write(self, item: FeedItem) -> ObjectId: ...
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["OPERATIONS", "docstring", "documented"]

F = TypeVar("F", bound=Callable[..., Any])

#: Each shared operation's docstring; ``{await}`` (and ``{open}``/``{close}`` around an awaited expression) mark
#: where the async door's examples differ.
OPERATIONS: dict[str, str] = {
    "refresh": r"""Reload every cluster's metadata; the old map stays in use if this raises.

A cluster that does not answer keeps its last known period. The map and the time
its load began are replaced together, and never by an older load.""",
    "write": r"""Store one item in the cluster owning its ``event_time``; return its ``_id``.

Raises :class:`InvalidItem`, :class:`NoClusterForTime`, :class:`StaleMetadata` or
:class:`ClusterUnavailable` (``from`` the :class:`WriteFailed` that holds the id).""",
    "write_many": r"""Store every item; return their ``_id``\ s in the order given.

All items are checked and routed before anything is written: one invalid item
(:class:`InvalidItem`) or one no period owns (:class:`NoClusterForTime`) rejects the
whole call and changes no cluster. Items are then grouped per cluster and sent as
unordered ``insert_many`` batches of ``write.batch_size``, clusters concurrently.
If some are not confirmed written, :class:`WriteFailed` says which (by index) and
why, with every item's id; the others are stored. An item with ``id`` set is
stored under that id (a repeat of a stored item is found, not stored twice).""",
    "prepare": r"""The write path without I/O: check, route, id and build every item (for measuring, or to inspect).

Raises what :meth:`write_many` raises for bad input, and :class:`StaleMetadata` for
an item past the map's horizon (:meth:`write_many` would refresh once first).""",
    "read": r"""One page of *receiver_id*'s feed, newest first by ``(event_time, _id)``.

The newest cluster in the read window is asked first; an older one only while
the page is not full. Pass ``next_cursor`` for the next page (``None`` once the
window is exhausted). *pull* merges in the outboxes of those senders (authors
whose posts are not copied to followers), each post once. *on_unavailable*
(default ``read.on_unavailable``): ``"raise"`` raises :class:`ClusterUnavailable`
for a cluster the page needs; ``"partial"`` serves the rest, marks the page
``partial`` and owes that cluster's items to later pages. *types* keeps only items
of those types (a notification feed's filter): pages stay full and cursors work as
without it.""",
    "mark_seen": r"""Mark everything up to *position* (an item of a page, or its :class:`Position`) as seen by *receiver_id*.

Example::

    page = {await}feeds.read(7, limit=20)
    {await}feeds.mark_seen(7, page.items[0])          # the newest item shown
    {open}{await}feeds.unseen_count(7){close}.count                # 0 until something newer arrives

The marker never moves backwards: marking an older position, or two devices
marking at once, leaves the highest one. It lives in the cluster that owns its time,
so it survives rollovers.""",
    "seen_position": r"""*receiver_id*'s seen marker, or ``None`` if nothing in the read window was marked.""",
    "unseen_count": r"""How many items are newer than the seen marker, stopping past *cap* (``capped``: show "99+").

Asks the newest cluster first and never one older than the marker; with *pull*, the
pulled senders' outbox posts count too, each post once.""",
    "delete": r"""Remove every copy of the item *data_key*, and its outbox entry, from every cluster; return how many copies.

Works in bounded steps, clusters concurrently, after leaving a tombstone in each
cluster: fan-outs still running remove what they write afterwards and stop, and the
key is never fanned out or published again (:class:`ItemDeleted`). If some cluster
fails, :class:`DeleteFailed` says which and how many were removed; run it again to finish.""",
    "update": r"""Replace ``data`` in every copy of *data_key* and in its outbox entry; return how many changed.

Same steps and failure rules as :meth:`delete` (:class:`UpdateFailed`); repeatable.
Recorded in each cluster's edit fence first, so copies that fan-outs still running
write afterwards get the new data too.""",
    "unfollow": r"""Remove *sender_id*'s copies from *receiver_id*'s feed in every cluster of the read window; return how many.""",
    "backfill": r"""Copy the senders' newest outbox entries (newer than *since*, at most *limit*) into *receiver_id*'s feed.

Rebuilds a dormant user's inbox on return. Copies have fan-out's ids, so running it
again, or while a fan-out of the same post runs, leaves one copy each. At most
``read.max_pull`` distinct senders (default 1,000) per call: more is
:class:`InvalidItem` (``senders: at most 1000 senders per backfill ...``).""",
    "follow": r"""Copy the *limit* newest posts of a newly followed *sender_id* into *receiver_id*'s feed (a :meth:`backfill`).""",
    "publish": r"""Store *activity* in its author's outbox, then push it to the (active) followers or, for a pulled author, not.

``pull=True``/``False`` decides; else ``fanout.pull_threshold`` applied to the
follower count (see :mod:`router.core.social`). The push is :meth:`fan_out`
(``background=True`` puts its handle in ``result.handle``). Raises what
:meth:`fan_out` raises; the outbox entry stays if the push fails, and publishing
again is safe.""",
    "fan_out": r"""Write one copy of *activity* per receiver into the cluster owning its ``event_time``.

Example::

    result = {await}feeds.fan_out(activity, followers(author), active=active_ids)
    handle = {await}feeds.fan_out(activity, followers(author), background=True)

Streaming (at most ``concurrency`` batches of ``batch_size`` in flight), idempotent
(derived ids: a rerun stores nothing twice) and resumable (a checkpoint per job in
the owning cluster). Raises :class:`InvalidItem`, :class:`NoClusterForTime` or
:class:`StaleMetadata` before writing anything, :class:`ItemDeleted` (from
``result()`` in background mode) for a post that was deleted, before or while it runs
(``.result`` says how far it got), and :class:`FanOutFailed` (with ``.result``) if
receivers are left without a copy.""",
    "plan_fan_out": r"""Check *activity* and choose its cluster: the job :meth:`fan_out`, :meth:`publish` and other engines
(:mod:`router.fanout.celery`) run. Nothing is written; raises as :meth:`fan_out` does before writing.""",
    "fan_out_status": r"""A fan-out job's progress from its checkpoint (any process's job), looked up in every cluster.

Raises :class:`InvalidItem` if no cluster has a job *job_id*.""",
}

#: What only the async door adds to an operation's docstring.
_ASYNC_NOTES: dict[str, str] = {
    "prepare": """Not a coroutine: it does no I/O.""",
    "publish": """*followers* may be an async iterable; with a pull threshold and no ``pull=``, at most
threshold + 1 of them are read to decide, as the sync door does for a stream.""",
    "fan_out": """*receivers* may be an iterable or an async iterable (a plain iterable is read a batch at
a time in a worker thread). At most ``concurrency`` batches are in flight (an asyncio
semaphore); ``background=True`` returns an :class:`~router.fanout.tasks.AsyncFanOutHandle` at once.""",
}


def docstring(name: str, *, asynchronous: bool = False) -> str:
    """The docstring of operation *name* on the sync door, or (*asynchronous*) on the async door."""
    text = OPERATIONS[name]
    marks = {"{await}": "await " if asynchronous else "", "{open}": "(" if asynchronous else "",
             "{close}": ")" if asynchronous else ""}
    for mark, value in marks.items():
        text = text.replace(mark, value)
    note = _ASYNC_NOTES.get(name) if asynchronous else None
    return text + "\n\n" + note if note else text


def documented(name: str, *, asynchronous: bool = False) -> Callable[[F], F]:
    """A decorator giving a door's method the docstring of operation *name* (see :func:`docstring`)."""
    def give(method: F) -> F:
        method.__doc__ = docstring(name, asynchronous=asynchronous)
        return method
    return give
