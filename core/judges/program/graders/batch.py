"""Batch grading: the submission's program runs on each test's input; its output is checked."""

from __future__ import annotations

from ...sandbox import Limits
from ..classify import format_facts, result_of
from ..problem import Case
from ..scoring import TestResult
from .base import Grader, Grading, judge_output


class Batch(Grader):
    """Run one ordinary test and check its output."""

    async def grade(
        self, g: Grading, number: int, case: Case, given: bytes, limits: Limits
    ) -> tuple[TestResult, bytes]:
        ahead = g.ahead(number)
        facts = await g.box.tests.run(g.argv, stdin=given, limits=limits, ahead=ahead)
        forced = format_facts(facts, limits, g.problem.format)
        if forced is not None:
            return result_of(number, forced[0], facts, 0.0, forced[1]), facts.stderr
        said = await judge_output(g, case, given, facts.stdout, ahead)
        return result_of(number, said.verdict, facts, said.score, said.message, said.points), facts.stderr
