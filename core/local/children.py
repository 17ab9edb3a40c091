"""The roles ``judgequeue local`` runs, as child processes in their own session, stopped in order."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

#: A child that runs ``judgequeue worker`` in the shadow lane (``spec.worker.shadow``).
SHADOW_WORKER = "shadow-worker"


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Linux: the child gets SIGTERM if ``judgequeue local`` itself dies without cleaning up."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


@dataclass
class Child:
    role: str
    index: int
    process: subprocess.Popen[bytes]
    log_path: Path
    log_file: IO[bytes] = field(repr=False)

    @property
    def label(self) -> str:
        return f"{self.role}-{self.index}"

    def tail(self, lines: int = 5) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join("    " + line for line in text[-lines:])


def start_children(plan: Sequence[str], env_for: Any, log_dir: Path) -> list[Child]:
    children: list[Child] = []
    seen: dict[str, int] = {}
    for role in plan:
        index = seen.get(role, 0)
        seen[role] = index + 1
        log_path = log_dir / f"{role}-{index}.log"
        log_file = log_path.open("wb")
        process = subprocess.Popen(
            [sys.executable, "-m", "judgequeue.core.cli", "worker" if role == SHADOW_WORKER else role],
            env=env_for(len(children)),
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
        )
        children.append(Child(role, index, process, log_path, log_file))
    return children


def stopped_summary(codes: Mapping[str, int]) -> tuple[bool, str]:
    """Whether the roles stopped cleanly, and the line that says how (pure). A role that ended by the
    SIGTERM it was sent got it before its first handler (``catch_early_signals``, once the command
    line is read): it was stopped while starting, which loses nothing; any other non-zero exit is a
    failure."""
    starting = sorted(label for label, code in codes.items() if code == -signal.SIGTERM)
    bad = {label: code for label, code in codes.items() if code not in (0, -signal.SIGTERM)}
    line = "all roles stopped" + (f"; non-zero exits: {bad}" if bad else " cleanly")
    if starting:
        line += f" ({', '.join(starting)} still starting, ended by the SIGTERM)"
    return not bad, line


async def stop_children(children: Sequence[Child], grace: float) -> dict[str, int]:
    """SIGTERM every child (workers first, so they release work while others still run), then wait."""
    order = sorted(children, key=lambda c: {"worker": 0, SHADOW_WORKER: 0, "dispatcher": 1, "reaper": 2}[c.role])
    for child in order:
        if child.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                child.process.send_signal(signal.SIGTERM)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + grace
    for child in order:
        with contextlib.suppress(subprocess.TimeoutExpired):
            await asyncio.to_thread(child.process.wait, max(0.0, deadline - loop.time()))
    for child in children:
        if child.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                child.process.kill()
            child.process.wait()
        child.log_file.close()
    return {c.label: int(c.process.returncode) for c in children}
