"""What ``judgequeue local`` shows while it runs: one progress line, redrawn in place."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from typing import IO

import asyncpg
import redis.asyncio as aioredis

from ..base.states import VERDICTS
from ..status import Figures, gather
from ..store import submissions


@dataclass(frozen=True)
class Progress:
    figures: Figures
    verdicts: dict[str, int]
    throughput: float  # verdicts per second over the last few seconds (DB clock)


def progress_line(p: Progress, children_alive: int, children_total: int) -> str:
    """One line of the live display. Pure."""
    f = p.figures
    verdicts = "  ".join(f"{k}={v}" for k, v in sorted(p.verdicts.items()) if k in VERDICTS) or "none yet"
    judging = p.verdicts.get("JUDGING", 0)
    stream = f"lag {f.lag if f.lag is not None else '-'}  pel {f.pel if f.pel is not None else '-'}"
    return (
        f"backlog {f.backlog}  judging {judging}  {stream}  {p.throughput:.1f} verdicts/s  "
        f"roles {children_alive}/{children_total}  | {verdicts}"
    )


async def read_progress(conn: asyncpg.Connection, client: aioredis.Redis, queue: str, window: float = 5.0) -> Progress:
    figures = await gather(conn, client, queue, redis_timeout=2.0)
    counts = await submissions.count_by_status(conn, queue)
    recent = await submissions.finished_since(conn, queue, window)
    return Progress(figures, counts, recent / window)


class Display:
    """A live status line on a terminal; on a pipe, a line whenever the figures change."""

    def __init__(self, stream: IO[str], enabled: bool = True) -> None:
        self._stream = stream
        self._tty = stream.isatty()
        self._enabled = enabled
        self._last = ""

    def show(self, line: str) -> None:
        if not self._enabled or line == self._last:
            return
        self._last = line
        if self._tty:  # one line, never wrapped, so the carriage return redraws it in place
            width = shutil.get_terminal_size().columns - 1
            self._stream.write("\r\x1b[K" + line[:width])
        else:
            self._stream.write(line + "\n")
        self._stream.flush()

    def say(self, text: str) -> None:
        if self._tty and self._last:
            self._stream.write("\r\x1b[K")
            self._last = ""
        self._stream.write(text + "\n")
        self._stream.flush()

    def end(self) -> None:
        if self._tty and self._last:
            self._stream.write("\n")
            self._stream.flush()
        self._last = ""
