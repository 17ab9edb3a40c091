"""A slow HTTP endpoint on this process's event loop that counts its concurrent calls.

Every POST takes ``delay`` seconds and answers ``200 {"ok": true}``. The server records how many
calls are in progress at each instant, the most ever at once, the time-weighted mean of that count
over any window, and the calls per ``Idempotency-Key``: what the endpoints' fleet-wide bound is
judged by (tests/process/test_endpoint_flow.py, bench/endpoints.py).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager


class CountingServer:
    """See the module. :attr:`url` once :func:`counting_server` has started it."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.url = ""
        self.now = 0
        self.peak = 0
        self.calls: Counter[str] = Counter()
        self.starts: list[float] = []
        #: When each ``Idempotency-Key``'s calls began (monotonic), in order.
        self.started: dict[str, list[float]] = {}
        #: (monotonic time, calls in progress from then on), one per change.
        self.steps: list[tuple[float, int]] = [(time.monotonic(), 0)]

    def _step(self, change: int) -> None:
        self.now += change
        self.peak = max(self.peak, self.now)
        self.steps.append((time.monotonic(), self.now))

    def mean_between(self, start: float, end: float) -> float:
        """The time-weighted mean of the calls in progress between ``start`` and ``end`` (monotonic)."""
        if end <= start:
            return 0.0
        area = 0.0
        for (at, count), (until, _) in zip(self.steps, [*self.steps[1:], (float("inf"), 0)], strict=True):
            lo, hi = max(at, start), min(until, end)
            if hi > lo:
                area += count * (hi - lo)
        return area / (end - start)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        counted = False
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            headers = {
                name.strip().lower(): value.strip()
                for name, _, value in (line.partition(":") for line in head.decode("latin-1").split("\r\n")[1:])
            }
            await reader.readexactly(int(headers.get("content-length", "0")))
            key = headers.get("idempotency-key", "")
            self.calls[key] += 1
            self.starts.append(time.monotonic())
            self.started.setdefault(key, []).append(self.starts[-1])
            self._step(+1)
            counted = True
            gone = asyncio.ensure_future(reader.read(1))  # the caller closing early (a cancelled call)
            done, _ = await asyncio.wait({gone}, timeout=self.delay)  # the endpoint's work
            gone.cancel()
            if done:
                return
            body = json.dumps({"ok": True}).encode()
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
                + f"Content-Length: {len(body)}\r\n\r\n".encode() + body
            )
            await writer.drain()
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
            pass  # the caller went away (a cancelled call, a killed worker)
        finally:
            if counted:
                self._step(-1)
            writer.close()


@asynccontextmanager
async def counting_server(delay: float) -> AsyncIterator[CountingServer]:
    """A :class:`CountingServer` listening on a free loopback port for the block's duration."""
    counter = CountingServer(delay)
    server = await asyncio.start_server(counter._serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    counter.url = f"http://127.0.0.1:{port}/call"
    try:
        yield counter
    finally:
        server.close()
        await server.wait_closed()
