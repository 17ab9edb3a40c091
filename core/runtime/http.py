"""The one HTTP port every role serves: ``/metrics``, ``/healthz`` and ``/readyz``.

A deliberately small HTTP/1.1 server on plain asyncio (one request per connection): it keeps the
idle footprint of a role low and has nothing to configure. ``/readyz`` calls a readiness function
that must be cheap; the server bounds it with a timeout anyway and answers 503 when it runs over.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest

log = logging.getLogger("judgequeue.http")


@dataclass(frozen=True)
class Readiness:
    """The result of a readiness check: overall verdict and one line per dependency."""

    ready: bool
    checks: dict[str, str] = field(default_factory=dict)


ReadinessCheck = Callable[[], Awaitable[Readiness]]

_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed", 503: "Service Unavailable"}


async def _always_ready() -> Readiness:
    return Readiness(True, {})


class HealthServer:
    """Serves metrics and probes on ``host:port`` (port 0 picks a free port; see :attr:`port`)."""

    def __init__(
        self,
        port: int,
        readiness: ReadinessCheck = _always_ready,
        *,
        host: str = "0.0.0.0",
        readiness_timeout: float = 2.0,
        registry: CollectorRegistry = REGISTRY,
    ) -> None:
        self._host = host
        self._requested_port = port
        self._readiness = readiness
        self._readiness_timeout = readiness_timeout
        self._registry = registry
        self._server: asyncio.Server | None = None
        self.port = port

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, self._host, self._requested_port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            try:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=5.0)
            except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
                return
            request_line = head.split(b"\r\n", 1)[0].decode("latin-1")
            parts = request_line.split()
            if len(parts) != 3:
                status, ctype, body = 400, "text/plain", b"bad request\n"
            else:
                status, ctype, body = await self.respond(parts[0], parts[1].split("?", 1)[0])
            head_only = len(parts) == 3 and parts[0] == "HEAD"
            writer.write(
                f"HTTP/1.1 {status} {_REASONS.get(status, 'OK')}\r\n"
                f"Content-Type: {ctype}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                + (b"" if head_only else body)
            )
            await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()

    async def respond(self, method: str, path: str) -> tuple[int, str, bytes]:
        """Status, content type and body for one request."""
        if method not in ("GET", "HEAD"):
            return 405, "text/plain", b"method not allowed\n"
        if path == "/metrics":
            return 200, CONTENT_TYPE_LATEST, generate_latest(self._registry)
        if path == "/healthz":
            return 200, "text/plain", b"ok\n"
        if path == "/readyz":
            try:
                result = await asyncio.wait_for(self._readiness(), timeout=self._readiness_timeout)
            except TimeoutError:
                result = Readiness(False, {"readiness": f"check took longer than {self._readiness_timeout}s"})
            except Exception as exc:  # a failing probe must answer, not crash the server
                result = Readiness(False, {"readiness": f"check failed: {type(exc).__name__}"})
            body = json.dumps({"ready": result.ready, "checks": result.checks}).encode() + b"\n"
            return (200 if result.ready else 503), "application/json", body
        return 404, "text/plain", b"not found\n"
