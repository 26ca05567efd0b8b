"""The ``push:`` section of ``clusters.yaml``: the Redis that carries live feeds, and their bounds.

Pure module (no client). :func:`push_section` is called by :func:`router.config.parse_config`;
its problems are collected with the rest of the file's. Every field is on the clusters.yaml
page of the docs, and what each does on the "Live feeds" page.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import attrs
import yaml

from .uris import masked_uri
from .yamlreader import YamlReader

__all__ = ["PushConfig", "push_section"]

_REDIS = re.compile(r"^(rediss?|unix)://\S+$")
_PREFIX = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")
#: The most items one catch-up hands out before it says ``Resync("too_far")`` instead.
MAX_CATCH_UP = 10_000


@attrs.frozen(kw_only=True)
class PushConfig:
    """Live feeds (:mod:`router.live`): the Redis URL (``redis://``, ``rediss://`` or ``unix://``; ``repr()`` and
    :attr:`display_redis` never show its password), the prefix of its keys and channels, how long a subscriber's
    presence lasts unless renewed, each subscriber's backlog, the most items one catch-up hands out, and
    ``timeout``, the longest a write waits on Redis (to connect, then for the answer)."""

    redis: str = attrs.field(repr=lambda u: repr(masked_uri(u)))
    prefix: str = "feedrouter"
    presence_ttl: timedelta = timedelta(seconds=30)
    queue: int = 1000
    catch_up: int = 1000
    timeout: timedelta = timedelta(milliseconds=100)

    @property
    def display_redis(self) -> str:
        """The Redis URL safe to print or log."""
        return masked_uri(self.redis)


def push_section(r: YamlReader, node: yaml.Node,
                 duration: Callable[[YamlReader, yaml.Node, str], timedelta | None]) -> PushConfig | None:
    """The ``push:`` section at *node* (problems go to *r*; *duration* reads a duration field as the rest of the file
    does), or None when it has a problem."""
    spec = r.mapping(node, "push", {"redis", "prefix", "presence_ttl", "queue", "catch_up", "timeout"})
    if spec is None:
        return None
    url = None
    if "redis" not in spec:
        r.problem(node, "push.redis", "is required: a Redis URL like redis://:${REDIS_PASSWORD}@host:6379/0")
    else:
        raw = r.value(spec["redis"], "push.redis")
        if isinstance(raw, str) and _REDIS.match(raw):
            url = raw
        else:
            shown = masked_uri(raw) if isinstance(raw, str) else raw
            r.problem(spec["redis"], "push.redis", f"must be a redis://, rediss:// or unix:// URL (got {shown!r})")
    kwargs: dict[str, Any] = {}
    if "prefix" in spec:
        kwargs["prefix"] = r.string(spec["prefix"], "push.prefix", pattern=_PREFIX,
                                    hint="must be 1-64 letters, digits, '_', '.', ':' or '-'")
    for field in ("presence_ttl", "timeout"):
        if field in spec:
            kwargs[field] = duration(r, spec[field], f"push.{field}")
    if "queue" in spec:
        kwargs["queue"] = r.integer(spec["queue"], "push.queue", minimum=1)
    if "catch_up" in spec:
        value = r.integer(spec["catch_up"], "push.catch_up", minimum=1)
        if value is not None and value > MAX_CATCH_UP:
            r.problem(spec["catch_up"], "push.catch_up", f"must be at most {MAX_CATCH_UP} (got {value})")
            value = None
        kwargs["catch_up"] = value
    ttl = kwargs.get("presence_ttl")
    if ttl is not None and ttl < timedelta(seconds=3):
        r.problem(spec["presence_ttl"], "push.presence_ttl", f"must be at least 3s (got {r.value(spec['presence_ttl'], 'push.presence_ttl')!r})")
        kwargs["presence_ttl"] = None
    if url is None:
        return None
    return PushConfig(redis=url, **{k: v for k, v in kwargs.items() if v is not None})
