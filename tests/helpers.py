"""Small test helpers shared by suites: waiting on conditions with deadlines, settings builders."""

from __future__ import annotations

import asyncio
import importlib
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import TypeVar

from judgequeue.core.config import Settings, load_settings

T = TypeVar("T")


async def eventually(
    check: Callable[[], Awaitable[T]], *, within: float = 10.0, every: float = 0.02, what: str = "condition"
) -> T:
    """Poll ``check`` until it returns a truthy value or the deadline passes (then fail loudly)."""
    deadline = time.monotonic() + within
    while True:
        last = await check()
        if last:
            return last
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {within}s (last value: {last!r})")
        await asyncio.sleep(every)


def make_settings(pg_dsn: str, redis_url: str, queue: str, **env: str) -> Settings:
    """Settings as a role would load them, with JUDGEQUEUE_<KEY> overrides from keyword arguments."""
    base = {
        "JUDGEQUEUE_POSTGRES_DSN": pg_dsn,
        "JUDGEQUEUE_REDIS_URL": redis_url,
        "JUDGEQUEUE_QUEUE": queue,
    }
    base.update({f"JUDGEQUEUE_{k.upper()}": v for k, v in env.items()})
    return load_settings(base)


PLUGIN_MODULE = '''\
from judgequeue.core.judges import Verdict


class {cls}:
    """A judge plugin installed by the tests, as a separate distribution would be."""

    async def judge(self, payload):
        return Verdict(status="ACCEPTED")
'''


def install_judge_plugin(site: Path, name: str) -> Iterator[None]:
    """Install a judge plugin ``name`` as its own distribution in ``site`` (a dist-info directory with
    an entry point in the ``judgequeue.judges`` group, the way ``pip install`` leaves one) and put
    ``site`` on ``sys.path`` while the generator is suspended (use with ``contextlib.contextmanager``)."""
    module = f"jq_test_plugin_{name}"
    site.mkdir(parents=True, exist_ok=True)
    (site / f"{module}.py").write_text(PLUGIN_MODULE.format(cls="Judge"))
    info = site / f"{module}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[judgequeue.judges]\n{name} = {module}:Judge\n")
    sys.path.insert(0, str(site))
    importlib.invalidate_caches()
    try:
        yield
    finally:
        sys.path.remove(str(site))
        sys.modules.pop(module, None)
        importlib.invalidate_caches()
