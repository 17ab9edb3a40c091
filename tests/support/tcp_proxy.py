"""A TCP proxy a test puts between the roles and a server, to cut or stall connections at will."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct

from tests.support.redis_servers import free_port


class TcpProxy:
    """Forwards 127.0.0.1:<port> to an upstream; ``cut()`` drops every connection, ``reset()`` aborts them
    with a TCP RST, ``stall()`` freezes them."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.port = free_port()
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._flowing = asyncio.Event()
        self._flowing.set()
        self.connections = 0

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        self.cut()
        if self._server is not None:
            await self._server.wait_closed()

    def cut(self) -> None:
        """Close every open connection in both directions (new ones are still accepted)."""
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()

    def reset(self) -> None:
        """Abort every open connection with a TCP RST in both directions (new ones are still accepted).

        ``SO_LINGER`` with a zero timeout makes the close send RST instead of FIN, so each peer sees
        ``ECONNRESET`` (what a middlebox or a crashed host does), not an orderly end of stream.
        """
        for writer in list(self._writers):
            sock = writer.transport.get_extra_info("socket")
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()
        self._writers.clear()

    def stall(self, stalled: bool) -> None:
        """Stop (or resume) forwarding bytes; connections stay open but silent."""
        if stalled:
            self._flowing.clear()
        else:
            self._flowing.set()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            writer.transport.abort()
            return
        self._writers.update((writer, up_writer))
        await asyncio.gather(self._pump(reader, up_writer), self._pump(up_reader, writer), return_exceptions=True)
        for w in (writer, up_writer):
            self._writers.discard(w)
            w.transport.abort()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while True:
                data = await reader.read(65536)
                if not data:
                    break
                await self._flowing.wait()
                writer.write(data)
                await writer.drain()
        writer.transport.abort()
