"""A webhook receiver of the tests' own (aiohttp): it checks each delivery's signature, counts
deliveries per ``Idempotency-Key``, applies each key's effect once (a scoreboard: per submission,
the verdict of the highest generation seen), and can be told to be down, to answer 503 or 429
with ``Retry-After``, or to hold a request unanswered (to kill the sender mid-POST)."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web


@dataclass
class Receiver:
    secret: bytes
    port: int = 0
    #: What the next requests get: a list of (status, retry_after) consumed one per request, then 200.
    script: list[tuple[int, int | None]] = field(default_factory=list)
    #: While set, requests are applied and then held unanswered until :attr:`release` is set.
    hold: bool = False
    deliveries: Counter[str] = field(default_factory=Counter)
    applied: Counter[str] = field(default_factory=Counter)
    #: submission -> (generation, status): the scoreboard the effects build.
    board: dict[int, tuple[int, str]] = field(default_factory=dict)
    #: every delivery in arrival order: (submission, generation)
    arrivals: list[tuple[int, int]] = field(default_factory=list)
    bad_signatures: int = 0
    answered: Counter[int] = field(default_factory=Counter)
    held: int = 0
    inflight: int = 0
    max_inflight: int = 0

    def __post_init__(self) -> None:
        self.release = asyncio.Event()
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/hook", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port, reuse_address=True)
        await site.start()
        if self.port == 0:
            server = site._server  # the port the OS picked
            assert server is not None
            self.port = server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]

    async def stop(self) -> None:
        """Down: the port refuses connections until :meth:`start` again."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def verified(self, body: bytes, header: str) -> bool:
        parts = dict(p.split("=", 1) for p in header.split(",") if "=" in p)
        mac = hmac.new(self.secret, parts.get("t", "").encode() + b"." + body, hashlib.sha256).hexdigest()
        return hmac.compare_digest(mac, parts.get("v1", ""))

    async def _handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        if not self.verified(body, request.headers.get("Judgequeue-Signature", "")):
            self.bad_signatures += 1
            return web.Response(status=401)
        if self.script:
            status, retry_after = self.script.pop(0)
            self.answered[status] += 1
            headers = {"Retry-After": str(retry_after)} if retry_after is not None else {}
            return web.Response(status=status, headers=headers)
        key = request.headers["Idempotency-Key"]
        event: dict[str, Any] = json.loads(body)
        assert key == f"{event['queue']}:{event['submission']}:{event['generation']}"
        self.inflight += 1
        self.max_inflight = max(self.max_inflight, self.inflight)
        try:
            self.deliveries[key] += 1
            self.arrivals.append((event["submission"], event["generation"]))
            if self.deliveries[key] == 1:  # the effect, once per key, fenced on generation
                self.applied[key] += 1
                current = self.board.get(event["submission"])
                if current is None or event["generation"] > current[0]:
                    self.board[event["submission"]] = (event["generation"], event["status"])
            if self.hold:
                self.held += 1
                await self.release.wait()
            await asyncio.sleep(0)  # let concurrent deliveries overlap as they would
            self.answered[200] += 1
            return web.Response(status=200, text="ok")
        finally:
            self.inflight -= 1
