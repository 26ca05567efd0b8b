"""What a writer tells live subscribers once its write is stored: push requests, presence members, wire messages.

Every writer's program yields one :class:`Push` after its write is stored (never before):
``write_many`` its items (:class:`PushItems`), a fan-out batch or a backfill its copies
(:class:`PushCopies`, :class:`PushItems`), ``publish`` the post in its author's outbox
(:class:`PushPost`, for subscribers that pull the author), ``update``, ``delete``, the edit
fence's clean-ups and erasures the keys they changed (:class:`PushEdit`). The driver answers
with ``None`` whatever happens: a push is best effort and never fails or delays the write
beyond ``push.timeout`` (:mod:`router.storage.push`).

**Cost proportional to who listens.** A push names its receivers by presence *member*
(``r:`` and the receiver, ``a:`` and an author); subscribers' processes keep their members in a
presence set in Redis with an expiry. The driver sends a batch's members, one head per member and
one shared body in one round trip, and Redis publishes to the members present only (a script), so
a fan-out batch of 1,000 receivers with none connected sends no message at all. ``write_many``'s
items differ per receiver and cost to encode: the driver looks the members up first and encodes
and publishes the present ones' only (a second round trip, when any is present). Edits go to one
broadcast channel, one message per edit whatever the copies (a subscriber cannot know which of
its shown items a key names, so every subscriber process hears every edit).

**Wire format.** A message is one BSON document, or a head document followed by a body
document: ``{k: "item", _id, receiver_id, sender_id, event_time, type, data, data_key}`` for an
item of ``write_many`` or a backfill, ``{k: "copy", sender_id, event_time, type, data, data_key}``
for a fan-out's copy (one message for the whole batch: the subscriber derives the copy's id,
:func:`router.ids.copy_id`), ``{k: "post", ...}`` likewise for an outbox entry, ``{k: "updated",
data_key, data}``, ``{k: "deleted", keys: [...]}``, and ``{k: "gap"}``, which a writer sends when
it reaches Redis again after pushes it could not make.

Example (what a driver does with a push)::

    messages = push.messages()
    send(members=messages.members, heads=messages.heads, body=messages.body, broadcast=messages.broadcast)
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from typing import Any, ClassVar, Literal, Protocol

import attrs
import bson
from bson import ObjectId
from bson.codec_options import CodecOptions

from ..model import Activity

__all__ = [
    "CODEC", "EDITS", "PRESENCE", "Messages", "cleanups", "Push", "PushCopies", "PushEdit", "PushItems", "PushPost", "decode",
    "member",
]

#: The suffix of the presence set's key (``<prefix>:here``) and of the broadcast channel (``<prefix>:edits``);
#: a member's channel is ``<prefix>:<member>``.
PRESENCE = "here"
EDITS = "edits"
#: How messages are decoded: times aware UTC, as the storage's clients decode a page's (``tz_aware=True``).
CODEC: CodecOptions[dict[str, Any]] = CodecOptions(tz_aware=True)


def member(kind: Literal["r", "a"], who: int | str) -> str:
    """The presence member (and channel suffix) of a receiver (``r``) or a pulled author (``a``): an int id and the
    str of the same digits are different ids, so each is marked (``r:i42``, ``r:s42``)."""
    return f"{kind}:i{who}" if isinstance(who, int) else f"{kind}:s{who}"


@attrs.frozen(slots=True)
class Messages:
    """What one push sends: to ``members[i]``, if it has a live subscriber, its head and ``body``; and each of
    ``broadcast`` to every subscriber process.

    A member's head is ``heads[i]`` (none when ``heads`` is empty: the body alone), or, with ``head`` set,
    ``head(i)``: made only for the members found present (a driver looks them up first), for messages that differ
    per member and cost to encode (``write_many``'s items)."""

    members: Sequence[str] = ()
    heads: Sequence[bytes] = ()
    body: bytes = b""
    broadcast: Sequence[bytes] = ()
    head: Callable[[int], bytes] | None = None

    def __len__(self) -> int:
        return len(self.members) + len(self.broadcast)

    def message(self, i: int) -> bytes:
        """What ``members[i]`` is sent."""
        head = self.head(i) if self.head is not None else self.heads[i] if self.heads else b""
        return head + self.body


class Push(abc.ABC):
    """A request to tell live subscribers of a stored write; answered with ``None`` (never a failure)."""

    #: The ``op`` label of its metrics and span (``feedrouter.push.<op>``).
    op: ClassVar[str]

    @abc.abstractmethod
    def messages(self) -> Messages:
        """The messages (built only by a driver that pushes: a router without ``push:`` never encodes one)."""


class _Copy(Protocol):
    """A stored item with its id: a :class:`~router.model.FeedItem` or a layout's ``Copy``."""

    @property
    def receiver_id(self) -> int | str: ...
    @property
    def sender_id(self) -> int | str: ...
    @property
    def event_time(self) -> Any: ...
    @property
    def type(self) -> int | str: ...
    @property
    def data(self) -> Any: ...
    @property
    def data_key(self) -> str: ...


@attrs.frozen(slots=True)
class PushItems(Push):
    """Items stored for their receivers (``write_many``, a backfill), ``ids[i]`` being ``items[i]``'s; the positions
    in *skip* were not stored."""

    op: ClassVar[str] = "items"
    items: Sequence[_Copy]
    ids: Sequence[ObjectId]
    skip: Collection[int] = ()

    def messages(self) -> Messages:
        chosen = [i for i in range(len(self.items)) if i not in self.skip] if self.skip else range(len(self.items))
        items, ids = self.items, self.ids

        def head(n: int) -> bytes:
            i = chosen[n]
            item = items[i]
            return bson.encode({"k": "item", "_id": ids[i], "receiver_id": item.receiver_id, "sender_id": item.sender_id,
                                "event_time": item.event_time, "type": item.type, "data": item.data,
                                "data_key": item.data_key})

        return Messages([member("r", items[i].receiver_id) for i in chosen], head=head)


def _body(kind: str, activity: Activity, data: Any) -> bytes:
    return bson.encode({"k": kind, "sender_id": activity.sender_id, "event_time": activity.event_time,
                        "type": activity.type, "data": data, "data_key": activity.data_key})


@attrs.frozen(slots=True)
class PushCopies(Push):
    """Copies of one post stored for *receivers* (a fan-out batch), ``ids[i]`` being ``receivers[i]``'s; *data* is
    what they hold (the activity's, or an update's the batch wrote); the positions in *skip* were not stored."""

    op: ClassVar[str] = "copies"
    activity: Activity
    receivers: Sequence[int | str]
    ids: Sequence[ObjectId]
    data: Any
    skip: Collection[int] = ()

    def messages(self) -> Messages:
        chosen = [r for i, r in enumerate(self.receivers) if i not in self.skip] if self.skip else self.receivers
        # one message for all: a copy's id is derived (router.ids.copy_id), so its subscriber makes it
        return Messages([member("r", r) for r in chosen], body=_body("copy", self.activity, self.data) if chosen else b"")


@attrs.frozen(slots=True)
class PushPost(Push):
    """A post stored in its author's outbox (``publish``): for subscribers that pull the author."""

    op: ClassVar[str] = "post"
    activity: Activity

    def messages(self) -> Messages:
        a = self.activity
        return Messages([member("a", a.sender_id)], body=_body("post", a, a.data))


@attrs.frozen(slots=True)
class PushEdit(Push):
    """Keys whose copies were deleted (*data* None: ``delete``, an erasure, a fence's clean-up) or given new *data*
    (``update``, a fence's clean-up that re-applied an update)."""

    op: ClassVar[str] = "edit"
    keys: Sequence[str]
    data: Mapping[str, Any] | None = None

    def messages(self) -> Messages:
        if not self.keys:
            return Messages()
        if self.data is None:
            return Messages(broadcast=[bson.encode({"k": "deleted", "keys": list(self.keys)})])
        return Messages(broadcast=[bson.encode({"k": "updated", "data_key": key, "data": self.data}) for key in self.keys])


class _Fence(Protocol):
    """What :func:`cleanups` reads of a fence (:class:`router.core.writes.fence.Fence`)."""

    @property
    def seq(self) -> int: ...
    @property
    def data(self) -> Mapping[str, Any] | None: ...
    @property
    def deleted(self) -> bool: ...
    @property
    def updated(self) -> bool: ...


def cleanups(fences: Mapping[str, _Fence], seqs: Mapping[str, int]) -> Iterator[PushEdit]:
    """The pushes of a writer's fence clean-up (:func:`router.core.writes.fence.settle`), once it is done: the keys whose
    just-written (and pushed) documents it removed, and those it gave an update newer than their data's *seqs*
    (0 when absent); a writer yields from it."""
    gone = [key for key, fence in fences.items() if fence.deleted]
    if gone:
        yield PushEdit(gone)
    for key, fence in fences.items():
        if fence.updated and fence.seq > seqs.get(key, 0) and fence.data is not None:
            yield PushEdit([key], fence.data)


#: What a writer broadcasts when it reaches Redis again after pushes it could not make: subscribers catch up.
GAP = bson.encode({"k": "gap"})
__all__ += ["GAP"]


def decode(raw: bytes) -> dict[str, Any]:
    """A message as one document (head and body merged); raises ``bson.errors.InvalidBSON`` for a malformed one."""
    docs = bson.decode_all(raw, CODEC)
    if not docs:
        raise bson.errors.InvalidBSON("an empty message")
    head = docs[0]
    for more in docs[1:]:
        head.update(more)
    return head
