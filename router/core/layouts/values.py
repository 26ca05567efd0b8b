"""What crosses the layout seam: copies as values, never as documents.

The core hands a layout :class:`Copy` values (or a batch of them, :class:`CopyBatch`) and a
layout hands values back (:class:`Copy` from a read-back, :class:`~router.model.FeedItem`
in a page); only a layout turns a copy into a stored document or reads one. A post in its
author's outbox is a :class:`Post`, which only :mod:`.outbox` stores and reads.

Batches are columns, not lists of objects: the two hot paths (``write_many`` and fan-out
batches) hand a layout their items, or one post and its receivers, with the ids, and the
layout builds every document in one comprehension (:meth:`CopyBatch.documents`). A
:class:`Copy` is made only where one copy is looked at alone: a read-back after a
duplicate, a fresh id after a collision, a backfill.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

import attrs
from bson import ObjectId

from ...model import Activity, FeedItem, stored_item, to_millis

if TYPE_CHECKING:
    from .base import Layout

__all__ = ["Copy", "CopyBatch", "CopyList", "FanBatch", "ItemBatch", "Post"]


@attrs.frozen(slots=True)
class Copy:
    """One copy of an item in one receiver's feed, under its ``id``. ``data`` may be None in a copy a layout read
    back for its identity alone (:meth:`same_as` does not compare it)."""

    id: ObjectId
    receiver_id: int | str
    sender_id: int | str
    event_time: datetime
    type: int | str
    data: Any
    data_key: str

    def same_as(self, other: Copy) -> bool:
        """Is this the same item as *other* (same key, receiver, sender, type and millisecond), whatever its id and
        data? What tells a copy stored by an earlier attempt from another item under the same id."""
        return (self.data_key == other.data_key and self.receiver_id == other.receiver_id
                and self.sender_id == other.sender_id and self.type == other.type
                and to_millis(self.event_time) == to_millis(other.event_time))

    def item(self) -> FeedItem:
        """This copy as a page shows it."""
        return stored_item(self.receiver_id, self.sender_id, self.event_time, self.type, self.data, self.data_key,
                           self.id)


@attrs.frozen(slots=True)
class Post:
    """A post in its author's outbox: the activity under the outbox entry's own ``id``."""

    id: ObjectId
    activity: Activity

    def same_as(self, other: Post) -> bool:
        """The same post (key, sender, type and millisecond), whatever its data."""
        a, b = self.activity, other.activity
        return (a.data_key == b.data_key and a.sender_id == b.sender_id and a.type == b.type
                and to_millis(a.event_time) == to_millis(b.event_time))


class CopyBatch(abc.ABC):
    """Copies to store, by position: ``ids[i]`` is copy *i*'s id (a fresh id after a collision replaces it here).

    Each kind of batch asks the layout for the bulk builder of its shape; a layout that has no faster one
    builds from :class:`Copy` values (:meth:`~router.core.layouts.base.Layout.copy_documents`).
    """

    ids: list[ObjectId]

    def __len__(self) -> int:
        return len(self.ids)

    @abc.abstractmethod
    def copy(self, i: int) -> Copy:
        """Copy *i* as a value."""

    def documents(self, layout: Layout) -> list[Any]:
        """Every copy's stored form in *layout* (one comprehension in the layout, for the hot paths)."""
        return layout.copy_documents([self.copy(i) for i in range(len(self.ids))])


@attrs.define(slots=True)
class ItemBatch(CopyBatch):
    """``write_many``'s copies: the caller's items, each under the id of the same position."""

    items: Sequence[FeedItem]
    ids: list[ObjectId]

    def copy(self, i: int) -> Copy:
        it = self.items[i]
        return Copy(self.ids[i], it.receiver_id, it.sender_id, it.event_time, it.type, it.data, it.data_key)

    def documents(self, layout: Layout) -> list[Any]:
        return layout.item_documents(self.items, self.ids)


@attrs.define(slots=True)
class FanBatch(CopyBatch):
    """One post's copies for many receivers (a fan-out batch): ``ids[i]`` is ``receivers[i]``'s copy; *data* is one
    object every copy shares."""

    ids: list[ObjectId]
    receivers: Sequence[int | str]
    sender_id: int | str
    event_time: datetime
    type: int | str
    data: Any
    data_key: str

    def copy(self, i: int) -> Copy:
        return Copy(self.ids[i], self.receivers[i], self.sender_id, self.event_time, self.type, self.data,
                    self.data_key)

    def documents(self, layout: Layout) -> list[Any]:
        return layout.fan_documents(self)


@attrs.define(slots=True)
class CopyList(CopyBatch):
    """Copies given one by one (a backfill's, or one copy given a fresh id)."""

    copies: list[Copy]
    ids: list[ObjectId] = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self.ids = [c.id for c in self.copies]

    def copy(self, i: int) -> Copy:
        c = self.copies[i]
        return c if c.id == self.ids[i] else attrs.evolve(c, id=self.ids[i])
