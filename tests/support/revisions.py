"""Another revision's code, importable as ``judgequeue`` beside this tree's: its core and controllers.

The benchmarks run a reference revision's roles on the schema that revision made; the schema test
builds databases the way an earlier version of judgequeue left them. ``git archive`` into /tmp: the
repository and its worktrees are left untouched. Nothing here imports pytest.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[2]
JUDGEQUEUE = str(Path(sys.executable).with_name("judgequeue"))

# Runs the revision's own migration runner, every migration one by one (its `replay`), as on a
# database that lived through each version.
_REPLAY = """
import asyncio, sys
import asyncpg
from judgequeue.core.migrate import migrate

async def main() -> None:
    conn = await asyncpg.connect(sys.argv[1])
    try:
        await migrate(conn, replay=True)
    finally:
        await conn.close()

asyncio.run(main())
"""


def ref_tree(rev: str) -> str:
    """A copy of ``rev``'s core and controllers importable as ``judgequeue`` (put it first on PYTHONPATH)."""
    commit = subprocess.run(
        ["git", "rev-parse", "--short", rev], capture_output=True, text=True, check=True, cwd=REPOSITORY
    )
    root = Path(f"/tmp/jq-bench-ref-{commit.stdout.strip()}")
    if not root.exists():
        # Extracted beside it and renamed into place: a run killed mid-extract leaves no half tree
        # that a later run would take for the revision.
        partial = Path(tempfile.mkdtemp(prefix=f"{root.name}-", dir=root.parent))
        (partial / "judgequeue").mkdir()
        archive = subprocess.run(
            ["git", "archive", rev, "core", "controllers"], capture_output=True, check=True, cwd=REPOSITORY
        )
        subprocess.run(["tar", "-x", "-C", str(partial / "judgequeue")], input=archive.stdout, check=True)
        try:
            partial.rename(root)
        except OSError:  # another run put it in place first
            shutil.rmtree(partial)
    return str(root)


def migrate_as(dsn: str, pythonpath: str, *, replay: bool = False) -> None:
    """Migrate ``dsn`` with the runner and migrations of the tree at ``pythonpath``.

    ``replay``: run each of that tree's migrations in turn instead of its schema file (a runner that
    had one); otherwise ``judgequeue migrate`` as that version's users ran it.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("JUDGEQUEUE_")}
    env.update({"PYTHONPATH": pythonpath, "JUDGEQUEUE_POSTGRES_DSN": dsn})
    command = [sys.executable, "-c", _REPLAY, dsn] if replay else [JUDGEQUEUE, "migrate"]
    subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL)
