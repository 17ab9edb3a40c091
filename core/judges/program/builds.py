"""A worker's cache of built submissions: the same source, language, standard and toolchain is
built once per worker and copied into each later box (a rejudge, a resubmission).

A build is keyed by the sha256 of everything that decides its result (:func:`build_key`): the
language, the compile command as the box sees it (tool paths, standard, flags, further translation
units), the source, the files of the submission beside it (a header it includes), and each tool
file's size and modification time (a toolchain upgraded in place is a new key). What the
build left in the box directory is copied, as root, into a 0700 directory of the worker's own
(symlinks as symlinks), and restored by copying it back and giving it to the next box's uid. A
worker removes its predecessor's builds at start (a crashed worker's are not trusted), keeps at
most :data:`MAX_KEPT_BUILDS`, oldest first out, and skips builds over :data:`MAX_BUILD_BYTES`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import time
from collections.abc import Mapping, Sequence

#: Builds a worker keeps (least recently used removed first).
MAX_KEPT_BUILDS = 64
#: A build directory larger than this is not kept (a box directory may hold anything the build wrote).
MAX_BUILD_BYTES = 64 * 1024 * 1024


def tool_stamps(values: Sequence[str]) -> list[tuple[str, int, int]]:
    """(path, size, mtime ns) of every existing file a tool value names (a path or a ``:`` list)."""
    stamps = []
    for value in values:
        for path in value.split(":"):
            with contextlib.suppress(OSError):
                st = os.stat(path)
                stamps.append((path, st.st_size, st.st_mtime_ns))
    return stamps


def build_key(
    language: str,
    argv: Sequence[str],
    source: str,
    tools: Mapping[str, str],
    used: Sequence[str],
    files: Sequence[tuple[str, bytes]] = (),
) -> str:
    """The sha256 naming one build (``used``: the names of the tools its command needs; ``files``:
    the files written beside the source, by name, each of which a build may include or compile)."""
    beside = sorted((name, hashlib.sha256(data).hexdigest()) for name, data in files)
    doc = [language, list(argv), source, tool_stamps([tools[t] for t in sorted(used) if t in tools]), beside]
    return hashlib.sha256(json.dumps(doc).encode()).hexdigest()


def keep_copy(directory: str, kept: str) -> bool:
    """Copy ``directory`` to ``kept`` all at once (a private copy renamed into place, so nobody sees a
    half-written build): True when this copy is the one kept, False when another submission kept the
    same build first (this copy is dropped)."""
    staging = f"{kept}.{os.getpid()}-{time.monotonic_ns()}"
    shutil.copytree(directory, staging, symlinks=True)
    try:
        os.rename(staging, kept)
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
        return False
    return True


class BuildCache:
    """Built box directories by key, under ``root`` (root's, 0700), emptied at start."""

    def __init__(self, root: str, max_kept: int = MAX_KEPT_BUILDS) -> None:
        self.root = root
        self.max_kept = max_kept
        self.hits = 0
        self.kept = 0
        shutil.rmtree(root, ignore_errors=True)
        os.makedirs(root, mode=0o700)

    def restore(self, key: str, directory: str, uid: int | None) -> bool:
        """Copy the build ``key`` into ``directory`` (owned by ``uid`` when given); False when not kept."""
        kept = os.path.join(self.root, key)
        if not os.path.isdir(kept):
            return False
        try:
            shutil.copytree(kept, directory, symlinks=True, dirs_exist_ok=True)
        except (OSError, shutil.Error):  # evicted while being copied: build it again, from an empty directory
            for name in os.listdir(directory):
                path = os.path.join(directory, name)
                if os.path.isdir(path) and not os.path.islink(path):
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    os.unlink(path)
            return False
        with contextlib.suppress(OSError):
            os.utime(kept)  # recently used: evicted last
        if uid is not None:
            for where, dirs, files in os.walk(directory):
                for name in dirs + files:
                    os.lchown(os.path.join(where, name), uid, uid)
        self.hits += 1
        return True

    def keep(self, key: str, directory: str) -> bool:
        """Keep a copy of the built ``directory`` under ``key`` (False when it is too large)."""
        size = 0
        for where, _dirs, files in os.walk(directory):
            for name in files:
                with contextlib.suppress(OSError):
                    size += os.lstat(os.path.join(where, name)).st_size
        if size > MAX_BUILD_BYTES:
            return False
        if not keep_copy(directory, os.path.join(self.root, key)):
            return True
        self.kept += 1
        entries = [os.path.join(self.root, n) for n in os.listdir(self.root) if "." not in n]
        entries.sort(key=lambda p: os.stat(p).st_mtime if os.path.exists(p) else 0)
        for old in entries[: max(0, len(entries) - self.max_kept)]:
            shutil.rmtree(old, ignore_errors=True)
        return True
