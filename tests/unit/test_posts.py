"""The posts registry without a server: the documents a write registers, and the pages its readers take."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

from bson.int64 import Int64

from router.core.layouts import posts
from router.core.steps import Insert
from router.model import FeedItem
from router.testing.scripted import ScriptedStore, run_alone

UTC = timezone.utc
T = datetime(2024, 5, 4, 12, 30, 15, 250000, tzinfo=UTC)


def item(sender: Any, key: str, minutes: int = 0, receiver: int = 1) -> FeedItem:
    return FeedItem(receiver_id=receiver, sender_id=sender, event_time=T + timedelta(minutes=minutes), type=1,
                    data={}, data_key=key)


def test_a_write_registers_one_document_per_sender_each_post_once_at_its_first_time() -> None:
    """Items of two senders, posts repeated for several receivers: a document per sender listing its posts once each,
    at the time of the post's first item, in the items' order; an Int64 sender is the int's user, a str id another."""
    items = [item(7, "a", 5), item(7, "a", 1, receiver=2), item("7", "a", 3), item(Int64(7), "b", 2), item(7, "c", 0)]
    entries = posts.of_items(items)
    assert [(e.sender_id, list(e.keys), [t - T for t in e.times]) for e in entries] == [
        (7, ["a", "b", "c"], [timedelta(minutes=5), timedelta(minutes=2), timedelta(0)]),
        ("7", ["a"], [timedelta(minutes=3)]),
    ]
    assert len({e.id for e in entries + posts.of_items(items)}) == 4  # written again: new documents, no duplicate
    doc = posts.REGISTRY.documents(entries[:1])[0]
    assert doc["event_time"] == T and doc["n"] == 3 and doc["keys"] == ["a", "b", "c"] and doc["sender_id"] == 7
    assert [type(e.sender_id) for e in posts.of_items([item(Int64(2**40), "a"), item(2**40, "b")])] == [int]  # identity


def test_a_sender_with_more_posts_than_a_document_lists_gets_several() -> None:
    """KEYS posts to a document: a write of 2.5 times as many posts of one sender registers three documents."""
    entries = posts.of_items([item(7, f"k{i}") for i in range(posts.KEYS * 5 // 2)])
    assert [len(e.keys) for e in entries] == [posts.KEYS, posts.KEYS, posts.KEYS // 2]
    assert len({k for e in entries for k in e.keys}) == posts.KEYS * 5 // 2


def register(store: ScriptedStore, entries: list[posts.Entry]) -> None:
    request = posts.REGISTRY.store("c", posts.REGISTRY.documents(entries), 0.0)
    assert isinstance(request, Insert)
    store.answer(request)


def test_a_page_takes_about_keys_posts_however_the_documents_were_cut() -> None:
    """Documents of 1, 300 and 300 posts and one of the old shape: pages of whole documents, at most KEYS posts
    unless one document alone lists more; each (time, key) once; the sizes are asked first."""
    store = ScriptedStore()
    register(store, [posts.Registered(7, "one", T).entry()])
    register(store, posts.of_items([item(7, f"a{i}", 1) for i in range(300)] + [item(7, "one", 1)]))
    register(store, posts.of_items([item(7, f"b{i}", 2) for i in range(300)]))
    store.docs("c", "posts")["0:old"] = {"_id": "0:old", "sender_id": 7, "data_key": "old", "event_time": T}
    register(store, [posts.Registered(8, "other", T).entry()])
    seen: list[tuple[datetime, str]] = []
    pages = []
    while True:
        page, sent = run_alone(posts.page("c", 7, 0.0), store)
        if not page.ids:
            break
        assert [r.projection is not None for r in sent] == [True, False]  # the sizes, then the posts that fit
        pages.append(len(page.posts))
        seen += page.posts
        store.answer(posts.remove("c", 7, page.ids, 0.0))
    assert pages == [302, 301]  # 1 + 301, then 300 + 1: a third document would pass KEYS
    assert len(seen) == len(set(seen)) == 603
    assert [p for p in seen if p[1] == "one"] == [(T, "one"), (T + timedelta(minutes=1), "one")]
    assert [d["sender_id"] for d in store.docs("c", "posts").values()] == [8]  # the other sender's is left


def test_an_ordered_page_continues_after_the_last_document_it_took() -> None:
    """Oldest first by each document's earliest time: the pages' positions walk every document once."""
    store = ScriptedStore()
    for n in range(4):
        register(store, posts.of_items([item(7, f"{n}-{i}", 10 * n + i) for i in range(posts.KEYS // 2 + 1)]))
    after = None
    walked: list[str] = []
    while True:
        page, _sent = run_alone(posts.page("c", 7, 0.0, after=after, ordered=True), store)
        walked += page.ids
        if page.after is None:
            break
        after = page.after
    assert len(walked) == 4 == len(set(walked))


def test_a_sweep_removes_the_documents_of_one_swept_post_alone() -> None:
    """After an erasure's sweep of posts a and b: the documents listing a or b alone (of either shape, an Int64
    sender's too) go; a document listing a with another post, another post's and another sender's stay."""
    store = ScriptedStore()
    register(store, [posts.Registered(7, "a", T).entry(), posts.Registered(Int64(7), "b", T).entry()])
    register(store, posts.of_items([item(7, "a"), item(7, "c")]) + posts.of_items([item(7, "d")]))
    register(store, [posts.Registered(8, "a", T).entry()])
    store.docs("c", "posts")["0:old"] = {"_id": "0:old", "sender_id": 7, "data_key": "b", "event_time": T}
    removed = store.answer(posts.remove_alone("c", Int64(7), ["a", "b"], 0.0))
    assert removed == 3
    assert sorted((d["sender_id"], d["keys"]) for d in store.docs("c", "posts").values()) == [
        (7, ["a", "c"]), (7, ["d"]), (8, ["a"])]
