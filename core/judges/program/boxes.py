"""Where this worker's boxes live: a uid range claimed by a lock file, the directories and cgroups of
each slot, and the small file operations a box's directory needs (written without following a link,
read with a bound).

A worker process claims one of :data:`RANGES` uid ranges (the kernel drops the lock when it dies,
so a free range holds only a crashed worker's leftovers, which are removed). Each slot is one
concurrent submission: its uid, its directory and groups, and its helpers' directories and groups.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import os
import shutil
import socket
import stat
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from ...base.errors import ConfigError
from ..sandbox import BOX, Isolation
from ..sandbox.cgroups import BoxGroup, Roots, box_group, remove_stale
from ..sandbox.isolation import SANDBOX_DIR_VAR
from ..sandbox.lane import Lane
from .problem import HELPER_LIMITS

UID_BASE = 200_000  # box uids: UID_BASE + range * slots + slot, nobody else's on a judge host
RANGES = 64  # worker processes that may share one host (each holds one range by a lock file)
#: What of a Kattis output validator's feedback directory is read (each file, at most).
FEEDBACK_MAX = 128 * 1024


def write_bytes(path: str, data: bytes) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def read_bounded(path: str, limit: int = HELPER_LIMITS.file_size) -> bytes:
    """A file a helper wrote (never following a link it made), at most ``limit`` bytes; b"" if none."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return b""
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            return b""
        return f.read(limit)


def read_feedback(directory: str) -> dict[str, bytes]:
    """The files a Kattis validator left in its feedback directory, each cut at FEEDBACK_MAX."""
    try:
        names = sorted(os.listdir(directory))[:16]
    except OSError:
        return {}
    return {name: read_bounded(os.path.join(directory, name), FEEDBACK_MAX) for name in names}


async def read_data(data: bytes | Path) -> bytes:
    return data if isinstance(data, bytes) else await asyncio.to_thread(data.read_bytes)


def claim_range(sandbox_dir: str) -> tuple[int, int]:
    """Lock one uid range for this worker process: (range, lock fd). The kernel drops the lock
    when the process dies, so a range whose lock is free holds only a crashed worker's leftovers."""
    locks = os.path.join(sandbox_dir, "locks")
    os.makedirs(locks, mode=0o700, exist_ok=True)
    for n in range(RANGES):
        fd = os.open(os.path.join(locks, f"{n}.lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        return n, fd
    raise RuntimeError(f"all {RANGES} sandbox uid ranges under {sandbox_dir} are in use")


def untraversable(path: str) -> str | None:
    """The first directory on ``path`` that other users cannot enter (box uids must reach their box)."""
    current = os.path.abspath(path)
    while True:
        if os.path.exists(current) and not os.stat(current).st_mode & stat.S_IXOTH:
            return current
        parent = os.path.dirname(current)
        if parent == current:
            return None
        current = parent


@dataclass
class Box:
    """One submission's place: its uid, its directory and groups, and its helpers' directories and
    groups, which the submission's runs never see: the interactor's (or a Kattis validator's, both
    run with a writable directory) and the checker's."""

    uid: int
    dir: str
    group: BoxGroup | None
    helper_dir: str
    helper_group: BoxGroup | None
    tests: Lane  # the submission's test runs: one box for all (a session) or armed ahead (groups -a and -b)
    checks: Lane  # the custom checker's runs, one per test, alike (groups -ca and -cb)
    check_dir: str = ""


class Boxes:
    """This worker's slots: ``slots`` boxes, each a uid of the claimed range with its directories and
    groups. Construction refuses a sandbox directory box uids cannot enter, claims a uid range and
    removes whatever a crashed worker left in it. ``runner``: the box runner's interpreter, for one
    box per submission (None: a box per test)."""

    def __init__(
        self, root: str, isolation: Isolation, roots: Roots | None, slots: int, runner: str | None = None
    ) -> None:
        self.root = root
        self.isolation = isolation
        self.roots = roots
        self.runner = runner
        os.makedirs(root, mode=0o711, exist_ok=True)
        os.chmod(root, 0o711)
        closed = untraversable(root) if self.isolation.mode == "full" else None
        if closed:
            raise ConfigError(f"{SANDBOX_DIR_VAR}={root!r}: box uids cannot enter {closed} (it needs o+x)")
        self.range, self._lock_fd = claim_range(root)
        # The cgroup tree is the whole host's (a node's, under Kubernetes) while ranges are only unique
        # per sandbox directory (per pod): group names carry both, so two workers never share a group
        # or remove each other's as "stale".
        tag = hashlib.sha256(f"{socket.gethostname()}:{os.path.abspath(root)}".encode()).hexdigest()[:8]
        self.group_prefix = f"{tag}-{self.range}-"
        self.uid_base = UID_BASE + self.range * slots
        self.boxes_dir = os.path.join(root, str(self.range))
        self.stale_removed = self._remove_stale()
        # Built checkers and interactors (see Builder.prepare_helper); a crashed worker's are not trusted.
        self.helpers_dir = os.path.join(root, "helpers", str(self.range))
        shutil.rmtree(self.helpers_dir, ignore_errors=True)
        os.makedirs(self.helpers_dir, mode=0o700)
        self.staging_dir = os.path.join(root, "staging", str(self.range))
        shutil.rmtree(self.staging_dir, ignore_errors=True)
        os.makedirs(self.staging_dir, mode=0o700)
        os.makedirs(self.boxes_dir, mode=0o711, exist_ok=True)
        self._free = asyncio.Queue[int]()
        for i in range(slots):
            self._free.put_nowait(i)

    def _remove_stale(self) -> list[str]:
        removed = []
        if self.roots is not None:
            removed += remove_stale(self.roots, self.group_prefix, time.monotonic() + 10)
        if os.path.isdir(self.boxes_dir):
            removed += [os.path.join(self.boxes_dir, n) for n in os.listdir(self.boxes_dir)]
            shutil.rmtree(self.boxes_dir, ignore_errors=True)
        return removed

    def fault(self) -> str | None:
        """Why this worker can no longer judge: a directory it made at start-up is gone (a pod's
        emptyDir removed under a running container, a cleaner sweeping /tmp), or the lock file of
        its uid range was replaced (another worker could claim the same range and uids)."""
        root = self.root
        for path in (self.staging_dir, self.boxes_dir, self.helpers_dir):
            if not os.path.isdir(path):
                return f"the sandbox directory {path} was removed while the worker ran (something cleaned {root})"
        lock = os.path.join(root, "locks", f"{self.range}.lock")
        try:
            found, held = os.stat(lock), os.fstat(self._lock_fd)
            same = (found.st_dev, found.st_ino) == (held.st_dev, held.st_ino)
        except OSError:
            same = False
        if not same:
            return f"the lock of sandbox uid range {self.range} ({lock}) was removed while the worker ran"
        return None

    def close(self) -> None:
        """Give the uid range back (tests; a worker keeps it until it exits)."""
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[Box]:
        """A free slot's box (its uid, directories and groups), given back clean."""
        slot = await self._free.get()
        uid = self.uid_base + slot
        named = f"{self.group_prefix}{slot}"
        groups = (box_group(self.roots, f"{named}-a"), box_group(self.roots, f"{named}-b")) if self.roots else None
        checks = (box_group(self.roots, f"{named}-ca"), box_group(self.roots, f"{named}-cb")) if self.roots else None
        helper_dir = os.path.join(self.boxes_dir, f"{slot}-helper")
        check_dir = os.path.join(self.boxes_dir, f"{slot}-check")
        directory = os.path.join(self.boxes_dir, str(slot))
        runner = self.runner
        box = Box(
            uid, directory, box_group(self.roots, named) if self.roots else None,
            helper_dir, box_group(self.roots, f"{named}-h") if self.roots else None,
            Lane(box=directory, uid=uid, isolation=self.isolation, groups=groups, python=runner),
            Lane(box=check_dir, uid=uid, isolation=self.isolation, groups=checks, python=runner),
            check_dir,
        )  # fmt: skip
        try:
            yield box
        finally:
            await asyncio.shield(box.tests.close())
            await asyncio.shield(box.checks.close())
            await asyncio.shield(asyncio.to_thread(self._remove_dirs, box))
            self._free.put_nowait(slot)

    @staticmethod
    def _remove_dirs(box: Box) -> None:
        for path in (box.dir, box.helper_dir, box.check_dir):
            shutil.rmtree(path, ignore_errors=True)

    def make_dir(self, path: str, uid: int) -> None:
        """A fresh 0700 directory owned by ``uid``, appearing at ``path`` only once it is both (made
        elsewhere and renamed into place: nobody ever sees it root's or with another mode)."""
        shutil.rmtree(path, ignore_errors=True)
        staging = os.path.join(self.staging_dir, os.path.basename(path))
        shutil.rmtree(staging, ignore_errors=True)
        os.mkdir(staging, 0o700)
        if self.isolation.mode == "full":
            os.chown(staging, uid, uid)
        os.rename(staging, path)

    def inside(self, path: str) -> str:
        """Where directory ``path`` appears to a run that has it as its box."""
        return BOX if self.isolation.mode == "full" else path

    def fresh_feedback(self, directory: str, uid: int) -> None:
        """An empty feedback directory for a Kattis validator, owned by the box's uid."""
        path = os.path.join(directory, "feedback")
        shutil.rmtree(path, ignore_errors=True)
        os.mkdir(path, 0o700)
        if self.isolation.mode == "full":
            os.chown(path, uid, uid)
