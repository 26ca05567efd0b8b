"""URIs that carry secrets: checking MongoDB URIs and broker URLs, and keeping passwords out of text.

Every URI the router prints, logs or raises passes through :func:`redact_uri` or
:func:`masked_uri`. pymongo is imported only inside :func:`uri_problem`, so the config
stays loadable without it.
"""

from __future__ import annotations

import re

__all__ = ["broker_problem", "masked_uri", "redact_uri", "uri_password", "uri_problem"]

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


#: A host as pymongo's split_hosts returns it: a name or IPv4 address, an IPv6 address (brackets
#: removed), or a unix socket path.
_HOST = re.compile(r"^(?:[A-Za-z0-9_~-]+(?:\.[A-Za-z0-9_~-]+)*\.?|[0-9A-Fa-f.]*:[0-9A-Fa-f:.]*(?:%[A-Za-z0-9]+)?|/\S+\.sock)$")


def uri_problem(uri: str) -> str | None:
    """Why pymongo would refuse *uri*, or ``None``: hosts, ports, credentials and every option checked.

    Uses pymongo's own URI parsing functions, without the DNS lookup a ``mongodb+srv://``
    URI needs at connect time, plus a check that host names hold no spaces or other
    characters no host name has. The reason never includes the password.
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
        if not hosts:
            return "it names no host"
        if at:
            parse_userinfo(userinfo)
        nodes = split_hosts(hosts, default_port=None if srv else 27017)
        for host, _port in nodes:
            if not _HOST.match(host):
                return f"host {host!r} is not a host name or address"
        if srv and (len(nodes) != 1 or nodes[0][1] is not None):
            return "a mongodb+srv:// URI names exactly one host and no port"
        if options:
            split_options(options, validate=True, warn=False)
    except (PyMongoError, ValueError, TypeError) as exc:
        text = redact_uri(str(exc))
        return text.replace(password, "***") if password else text
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
