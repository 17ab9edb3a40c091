"""The cgroup v2 VM tier: tests that boot a throwaway cgroup v2 machine (:mod:`tests.vm.machine`).

Every test here is marked ``vm`` (select with ``-m vm``, leave out with ``-m "not vm"``). The VM
disk is built on first use by ``scripts/build-vm`` and cached by content; when it cannot be built
the tests fail and say why rather than skip: this tier is the only proof of the cgroup v2 backend
on this cgroup v1 host.

``tests/vm/guest/`` holds tests that run *inside* the VM (cgroup v2 only): they are collected only
there, where the runner sets ``JUDGEQUEUE_VM_GUEST=1``.
"""

from __future__ import annotations

import os
from typing import Any

GUEST = os.environ.get("JUDGEQUEUE_VM_GUEST") == "1"
collect_ignore_glob = [] if GUEST else ["guest/*"]

#: What the VM runs measured (seconds, the kernel, inner results), printed at the end of the session.
FIGURES: dict[str, Any] = {}


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if FIGURES:
        terminalreporter.write_sep("-", "cgroup v2 VM")
        for name, value in FIGURES.items():
            terminalreporter.write_line(f"{name}: {value}")
