"""Another revision's code, importable as ``judgequeue`` beside this tree's: its core and controllers
(or its whole tree, to build and install it as a release).

The benchmarks run a reference revision's roles on the schema that revision made; the schema and
upgrade tests build databases the way an earlier version of judgequeue left them, run its roles,
and read what every earlier revision shipped (:func:`shipped`). ``git archive`` into /tmp: the
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
# database that lived through each version. The runner stood at core/migrate.py before the layers
# had folders, at core/store/migrate.py since.
_REPLAY = """
import asyncio, sys
import asyncpg
try:
    from judgequeue.core.store.migrate import migrate
except ImportError:
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
    return str(_extracted(rev, "jq-bench-ref", ("core", "controllers"), into="judgequeue"))


def source_tree(rev: str) -> Path:
    """``rev``'s whole tree as ``git archive`` gives it (its README, chart, Dockerfile and scripts): a
    release as its users had it, to build its image and install its chart from."""
    return _extracted(rev, "jq-tree", ())


def _extracted(rev: str, prefix: str, paths: tuple[str, ...], *, into: str = "") -> Path:
    """``paths`` of ``rev`` (all of it when empty) extracted once into /tmp/<prefix>-<commit>/<into>."""
    commit = subprocess.run(
        ["git", "rev-parse", "--short", rev], capture_output=True, text=True, check=True, cwd=REPOSITORY
    )
    root = Path(f"/tmp/{prefix}-{commit.stdout.strip()}")
    if not root.exists():
        # Extracted beside it and renamed into place: a run killed mid-extract leaves no half tree
        # that a later run would take for the revision.
        partial = Path(tempfile.mkdtemp(prefix=f"{root.name}-", dir=root.parent))
        (partial / into).mkdir(exist_ok=True)
        archive = subprocess.run(["git", "archive", rev, *paths], capture_output=True, check=True, cwd=REPOSITORY)
        subprocess.run(["tar", "-x", "-C", str(partial / into)], input=archive.stdout, check=True)
        try:
            partial.rename(root)
        except OSError:  # another run put it in place first
            shutil.rmtree(partial)
    return root


def _git(*args: str, stdin: bytes | None = None) -> bytes:
    return subprocess.run(["git", *args], input=stdin, capture_output=True, check=True, cwd=REPOSITORY).stdout


def shipped(path: str, rev: str = "HEAD") -> dict[str, set[str]]:
    """Every text a file under ``path`` had in ``rev`` or a commit of main before it, by file path."""
    # --first-parent: main's own commits (a merged branch's commits were never main's state; its
    # merge is, with what it brought).
    log = _git("log", rev, "--first-parent", "--format=", "--raw", "--no-abbrev", "--no-renames", "--root", "-m",
               "--", path)
    blobs: dict[str, set[str]] = {}
    for line in log.decode().splitlines():
        meta, _, name = line.partition("\t")
        blob = meta.split()[3]
        if blob.strip("0"):  # not a deletion
            blobs.setdefault(blob, set()).add(name)
    texts = _blobs(sorted(blobs))
    found: dict[str, set[str]] = {}
    for blob, names in blobs.items():
        for name in names:
            found.setdefault(name, set()).add(texts[blob])
    return found


def shipped_where_absent(path: str, absent: str, rev: str = "HEAD") -> set[str]:
    """Every text ``path`` had in a commit (``rev`` or before it) that had no file ``absent``."""
    commits = _git("rev-list", "--first-parent", rev).decode().split()
    asked = "".join(f"{c}:{p}\n" for c in commits for p in (path, absent)).encode()
    answers = _git("cat-file", "--batch-check=%(objectname)", stdin=asked).decode().splitlines()
    pairs = zip(answers[0::2], answers[1::2], strict=True)
    blobs = {have for have, lacks in pairs if not have.endswith(" missing") and lacks.endswith(" missing")}
    return set(_blobs(sorted(blobs)).values())


def _blobs(ids: list[str]) -> dict[str, str]:
    """The texts of these blobs, in one ``git cat-file --batch``."""
    out = _git("cat-file", "--batch", stdin="".join(f"{i}\n" for i in ids).encode())
    texts: dict[str, str] = {}
    at = 0
    for blob in ids:
        header_end = out.index(b"\n", at)
        size = int(out[at:header_end].split()[2])
        texts[blob] = out[header_end + 1 : header_end + 1 + size].decode()
        at = header_end + 1 + size + 1
    return texts


def migrate_as(dsn: str, pythonpath: str, *, replay: bool = False) -> None:
    """Migrate ``dsn`` with the runner and migrations of the tree at ``pythonpath``.

    ``replay``: run each of that tree's migrations in turn instead of its schema file (a runner that
    had one); otherwise ``judgequeue migrate`` as that version's users ran it.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("JUDGEQUEUE_")}
    env.update({"PYTHONPATH": pythonpath, "JUDGEQUEUE_POSTGRES_DSN": dsn})
    command = [sys.executable, "-c", _REPLAY, dsn] if replay else [JUDGEQUEUE, "migrate"]
    subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL)
