"""A small HTTP/1.1 client on plain asyncio for the ``http-call`` judge: one POST per connection.

Why not a library: the judge needs exactly one request shape (a JSON POST), a hard bound on the
response's size, and prompt cancellation (a rejudge or a lost lease cancels the call: the socket is
closed at once). The standard library's ``http.client`` blocks a thread, and the project serves its
own HTTP the same way (:mod:`judgequeue.core.runtime.http`), so a new dependency would buy little. Redirects
are not followed (an endpoint is a configured URL; a redirect could point anywhere). ``https`` uses
the system's default TLS context.

It never decides what an answer means: :func:`judgequeue.core.judges.http_call.classify` does.
"""

from __future__ import annotations

import asyncio
import base64
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

#: Bytes of status line and headers an answer may have.
MAX_HEAD = 64 * 1024


@dataclass(frozen=True)
class Answer:
    """What the endpoint answered: status, headers (lower-case names) and the whole body."""

    status: int
    headers: Mapping[str, str]
    body: bytes


class CallFailed(Exception):
    """The call got no usable answer. ``kind``: ``connection`` (refused, reset, closed early,
    garbled) or ``too_large`` (the answer is over the size bound)."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind = kind
        self.detail = detail


def check_url(url: str) -> str:
    """``url`` if it is an absolute http(s) URL with a host, else ValueError saying why (pure)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"URL scheme must be http or https, got {parts.scheme or 'none'!r}")
    if not parts.hostname:
        raise ValueError("URL has no host")
    try:
        _ = parts.port
    except ValueError as exc:
        raise ValueError(f"URL port: {exc}") from None
    return url


@dataclass(frozen=True)
class Request:
    """Where to connect and the bytes to send (:func:`request`)."""

    host: str
    port: int
    secure: bool
    data: bytes


def request(url: str, body: bytes, headers: Mapping[str, str]) -> Request:
    """The POST of ``body`` to ``url`` (pure). Credentials in the URL (``https://user:token@host/``,
    as a Secret may hold it) become an ``Authorization: Basic`` header and never reach the wire
    otherwise."""
    parts = urlsplit(url)
    secure = parts.scheme == "https"
    host = parts.hostname or ""
    port = parts.port or (443 if secure else 80)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    netloc = parts.netloc.rpartition("@")[2]
    lines = [f"POST {target} HTTP/1.1", f"Host: {netloc}", f"Content-Length: {len(body)}", "Connection: close"]
    if parts.username is not None:
        user = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
        lines.append("Authorization: Basic " + base64.b64encode(user.encode()).decode("ascii"))
    lines += [f"{name}: {value}" for name, value in headers.items()]
    return Request(host, port, secure, ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)


async def post(url: str, body: bytes, headers: Mapping[str, str], *, max_response: int) -> Answer:
    """POST ``body`` to ``url`` and read the whole answer (at most ``max_response`` body bytes).

    Unbounded in time: the caller wraps it in its deadline. Raises :class:`CallFailed`; its
    messages name the host and port, never the URL (which may hold a secret).
    """
    req = request(url, body, headers)
    try:
        reader, writer = await asyncio.open_connection(
            req.host, req.port, ssl=ssl.create_default_context() if req.secure else None, limit=MAX_HEAD
        )
    except OSError as exc:
        raise CallFailed("connection", f"cannot connect to {req.host}:{req.port}: {exc.strerror or exc}") from None
    try:
        writer.write(req.data)
        await writer.drain()
        return await _read_answer(reader, max_response)
    except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
        raise CallFailed("connection", f"{type(exc).__name__}: {exc}") from None
    finally:
        writer.close()  # also on cancellation: the endpoint sees the call go away


async def _read_answer(reader: asyncio.StreamReader, max_response: int) -> Answer:
    head = await reader.readuntil(b"\r\n\r\n")
    status_line, *header_lines = head[:-4].decode("latin-1").split("\r\n")
    fields = status_line.split(" ", 2)
    if len(fields) < 2 or not fields[0].startswith("HTTP/1.") or not fields[1].isdigit():
        raise CallFailed("connection", f"not an HTTP answer: {status_line[:80]!r}")
    headers: dict[str, str] = {}
    for line in header_lines:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    if "chunked" in headers.get("transfer-encoding", "").lower():
        body = await _read_chunked(reader, max_response)
    elif "content-length" in headers:
        try:
            length = int(headers["content-length"])
        except ValueError:
            raise CallFailed("connection", f"bad Content-Length {headers['content-length']!r}") from None
        if length > max_response:
            raise CallFailed("too_large", f"answer of {length} bytes, over the bound of {max_response} bytes")
        body = await reader.readexactly(length)
    else:
        body = await reader.read(max_response + 1)
        while len(body) <= max_response and (more := await reader.read(max_response + 1 - len(body))):
            body += more
        if len(body) > max_response:
            raise CallFailed("too_large", f"answer over the bound of {max_response} bytes")
    return Answer(int(fields[1]), headers, body)


async def _read_chunked(reader: asyncio.StreamReader, max_response: int) -> bytes:
    body = bytearray()
    while True:
        size_line = await reader.readuntil(b"\r\n")
        try:
            size = int(size_line.split(b";", 1)[0].strip(), 16)
        except ValueError:
            raise CallFailed("connection", f"bad chunk size {size_line[:40]!r}") from None
        if size == 0:
            return bytes(body)  # trailers, if any, are ignored: the connection closes
        if len(body) + size > max_response:
            raise CallFailed("too_large", f"answer over the bound of {max_response} bytes")
        body += await reader.readexactly(size)
        await reader.readexactly(2)
