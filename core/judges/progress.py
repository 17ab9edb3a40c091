"""Live progress of a judging: what a judge tells the worker while it works (compiled, test i
started, test i finished with its verdict and time), for queues whose workers report it
(``JUDGEQUEUE_PROGRESS``, docs/events.md).

The worker passes a :class:`Progress` to :func:`~.registry.judge_job`, which makes it the current
one for the judge's task; a judge reports through :func:`current_progress`, which is a no-op reporter when
nobody listens, so a judge never has to know whether progress is on. Reporting is synchronous and
cheap (it records the latest state; the worker writes it at most once per interval), so a judge may
report every test.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Protocol


class Progress(Protocol):
    """Where a judge reports how far it got; every method returns at once."""

    def compiled(self, ok: bool = True) -> None:
        """The submission was built (``ok``), or did not build (a compile error is coming)."""

    def test_started(self, number: int, total: int) -> None:
        """Test ``number`` (1-based) of ``total`` started."""

    def test_finished(self, number: int, total: int, verdict: str, seconds: float) -> None:
        """Test ``number`` of ``total`` finished with ``verdict`` after ``seconds`` (its CPU or wall time)."""


class NoProgress:
    """Nobody listens: every report is dropped."""

    def compiled(self, ok: bool = True) -> None:
        return None

    def test_started(self, number: int, total: int) -> None:
        return None

    def test_finished(self, number: int, total: int, verdict: str, seconds: float) -> None:
        return None


NO_PROGRESS: Progress = NoProgress()

_current: ContextVar[Progress] = ContextVar("judgequeue_progress", default=NO_PROGRESS)


def current_progress() -> Progress:
    """The reporter of the judging running in this task (:data:`NO_PROGRESS` when nobody listens)."""
    return _current.get()


@contextlib.contextmanager
def reporting(reporter: Progress) -> Iterator[None]:
    """Make ``reporter`` the current one for the code run inside (this task and what it starts)."""
    token = _current.set(reporter)
    try:
        yield
    finally:
        _current.reset(token)
