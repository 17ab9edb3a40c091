"""From per-test results to a submission's verdict and score (pure functions, no I/O).

Two policies, as contest organisers use them:

- **first failure** (the default, ICPC and Codeforces style): tests run in order and judging stops at
  the first test that is not ``ACCEPTED``; the verdict is that test's.
- **scoring** (IOI, CMS style), chosen when a problem has groups or asks to run every test: tests are
  grouped into subtasks worth points; a group earns its points times the smallest score of its
  tests (so it earns nothing unless every test passes, and partial points a checker gives scale
  it); once a test of a group fails, that group's remaining tests are skipped (they cannot change
  its score) unless another group needs them too. The verdict is still the first failing test's.
  Without groups, every test is worth the same share of 100 points.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

#: Points of a problem with no groups, shared equally by its tests.
DEFAULT_POINTS = 100.0


class InvalidScoring(ValueError):
    """Groups that do not describe the problem's tests."""


@dataclass(frozen=True)
class TestResult:
    """One test's outcome, as reported per test in the verdict."""

    __test__ = False  # not a pytest test class despite the name

    test: int  # 1-based
    verdict: str
    score: float = 0.0  # in [0, 1]
    cpu_ms: int = 0
    wall_ms: int = 0
    memory_kb: int = 0
    exit_code: int | None = None
    signal: int | None = None
    message: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}


@dataclass(frozen=True)
class Group:
    name: str
    points: float
    tests: tuple[int, ...]


@dataclass(frozen=True)
class Scoring:
    """How a problem's tests count: groups with points, and whether every test runs."""

    groups: tuple[Group, ...] = ()
    run_all: bool = False

    @property
    def scored(self) -> bool:
        return self.run_all or bool(self.groups)


@dataclass(frozen=True)
class Summary:
    verdict: str
    score: float | None  # None under the first-failure policy
    max_score: float | None
    groups: list[dict[str, Any]] = field(default_factory=list)


def parse_scoring(spec: Any, test_count: int) -> Scoring:
    """Validate ``{"run_all": bool, "groups": [{"name", "points", "tests": [1, 2]}]}`` (pure)."""
    if spec is None:
        return Scoring()
    if not isinstance(spec, dict):
        raise InvalidScoring("scoring must be an object")
    run_all = spec.get("run_all", False)
    if not isinstance(run_all, bool):
        raise InvalidScoring("scoring.run_all must be true or false")
    groups = []
    raw_groups = spec.get("groups", [])
    if not isinstance(raw_groups, list):
        raise InvalidScoring("scoring.groups must be a list")
    seen: set[int] = set()
    for i, g in enumerate(raw_groups):
        where = f"scoring.groups[{i}]"
        if not isinstance(g, dict):
            raise InvalidScoring(f"{where} must be an object")
        name, points, tests = g.get("name", f"group {i + 1}"), g.get("points"), g.get("tests")
        if isinstance(points, bool) or not isinstance(points, (int, float)) or not 0 <= points <= 1e6:
            raise InvalidScoring(f"{where}.points must be a number in [0, 1000000]")
        if not isinstance(tests, list) or not tests:
            raise InvalidScoring(f"{where}.tests must be a non-empty list of test numbers")
        for t in tests:
            if isinstance(t, bool) or not isinstance(t, int) or not 1 <= t <= test_count:
                raise InvalidScoring(f"{where}.tests: {t!r} is not a test number 1..{test_count}")
        seen.update(tests)
        groups.append(Group(str(name), float(points), tuple(tests)))
    if groups and len(seen) != test_count:
        missing = sorted(set(range(1, test_count + 1)) - seen)
        raise InvalidScoring(f"tests {missing[:10]} belong to no group")
    return Scoring(tuple(groups), run_all)


def should_run(test: int, done: Sequence[TestResult], scoring: Scoring) -> bool:
    """Whether test ``test`` (1-based) still matters, given the results so far (pure)."""
    failed = {r.test for r in done if r.verdict != "ACCEPTED"}
    if not scoring.scored:
        return not failed
    if not scoring.groups:
        return True
    # Skip a test only if every group it belongs to already failed.
    return any(test in g.tests and not failed.intersection(g.tests) for g in scoring.groups)


def summarize(results: Sequence[TestResult], scoring: Scoring, test_count: int) -> Summary:
    """The submission's verdict (first failing test's, or ACCEPTED) and, when scored, its score."""
    ordered = sorted(results, key=lambda r: r.test)
    failing = next((r for r in ordered if r.verdict != "ACCEPTED"), None)
    verdict = failing.verdict if failing is not None else "ACCEPTED"
    if not scoring.scored:
        return Summary(verdict, None, None)
    by_test = {r.test: r for r in ordered}
    groups = scoring.groups or tuple(
        Group(f"test {t}", DEFAULT_POINTS / test_count, (t,)) for t in range(1, test_count + 1)
    )
    report = []
    total = 0.0
    for g in groups:
        scores = [
            by_test[t].score if t in by_test and by_test[t].verdict in ("ACCEPTED", "WRONG_ANSWER") else 0.0
            for t in g.tests
        ]
        earned = g.points * min(scores)
        total += earned
        report.append({"name": g.name, "points": g.points, "earned": round(earned, 6), "tests": list(g.tests)})
    max_score = sum(g.points for g in groups)
    return Summary(verdict, round(total, 6), max_score, report if scoring.groups else [])
