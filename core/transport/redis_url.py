"""Redis connection URLs, parsed in one place: a plain server, or a master found through Sentinel.

Plain servers use redis-py's own forms (``redis://``, ``rediss://``, ``unix://``). A Sentinel-managed
master is named by::

    redis+sentinel://[[user]:password@]host:port[,host:port...]/<master-name>[/<db>][?sentinel_password=...]

The hosts are the sentinels (at least one; list them all so any may be down); ``master-name`` is the
name they monitor (``sentinel monitor <master-name> ...``); ``db`` defaults to 0. The user and
password in the URL authenticate to the master (and replicas); ``sentinel_password`` authenticates to
the sentinels when they require it. This module imports nothing heavy so configuration validation
stays cheap; :mod:`judgequeue.core.transport.connect` turns a parsed URL into a client.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import parse_qs, unquote, urlsplit

SENTINEL_SCHEME = "redis+sentinel"
PLAIN_SCHEMES = ("redis", "rediss", "unix")
_MASTER_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


@dataclass(frozen=True)
class SentinelTarget:
    """Where to find a Sentinel-managed master and how to authenticate."""

    sentinels: tuple[tuple[str, int], ...]
    master: str
    db: int = 0
    username: str | None = None
    password: str | None = None
    sentinel_password: str | None = None


def is_sentinel_url(url: str) -> bool:
    return url.startswith(SENTINEL_SCHEME + "://")


def _host_port(text: str) -> tuple[str, int]:
    if text.startswith("["):  # [ipv6]:port
        host, sep, rest = text[1:].partition("]")
        port_text = rest.removeprefix(":") if sep else ""
    else:
        host, _, port_text = text.rpartition(":")
        if not host:
            host, port_text = text, ""
    if not host:
        raise ValueError(f"sentinel address {text!r} has no host")
    port = 26379
    if port_text:
        if not port_text.isdigit() or not 0 < int(port_text) < 65536:
            raise ValueError(f"sentinel address {text!r} has a bad port")
        port = int(port_text)
    return host, port


def parse_sentinel_url(url: str) -> SentinelTarget:
    """Parse a ``redis+sentinel://`` URL; ValueError says what is wrong (never echoing a password)."""
    parts = urlsplit(url)
    if parts.scheme != SENTINEL_SCHEME:
        raise ValueError(f"a Sentinel URL starts with {SENTINEL_SCHEME}://")
    userinfo, _, hosts = parts.netloc.rpartition("@")
    if not hosts:
        raise ValueError("a Sentinel URL needs at least one sentinel host:port")
    sentinels = tuple(_host_port(h) for h in hosts.split(",") if h)
    if not sentinels:
        raise ValueError("a Sentinel URL needs at least one sentinel host:port")
    path = [unquote(p) for p in parts.path.split("/") if p]
    if not path or not _MASTER_NAME.match(path[0]):
        raise ValueError("a Sentinel URL names its master: redis+sentinel://host:port,.../<master-name>[/<db>]")
    if len(path) > 2 or (len(path) == 2 and not path[1].isdigit()):
        raise ValueError("after the master name a Sentinel URL takes only a database number")
    username = password = None
    if userinfo:
        user, has_password, secret = userinfo.partition(":")
        username = unquote(user) or None
        password = unquote(secret) if has_password else None
    query = parse_qs(parts.query, keep_blank_values=True)
    unknown = set(query) - {"sentinel_password"}
    if unknown:
        raise ValueError(f"unknown Sentinel URL option(s) {sorted(unknown)} (known: sentinel_password)")
    sentinel_password = query.get("sentinel_password", [None])[-1] or None
    return SentinelTarget(
        sentinels=sentinels,
        master=path[0],
        db=int(path[1]) if len(path) == 2 else 0,
        username=username,
        password=password,
        sentinel_password=sentinel_password,
    )


def validate_redis_url(text: str) -> str:
    """Accept a plain Redis URL or a well-formed Sentinel URL (ValueError otherwise)."""
    if is_sentinel_url(text):
        parse_sentinel_url(text)
        return text
    if not text.startswith(tuple(s + "://" for s in PLAIN_SCHEMES)):
        raise ValueError(
            "must be a redis://, rediss://, unix:// or redis+sentinel://host:port,.../<master-name>[/<db>] URL"
        )
    if not text.startswith("unix://"):
        # What redis-py would refuse only when it first connects (a role's first command, the
        # operator's backlog read), said now. Only the part after the credentials is quoted.
        hostport = urlsplit(text).netloc.rpartition("@")[2]
        if hostport.startswith("["):
            port_text = hostport.partition("]")[2].removeprefix(":")
        else:
            port_text = hostport.rpartition(":")[2] if ":" in hostport else ""
        if port_text and (not port_text.isdigit() or not 0 < int(port_text) < 65536):
            raise ValueError(f"has a bad port {port_text!r} (a number from 1 to 65535)")
    return text
