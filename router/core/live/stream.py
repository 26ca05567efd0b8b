"""A subscriber's stream, without I/O: its events, the gap-free protocol, the bounded backlog and the catch-up.

**The protocol.** A subscription first subscribes (its channels confirmed by Redis, its members
in the presence set), *then* catches up from storage (``read`` pages, newest first, down to
its cursor), *then* hands out what arrived live meanwhile and afterwards, dropping by id what
came both ways. A writer pushes after storing (:mod:`router.core.push`), so an item
stored before the catch-up's read is in that read, and one stored after it is pushed to a
subscriber already there: nothing falls between the page and the stream, and nothing is
served twice. After a break (the backlog overflowed, the connection was lost, a writer could
not push for a while) the stream says :class:`Resync` and catches up again from its cursor.

**Positions.** A feed is ordered by ``(event_time, _id)``; a stream's :attr:`Stream.cursor`
is the newest position it has handed out (or was given), and every event carries it: a
reader that comes back with it (``Last-Event-ID``) gets every item stored after it since.
An item stored later at an older position (a fan-out of an older post, a backfill) is pushed
while connected; a catch-up after a break finds only newer positions (a read shows the rest).

Example (what a door's subscription does with these)::

    stream = Stream(plan)
    catch_up = run(catch_up_program(read, stream.catch_up()))    # after the subscribe is confirmed
    events = stream.caught_up(catch_up) + stream.accept(raw)       # raw: each live message, in order
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, Literal

import attrs
from bson import ObjectId
from bson.errors import InvalidBSON

from ...cursor import Position, decode_state, encode_cursor
from ...errors import InvalidCursor
from ...ids import copy_ids
from ...model import EPOCH, Activity, FeedItem, Page, to_millis
from .. import calls
from ..calls import View
from ..writes import check_ids, check_senders
from ..layouts import Post, outbox
from ..settings import MAX_TYPES
from ..steps import Program
from ..push import decode, member

__all__ = [
    "Backlog", "CatchUp", "DeletedItem", "LiveEvent", "LivePlan", "NewItem", "Resync", "Stream", "UpdatedItem",
    "catch_up_events", "catch_up_program", "live_cursor", "subscribe_plan",
]

#: Ids a stream remembers to drop an item pushed twice (a retried push, two runs of one fan-out), besides those of
#: its last catch-up.
DEDUP_WINDOW = 256
#: The position before every item: where a stream of an empty feed starts.
START = Position(EPOCH, ObjectId(bytes(12)))


def live_cursor(page: Page) -> str:
    """The cursor to subscribe with after showing *page* (the first page of a feed): its newest item's position, or
    the start of the feed for an empty page (then every item stored since the read comes)."""
    head = page.items[0] if page.items else None
    position = START if head is None or head.id is None else Position(head.event_time, head.id)
    return encode_cursor(position)


def _key(position: Position) -> tuple[int, bytes]:
    return to_millis(position.event_time), position.id.binary


@attrs.frozen
class NewItem:
    """An item new in the feed: the :class:`~router.model.FeedItem` a page returns (``pulled``: from the outbox of an
    author the subscriber pulls, under the id its copy would have) and ``cursor``, where the stream resumes after it
    (its newest position so far, which an older item pushed late does not move back)."""

    kind: ClassVar[str] = "item"
    item: FeedItem
    cursor: str
    pulled: bool = False


@attrs.frozen
class UpdatedItem:
    """Every copy of ``data_key`` now holds ``data`` (``update``, or a fan-out batch that met the update)."""

    kind: ClassVar[str] = "updated"
    data_key: str
    data: Mapping[str, Any]
    cursor: str | None


@attrs.frozen
class DeletedItem:
    """Every copy of ``data_key`` is gone (``delete``, an erasure, or a fan-out batch that met the tombstone)."""

    kind: ClassVar[str] = "deleted"
    data_key: str
    cursor: str | None


@attrs.frozen
class Resync:
    """The stream may have missed events: ``"overflow"`` (its backlog was full: dropped), ``"disconnected"`` (Redis
    was lost; the stream reconnects by itself), ``"missed"`` (a writer could not push for a while) or ``"too_far"``
    (more items were stored since ``cursor`` than one catch-up serves: they are skipped).

    New items stay exactly-once across a break (the stream catches up from ``cursor`` once it is back), except for
    ``"too_far"``; updates and deletes made during it are not repeated: read again what you show (from the top for
    ``"too_far"``). ``cursor`` is where the stream stands."""

    kind: ClassVar[str] = "resync"
    reason: Literal["overflow", "disconnected", "missed", "too_far"]
    cursor: str | None


LiveEvent = NewItem | UpdatedItem | DeletedItem | Resync


@attrs.frozen
class LivePlan:
    """One subscription's arguments, checked as ``read`` checks them: the receiver, the authors pulled, the types kept
    (empty: all), where it starts (None: at the feed's newest item when it subscribes), its backlog and catch-up."""

    receiver_id: int | str
    pull: tuple[int | str, ...] = ()
    types: tuple[int | str, ...] = ()
    after: Position | None = None
    queue: int = 1000
    catch_up: int = 1000

    @property
    def members(self) -> tuple[str, ...]:
        """Its presence members: the receiver's and each pulled author's (also its channels' suffixes)."""
        return (member("r", self.receiver_id), *(member("a", a) for a in self.pull))


class CatchUp:
    """What one catch-up found, page by page newest first: the items after ``after`` (at most ``limit``), or, with
    ``after`` None, only the feed's newest position."""

    def __init__(self, after: Position | None, limit: int) -> None:
        self.after = after
        self.limit = limit
        #: ``(item, pulled)`` newest first.
        self.found: list[tuple[FeedItem, bool]] = []
        self.head: Position | None = None
        self.too_far = False

    @property
    def page_size(self) -> int:
        """Items per page to ask: one past the limit, so a page says whether the limit is passed."""
        return 1 if self.after is None else min(self.limit + 1, 1000)

    def take(self, page: Page) -> bool:
        """Add *page* (the next one); True once no further page is needed."""
        pulled = page.pulled or (False,) * len(page.items)
        for item, was_pulled in zip(page.items, pulled):
            if item.id is None:
                continue
            position = Position(item.event_time, item.id)
            if self.head is None:
                self.head = position
            if self.after is None or _key(position) <= _key(self.after):
                return True
            if len(self.found) >= self.limit:
                self.too_far = True
                return True
            self.found.append((item, was_pulled))
        return page.next_cursor is None


def catch_up_program(read: Callable[[str | None], Program[Page]], catch_up: CatchUp) -> Program[CatchUp]:
    """Read pages with *read* (a page of the subscriber's feed from a cursor, as ``read`` makes it) until
    *catch_up* has what it needs."""
    cursor: str | None = None
    while True:
        page = yield from read(cursor)
        if catch_up.take(page) or page.next_cursor is None:
            return catch_up
        cursor = page.next_cursor


#: The backlog of a subscription with nothing queued (never appended to).
_EMPTY: deque[bytes] = deque(maxlen=0)


class Backlog:
    """A subscription's bounded queue of raw messages, and what happened to its connection. Not thread-safe: the
    I/O layer guards it (a lock for threads; one event loop).

    Full, it drops every message and remembers an overflow, so memory never grows past ``size``."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.messages: deque[bytes] = _EMPTY  # (an idle subscription holds no deque of its own: made at the first put)
        #: Dropped for being full since the last :meth:`take`.
        self.overflowed = False
        #: The connection is lost (until :meth:`restored`), and it was lost since the last take.
        self.down = False
        self.lost = False
        #: Back since the last take: catch up before the messages.
        self.back = False

    def put(self, raw: bytes) -> None:
        if self.down:
            return
        if len(self.messages) >= self.size:
            self.messages = _EMPTY
            self.overflowed = True
            return
        if self.messages is _EMPTY:
            self.messages = deque()
        self.messages.append(raw)

    def disconnected(self) -> None:
        """The connection is lost: what is queued may lack what was published meanwhile; drop it."""
        self.messages = _EMPTY
        self.down = self.lost = True
        self.back = False

    def restored(self) -> None:
        """Subscribed again (confirmed, present again): catch up, then the messages."""
        self.down = False
        self.back = True

    @property
    def ready(self) -> bool:
        """Something for :meth:`take`."""
        return bool(self.messages) or self.overflowed or self.lost or self.back

    def take(self) -> tuple[str, bytes | None]:
        """The next thing to handle: ``("lost", None)``, ``("overflow", None)``, ``("back", None)``,
        ``("message", raw)``, or ``("wait", None)`` (nothing yet; while down, only ``back`` ends the wait)."""
        if self.lost:
            self.lost = False
            return "lost", None
        if self.overflowed:
            self.overflowed = False
            return "overflow", None
        if self.back:
            self.back = False
            return "back", None
        if self.messages and not self.down:
            return "message", self.messages.popleft()
        return "wait", None


class Stream:
    """One subscription's state, touched by its consumer only: where it stands, what it handed out lately, and what
    it owes (a catch-up). :meth:`accept` turns a live message into events; :meth:`caught_up` a finished catch-up."""

    def __init__(self, plan: LivePlan) -> None:
        self.plan = plan
        self.position: Position | None = plan.after
        #: A catch-up is owed before the next live message (from the start: subscribing is followed by one).
        self.behind = True
        self._types = frozenset(plan.types)
        self._seen: dict[ObjectId, None] = {}  # in the order handed out
        self._floor = DEDUP_WINDOW

    @property
    def cursor(self) -> str | None:
        """Where the stream stands (what its events carry), or None before it knows."""
        return None if self.position is None else encode_cursor(self.position)

    def catch_up(self) -> CatchUp:
        """The catch-up it owes: from its position, or (a subscription with no cursor) the feed's newest position."""
        return CatchUp(self.position, self.plan.catch_up)

    def caught_up(self, done: CatchUp) -> list[LiveEvent]:
        """The events of a finished catch-up, oldest first (or a :class:`Resync` ``too_far``)."""
        self.behind = False
        if self.position is None:  # subscribed with no cursor: start at the newest item (or the start of the feed)
            self.position = done.head or START
            return []
        if done.too_far:
            if done.head is not None:
                self.position = done.head
            return [Resync("too_far", self.cursor)]
        events: list[LiveEvent] = []
        for item, pulled in reversed(done.found):
            event = self._new(item, pulled)
            if event is not None:
                events.append(event)
        self._floor = max(DEDUP_WINDOW, len(self._seen))
        return events

    def resync(self, reason: Literal["overflow", "disconnected", "missed"]) -> Resync:
        """A break: say so, and owe a catch-up."""
        self.behind = True
        return Resync(reason, self.cursor)

    def accept(self, raw: bytes) -> list[LiveEvent]:
        """The events of one live message (none for a repeat, another type, or a malformed message)."""
        try:
            doc = decode(raw)
        except (InvalidBSON, ValueError):
            return []
        kind = doc.get("k")
        if kind == "deleted":
            return [DeletedItem(key, self.cursor) for key in doc.get("keys", ()) if isinstance(key, str)]
        if kind == "updated":
            data = doc.get("data")
            return [UpdatedItem(doc["data_key"], data, self.cursor)] if isinstance(data, Mapping) else []
        if kind == "gap":
            return [self.resync("missed")]
        if kind not in ("item", "copy", "post"):
            return []
        try:
            if kind == "copy":
                receiver = self.plan.receiver_id
                (oid,) = copy_ids(int(doc["event_time"].timestamp()), doc["data_key"], [receiver])
                item, pulled = FeedItem(receiver_id=receiver, sender_id=doc["sender_id"], event_time=doc["event_time"],
                                        type=doc["type"], data=doc["data"], data_key=doc["data_key"], id=oid), False
            elif kind == "post":
                post = Post(ObjectId(), _activity(doc))
                shown = outbox.pulled_item(post, self.plan.receiver_id)
                if shown is None:
                    return []
                item, pulled = shown[2], True
            else:
                item, pulled = FeedItem(receiver_id=doc["receiver_id"], sender_id=doc["sender_id"],
                                        event_time=doc["event_time"], type=doc["type"], data=doc["data"],
                                        data_key=doc["data_key"], id=doc["_id"]), False
        except (KeyError, TypeError, AttributeError, ValueError, UnicodeEncodeError):
            return []
        event = self._new(item, pulled)
        return [] if event is None else [event]

    def _new(self, item: FeedItem, pulled: bool) -> NewItem | None:
        """The event of *item*, unless it was handed out lately or is of a type not asked for."""
        oid = item.id
        if oid is None or oid in self._seen or (self._types and item.type not in self._types):
            return None
        self._seen[oid] = None
        if len(self._seen) > self._floor:
            del self._seen[next(iter(self._seen))]
            self._floor = max(DEDUP_WINDOW, self._floor - 1)
        position = Position(item.event_time, oid)
        if self.position is None or _key(position) > _key(self.position):
            self.position = position
        return NewItem(item, encode_cursor(self.position), pulled)


def _activity(doc: Mapping[str, Any]) -> Activity:
    return Activity(sender_id=doc["sender_id"], event_time=doc["event_time"], type=doc["type"], data=doc["data"],
                    data_key=doc["data_key"])


def subscribe_plan(view: View, receiver_id: object, *, cursor: object = None, pull: Sequence[object] | None = None,
                   types: Sequence[object] | None = None) -> LivePlan:
    """``subscribe``'s arguments checked by ``read``'s own checks (the same errors for a bad receiver id, cursor,
    ``pull`` or ``types``), as the subscription's plan. A cursor must name a position (any cursor a page, an event
    or :func:`live_cursor` gave)."""
    calls.read(view, receiver_id, cursor=cursor, pull=pull, types=types).close()  # raises what read raises
    after = None
    if cursor is not None:
        after = decode_state(cursor).position  # type: ignore[arg-type]  # (checked by read just now)
        if after is None:
            raise InvalidCursor(f"cursor: names no position to follow, so no subscription can start from it "
                                f"(got {cursor!r:.60})")
    push = view.config.push
    settings = view.settings
    return LivePlan(
        receiver_id=receiver_id,  # type: ignore[arg-type]  # (checked by read just now)
        pull=check_senders(pull, field="pull", limit=settings.max_pull, per="read"),
        types=check_ids(types, field="types", noun="types", limit=MAX_TYPES, too_many="distinct types", empty=False),
        after=after, queue=push.queue if push else 1000, catch_up=push.catch_up if push else 1000)


def catch_up_events(view: View, stream: Stream) -> Program[list[LiveEvent]]:
    """The catch-up *stream* owes, as ``read`` pages of its feed from the top (never partial: a cluster that cannot
    be read raises, and the catch-up is owed still); its events."""
    plan, wanted = stream.plan, stream.catch_up()

    def read(cursor: str | None) -> Program[Page]:
        return calls.read(view, plan.receiver_id, limit=wanted.page_size, cursor=cursor, on_unavailable="raise",
                          pull=list(plan.pull) or None, types=list(plan.types) or None)

    done = yield from catch_up_program(read, wanted)
    return stream.caught_up(done)
