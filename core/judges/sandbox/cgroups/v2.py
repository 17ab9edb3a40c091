"""cgroup v2 (unified hierarchy) accounting for the sandbox, in the worker's delegated subtree.

The worker owns one cgroup (a container's, seen through its cgroup namespace with a writable
``/sys/fs/cgroup``, or a systemd unit with ``Delegate=yes``) and claims it as isolate 2 does:

* it moves every process of that cgroup (itself first among them) into a leaf beside the boxes,
  ``<own>/judgequeue-worker`` (a cgroup with processes may not hand controllers to children);
* it enables ``memory`` and ``pids`` (and ``cpu`` where offered, so the worker's leaf and each
  box get a fair share of the CPU whatever a box forks) in ``<own>/cgroup.subtree_control``;
* it makes each box's group beside that leaf, ``<own>/<name>``: ``memory.max``,
  ``memory.swap.max`` 0 where swap is accounted, ``pids.max``; facts from ``memory.peak``,
  ``memory.events`` (``oom_kill``), ``pids.events`` (``max``), ``cpu.stat`` (``usage_usec``),
  all over the box's whole tree. ``cgroup.kill`` empties a box at once.

A worker started later inside the leaf (a second worker process, a restarted judge) finds its
cgroup named ``judgequeue-worker`` and claims the parent: the same subtree.

A box that runs several tests (:mod:`.session`) is not a leaf: its runner lives in
``<box>/runner`` and each test gets a fresh ``<box>/test-<n>`` with the test's own limits, which
the program joins before its exec (the runner hands it a descriptor of that ``cgroup.procs``,
opened by the worker: since Linux 5.16 the kernel checks a write against the opener's credentials
and cgroup namespace). Every counter of a test is then the test's alone, on any kernel; the memory
peak is not reset in place (that needs Linux 6.12).

Requires Linux 5.19 (``memory.peak``); :meth:`V2Roots.usable` names anything missing.
Parsing is pure (:func:`find_v2_roots`, :func:`v2_mount`, :func:`parse_controllers`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import signal
import time
from dataclasses import dataclass

from .base import BoxGroup, PerTest, Roots, Usage, keyed, procs_below, read, remove_tree, write

LEAF = "judgequeue-worker"  # where the worker's own processes live, beside its boxes
RUNNER = "runner"  # a split box's leaf for its runner (and bubblewrap's monitor)
REQUIRED = ("memory", "pids")
OPTIONAL = ("cpu",)
DELEGATE = (
    "give the worker a delegated cgroup (a container cgroup namespace with a writable /sys/fs/cgroup, "
    "or a systemd unit with Delegate=yes)"
)
MOVE_ROUNDS = 50  # passes over the own cgroup's processes (one may fork while they are moved)


def v2_mount(mounts: str) -> str | None:
    """The unified hierarchy's mount point from ``/proc/self/mounts`` (pure): ``/sys/fs/cgroup``
    when it is there, else the first ``cgroup2`` mount (a hybrid layout's ``.../unified``)."""
    found = [f[1] for f in (line.split() for line in mounts.splitlines()) if len(f) >= 3 and f[2] == "cgroup2"]
    if "/sys/fs/cgroup" in found:
        return "/sys/fs/cgroup"
    return found[0] if found else None


def own_path(self_cgroup: str) -> str | None:
    """This process's path in the unified hierarchy: the ``0::`` line of ``/proc/self/cgroup`` (pure)."""
    for line in self_cgroup.splitlines():
        if line.startswith("0::"):
            return line[3:].strip()
    return None


def mount_root(mountinfo: str, mount_point: str) -> str:
    """The root of the ``cgroup2`` mount at ``mount_point``, from ``/proc/self/mountinfo`` (pure):
    ``/`` for a mount of this process's cgroup namespace (a container's own), ``/../..`` for one of
    the whole tree seen from inside a namespace (the host's ``/sys/fs/cgroup`` as a hostPath), a
    path for a mount of a subtree; ``/`` when it is not listed."""
    for line in mountinfo.splitlines():
        before, _, after = line.partition(" - ")
        fields, kind = before.split(), after.split()
        if len(fields) >= 5 and kind and kind[0] == "cgroup2" and _unescape(fields[4]) == mount_point:
            return _unescape(fields[3])
    return "/"


def _unescape(field: str) -> str:
    """mountinfo's octal escapes (``\\040`` for a space)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def parse_controllers(text: str) -> set[str]:
    """The names in ``cgroup.controllers`` or ``cgroup.subtree_control`` (pure)."""
    return set(text.split())


@dataclass(frozen=True)
class V2Roots(Roots):
    """The worker's delegated cgroup (``subtree``): boxes are made in it, beside ``leaf``.

    ``above`` > 0: the mount shows the tree that many levels above this process's cgroup namespace
    and ``subtree`` is still relative to the namespace (``mount`` + path); :func:`locate` finds it.
    """

    mount: str
    subtree: str
    above: int = 0
    own: str = ""  # this process's cgroup relative to ``subtree``'s namespace path ("" or the leaf)

    version = 2

    @property
    def leaf(self) -> str:
        return os.path.join(self.subtree, LEAF)

    def all(self) -> tuple[str]:
        return (self.subtree,)

    def usable(self) -> str | None:
        problem = claim(self)
        if problem:
            return f"cgroup v2: {problem}"
        probe = V2Group(self, f"probe-{os.getpid()}")
        try:
            probe.destroy(time.monotonic() + 5)  # a crashed process's of the same pid
            probe.create(memory=64 << 20, processes=4, split_tests=True)
            for name in ("memory.peak", "memory.events", "pids.events", "cpu.stat", "cgroup.kill"):
                if not os.path.exists(os.path.join(probe.path, name)):
                    return f"cgroup v2: {probe.path} has no {name} (the sandbox needs Linux 5.19 or later)"
            test = probe.per_test(memory=32 << 20, processes=2)
            test.close(time.monotonic() + 5)
        except OSError as exc:
            return f"cgroup v2: cannot make a box's cgroup under {self.subtree} ({exc.strerror}): {DELEGATE}"
        finally:
            with contextlib.suppress(OSError):
                probe.destroy(time.monotonic() + 5)
        return None


def find_v2_roots(mount: str, self_cgroup: str, root: str = "/") -> V2Roots | str:
    """The worker's delegated cgroup under ``mount`` whose root is ``root`` (pure, see
    :func:`mount_root`): its own cgroup, or the parent of its own when it is already in the
    worker's leaf (claimed before, by this process or another)."""
    path = own_path(self_cgroup)
    if path is None:
        return "cgroup v2 is mounted but /proc/self/cgroup has no unified (0::) entry"
    if path == ".." or path.startswith("/..") or not path.startswith("/"):
        return f"cgroup v2: this process's cgroup ({path}) is outside its cgroup namespace: {DELEGATE}"
    parts = [p for p in path.split("/") if p]
    own = ""
    if parts and parts[-1] == LEAF:
        parts, own = parts[:-1], LEAF
    root_parts = [p for p in root.split("/") if p]
    above = 0
    while root_parts and root_parts[0] == "..":
        root_parts, above = root_parts[1:], above + 1
    if above:
        if root_parts:  # an ancestor's other branch: this process's cgroup is not in it
            return f"cgroup v2: {mount} (root {root}) does not hold this process's cgroup {path}: {DELEGATE}"
        return V2Roots(mount, os.path.join(mount, *parts), above=above, own=own)
    if parts[: len(root_parts)] != root_parts:
        return f"cgroup v2: {mount} (root {root}) does not hold this process's cgroup {path}: {DELEGATE}"
    return V2Roots(mount, os.path.join(mount, *parts[len(root_parts) :]), own=own)


def locate(roots: V2Roots, pid: int) -> V2Roots | str:
    """``roots`` with ``subtree`` found in a mount that shows the tree ``above`` levels over this
    process's cgroup namespace (the host's ``/sys/fs/cgroup`` mounted into a container): the one
    cgroup at that depth below which this process (``pid``) is where its namespace says."""
    relative = os.path.relpath(roots.subtree, roots.mount)
    relative = "" if relative == "." else relative
    levels = [roots.mount]
    for _ in range(roots.above):
        levels = [e.path for d in levels for e in _subdirs(d)]
    found = []
    for top in levels:
        group = os.path.join(top, relative, roots.own)
        with contextlib.suppress(OSError):
            if str(pid) in read(os.path.join(group, "cgroup.procs")).split():
                found.append(os.path.normpath(os.path.join(top, relative)))
    if len(found) != 1:
        return (
            f"cgroup v2: cannot find this process's cgroup in {roots.mount}, which shows the tree above its cgroup "
            f"namespace: {DELEGATE}"
        )
    return V2Roots(roots.mount, found[0], own=roots.own)


def _subdirs(path: str) -> list[os.DirEntry[str]]:
    try:
        return [e for e in os.scandir(path) if e.is_dir(follow_symlinks=False)]
    except OSError:
        return []


def claim(roots: V2Roots) -> str | None:
    """Move every process of the worker's cgroup into its leaf and hand the controllers to the
    subtree (idempotent); None when done, else what is missing."""
    subtree = roots.subtree
    if not os.path.isdir(subtree):
        return f"this process's cgroup {subtree} is not there: {DELEGATE}"
    if not os.path.exists(os.path.join(subtree, "cgroup.type")):
        return f"the worker runs in the root cgroup ({subtree}), which cannot be its own: {DELEGATE}"
    try:
        offered = parse_controllers(read(os.path.join(subtree, "cgroup.controllers")))
    except OSError as exc:
        return f"cannot read {subtree}/cgroup.controllers ({exc.strerror}): {DELEGATE}"
    missing = [c for c in REQUIRED if c not in offered]
    if missing:
        return (
            f"the {' and '.join(missing)} controller{'s are' if len(missing) > 1 else ' is'} not delegated to "
            f"{subtree} (its cgroup.controllers: {' '.join(sorted(offered)) or 'none'}): {DELEGATE}"
        )
    try:
        os.makedirs(roots.leaf, exist_ok=True)
    except OSError as exc:
        return f"cannot create {roots.leaf} ({exc.strerror}): {DELEGATE}"
    problem = _move_all(subtree, roots.leaf)
    if problem:
        return problem
    wanted = [*REQUIRED, *(c for c in OPTIONAL if c in offered)]
    for controller in wanted:
        control = os.path.join(subtree, "cgroup.subtree_control")
        try:
            if controller not in parse_controllers(read(control)):
                write(control, f"+{controller}")
        except OSError as exc:
            if controller in OPTIONAL:
                continue  # a fairer share of the CPU, not a limit: go on without it
            why = exc.strerror or str(exc)
            if exc.errno == errno.EBUSY:
                why += ": a process is still in it (the no-internal-processes rule)"
            return f"cannot enable {controller} in {control} ({why}): {DELEGATE}"
    return None


def _move_all(subtree: str, leaf: str) -> str | None:
    """Move every process of ``subtree`` itself into ``leaf``; a process forked meanwhile is moved
    on the next pass."""
    procs = os.path.join(subtree, "cgroup.procs")
    target = os.path.join(leaf, "cgroup.procs")
    for _ in range(MOVE_ROUNDS):
        try:
            pids = read(procs).split()
        except OSError as exc:
            return f"cannot read {procs} ({exc.strerror}): {DELEGATE}"
        if not pids:
            return None
        for pid in pids:
            try:
                write(target, pid)
            except ProcessLookupError:
                continue  # it exited
            except OSError as exc:
                return f"cannot move process {pid} into {target} ({exc.strerror}): {DELEGATE}"
    return f"processes keep appearing in {procs}: it cannot be emptied into {leaf}"


def _empty(path: str, deadline: float) -> bool:
    """SIGKILL everything in the cgroup ``path`` (and below) and wait until it holds no process."""
    events = os.path.join(path, "cgroup.events")
    killed = False
    while True:
        try:
            populated = keyed(read(events)).get("populated", 0)
        except FileNotFoundError:
            return True
        if not populated:
            return True
        if not killed:
            try:
                write(os.path.join(path, "cgroup.kill"), "1")
                killed = True
            except FileNotFoundError:  # a kernel without cgroup.kill: one by one
                for pid in procs_below(path):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
        if time.monotonic() > deadline:
            return False
        time.sleep(0.001)  # the kernel finishes the exits (and their reaping) on its own


def _usage(path: str) -> Usage:
    return Usage(
        cpu_ns=_cpu_ns(path),
        memory_peak=int(read(os.path.join(path, "memory.peak"))),
        oom_kills=keyed(read(os.path.join(path, "memory.events"))).get("oom_kill", 0),
        pids_refused=keyed(read(os.path.join(path, "pids.events"))).get("max", 0),
    )


def _cpu_ns(path: str) -> int:
    return keyed(read(os.path.join(path, "cpu.stat"))).get("usage_usec", 0) * 1000


def _limit(path: str, memory: int, processes: int) -> None:
    write(os.path.join(path, "memory.max"), str(memory))
    swap = os.path.join(path, "memory.swap.max")
    if os.path.exists(swap):  # no swap on top of the limit where swap is accounted
        write(swap, "0")
    write(os.path.join(path, "pids.max"), str(processes))


class V2Group(BoxGroup):
    """A box's cgroup beside the worker's leaf (a leaf itself, or split for a runner and its tests)."""

    def __init__(self, roots: V2Roots, name: str) -> None:
        self.name = name
        self.path = os.path.join(roots.subtree, name)
        self.split = False
        self.tests = 0

    def dirs(self) -> tuple[str]:
        return (self.path,)

    def procs_files(self) -> list[str]:
        """The box's own, or its runner's leaf when the box is split."""
        return [os.path.join(self.path, RUNNER if self.split else "", "cgroup.procs")]

    def leftover(self) -> bool:
        return os.path.isdir(self.path)

    def try_remove(self) -> bool:
        if self.pids_in():
            return False
        return remove_tree(self.path, None)

    def create(self, *, memory: int, processes: int, split_tests: bool = False) -> None:
        os.mkdir(self.path)
        self.split = split_tests
        _limit(self.path, memory, processes)
        if split_tests:
            for controller in REQUIRED:  # each test's own limits and counters
                write(os.path.join(self.path, "cgroup.subtree_control"), f"+{controller}")
            os.mkdir(os.path.join(self.path, RUNNER))

    def usage(self) -> Usage:
        return _usage(self.path)

    def cpu_ns(self) -> int:
        return _cpu_ns(self.path)

    def pids_in(self, *, everywhere: bool = False) -> set[int]:
        """Every process in the box's tree (one hierarchy: ``everywhere`` is the same)."""
        return procs_below(self.path)

    def kill_all(self, deadline: float) -> bool:
        return _empty(self.path, deadline)

    def destroy(self, deadline: float) -> bool:
        if not os.path.isdir(self.path):
            return True
        _empty(self.path, deadline)
        return remove_tree(self.path, deadline)

    def per_test(self, *, memory: int, processes: int) -> PerTest:
        if not self.split:
            raise ValueError(f"{self.path} was not made for tests of their own (split_tests)")
        self.tests += 1
        return V2PerTest(os.path.join(self.path, f"test-{self.tests}"), memory, processes)


class V2PerTest(PerTest):
    """A test's own cgroup in a split box: fresh counters, the test's own limits; the program joins
    it through :attr:`join_fd` before its exec."""

    def __init__(self, path: str, memory: int, processes: int) -> None:
        self.path = path
        os.mkdir(path)
        try:
            _limit(path, memory, processes)
            self.join_fd = os.open(os.path.join(path, "cgroup.procs"), os.O_WRONLY | os.O_CLOEXEC)
        except BaseException:
            remove_tree(path, None)
            raise

    def cpu_ns(self) -> int:
        return _cpu_ns(self.path)

    def usage(self) -> Usage:
        return _usage(self.path)

    def close(self, deadline: float) -> bool:
        if self.join_fd >= 0:
            os.close(self.join_fd)
            self.join_fd = -1
        _empty(self.path, deadline)
        return remove_tree(self.path, deadline)
