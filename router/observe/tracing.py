"""OpenTelemetry spans for the router's calls and for each request to a cluster; nothing when not asked for.

A door (or a Celery app, :func:`router.fanout.celery.make_app`) given ``tracer_provider=``
(``opentelemetry.trace.get_tracer_provider()`` for the global one) opens a span per public call
(``feedrouter.write_many``, ``feedrouter.read`` ...) and, inside it, one per request to a
cluster (``feedrouter.find.feed`` ...) with the attribute ``feedrouter.cluster``. Spans
are context managers on contextvars, so they nest across ``asyncio.gather`` and across the
sync door's thread pools (which copy the context into each thread).

Example::

    from opentelemetry.sdk.trace import TracerProvider
    feeds = FeedRouter.from_yaml("clusters.yaml", tracer_provider=TracerProvider())
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Any

__all__ = ["NO_TRACING", "Tracing"]


class Tracing:
    """Makes spans through an OpenTelemetry tracer, or does nothing (``tracer`` None)."""

    def __init__(self, tracer_provider: Any = None) -> None:
        self._tracer: Any = None
        if tracer_provider is not None:
            self._tracer = tracer_provider.get_tracer("feed-router")

    @property
    def enabled(self) -> bool:
        """True when spans are made."""
        return self._tracer is not None

    def span(self, name: str, *, cluster: str | None = None, op: str | None = None) -> AbstractContextManager[Any]:
        """A span named *name* (with the cluster and op as attributes), or nothing: a context manager that does
        nothing, shared (a page asks for one per call and one per request; an unused one costs no generator)."""
        if self._tracer is None:
            return _NO_SPAN
        attributes: dict[str, str] = {}
        if cluster is not None:
            attributes["feedrouter.cluster"] = cluster
        if op is not None:
            attributes["feedrouter.op"] = op
        return self._tracer.start_as_current_span(name, attributes=attributes)  # type: ignore[no-any-return]


_NO_SPAN: AbstractContextManager[Any] = nullcontext()


#: Spans off.
NO_TRACING = Tracing()
