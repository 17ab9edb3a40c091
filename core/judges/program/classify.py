"""Verdicts from facts (pure): what a run's facts force (a limit, a crash), what a checker, a Kattis
output validator or an interactor said, the order of verdicts of an interactive test under each
package format's rules, and the submission's verdict and details from its tests' results."""

from __future__ import annotations

from typing import Any

from .. import STATUSES, Status, Verdict
from ..sandbox import Limits, RunFacts
from .checkers import MAX_MESSAGE, CheckResult, custom_outcome, kattis_outcome
from .problem import Problem
from .scoring import TestResult, summarize


def normalise_output(text: str) -> list[str]:
    """Lines without trailing whitespace, trailing blank lines dropped (pure)."""
    lines = [line.rstrip() for line in text.replace("\r\n", "\n").split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def outputs_match(actual: bytes, expected: str) -> bool:
    """Compare a program's output with the expected text, ignoring trailing whitespace (pure)."""
    return normalise_output(actual.decode("utf-8", errors="replace")) == normalise_output(expected)


def classify_facts(facts: RunFacts, limits: Limits) -> tuple[Status, str] | None:
    """The verdict a run's facts force (a limit, a crash), or None when it ended normally (pure).

    Order: a box that would not die is the system's fault; then the limits the worker itself
    enforced (output, memory by the cgroup's OOM count or peak, CPU by the cgroup's counter, wall);
    then the engine's exit report. Nothing the program prints decides these, and no exit status is
    read as a limit.
    """
    mib = limits.memory // (1024 * 1024)
    if facts.stuck:
        return "SYSTEM_ERROR", "the box did not stop after it was killed"
    if facts.killed_for == "output":
        return "OUTPUT_LIMIT", f"output over {limits.output // 1024} KiB"
    failed = facts.killed_for is not None or facts.exit_code != 0 or facts.signal is not None
    if facts.oom_killed or (failed and facts.memory_peak >= limits.memory):
        return "MEMORY_LIMIT", f"memory over {mib} MiB (peak {facts.memory_peak // (1024 * 1024)} MiB)"
    if facts.cpu >= limits.cpu:
        return "TIME_LIMIT", f"CPU time {facts.cpu:.3f}s over {limits.cpu:g}s"
    if facts.killed_for == "wall" and facts.waited * 2 >= facts.wall:
        # Stopped at the wall guard's hard cap having mostly waited for a CPU: nothing the program
        # did; a verdict on it would be a guess.
        return "SYSTEM_ERROR", (
            f"the worker was overloaded: the program waited {facts.waited:.1f}s of {facts.wall:.1f}s for a CPU"
        )
    if facts.killed_for == "wall":
        return "IDLENESS_LIMIT", f"wall time over {limits.wall:g}s with {facts.cpu:.3f}s of CPU"
    if facts.signal is not None:
        return "RUNTIME_ERROR", f"killed by signal {facts.signal}"
    if facts.exit_code is None:
        return "SYSTEM_ERROR", "the sandbox reported no exit status"
    if facts.exit_code != 0:
        reason = f"exit status {facts.exit_code}"
        if facts.exit_code > 128:
            reason += f" (an exit({facts.exit_code}) or signal {facts.exit_code - 128})"
        return "RUNTIME_ERROR", reason
    return None


def classify_run(facts: RunFacts, limits: Limits, expected: str) -> tuple[Status, str | None]:
    """Verdict of one run against an expected output with the default ``lines`` checker (pure)."""
    forced = classify_facts(facts, limits)
    if forced is not None:
        return forced
    if not outputs_match(facts.stdout, expected):
        return "WRONG_ANSWER", None
    return "ACCEPTED", None


def helper_outcome(facts: RunFacts, *, absolute_points: bool = False) -> CheckResult:
    """What a testlib-protocol checker or interactor said, from its facts (pure): testlib's exit
    codes, its message from stderr (or stdout); a checker stopped by its limits or killed is
    SYSTEM_ERROR."""
    limited = facts.killed_for is not None or facts.oom_killed or facts.stuck
    return custom_outcome(
        facts.exit_code, facts.signal, facts.stderr or facts.stdout, timed_out=limited, absolute_points=absolute_points
    )


def kattis_helper_outcome(facts: RunFacts, feedback: dict[str, bytes], *, score_allowed: bool) -> CheckResult:
    """What a Kattis output validator said, from its facts and feedback directory (pure)."""
    limited = facts.killed_for is not None or facts.oom_killed or facts.stuck
    return kattis_outcome(
        facts.exit_code, facts.signal, feedback, facts.stderr, timed_out=limited, score_allowed=score_allowed
    )


def format_facts(facts: RunFacts, limits: Limits, fmt: str) -> tuple[Status, str] | None:
    """:func:`classify_facts` under a format's rules (pure): Kattis has no idleness verdict, a run
    stopped by the wall clock is over its time limit there."""
    forced = classify_facts(facts, limits)
    if forced is not None and forced[0] == "IDLENESS_LIMIT" and fmt == "kattis":
        return "TIME_LIMIT", forced[1]
    return forced


def classify_interactive(
    submission: RunFacts, limits: Limits, interactor: RunFacts, said: CheckResult, fmt: str = "judgequeue"
) -> tuple[Status, float, str]:
    """Verdict, score and message of one interactive test (pure), by the package format's rules.

    judgequeue and Polygon (testlib): an interactor that failed (crashed, its limits, exit 3) is
    the system's fault; then the submission's limits (IDLENESS_LIMIT when it waited forever: it
    is stopped before the interactor, so the interactor's complaint about EOF does not hide it);
    then the interactor's verdict (a wrong guess, too many queries: the submission may have died
    writing to it, so this comes before the submission's exit status); then the submission's crash.

    ICPC/Kattis (problemtools' rules): a validator that failed is a judge error; a wrong answer
    from a validator that ended before the submission wins over anything the submission did after
    (a wrong guess, then a spin); then the submission's time limit (wall clock included), its
    crash (a crash at once is a run-time error even if the validator then says wrong answer), and
    last the validator's verdict.
    """
    if fmt == "kattis":
        if interactor.stuck or said.verdict == "SYSTEM_ERROR":
            return "SYSTEM_ERROR", 0.0, f"output validator: {said.message}"[:MAX_MESSAGE]
        validator_first = 0 < interactor.ended < submission.ended or (interactor.ended and not submission.ended)
        if said.verdict == "WRONG_ANSWER" and validator_first:
            return "WRONG_ANSWER", 0.0, said.message
        forced = format_facts(submission, limits, fmt)
        if forced is not None:
            return forced[0], 0.0, forced[1]
        return said.verdict, said.score, said.message
    if interactor.stuck or said.verdict == "SYSTEM_ERROR":
        return "SYSTEM_ERROR", 0.0, f"interactor: {said.message}"[:MAX_MESSAGE]
    forced = classify_facts(submission, limits)
    if forced is not None and forced[0] != "RUNTIME_ERROR":
        return forced[0], 0.0, forced[1]
    if said.verdict != "ACCEPTED":
        return said.verdict, said.score, said.message
    if forced is not None:
        return forced[0], 0.0, forced[1]
    return "ACCEPTED", said.score, said.message


def result_of(
    number: int, verdict: Status, facts: RunFacts | None, score: float, message: str, points: float | None = None
) -> TestResult:
    """One test's line in the verdict details (pure)."""
    if facts is None:
        return TestResult(number, verdict, score, message=message[:MAX_MESSAGE], points=points)
    return TestResult(
        test=number, verdict=verdict, score=score,
        cpu_ms=round(facts.cpu * 1000), wall_ms=round(facts.wall * 1000), memory_kb=facts.memory_peak // 1024,
        exit_code=facts.exit_code, signal=facts.signal, message=message[:MAX_MESSAGE], points=points,
    )  # fmt: skip


def verdict_details(
    results: list[TestResult], problem: Problem, base: dict[str, Any], stderr: dict[int, bytes] | None = None
) -> Verdict:
    """The submission's verdict from its test results (pure): the first failing test's verdict (or,
    for a Kattis package, its test data tree's), that test as ``failed_test`` with its message as the
    reason and its stderr, and the score when the problem is scored. The test named is always one
    whose verdict is the submission's, and the stderr is that test's own."""
    summary = summarize(results, problem.scoring, len(problem.tests))
    details: dict[str, Any] = {**base, "tests": [r.as_dict() for r in results]}
    ordered = sorted(results, key=lambda r: r.test)
    failing = None
    if summary.verdict != "ACCEPTED":
        failing = next((r for r in ordered if r.verdict == summary.verdict), None)
        failing = failing or next((r for r in ordered if r.verdict != "ACCEPTED"), None)
    if failing is not None:
        details["failed_test"] = failing.test
        if failing.message:
            details["reason"] = failing.message
        if stderr and stderr.get(failing.test):
            details["stderr"] = tail(stderr[failing.test])
    if summary.score is not None:
        details.update(score=summary.score, max_score=summary.max_score)
        if summary.groups:
            details["groups"] = summary.groups
    status = next(s for s in STATUSES if s == summary.verdict)  # every test verdict is a Status
    return Verdict(status, details)


def tail(data: bytes, limit: int = 2000) -> str:
    """The last ``limit`` bytes of a program's output as text, for people."""
    return data[-limit:].decode("utf-8", errors="replace")
