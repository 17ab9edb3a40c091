"""A judge plugin installed the way a separate distribution would be (for the operator and worker tests)."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from pathlib import Path

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
