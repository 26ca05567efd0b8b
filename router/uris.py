"""URIs that carry secrets: checking MongoDB URIs and broker URLs, and keeping passwords out of text.

Every URI the router prints, logs or raises passes through :func:`redact_uri` or
:func:`masked_uri`. pymongo is imported only inside :func:`uri_problem`, so the config
stays loadable without it.
"""

from __future__ import annotations

import re
from collections.abc import Hashable, Mapping
from typing import Any

__all__ = [
    "broker_problem", "deployment_identity", "masked_uri", "redact_uri", "uri_database", "uri_password", "uri_path",
    "uri_problem",
]

# scheme://user:password@ -- the password runs to the last "@" before the host part.
_SECRET = re.compile(r"(?i)([a-z][a-z0-9+.-]*://[^:@/\s'\"]*):[^\s'\"]*@(?=[^@\s'\"]*(?:[\s'\"]|$))")


def uri_password(uri: str) -> str | None:
    """The password in *uri*'s ``user:password@`` part, read by position (quotes and spaces included)."""
    start = uri.find("://")
    if start < 0:
        return None
    rest = uri[start + 3 :]
    authority = rest.split("/", 1)[0]
    at = authority.rfind("@")
    userinfo = authority[:at] if at >= 0 else ""
    return userinfo.split(":", 1)[1] if ":" in userinfo else None


def uri_path(uri: str) -> str | None:
    """*uri*'s path, unquoted (``mongodb://h/feed_x`` gives ``feed_x``), or ``None``."""
    from urllib.parse import unquote_plus

    path = uri.split("://", 1)[-1].partition("?")[0].partition("/")[2]
    return unquote_plus(path) if path else None


def uri_database(uri: str) -> str | None:
    """The database named in *uri*'s path, as pymongo reads it (``db.coll`` names database ``db``), or ``None``."""
    path = uri_path(uri)
    return path.partition(".")[0] if path else None


def deployment_identity(uri: str, options: Mapping[str, Any]) -> tuple[Hashable, ...]:
    """What makes two cluster entries one deployment for a client: *uri* and *options* as the driver reads them.

    The scheme; the hosts as ``(host, port)`` pairs, lower-cased, with the default port
    filled in, in any order; the credentials; and every driver option, from the URI's
    query or from *options* (which win, as they do for ``MongoClient``), by its
    case-insensitive internal name and its validated value (``maxpoolsize=5`` in the URI
    and ``maxPoolSize: 5`` under ``options`` are the same). The authentication database
    is counted where credentials are given (the URI path is its default). A URI pymongo
    cannot parse is its own identity. Never shown: it holds the password.
    """
    from pymongo import common
    from pymongo.errors import PyMongoError
    from pymongo.uri_parser import parse_userinfo, split_hosts, split_options

    scheme, _, rest = uri.partition("://")
    head, _, query = rest.partition("?")
    hostinfo, _, path = head.partition("/")
    userinfo, at, hosts = hostinfo.rpartition("@")
    try:
        merged: dict[str, Any] = {}
        if at:
            merged["username"], merged["password"] = parse_userinfo(userinfo)
        nodes = sorted(split_hosts(hosts, default_port=None if scheme == "mongodb+srv" else 27017), key=repr)
        if query:
            merged.update((key.lower(), value) for key, value in split_options(query, validate=True, warn=False).items())
        for key, value in options.items():
            try:
                value = common.validate(key, value)[1]
            except (PyMongoError, ValueError, TypeError):  # the client refuses it when it is made
                pass
            merged[common.INTERNAL_URI_OPTION_NAME_MAP.get(key.lower(), key.lower())] = value
    except (PyMongoError, ValueError, TypeError):
        return (uri, tuple(sorted((k, _hashable(v)) for k, v in options.items())))
    if merged.get("username") is not None and "authsource" not in merged:
        merged["authsource"] = uri_database(uri) or "admin"
    return (scheme, tuple(nodes), tuple(sorted((k, _hashable(v)) for k, v in merged.items())))


def _hashable(value: Any) -> Hashable:
    """An option's value as a key part (event listeners and other objects by identity)."""
    if isinstance(value, (list, tuple)):
        return tuple(_hashable(v) for v in value)
    try:
        hash(value)
    except TypeError:
        return id(value)
    return value  # type: ignore[no-any-return]


#: A host as pymongo's split_hosts returns it: a name or IPv4 address, an IPv6 address (brackets
#: removed), or a unix socket path.
_HOST = re.compile(r"^(?:[A-Za-z0-9_~-]+(?:\.[A-Za-z0-9_~-]+)*\.?|[0-9A-Fa-f.]*:[0-9A-Fa-f:.]*(?:%[A-Za-z0-9]+)?|/\S+\.sock)$")


def uri_problem(uri: str) -> str | None:
    """Why pymongo would refuse *uri*, or ``None``: hosts, ports, credentials and every option checked.

    The common mistakes (no host, a bad port, an unknown option, a bad option value) get the
    router's own words, naming what was wrong, whatever pymongo's version says; pymongo's
    own parsing functions then check the rest, without the DNS lookup a ``mongodb+srv://``
    URI needs at connect time. The reason never includes the password.
    """
    from pymongo.errors import PyMongoError
    from pymongo.uri_parser import parse_userinfo, split_hosts, split_options

    srv = uri.startswith("mongodb+srv://")
    rest = uri.split("://", 1)[1]
    hosts_part, _, options = rest.partition("?")
    hosts_part = hosts_part.split("/", 1)[0]
    userinfo, at, hosts = hosts_part.rpartition("@")
    password = uri_password(uri)
    try:
        problem = _hosts_problem(hosts) or (_options_problem(options) if options else None)
        if problem is None:
            if at:
                parse_userinfo(userinfo)
            nodes = split_hosts(hosts, default_port=None if srv else 27017)
            if srv and (len(nodes) != 1 or nodes[0][1] is not None):
                problem = "a mongodb+srv:// URI names exactly one host and no port"
            elif options:
                split_options(options, validate=True, warn=False)
    except (PyMongoError, ValueError, TypeError) as exc:
        problem = str(exc)
    if problem is None:
        return None
    problem = redact_uri(problem)
    return problem.replace(password, "***") if password else problem


def _hosts_problem(hosts: str) -> str | None:
    """The first host or port in the URI's host list that no server could have, in the router's words."""
    if not hosts:
        return "it names no host"
    from urllib.parse import unquote_plus

    for entry in hosts.split(","):
        host, port = entry, ""
        if entry.endswith(".sock"):
            host = unquote_plus(entry)
        elif entry.startswith("["):  # [IPv6]:port
            host, _, tail = entry[1:].partition("]")
            port = tail[1:] if tail.startswith(":") else ""
        elif entry.count(":") == 1:
            host, port = entry.split(":")
        if port and not (port.isdigit() and 0 < int(port) <= 65535):
            return f"port {port!r} of host {host!r} must be a number from 1 to 65535"
        if not _HOST.match(host):
            return f"host {host!r} is not a host name or address"
    return None


def _options_problem(options: str) -> str | None:
    """The first unknown option or bad option value in the URI's ``?key=value&...`` part, in the router's words."""
    from urllib.parse import unquote_plus

    from pymongo import common

    known = {k.lower() for k in (*common.URI_OPTIONS_VALIDATOR_MAP, *common.URI_OPTIONS_ALIAS_MAP)}
    known |= {k.lower() for aliases in common.URI_OPTIONS_ALIAS_MAP.values() for k in aliases}
    known |= {k.lower() for k in common.URI_OPTIONS_DEPRECATION_MAP}
    for pair in re.split("[&;]", options):
        key, eq, value = pair.partition("=")
        if not eq or not key:
            return f"URI options are key=value pairs (got {pair!r})"
        if key.lower() not in known:
            return f"unknown URI option {key!r}"
        if key.lower() in ("readpreferencetags", "authmechanismproperties"):
            continue  # structured values: pymongo's own parser checks them with the rest
        try:
            common.validate(key, unquote_plus(value))
        except (ValueError, TypeError) as exc:
            return f"URI option {key!r} has a bad value {value!r} ({exc})"
    return None


def redact_uri(text: str) -> str:
    """*text* with the password of every ``scheme://user:password@host`` in it replaced by ``***``.

    Works on a bare URI and on any message that contains URIs; user names and
    hosts are kept. Used for every URI the router prints, logs or raises.
    """
    return _SECRET.sub(r"\1:***@", text)


def masked_uri(uri: str) -> str:
    """*uri* with its password shown as ``***``, however odd the password; for reprs and messages."""
    password = uri_password(uri)
    return redact_uri(uri.replace(f":{password}@", ":***@", 1) if password else uri)


_BROKER = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://\S*$")


def broker_problem(url: object) -> str | None:
    """Why *url* is not a Celery broker URL, or ``None``; the reason never shows a password."""
    if isinstance(url, str) and _BROKER.match(url):
        return None
    shown = url
    if isinstance(url, str):  # not a URL, but whatever precedes an "@" may still be a password
        shown = masked_uri(url) if "://" in url else ("***@" + url.rpartition("@")[2] if "@" in url else url)
    return f"must be a broker URL like redis://host:6379/0 or amqp://user:password@host:5672// (got {shown!r})"
