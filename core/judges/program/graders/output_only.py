"""Output-only grading: nothing runs but the checker; each test's submitted output is checked, and a
test with none submitted is a wrong answer."""

from __future__ import annotations

from ...sandbox import Limits
from ..classify import result_of
from ..problem import Case
from ..scoring import TestResult
from .base import Grader, Grading, judge_output


class OutputOnly(Grader):
    """One test of an output-only problem: the output submitted for it, checked."""

    async def grade(
        self, g: Grading, number: int, case: Case, given: bytes, limits: Limits
    ) -> tuple[TestResult, bytes]:
        assert g.outputs is not None
        problem = g.problem
        output = g.outputs.get(case.name)
        if output is None:
            return result_of(number, "WRONG_ANSWER", None, 0.0, f"no output submitted for test {case.name}"), b""
        data = output.encode()
        if len(data) > problem.output_kb * 1024:
            return result_of(number, "OUTPUT_LIMIT", None, 0.0, f"output over {problem.output_kb} KiB"), b""
        said = await judge_output(g, case, given, data, g.ahead(number))
        return result_of(number, said.verdict, None, said.score, said.message, said.points), b""
