"""Built-in judges for benchmarks and tests: ``noop`` and ``sleep``."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from . import Verdict
from .progress import current_progress


class NoopJudge:
    """Accepts everything at once: measures the queue, not the judging.

    It records when it ran (``started_at``, unix seconds) so benchmarks can tell commit-to-start
    from commit-to-verdict.
    """

    async def judge(self, payload: Any) -> Verdict:
        return Verdict("ACCEPTED", {"started_at": time.time()})


class JudgeCrashed(RuntimeError):
    """Raised on purpose by the sleep judge (``crash: true``)."""


class SleepJudge:
    """Test judge driven by the payload.

    ``seconds`` (default 0) to sleep; ``tests`` (a number, default 0) splits that sleep into so many
    tests and reports each one's start and end as live progress (what a program judge reports,
    without the sandbox; a program judge's list of tests, as the local demo's payloads carry, is
    not a number and is ignored); ``crash: true`` raises after sleeping; ``hang: true`` never
    returns (until cancelled); ``exit: true`` kills the whole worker process (a native judge
    segfaulting, the OOM killer) to test poison jobs; ``status`` picks the verdict (default
    ACCEPTED); ``echo`` is copied into the details so tests can tell attempts apart.
    """

    async def judge(self, payload: Any) -> Verdict:
        options = payload if isinstance(payload, dict) else {}
        seconds = float(options.get("seconds", 0) or 0)
        given = options.get("tests")
        tests = given if isinstance(given, int) and not isinstance(given, bool) else 0
        if tests > 0:
            report = current_progress()
            report.compiled()
            for number in range(1, tests + 1):
                report.test_started(number, tests)
                if seconds > 0:
                    await asyncio.sleep(seconds / tests)
                report.test_finished(number, tests, "ACCEPTED", seconds / tests)
        elif seconds > 0:
            await asyncio.sleep(seconds)
        if options.get("hang"):
            await asyncio.Event().wait()
        if options.get("exit"):
            os._exit(137)
        if options.get("crash"):
            raise JudgeCrashed("sleep judge asked to crash")
        details: dict[str, Any] = {"slept": seconds}
        if "echo" in options:
            details["echo"] = options["echo"]
        return Verdict(options.get("status", "ACCEPTED"), details)
