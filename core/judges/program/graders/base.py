"""What every grader shares: the submission being graded (:class:`Grading`) and how one output is
checked against a test, by the problem's built-in checker, its testlib checker program or its
Kattis output validator."""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass

from ...sandbox import Limits, run
from ..boxes import Box, Boxes, read_data, read_feedback, write_bytes
from ..checkers import CheckResult, check
from ..classify import helper_outcome, kattis_helper_outcome
from ..problem import HELPER_LIMITS, Case, Problem
from ..scoring import TestResult


@dataclass(frozen=True)
class Grading:
    """One submission being graded, test by test: its problem, its box, and the commands that run
    in it (the submission's, empty for an output-only one; the checker's and the interactor's when
    the problem has them). ``outputs``: an output-only submission's output for each test, by name."""

    problem: Problem
    box: Box
    boxes: Boxes
    argv: list[str]
    checker: list[str] | None = None
    interactor: list[str] | None = None
    outputs: dict[str, str] | None = None

    def ahead(self, number: int) -> bool:
        """Whether another test follows test ``number`` (its runs may be started ahead)."""
        return number < len(self.problem.tests)


class Grader:
    """One grading mode: how a submission meets one test. ``limits`` are the submission's run limits
    for this test (its wall limit cut to what is left of the submission's budget). Returns the
    test's result and what the submission wrote to stderr."""

    async def grade(
        self, g: Grading, number: int, case: Case, given: bytes, limits: Limits
    ) -> tuple[TestResult, bytes]:
        raise NotImplementedError


async def judge_output(g: Grading, case: Case, given: bytes, output: bytes, ahead: bool) -> CheckResult:
    """Check one output against the test: the built-in checker, or the package's checker program
    by its protocol."""
    answer = await read_data(case.answer)
    problem = g.problem
    if g.checker is None:
        return check(problem.checker, output, answer, case.flags)
    assert problem.checker_program is not None
    if problem.checker_program.protocol == "kattis":
        return await run_validator(g, case, given, output, answer)
    return await run_checker(g, given, output, answer, ahead)


async def run_checker(g: Grading, given: bytes, output: bytes, answer: bytes, ahead: bool) -> CheckResult:
    """Run the custom checker on one test (testlib arguments: input, output, answer); in one box
    for all of a submission's tests, like the tests (the files are rewritten before each run).
    Polygon's checkers give points in the problem's own units."""
    box = g.box
    assert g.checker is not None

    def write() -> None:
        for name, data in (("input", given), ("output", output), ("answer", answer)):
            write_bytes(os.path.join(box.check_dir, name), data)

    await asyncio.to_thread(write)
    inside = g.boxes.inside(box.check_dir)
    paths = [f"{inside}/input", f"{inside}/output", f"{inside}/answer"]
    facts = await box.checks.run([*g.checker, *paths], stdin=b"", limits=HELPER_LIMITS, ahead=ahead)
    return helper_outcome(facts, absolute_points=g.problem.format == "polygon")


async def run_validator(g: Grading, case: Case, given: bytes, output: bytes, answer: bytes) -> CheckResult:
    """Run a Kattis output validator on one test: ``validator input answer feedback/ [flags] <
    output``, in its directory (writable: the feedback directory is in it), then read its feedback."""
    box = g.box
    assert g.checker is not None

    def write() -> None:
        for name, data in (("input", given), ("answer", answer)):
            write_bytes(os.path.join(box.check_dir, name), data)
        g.boxes.fresh_feedback(box.check_dir, box.uid)

    await asyncio.to_thread(write)
    inside = g.boxes.inside(box.check_dir)
    command = [*g.checker, f"{inside}/input", f"{inside}/answer", f"{inside}/feedback/", *case.flags]
    facts = await run(
        command, box=box.check_dir, uid=box.uid, stdin=output, limits=HELPER_LIMITS, isolation=g.boxes.isolation,
        group=box.helper_group, writable_box=True,
    )  # fmt: skip
    feedback = await asyncio.to_thread(read_feedback, os.path.join(box.check_dir, "feedback"))
    return kattis_helper_outcome(facts, feedback, score_allowed=g.problem.custom_score)

