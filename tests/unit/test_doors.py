"""The two front doors cannot drift: the same public operations, with the same parameters, on each."""

from __future__ import annotations

import inspect

from router import AsyncFeedRouter, FeedRouter

#: Members that exist on one door only, by design: the async door must be started.
ONLY_ASYNC = {"start"}
#: Plain (not coroutine) methods on both doors: no I/O.
PLAIN = {"prepare"}


def public(cls: type) -> dict[str, object]:
    return {name: member for name, member in vars(cls).items() if not name.startswith("_")}


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


def test_async_door_operations_are_coroutines() -> None:
    """Every operation of AsyncFeedRouter is awaited, except the ones that do no I/O."""
    for name, member in public(AsyncFeedRouter).items():
        if isinstance(member, (property, classmethod)) or name in PLAIN:
            continue
        assert inspect.iscoroutinefunction(member), name
