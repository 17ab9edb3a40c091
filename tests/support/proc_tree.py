"""Processes under a role process, read from /proc, and one series of a role's /metrics: how the
cancel tests and bench/cancel.py see a sandboxed program start and stop."""

from __future__ import annotations

import os
import re
import urllib.request
from pathlib import Path


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (state first), or None once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def descendants(pid: int) -> list[int]:
    """Every process under ``pid`` (children of children too)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (fields := _stat(int(entry))) is not None:
            children.setdefault(int(fields[1]), []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def cpu_seconds(pid: int) -> float:
    """User plus system CPU seconds ``pid`` has used (0 once it is gone)."""
    fields = _stat(pid)
    return 0.0 if fields is None else (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def alive(pid: int) -> bool:
    """Running (not gone, not a zombie waiting to be reaped)."""
    fields = _stat(pid)
    return fields is not None and fields[0] != "Z"


def spinning_under(pid: int, cpu: float = 0.5) -> int | None:
    """A process under ``pid`` that has burnt at least ``cpu`` seconds of CPU, if any."""
    return next((p for p in descendants(pid) if cpu_seconds(p) >= cpu), None)


def metric(port: int, name: str, queue: str) -> float:
    """``name{queue="..."}`` from the role's /metrics on ``port`` (0 when absent)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    found = re.search(rf'^{name}\{{queue="{re.escape(queue)}"\}} (\S+)$', text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0
