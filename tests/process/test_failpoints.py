"""Failpoints: parsing, and a real SIGKILL at the armed point."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from judgequeue.core.base import failpoints


def test_parse_forms_and_errors() -> None:
    armed = failpoints.parse("a, b@3, c%0.25")
    assert armed["a"].at_hit == 1 and armed["b"].at_hit == 3 and armed["c"].probability == 0.25
    for bad in ("x@0", "x@two", "x%1.5"):
        with pytest.raises(ValueError, match="JUDGEQUEUE_FAILPOINTS"):
            failpoints.parse(bad)


def test_unarmed_hit_is_free_and_harmless() -> None:
    failpoints.arm("")
    failpoints.hit("dispatcher.after_claim")  # returns: nothing armed


def test_armed_failpoint_kills_the_process_at_the_nth_hit() -> None:
    code = (
        "from judgequeue.core.base import failpoints\n"
        "for i in range(5):\n"
        "    print(i, flush=True)\n"
        "    failpoints.hit('here')\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        env={"JUDGEQUEUE_FAILPOINTS": "here@3", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == -signal.SIGKILL
    assert proc.stdout.split() == ["0", "1", "2"]
    assert '"failpoint"' in proc.stderr


def test_bad_spec_in_the_environment_is_one_line_and_exit_2() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", "import judgequeue.core.base.failpoints"],
        env={"JUDGEQUEUE_FAILPOINTS": "here@zero", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "judgequeue: JUDGEQUEUE_FAILPOINTS: 'here@zero' is not name, name@N (N >= 1) or name%P (0 <= P <= 1)"
    ]
