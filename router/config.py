"""``clusters.yaml``: which clusters exist and how to reach them (every field: docs/operating/clusters-yaml.md).

Pure module (no pymongo). Loading validates the whole file and reports every
problem at once, each as ``clusters.yaml:LINE:COL: path.to.field: what is wrong
(got VALUE)``, in a single :class:`~router.errors.ConfigError`. Strings may use
``${VAR}`` or ``${VAR:-default}``; a variable that is unset (and has no default) is a
config error, so secrets stay in the environment, not the file.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Hashable, Mapping
from datetime import date, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import attrs
import yaml

from .boundaries import period_length_hint
from .errors import ConfigError, ConfigProblem
from .layout_names import DEFAULT as DEFAULT_LAYOUT, LAYOUT_NAMES
from .pushconfig import PushConfig, push_section
from .timemap import ReadWindow
from .uris import (
    broker_problem, deployment_identity, masked_uri, redact_uri, uri_database, uri_password, uri_path, uri_problem,
)
from .yamlreader import YamlReader

__all__ = [
    "CeleryConfig",
    "PushConfig",
    "broker_problem",
    "ClusterConfig",
    "RolloverConfig",
    "RouterConfig",
    "load_config",
    "parse_config",
    "redact_uri",
    "uri_password",
    "uri_problem",
    "parse_duration",
    "DRIVER_OPTIONS",
    "Deployment",
]

#: Driver options a cluster may set, with the type each must have.
DRIVER_OPTIONS: Mapping[str, type | tuple[type, ...]] = {
    "appname": str,
    "authSource": str,
    "authMechanism": str,
    "compressors": str,
    "connectTimeoutMS": int,
    "directConnection": bool,
    "maxIdleTimeMS": int,
    "maxPoolSize": int,
    "minPoolSize": int,
    "password": str,
    "readPreference": str,
    "replicaSet": str,
    "retryReads": bool,
    "retryWrites": bool,
    "serverSelectionTimeoutMS": int,
    "socketTimeoutMS": int,
    "timeoutMS": int,
    "tls": bool,
    "tlsAllowInvalidCertificates": bool,
    "tlsCAFile": str,
    "tlsCertificateKeyFile": str,
    "username": str,
    "w": (int, str),
    "waitQueueTimeoutMS": int,
}

_DATABASE = re.compile(r"^[^/\\. \"$]{1,63}$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_DURATION = re.compile(r"^\s*(\d+)\s*(ms|[smhdw])\s*$")
_UNITS = {"ms": "milliseconds", "s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}
#: The database of every cluster that names none, when the file names none either.
DEFAULT_DATABASE = "feed"
#: ``write.batch_size``'s default: documents per insert of ``write``/``write_many``, and receivers per fan-out batch.
#: Larger batches (up to 25,000, the most FerretDB 2 takes in one command) measured no faster, and make each request
#: longer: docs/performance.md, "Write batches".
WRITE_BATCH_SIZE = 1000
#: What identifies a deployment: its URI and driver options as the driver parses them
#: (:func:`~router.uris.deployment_identity`); it holds the password, so it is never shown.
Deployment = tuple[Hashable, ...]


@attrs.frozen(kw_only=True)
class ClusterConfig:
    """One cluster (one period's home) from ``clusters.yaml``: its name, URI, driver options and database.

    ``database`` is ``None`` for the database named in the URI's path, else the
    top-level ``database`` (:meth:`RouterConfig.database_for` resolves it); one that
    contradicts the URI's path is refused (:class:`ConfigError`). Several clusters may live
    on one deployment, each in a database of its own; they share one client.
    ``repr()`` and :attr:`display_uri` never show the password.
    """

    name: str
    uri: str = attrs.field(repr=lambda u: repr(masked_uri(u)))
    options: Mapping[str, Any] = attrs.field(factory=dict, repr=False)
    database: str | None = None

    def __attrs_post_init__(self) -> None:
        problem = database_problem(self.uri, self.database)
        if problem is not None:
            raise ConfigError([ConfigProblem("<config>", 0, 0, f"clusters[{self.name!r}].database", problem)])

    @property
    def display_uri(self) -> str:
        """The URI safe to print or log."""
        return masked_uri(self.uri)

    @functools.cached_property
    def deployment(self) -> Deployment:
        """The deployment this cluster is on: clusters with equivalent URIs and options share a client
        (see :func:`~router.uris.deployment_identity`)."""
        return deployment_identity(self.uri, self.options)


def database_problem(uri: str, database: str | None) -> str | None:
    """Why *database* cannot be the period's database given *uri*'s path, or ``None``."""
    path = uri_path(uri)
    if path is None:
        return None
    in_path = uri_database(uri)
    if in_path != path or in_path is None or not _DATABASE.match(in_path):
        return f"the URI's path must be a database name, the period's database (got {path!r})"
    if database is not None and database != in_path:
        return (f"contradicts the database in the URI's path ({in_path!r}): name one of them, or the same in both "
                f"(got {database!r})")
    return None


@attrs.frozen(kw_only=True)
class RolloverConfig:
    """When periods end and which clusters take over (used by ``feedrouter rollover`` and the scheduler).

    ``period`` is ``"monthly"``, ``"quarterly"``, ``"yearly"`` or a whole number of days
    or weeks (``"30d"``, ``"2w"``) counted from ``anchor``; boundaries are UTC midnights.
    ``lead_time`` is how long before a boundary the next period is opened; ``standby``
    lists configured clusters kept migrated and empty, with no metadata yet, in the
    order they will be used. ``layout`` is how each new period stores its copies
    (``copies`` or ``buckets``; see :mod:`router.core.layouts`).
    """

    period: str = "monthly"
    lead_time: timedelta = timedelta(days=7)
    standby: tuple[str, ...] = ()
    anchor: datetime = datetime(1970, 1, 1, tzinfo=timezone.utc)
    layout: str = DEFAULT_LAYOUT


@attrs.frozen(kw_only=True)
class CeleryConfig:
    """The ``celery:`` section: the broker that carries fan-out batches to workers, and how they retry.

    ``broker`` is a Celery broker URL (``redis://...``, ``amqp://...``); ``repr()`` and
    :attr:`display_broker` never show its password. ``visibility_timeout`` is how long a
    batch a worker took but did not acknowledge stays invisible before the broker hands it
    out again (Redis and SQS; RabbitMQ redelivers when the worker's connection drops).
    A batch whose cluster failed is tried again ``retries`` times, after ``retry_backoff``
    then twice as long each time (jittered). See :mod:`router.fanout.celery`.
    """

    broker: str = attrs.field(repr=lambda u: repr(masked_uri(u)))
    visibility_timeout: timedelta = timedelta(hours=1)
    retries: int = 3
    retry_backoff: timedelta = timedelta(seconds=5)

    @property
    def display_broker(self) -> str:
        """The broker URL safe to print or log."""
        return masked_uri(self.broker)


@attrs.frozen(kw_only=True)
class RouterConfig:
    """Everything ``clusters.yaml`` says, validated.

    Example::

        config = load_config("clusters.yaml")
        [c.name for c in config.clusters]     # ['cluster_1', 'cluster_2', 'cluster_3']
    """

    clusters: tuple[ClusterConfig, ...]
    database: str = DEFAULT_DATABASE
    feed_collection: str = "feed"
    metadata_collection: str = "metadata"
    read_window: ReadWindow = attrs.field(factory=ReadWindow)
    batch_size: int = WRITE_BATCH_SIZE
    write_retries: int = 2
    retry_backoff: timedelta = timedelta(milliseconds=100)
    on_unavailable: str = "raise"
    max_pull: int = 1000
    max_periods: int | None = None
    pull_threshold: int | None = None
    refresh_interval: timedelta = timedelta(seconds=60)
    timeout: timedelta = timedelta(seconds=10)
    client_idle_close: timedelta = timedelta(minutes=10)
    rollover: RolloverConfig | None = None
    celery: CeleryConfig | None = None
    push: PushConfig | None = None
    #: ``erasure.key``: the secret the erasure records' pseudonyms are keyed with (None: the public default key).
    erasure_key: str | None = attrs.field(default=None, repr=False)
    source: str = "<config>"

    def database_for(self, cluster: str | ClusterConfig) -> str:
        """The database that holds *cluster*'s period: its own ``database``, else the one its URI's path names,
        else the top-level one."""
        spec = next((c for c in self.clusters if c.name == cluster), None) if isinstance(cluster, str) else cluster
        if spec is None:
            return self.database
        return spec.database or uri_database(spec.uri) or self.database


def parse_config(text: str, *, source: str = "clusters.yaml", env: Mapping[str, str] | None = None) -> RouterConfig:
    """Parse and validate ``clusters.yaml`` text; raise :class:`ConfigError` listing every problem."""
    r = YamlReader(source, os.environ if env is None else env)
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line, col = (mark.line + 1, mark.column + 1) if mark is not None else (0, 0)
        raise ConfigError([ConfigProblem(source, line, col, "", f"not valid YAML: {getattr(exc, 'problem', exc)}")]) from None
    except RecursionError:  # PyYAML composes nested nodes recursively
        raise ConfigError([ConfigProblem(source, 0, 0, "", "nested too deeply to be a clusters.yaml")]) from None
    if root is None:
        raise ConfigError([ConfigProblem(source, 0, 0, "", "the file is empty; it needs at least a 'clusters' list")])
    top = r.mapping(
        root, "", {
            "database", "collections", "read_window", "read", "write", "fanout", "refresh_interval", "timeout", "rollover",
            "celery", "clusters", "clients", "erasure", "push",
        }
    )
    if top is None:
        raise ConfigError(r.problems)

    kwargs: dict[str, Any] = {"source": source}
    if "database" in top:
        kwargs["database"] = r.string(top["database"], "database", pattern=_DATABASE, hint="must be a MongoDB database name")
    if "collections" in top:
        cols = r.mapping(top["collections"], "collections", {"feed", "metadata"}) or {}
        for key in ("feed", "metadata"):
            if key in cols:
                kwargs[f"{key}_collection"] = r.string(cols[key], f"collections.{key}", pattern=re.compile(r"^[^$\x00]{1,120}$"), hint="must be a collection name")
        if kwargs.get("feed_collection") and kwargs.get("feed_collection") == kwargs.get("metadata_collection"):
            r.problem(cols.get("metadata"), "collections.metadata", f"must differ from collections.feed (got {kwargs['metadata_collection']!r})")
    if "read_window" in top:
        kwargs["read_window"] = _read_window(r, top["read_window"])
    if "write" in top:
        write = r.mapping(top["write"], "write", {"batch_size", "retries", "retry_backoff"}) or {}
        if "batch_size" in write:
            kwargs["batch_size"] = r.integer(write["batch_size"], "write.batch_size", minimum=1)
        if "retries" in write:
            kwargs["write_retries"] = r.integer(write["retries"], "write.retries", minimum=0)
        if "retry_backoff" in write:
            kwargs["retry_backoff"] = _duration(r, write["retry_backoff"], "write.retry_backoff")
    if "fanout" in top:
        fanout = r.mapping(top["fanout"], "fanout", {"pull_threshold"}) or {}
        if "pull_threshold" in fanout:
            kwargs["pull_threshold"] = r.integer(fanout["pull_threshold"], "fanout.pull_threshold", minimum=1)
    if "read" in top:
        read = r.mapping(top["read"], "read", {"on_unavailable", "max_pull", "max_periods"}) or {}
        if "max_pull" in read:
            kwargs["max_pull"] = r.integer(read["max_pull"], "read.max_pull", minimum=1)
        if "max_periods" in read and r.value(read["max_periods"], "read.max_periods") is not None:
            kwargs["max_periods"] = r.integer(read["max_periods"], "read.max_periods", minimum=1)
        if "on_unavailable" in read:
            policy = r.value(read["on_unavailable"], "read.on_unavailable")
            if policy in ("raise", "partial"):
                kwargs["on_unavailable"] = policy
            else:
                r.problem(read["on_unavailable"], "read.on_unavailable", f"must be raise or partial (got {policy!r})")
    clusters: list[ClusterConfig] = []
    if "clusters" not in top:
        r.problem(root, "clusters", "is required: a list of {name, uri} entries")
    elif not isinstance(top["clusters"], yaml.SequenceNode) or not top["clusters"].value:
        r.problem(top["clusters"], "clusters", f"must be a non-empty list (got {r._show(top['clusters'])})")
    else:
        clusters = _clusters(r, top["clusters"], kwargs.get("database") or DEFAULT_DATABASE)
    if "clients" in top:
        clients = r.mapping(top["clients"], "clients", {"idle_close"}) or {}
        if "idle_close" in clients:
            kwargs["client_idle_close"] = _duration(r, clients["idle_close"], "clients.idle_close")
    if "refresh_interval" in top:
        kwargs["refresh_interval"] = _duration(r, top["refresh_interval"], "refresh_interval")
    if "timeout" in top:
        kwargs["timeout"] = _duration(r, top["timeout"], "timeout")
    if "rollover" in top:
        kwargs["rollover"] = _rollover(r, top["rollover"], {c.name for c in clusters}, bool(clusters))
    if "celery" in top:
        kwargs["celery"] = _celery(r, top["celery"])
    if "erasure" in top:
        kwargs["erasure_key"] = _erasure_key(r, top["erasure"])
    if "push" in top:
        kwargs["push"] = push_section(r, top["push"], _duration)
    if r.problems:
        raise ConfigError(sorted(r.problems, key=lambda p: (p.line, p.column)))
    return RouterConfig(clusters=tuple(clusters), **{k: v for k, v in kwargs.items() if v is not None})


def parse_duration(raw: object) -> timedelta | None:
    """``"90d"``, ``"12h"``, ``"4w"``, ``"30m"``, ``"45s"``, ``"250ms"`` as a positive timedelta, else ``None``."""
    m = _DURATION.match(raw) if isinstance(raw, str) else None
    if m is None or int(m.group(1)) == 0:
        return None
    return timedelta(**{_UNITS[m.group(2)]: int(m.group(1))})


def _duration(r: YamlReader, node: yaml.Node, path: str) -> timedelta | None:
    raw = r.value(node, path)
    value = parse_duration(raw)
    if value is None:
        r.problem(node, path, f"must be a positive duration like 90d, 12h, 4w (got {raw!r})")
    return value


def _rollover(r: YamlReader, node: yaml.Node, names: set[str], check_names: bool) -> RolloverConfig | None:
    spec = r.mapping(node, "rollover", {"period", "lead_time", "standby", "anchor", "layout"})
    if spec is None:
        return None
    kwargs: dict[str, Any] = {}
    length: timedelta | None = period_length_hint("monthly")
    if "period" in spec:
        raw = r.value(spec["period"], "rollover.period")
        try:
            length = period_length_hint(raw.strip() if isinstance(raw, str) else "")
            kwargs["period"] = raw.strip()
        except ValueError:
            r.problem(spec["period"], "rollover.period", f"must be monthly, quarterly, yearly, or days/weeks like 30d, 2w (got {raw!r})")
            length = None
    if "lead_time" in spec:
        lead = _duration(r, spec["lead_time"], "rollover.lead_time")
        if lead is not None and length is not None and lead >= length:
            r.problem(spec["lead_time"], "rollover.lead_time", f"must be shorter than the period (got {r.value(spec['lead_time'], 'rollover.lead_time')!r})")
        elif lead is not None:
            kwargs["lead_time"] = lead
    if "anchor" in spec:
        raw = r.value(spec["anchor"], "rollover.anchor")
        if isinstance(raw, date) and not isinstance(raw, datetime):
            kwargs["anchor"] = datetime(raw.year, raw.month, raw.day, tzinfo=timezone.utc)
        else:
            r.problem(spec["anchor"], "rollover.anchor", f"must be a date like 2024-01-01 (got {raw!r})")
    if "standby" in spec:
        node_list = spec["standby"]
        if not isinstance(node_list, yaml.SequenceNode):
            r.problem(node_list, "rollover.standby", f"must be a list of cluster names (got {r._show(node_list)})")
        else:
            standby: list[str] = []
            for i, item in enumerate(node_list.value):
                name = r.string(item, f"rollover.standby[{i}]")
                if name is None:
                    continue
                if check_names and name not in names:
                    r.problem(item, f"rollover.standby[{i}]", f"must name a cluster listed under clusters (got {name!r})")
                elif name in standby:
                    r.problem(item, f"rollover.standby[{i}]", f"listed twice (got {name!r})")
                else:
                    standby.append(name)
            kwargs["standby"] = tuple(standby)
    if "layout" in spec:
        layout = r.string(spec["layout"], "rollover.layout")
        if layout is not None and layout not in LAYOUT_NAMES:
            r.problem(spec["layout"], "rollover.layout", f"must be one of {', '.join(sorted(LAYOUT_NAMES))} (got {layout!r})")
        elif layout is not None:
            kwargs["layout"] = layout
    return RolloverConfig(**kwargs)


def _celery(r: YamlReader, node: yaml.Node) -> CeleryConfig | None:
    spec = r.mapping(node, "celery", {"broker", "visibility_timeout", "retries", "retry_backoff"})
    if spec is None:
        return None
    broker = None
    if "broker" not in spec:
        r.problem(node, "celery.broker", "is required: a Celery broker URL like redis://host:6379/0")
    else:
        raw = r.value(spec["broker"], "celery.broker")
        problem = broker_problem(raw)
        if problem is None:
            broker = raw
        elif isinstance(spec["broker"], yaml.ScalarNode):
            r.problem(spec["broker"], "celery.broker", problem)
    kwargs: dict[str, Any] = {}
    if "visibility_timeout" in spec:
        kwargs["visibility_timeout"] = _duration(r, spec["visibility_timeout"], "celery.visibility_timeout")
    if "retries" in spec:
        kwargs["retries"] = r.integer(spec["retries"], "celery.retries", minimum=0)
    if "retry_backoff" in spec:
        kwargs["retry_backoff"] = _duration(r, spec["retry_backoff"], "celery.retry_backoff")
    if broker is None:
        return None
    return CeleryConfig(broker=broker, **{k: v for k, v in kwargs.items() if v is not None})


#: The length an ``erasure.key`` must have, in UTF-8 bytes (BLAKE2b takes keys of up to 64).
ERASURE_KEY_BYTES = (16, 64)


def _erasure_key(r: YamlReader, node: yaml.Node) -> str | None:
    """``erasure.key``: a secret of 16 to 64 bytes; never shown in a problem (only its length)."""
    spec = r.mapping(node, "erasure", {"key"}, secret=True)
    if spec is None or "key" not in spec:
        if spec is not None:
            r.problem(node, "erasure.key", "is required in an erasure section: a secret of 16 to 64 bytes")
        return None
    value = r.value(spec["key"], "erasure.key")
    low, high = ERASURE_KEY_BYTES
    size = len(value.encode("utf-8", "surrogatepass")) if isinstance(value, str) else None
    if size is None or not low <= size <= high:
        got = f"{size} bytes" if size is not None else f"a {type(value).__name__}"
        r.problem(spec["key"], "erasure.key", f"must be a string of {low} to {high} bytes, kept secret (got {got})")
        return None
    return str(value)


def _read_window(r: YamlReader, node: yaml.Node) -> ReadWindow | None:
    spec = r.mapping(node, "read_window", {"clusters", "max_age"})
    if spec is None:
        return None
    clusters = r.integer(spec["clusters"], "read_window.clusters", minimum=1) if "clusters" in spec else None
    max_age = _duration(r, spec["max_age"], "read_window.max_age") if "max_age" in spec else None
    return ReadWindow(clusters=clusters, max_age=max_age)


def _clusters(r: YamlReader, node: yaml.SequenceNode, default_database: str) -> list[ClusterConfig]:
    out: list[ClusterConfig] = []
    names: dict[str, str] = {}
    homes: dict[tuple[Deployment, str], str] = {}
    for i, item in enumerate(node.value):
        path = f"clusters[{i}]"
        spec = r.mapping(item, path, {"name", "uri", "options", "database"})
        if spec is None:
            continue
        for required in ("name", "uri"):
            if required not in spec:
                r.problem(item, f"{path}.{required}", "is required")
        name = r.string(spec["name"], f"{path}.name", pattern=_NAME, hint="must be 1-64 letters, digits, '_', '.' or '-'") if "name" in spec else None
        uri = None
        if "uri" in spec:
            uri = r.string(spec["uri"], f"{path}.uri")
            if uri is not None and not uri.startswith(("mongodb://", "mongodb+srv://")):
                r.problem(spec["uri"], f"{path}.uri", f"must be a mongodb:// or mongodb+srv:// URI (got {masked_uri(uri)!r})")
                uri = None
            elif uri is not None:
                reason = uri_problem(uri)
                if reason is not None:
                    r.problem(spec["uri"], f"{path}.uri", f"not a valid MongoDB URI: {reason} (got {masked_uri(uri)!r})")
                    uri = None
        options = _options(r, spec["options"], f"{path}.options") if "options" in spec else {}
        database = None
        if "database" in spec:
            database = r.string(spec["database"], f"{path}.database", pattern=_DATABASE, hint="must be a MongoDB database name")
        if name is not None:
            if name in names:
                r.problem(spec["name"], f"{path}.name", f"duplicate cluster name, already used by {names[name]} (got {name!r})")
            names.setdefault(name, path)
        if uri is not None and database is not None:
            problem = database_problem(uri, database)
            if problem is not None:
                r.problem(spec["database"], f"{path}.database", problem)
                continue
        elif uri is not None and "database" not in spec:
            problem = database_problem(uri, None)
            if problem is not None:
                r.problem(spec["uri"], f"{path}.uri", problem)
                continue
        if uri is not None and (database is not None or "database" not in spec):
            cluster = ClusterConfig(name=name or "", uri=uri, options=options, database=database)
            home = (cluster.deployment, database or uri_database(uri) or default_database)
            if home in homes:
                r.problem(
                    spec["uri"], f"{path}.uri", f"same deployment and database as {homes[home]}: give one of them a database "
                    f"of its own (got {masked_uri(uri)!r}, database {home[1]!r})"
                )
            homes.setdefault(home, path)
            if name is not None:
                out.append(attrs.evolve(cluster, name=name))
    return out


def _options(r: YamlReader, node: yaml.Node, path: str) -> dict[str, Any]:
    spec = r.mapping(node, path, set(DRIVER_OPTIONS)) or {}
    out: dict[str, Any] = {}
    for key, value_node in spec.items():
        value = r.value(value_node, f"{path}.{key}")
        expected = DRIVER_OPTIONS[key]
        ok = isinstance(value, expected) and not (isinstance(value, bool) and expected is int)
        if not ok:
            kinds = " or ".join(t.__name__ for t in (expected if isinstance(expected, tuple) else (expected,)))
            shown = "***" if key == "password" else repr(value)
            r.problem(value_node, f"{path}.{key}", f"must be {kinds} (got {shown})")
        elif isinstance(value, int) and not isinstance(value, bool) and value < 0:
            r.problem(value_node, f"{path}.{key}", f"must not be negative (got {value!r})")
        else:
            out[key] = value
    return out


def load_config(path: str | Path, *, env: Mapping[str, str] | None = None) -> RouterConfig:
    """Read and validate the file at *path*; raise :class:`ConfigError` listing every problem."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError([ConfigProblem(str(p), 0, 0, "", f"cannot read the file: {exc.strerror}")]) from None
    except UnicodeDecodeError as exc:
        raise ConfigError([ConfigProblem(str(p), 0, 0, "", f"not UTF-8 text: {exc.reason}")]) from None
    return parse_config(text, source=str(p), env=env)

