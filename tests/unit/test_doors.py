"""The two front doors cannot drift: the same public operations, with the same parameters, return types, overloads
and docstrings, on each."""

from __future__ import annotations

import inspect
import re
import typing
from typing import Any

import pytest

from router import AsyncFeedRouter, FeedRouter

#: Members that exist on one door only, by design: the async door must be started.
ONLY_ASYNC = {"start"}
#: Plain (not coroutine) methods on both doors: no I/O (``subscribe`` checks its arguments; its first wait subscribes).
PLAIN = {"prepare", "subscribe"}
#: What the async door calls the sync door's types (the rest of an annotation must read the same).
ASYNC_NAMES = {"AsyncFeedRouter": "FeedRouter", "AsyncFanOutHandle": "FanOutHandle", "AsyncClusters": "Clusters",
               "AsyncFanOutExecutor": "FanOutExecutor", "AsyncSubscription": "Subscription"}


def public(cls: type) -> dict[str, object]:
    """The door's public members as defined, its base's (the calls in flight, the map, its refresh) included."""
    members: dict[str, object] = {}
    for klass in reversed(cls.__mro__[:-1]):
        members.update((name, member) for name, member in vars(klass).items() if not name.startswith("_"))
    return members


def shared() -> list[str]:
    return sorted(public(FeedRouter))


def function(member: object) -> Any:
    """The function behind a member (a property's getter, a classmethod's function)."""
    if isinstance(member, property):
        return member.fget
    return getattr(member, "__func__", member)


def mapped(annotation: object) -> str:
    """An annotation as text, the async door's type names read as the sync door's."""
    text = annotation if isinstance(annotation, str) else inspect.formatannotation(annotation)
    return re.sub(r"\b(" + "|".join(ASYNC_NAMES) + r")\b", lambda m: ASYNC_NAMES[m.group(1)], text)


def test_same_operations_on_both_doors() -> None:
    """Every public method and property of FeedRouter exists on AsyncFeedRouter, and the reverse."""
    assert set(public(FeedRouter)) == set(public(AsyncFeedRouter)) - ONLY_ASYNC


def test_same_parameters_on_both_doors() -> None:
    """Each operation takes the same parameters, with the same defaults and kinds, on both doors."""
    for name, sync_member in public(FeedRouter).items():
        async_member = public(AsyncFeedRouter)[name]
        if isinstance(sync_member, property):
            assert isinstance(async_member, property), name
            continue
        if isinstance(sync_member, classmethod):
            assert isinstance(async_member, classmethod), name
            sync_member, async_member = sync_member.__func__, async_member.__func__  # type: ignore[union-attr]
        sync_sig = inspect.signature(sync_member)  # type: ignore[arg-type]
        async_sig = inspect.signature(async_member)  # type: ignore[arg-type]
        strip = [(p.name, p.kind, p.default) for p in sync_sig.parameters.values()]
        assert strip == [(p.name, p.kind, p.default) for p in async_sig.parameters.values()], name


@pytest.mark.parametrize("name", shared())
def test_same_return_types_on_both_doors(name: str) -> None:
    """Each operation returns the same type on both doors (what the async door's coroutine returns), the async
    door's own classes read as the sync door's (AsyncFanOutHandle as FanOutHandle, ...)."""
    sync_fn, async_fn = function(public(FeedRouter)[name]), function(public(AsyncFeedRouter)[name])
    sync_ret = inspect.signature(sync_fn).return_annotation
    async_ret = inspect.signature(async_fn).return_annotation
    assert sync_ret is not inspect.Signature.empty, f"FeedRouter.{name} has no return annotation"
    assert mapped(async_ret) == mapped(sync_ret), name


@pytest.mark.parametrize("name", shared())
def test_same_overloads_on_both_doors(name: str) -> None:
    """An operation overloaded on one door is overloaded alike on the other: the same parameters (names, kinds) and
    the same return type for each overload, in order."""
    def shapes(fn: Any) -> list[tuple[list[tuple[str, Any, str]], str]]:
        return [([(p.name, p.kind, mapped(p.annotation) if p.name == "background" else "") for p in
                  inspect.signature(o).parameters.values()], mapped(inspect.signature(o).return_annotation))
                for o in typing.get_overloads(fn)]

    sync_fn, async_fn = function(public(FeedRouter)[name]), function(public(AsyncFeedRouter)[name])
    assert shapes(async_fn) == shapes(sync_fn), name


@pytest.mark.parametrize("name", shared())
def test_both_doors_document_each_member(name: str) -> None:
    """Each public member has a real docstring on both doors (what help() shows), not a pointer to the other door."""
    for door in (FeedRouter, AsyncFeedRouter):
        doc = inspect.getdoc(function(public(door)[name])) or ""
        assert doc.strip(), f"{door.__name__}.{name} has no docstring"
        assert not re.search(r"\bsee ``?(Async)?FeedRouter\.", doc, re.I), f"{door.__name__}.{name} points elsewhere: {doc!r:.120}"


#: Members documented for their own door: how each is built, connected and closed, and what it holds.
OWN_TEXT = {"from_yaml", "close", "stop_refresh", "timemap", "routing", "refreshed_at", "clusters", "fanouts"}


def unawaited(doc: str) -> str:
    """An async docstring read as the sync door's: its examples' awaits taken out."""
    return re.sub(r"\(await ([^()]*\([^()]*\))\)", r"\1", doc).replace("await ", "")


@pytest.mark.parametrize("name", sorted(set(shared()) - OWN_TEXT))
def test_both_doors_say_the_same_of_each_operation(name: str) -> None:
    """An operation's docstring is the same text on both doors: the async door's is the sync door's with its examples
    awaited, and may add what is the async door's own after it (an async iterable of receivers, ...)."""
    sync_doc = inspect.getdoc(function(public(FeedRouter)[name])) or ""
    async_doc = inspect.getdoc(function(public(AsyncFeedRouter)[name])) or ""
    assert unawaited(async_doc).startswith(sync_doc), name
    assert ("feeds." in sync_doc) == ("await feeds." in async_doc), name


def test_async_door_operations_are_coroutines() -> None:
    """Every operation of AsyncFeedRouter is awaited, except the ones that do no I/O."""
    for name, member in public(AsyncFeedRouter).items():
        if isinstance(member, (property, classmethod)) or name in PLAIN:
            continue
        assert inspect.iscoroutinefunction(member), name


def test_the_subscriptions_are_twins() -> None:
    """Subscription and AsyncSubscription (the twin pair subscribe returns): the same public members, parameters and
    docstrings (the async one's waits awaited), the async one's waits coroutines."""
    from router import AsyncSubscription, Subscription

    sync_members, async_members = public(Subscription), public(AsyncSubscription)
    assert set(sync_members) == set(async_members)
    for name, member in sync_members.items():
        other = async_members[name]
        if isinstance(member, property):
            assert isinstance(other, property), name
            continue
        assert ([(p.name, p.kind, p.default) for p in inspect.signature(member).parameters.values()]  # type: ignore[arg-type]
                == [(p.name, p.kind, p.default) for p in inspect.signature(other).parameters.values()]), name  # type: ignore[arg-type]
        assert inspect.iscoroutinefunction(other), name
        assert unawaited(inspect.getdoc(other) or "").startswith(inspect.getdoc(member) or "-"), name
