"""Fixtures of the tests that run inside the cgroup v2 VM: root, and a sandbox directory (the same
as the process tier's, whose sandbox catalogue runs beside these)."""

from __future__ import annotations

from tests.process.conftest import as_root, sandbox_dir

__all__ = ["as_root", "sandbox_dir"]
