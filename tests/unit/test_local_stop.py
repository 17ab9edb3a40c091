"""How `judgequeue local` reports the roles it stopped (pure)."""

from __future__ import annotations

import signal

from judgequeue.core.local.children import stopped_summary


def test_roles_that_handled_the_sigterm_stopped_cleanly() -> None:
    assert stopped_summary({"worker-0": 0, "reaper-0": 0}) == (True, "all roles stopped cleanly")


def test_a_role_ended_by_the_sigterm_while_starting_is_no_failure_and_is_named() -> None:
    clean, line = stopped_summary({"worker-0": 0, "dispatcher-0": -signal.SIGTERM, "reaper-0": -signal.SIGTERM})
    assert clean
    assert line == "all roles stopped cleanly (dispatcher-0, reaper-0 still starting, ended by the SIGTERM)"


def test_any_other_exit_is_a_failure_naming_the_role_and_code() -> None:
    clean, line = stopped_summary({"worker-0": 1, "reaper-0": -signal.SIGKILL, "dispatcher-0": -signal.SIGTERM})
    assert not clean
    assert "non-zero exits: {'worker-0': 1, 'reaper-0': -9}" in line and "dispatcher-0 still starting" in line
