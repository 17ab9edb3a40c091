"""The example tool server (examples/agent/tool_server.py) as a child process, and a raw answer server.

:class:`ToolServer` runs the example a newcomer runs, on a free loopback port, and reads its effect
counts (``GET /effects``). :class:`RawServer` answers every POST with fixed bytes chosen by path, for
answers the example never gives (not JSON, too large).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import urllib.request
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "agent" / "tool_server.py"


class ToolServer:
    """``python examples/agent/tool_server.py --port 0 ARGS``; :attr:`url` once it listens."""

    def __init__(self, *args: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, str(EXAMPLE), "--port", "0", *args], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline().decode()  # it prints this line once it serves
        if not line.startswith("listening on "):
            self.close()
            raise AssertionError(f"tool server did not start: {line!r}")
        self.url = line.removeprefix("listening on ").strip()

    def effects(self) -> dict[str, dict[str, int]]:
        with urllib.request.urlopen(self.url + "/effects", timeout=5) as response:
            doc: dict[str, dict[str, int]] = json.loads(response.read())
        return doc

    async def aeffects(self) -> dict[str, dict[str, int]]:
        return await asyncio.to_thread(self.effects)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()


@contextlib.contextmanager
def tool_server(*args: str) -> Any:
    server = ToolServer(*args)
    try:
        yield server
    finally:
        server.close()


class RawServer:
    """Answers ``POST /<name>`` with ``answers[name]`` (a whole HTTP answer, bytes) and closes."""

    def __init__(self, answers: Mapping[str, bytes]) -> None:
        self.answers = answers
        self.url = ""
        self._server: asyncio.Server | None = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            path = head.split(b" ", 2)[1].decode().strip("/")
            lines = head.split(b"\r\n")
            length = next((int(x.split(b":", 1)[1]) for x in lines if x.lower().startswith(b"content-length")), 0)
            await reader.readexactly(length)
            writer.write(self.answers[path])
            await writer.drain()
        finally:
            writer.close()

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[RawServer]:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        try:
            yield self
        finally:
            self._server.close()
            await self._server.wait_closed()


def http_answer(status: int, body: bytes, content_type: str = "application/json") -> bytes:
    """A whole HTTP/1.1 answer with a Content-Length."""
    return (
        f"HTTP/1.1 {status} X\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    ).encode() + body
