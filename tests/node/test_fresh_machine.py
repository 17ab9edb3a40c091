"""A machine that never saw the project installs what every tier runs (scripts/check-fresh).

The node tier is where a missing tool once surfaced only after twenty minutes of builds on a new
machine (mmdebstrap, used by the image build, installed by no step before it). Here a pristine Debian
root with only the base of the project's kind of machine takes a clean clone, ``scripts/install``
and ``scripts/tools install`` of every tier, and each tier's commands are then checked inside it.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TIERS = ("install", "integration", "kube", "node", "vm")


def test_a_pristine_root_installs_every_tier() -> None:
    done = subprocess.run(
        [str(ROOT / "scripts" / "check-fresh"), *TIERS], capture_output=True, text=True, timeout=1800, cwd=ROOT
    )
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-6000:]
    for tier in TIERS:
        assert f"[check-fresh] tier {tier}: every command there" in log, log[-6000:]
    assert "judgequeue " in done.stdout, log[-3000:]
