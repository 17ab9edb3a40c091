"""cgroups for the sandbox: one group per box, limiting and accounting its whole process tree.

Limits and facts cover every process of a box, not one: memory (+swap) peak and OOM kills, CPU time,
and the number of processes. Two backends, chosen once at start-up from ``/proc/self/mounts``:

* :mod:`.v1` where the v1 memory, pids and cpuacct hierarchies are mounted (a v1 or hybrid
  host): boxes under ``<worker's own group>/judgequeue-sandbox`` in each;
* :mod:`.v2` on the unified hierarchy: boxes in the worker's delegated cgroup, beside the
  leaf the worker moves itself into.

Either way the worker's own memory limit (a pod's) bounds all its boxes together, and the factory
:func:`box_group` makes a box group of the backend ``roots`` belong to. Parsing is pure
(:func:`find_roots`); a crashed worker's leftovers are removed by the next one (:func:`remove_stale`).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable
from typing import Any

from .base import BoxGroup, PerTest, Roots, Usage, read
from .v1 import CONTROLLERS, V1Group, V1Roots, find_v1_roots, parse_oom_kills, v1_mounts
from .v2 import V2Group, V2Roots, find_v2_roots, locate, mount_root, v2_mount

__all__ = [
    "BoxGroup",
    "PerTest",
    "Roots",
    "Usage",
    "V1Roots",
    "V2Roots",
    "all_gone",
    "box_group",
    "find_roots",
    "memory_controllers_usable",
    "parse_oom_kills",
    "read_roots",
    "remove_stale",
]

#: The kind of box group each backend's roots make (:func:`box_group`).
_GROUPS: dict[type[Roots], Callable[[Any, str], BoxGroup]] = {V1Roots: V1Group, V2Roots: V2Group}


def box_group(roots: Roots, name: str) -> BoxGroup:
    """The box group ``name`` under ``roots``, of the backend those roots are (v1 or v2)."""
    return _GROUPS[type(roots)](roots, name)


def find_roots(mounts: str, self_cgroup: str, mountinfo: str = "") -> Roots | str:
    """Which backend, and where box groups go, from ``/proc/self/mounts`` and ``/proc/self/cgroup``
    (and ``/proc/self/mountinfo``, for where the unified mount's root is).

    cgroup v1 when its memory, pids and cpuacct hierarchies are all mounted (so a hybrid host keeps
    the v1 layout it always had), else the unified hierarchy where one is mounted. Returns the
    roots, or a sentence naming what is missing (pure).
    """
    v1 = v1_mounts(mounts)
    if all(c in v1 for c in CONTROLLERS):
        return find_v1_roots(v1, self_cgroup)
    unified = v2_mount(mounts)
    if unified is not None:
        return find_v2_roots(unified, self_cgroup, mount_root(mountinfo, unified))
    missing = ", ".join(c for c in CONTROLLERS if c not in v1)
    return f"no cgroup hierarchy is mounted: neither cgroup v2 (unified) nor the cgroup v1 controllers {missing}"


def read_roots() -> Roots | str:
    """:func:`find_roots` for this process."""
    try:
        roots = find_roots(read("/proc/self/mounts"), read("/proc/self/cgroup"), read("/proc/self/mountinfo"))
    except OSError as exc:
        return f"cannot read the cgroup mounts: {exc}"
    if isinstance(roots, V2Roots) and roots.above:
        return locate(roots, os.getpid())
    return roots


def memory_controllers_usable(roots: Roots) -> str | None:
    """None when box groups can be made here, else why not (makes the worker's part of the tree
    ready, then tries one box)."""
    return roots.usable()


def remove_stale(roots: Roots, prefix: str, deadline: float) -> list[str]:
    """Remove every box group whose name starts with ``prefix`` (a crashed worker's); their names."""
    names: set[str] = set()
    for root in roots.all():
        with contextlib.suppress(FileNotFoundError):
            names.update(n for n in os.listdir(root) if n.startswith(prefix) and os.path.isdir(os.path.join(root, n)))
    for name in names:
        box_group(roots, name).destroy(deadline)
    return sorted(names)


def all_gone(groups: Iterable[BoxGroup]) -> bool:
    return not any(os.path.isdir(d) for g in groups for d in g.dirs())
