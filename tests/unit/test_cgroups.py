"""Which cgroup backend a worker uses and where its boxes go, from its mounts and its own cgroup
(pure parsing: v1, v2 and hybrid layouts as the kernel writes them)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from judgequeue.core.judges.sandbox.cgroups import V1Roots, V2Roots, find_roots, parse_oom_kills
from judgequeue.core.judges.sandbox.cgroups.base import BoxGroup, below, keyed, procs, procs_below, remove_tree
from judgequeue.core.judges.sandbox.cgroups.v1 import V1Group
from judgequeue.core.judges.sandbox.cgroups.v2 import LEAF, V2Group, mount_root, own_path, parse_controllers, v2_mount

V1_MOUNTS = (
    "sysfs /sys sysfs rw,nosuid,nodev,noexec,relatime 0 0\n"
    "tmpfs /sys/fs/cgroup tmpfs ro,nosuid,nodev,noexec,mode=755 0 0\n"
    "cgroup /sys/fs/cgroup/memory cgroup rw,nosuid,memory 0 0\n"
    "cgroup /sys/fs/cgroup/pids cgroup rw,pids 0 0\n"
    "cgroup /sys/fs/cgroup/cpu,cpuacct cgroup rw,cpu,cpuacct 0 0\n"
)
#: systemd's hybrid layout: the v1 controllers, and a unified hierarchy without controllers.
HYBRID_MOUNTS = V1_MOUNTS + "cgroup2 /sys/fs/cgroup/unified cgroup2 rw,nosuid,nodev,noexec,relatime,nsdelegate 0 0\n"
V2_MOUNTS = (
    "proc /proc proc rw,nosuid,nodev,noexec,relatime 0 0\n"
    "cgroup2 /sys/fs/cgroup cgroup2 rw,nosuid,nodev,noexec,relatime,nsdelegate,memory_recursiveprot 0 0\n"
)


def test_v1_boxes_go_under_each_controllers_own_group() -> None:
    roots = find_roots(V1_MOUNTS, "4:memory:/pod/abc\n2:cpu,cpuacct:/\n8:pids:/x\n")
    assert isinstance(roots, V1Roots) and roots.version == 1
    assert roots.memory == "/sys/fs/cgroup/memory/pod/abc/judgequeue-sandbox"
    assert roots.cpuacct == "/sys/fs/cgroup/cpu,cpuacct/judgequeue-sandbox"
    assert roots.pids == "/sys/fs/cgroup/pids/x/judgequeue-sandbox"
    assert roots.all() == (roots.memory, roots.pids, roots.cpuacct)


def test_a_hybrid_host_keeps_v1() -> None:
    own = "12:pids:/system.slice/w.service\n5:memory:/system.slice/w.service\n3:cpu,cpuacct:/system.slice\n"
    roots = find_roots(HYBRID_MOUNTS, own + "0::/system.slice/w.service\n")
    assert isinstance(roots, V1Roots)
    assert roots.memory == "/sys/fs/cgroup/memory/system.slice/w.service/judgequeue-sandbox"


def test_v2_boxes_go_in_the_workers_own_cgroup() -> None:
    roots = find_roots(V2_MOUNTS, "0::/system.slice/judgequeue-worker@1.service\n")
    assert isinstance(roots, V2Roots) and roots.version == 2
    assert roots.subtree == "/sys/fs/cgroup/system.slice/judgequeue-worker@1.service"
    assert roots.leaf == f"{roots.subtree}/{LEAF}"
    assert roots.all() == (roots.subtree,)


def test_v2_in_a_container_cgroup_namespace_is_the_namespaces_root() -> None:
    roots = find_roots(V2_MOUNTS, "0::/\n")
    assert isinstance(roots, V2Roots) and roots.subtree == "/sys/fs/cgroup"


def test_v2_a_worker_already_in_the_leaf_claims_the_same_subtree() -> None:
    # Claimed before (by this process, or by the worker that started this one): the parent is ours.
    first = find_roots(V2_MOUNTS, "0::/kubepods/pod1/c1\n")
    again = find_roots(V2_MOUNTS, f"0::/kubepods/pod1/c1/{LEAF}\n")
    in_namespace = find_roots(V2_MOUNTS, f"0::/{LEAF}\n")
    assert isinstance(first, V2Roots) and isinstance(again, V2Roots) and isinstance(in_namespace, V2Roots)
    assert first.subtree == again.subtree == "/sys/fs/cgroup/kubepods/pod1/c1"
    assert in_namespace.subtree == "/sys/fs/cgroup"


def test_v2_problems_are_named() -> None:
    outside = find_roots(V2_MOUNTS, "0::/../../system.slice/other.service\n")
    assert isinstance(outside, str) and "outside its cgroup namespace" in outside and "Delegate=yes" in outside
    assert find_roots(V2_MOUNTS, "1:name=systemd:/\n") == (
        "cgroup v2 is mounted but /proc/self/cgroup has no unified (0::) entry"
    )
    nothing = find_roots("proc /proc proc rw 0 0\ncgroup /sys/fs/cgroup/memory cgroup rw,memory 0 0\n", "")
    assert nothing == (
        "no cgroup hierarchy is mounted: neither cgroup v2 (unified) nor the cgroup v1 controllers pids, cpuacct"
    )


def test_v2_mount_and_file_parsing() -> None:
    assert v2_mount(V2_MOUNTS) == "/sys/fs/cgroup"
    assert v2_mount(HYBRID_MOUNTS) == "/sys/fs/cgroup/unified"
    assert v2_mount(V1_MOUNTS) is None
    # /sys/fs/cgroup wins over another cgroup2 mount listed first (a container's private one).
    assert v2_mount("cgroup2 /run/x cgroup2 rw 0 0\n" + V2_MOUNTS) == "/sys/fs/cgroup"
    assert own_path("12:pids:/a\n0::/b/c\n") == "/b/c"
    assert own_path("12:pids:/a\n") is None
    assert parse_controllers("cpuset cpu io memory pids\n") == {"cpuset", "cpu", "io", "memory", "pids"}
    assert parse_controllers("\n") == set()


def test_counter_files() -> None:
    assert keyed("low 0\nhigh 0\nmax 12\noom 2\noom_kill 1\noom_group_kill 0\n")["oom_kill"] == 1
    assert keyed("usage_usec 1234\nuser_usec 1000\nsystem_usec 234\n")["usage_usec"] == 1234
    assert keyed("populated 1\nfrozen 0\n") == {"populated": 1, "frozen": 0}
    assert keyed("max 3\n")["max"] == 3
    assert keyed("garbage\nkey notanumber\n") == {}
    assert parse_oom_kills("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n") == 3
    assert parse_oom_kills("oom_kill_disable 0\n") == 0


MOUNTINFO = (
    "22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw\n"
    "25 22 0:23 {root} /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate\n"
)


def test_v2_mount_roots_from_mountinfo() -> None:
    assert mount_root(MOUNTINFO.format(root="/"), "/sys/fs/cgroup") == "/"
    assert mount_root(MOUNTINFO.format(root="/../.."), "/sys/fs/cgroup") == "/../.."
    assert mount_root(MOUNTINFO.format(root="/a\\040b"), "/sys/fs/cgroup") == "/a b"
    assert mount_root(MOUNTINFO.format(root="/x"), "/elsewhere") == "/"  # not listed: taken as the namespace's


def test_v2_a_mount_of_the_tree_above_the_namespace_is_searched() -> None:
    # The host's /sys/fs/cgroup in a container with its own cgroup namespace (a hostPath): the mount
    # root is two levels above the namespace's, whose path the container cannot see.
    roots = find_roots(V2_MOUNTS, "0::/\n", MOUNTINFO.format(root="/../.."))
    assert isinstance(roots, V2Roots) and (roots.above, roots.own, roots.subtree) == (2, "", "/sys/fs/cgroup")
    claimed = find_roots(V2_MOUNTS, f"0::/{LEAF}\n", MOUNTINFO.format(root="/.."))
    assert isinstance(claimed, V2Roots) and (claimed.above, claimed.own) == (1, LEAF)
    other = find_roots(V2_MOUNTS, "0::/\n", MOUNTINFO.format(root="/../other"))
    assert isinstance(other, str) and "does not hold this process's cgroup" in other


def test_v2_a_mount_of_a_subtree_is_joined_where_it_starts() -> None:
    roots = find_roots(V2_MOUNTS, "0::/ns/worker/c\n", MOUNTINFO.format(root="/ns/worker"))
    assert isinstance(roots, V2Roots) and roots.subtree == "/sys/fs/cgroup/c" and roots.above == 0
    outside = find_roots(V2_MOUNTS, "0::/elsewhere\n", MOUNTINFO.format(root="/ns"))
    assert isinstance(outside, str) and "does not hold" in outside


@pytest.mark.parametrize("backend", [V1Group, V2Group])
def test_each_backend_group_implements_every_operation(backend: type[BoxGroup]) -> None:
    """BoxGroup's operations only raise NotImplementedError: a backend that misnames one (a rename
    gone wrong) would fall back to it and fail only on a real cgroup tree."""
    operations = [n for n, v in vars(BoxGroup).items() if callable(v) and not n.startswith("_")]
    assert operations
    missing = [n for n in operations if getattr(backend, n) is getattr(BoxGroup, n)]
    assert missing == [], f"{backend.__name__} leaves {missing} to BoxGroup"


def test_a_group_tree_is_read_and_removed_deepest_first(tmp_path: Path) -> None:
    """The tree walk both backends share, on plain directories (a cgroup tree's shape)."""
    box = tmp_path / "box"
    (box / "test-1" / "inner").mkdir(parents=True)
    (box / "runner").mkdir()
    (box / "cgroup.procs").write_text("7\n")
    (box / "runner" / "cgroup.procs").write_text("8\n9\n")
    order = below(str(box))
    assert order[-1] == str(box) and order.index(str(box / "test-1" / "inner")) < order.index(str(box / "test-1"))
    assert procs(str(box)) == {7} and procs(str(box / "test-1")) == set()
    assert procs_below(str(box)) == {7, 8, 9}
    assert not remove_tree(str(box), None)  # a directory with files is not an empty group: one try, then False
    for f in (box / "cgroup.procs", box / "runner" / "cgroup.procs"):
        f.unlink()
    assert remove_tree(str(box), None) and not os.path.exists(box)
    assert remove_tree(str(box), None)  # already gone
