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

Two formats bring rules of their own, applied to their packages only:

- **Polygon** groups: a ``complete-group`` group earns its points only when every test passes (as
  above); an ``each-test`` group earns the points of each test that passes (``test_points``, or
  the points a testlib checker gave for it); a group whose dependencies did not all pass earns
  nothing, and its tests are skipped.
- **ICPC/Kattis** test data groups (:class:`KattisGroup`, a tree mirroring ``data/``): tests run in
  order, a group stops at its first rejected test when its ``on_reject`` is ``break``, each test
  scores its ``accept_score`` or ``reject_score`` (or the validator's ``score.txt``), and each
  group's verdict and score come from problemtools' default grader and its flags
  (``worst_error``/``first_error``/``always_accept``, ``sum``/``min``/``max``/``avg``,
  ``ignore_sample``, ``accept_if_any_accepted``). The root's verdict is the submission's.
"""

from __future__ import annotations

import math
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
    points: float | None = None  # points a checker gave in its own units (testlib quitp, Kattis score.txt)

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}


@dataclass(frozen=True)
class Group:
    name: str
    points: float
    tests: tuple[int, ...]
    each_test: bool = False  # Polygon's each-test policy: the points of every test that passes
    depends: tuple[str, ...] = ()  # groups that must pass entirely for this one to earn anything


@dataclass(frozen=True)
class KattisGroup:
    """One ICPC/Kattis test data group: its items (test numbers and subgroups, in judging order)
    and the settings of its ``testdata.yaml`` after inheritance."""

    name: str
    items: tuple[int | KattisGroup, ...]
    on_reject: str = "break"  # or "continue"
    accept_score: float = 1.0
    reject_score: float = 0.0
    grader_flags: tuple[str, ...] = ()


@dataclass(frozen=True)
class Scoring:
    """How a problem's tests count: groups with points, and whether every test runs; or a Kattis
    test data tree (``tree``), scored when the problem is a scoring one (``tree_scored``)."""

    groups: tuple[Group, ...] = ()
    run_all: bool = False
    test_points: tuple[float, ...] = ()  # Polygon: each test's points, by test number - 1
    tree: KattisGroup | None = None
    tree_scored: bool = False

    @property
    def scored(self) -> bool:
        return self.run_all or bool(self.groups) or (self.tree is not None and self.tree_scored)


@dataclass(frozen=True)
class Summary:
    verdict: str
    score: float | None  # None under the first-failure policy
    max_score: float | None
    groups: list[dict[str, Any]] = field(default_factory=list)


def parse_scoring(spec: Any, test_count: int) -> Scoring:
    """Validate ``{"run_all": bool, "groups": [{"name", "points", "tests": [1, 2]}]}`` (pure).

    Groups may also say ``"each_test": true`` and ``"depends": [names]`` (Polygon), with
    ``"test_points": [..]`` for every test; or the spec is ``{"kattis": TREE, "scored": bool}``."""
    if spec is None:
        return Scoring()
    if not isinstance(spec, dict):
        raise InvalidScoring("scoring must be an object")
    if "kattis" in spec:
        seen_tree: set[int] = set()
        tree = _parse_tree(spec["kattis"], "scoring.kattis", test_count, seen_tree)
        if len(seen_tree) != test_count:
            missing = sorted(set(range(1, test_count + 1)) - seen_tree)
            raise InvalidScoring(f"scoring.kattis: tests {missing[:10]} belong to no group")
        return Scoring(tree=tree, tree_scored=bool(spec.get("scored", False)))
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
        name, points, tests = (
            g.get("name", f"group {i + 1}"),
            g.get("points", 0 if g.get("each_test") else None),
            g.get("tests"),
        )
        if isinstance(points, bool) or not isinstance(points, (int, float)) or not 0 <= points <= 1e6:
            raise InvalidScoring(f"{where}.points must be a number in [0, 1000000]")
        if not isinstance(tests, list) or not tests:
            raise InvalidScoring(f"{where}.tests must be a non-empty list of test numbers")
        for t in tests:
            if isinstance(t, bool) or not isinstance(t, int) or not 1 <= t <= test_count:
                raise InvalidScoring(f"{where}.tests: {t!r} is not a test number 1..{test_count}")
        each_test, depends = g.get("each_test", False), g.get("depends", [])
        if not isinstance(each_test, bool):
            raise InvalidScoring(f"{where}.each_test must be true or false")
        if not isinstance(depends, list) or not all(isinstance(d, str) for d in depends):
            raise InvalidScoring(f"{where}.depends must be a list of group names")
        seen.update(tests)
        groups.append(Group(str(name), float(points), tuple(tests), each_test, tuple(depends)))
    if groups and len(seen) != test_count:
        missing = sorted(set(range(1, test_count + 1)) - seen)
        raise InvalidScoring(f"tests {missing[:10]} belong to no group")
    names = {g.name for g in groups}
    for g in groups:
        unknown = [d for d in g.depends if d not in names or d == g.name]
        if unknown:
            raise InvalidScoring(f"scoring: group {g.name!r} depends on {unknown[0]!r}, not another group")
    test_points = spec.get("test_points", [])
    if (
        not isinstance(test_points, list)
        or (test_points and len(test_points) != test_count)
        or not all(isinstance(p, (int, float)) and not isinstance(p, bool) and 0 <= p <= 1e6 for p in test_points)
    ):
        raise InvalidScoring(f"scoring.test_points must be {test_count} numbers in [0, 1000000]")
    if any(g.each_test for g in groups) and not test_points:
        raise InvalidScoring("scoring: an each_test group needs test_points")
    return Scoring(tuple(groups), run_all, tuple(float(p) for p in test_points))


_ON_REJECT = ("break", "continue")
_FLAGS = {"worst_error", "no_errors", "first_error", "always_accept", "sum", "avg", "max", "min", "ignore_sample",
          "accept_if_any_accepted"}  # fmt: skip


def _parse_tree(node: Any, where: str, test_count: int, seen: set[int]) -> KattisGroup:
    if not isinstance(node, dict) or not isinstance(node.get("items"), list):
        raise InvalidScoring(f"{where} must be an object with a list of items")
    items: list[int | KattisGroup] = []
    for i, item in enumerate(node["items"]):
        if isinstance(item, dict):
            items.append(_parse_tree(item, f"{where}.items[{i}]", test_count, seen))
        elif isinstance(item, int) and not isinstance(item, bool) and 1 <= item <= test_count and item not in seen:
            seen.add(item)
            items.append(item)
        else:
            raise InvalidScoring(f"{where}.items[{i}]: {item!r} is not a test number 1..{test_count} (once)")
    on_reject = node.get("on_reject", "break")
    if on_reject not in _ON_REJECT:
        raise InvalidScoring(f"{where}.on_reject must be break or continue, got {on_reject!r}")
    flags = node.get("grader_flags", [])
    if not isinstance(flags, list) or not all(isinstance(f, str) for f in flags):
        raise InvalidScoring(f"{where}.grader_flags must be a list of strings")
    scores = []
    for key, default in (("accept_score", 1.0), ("reject_score", 0.0)):
        value = node.get(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise InvalidScoring(f"{where}.{key} must be a number")
        scores.append(float(value))
    return KattisGroup(str(node.get("name", "")), tuple(items), on_reject, scores[0], scores[1], tuple(flags))


#: problemtools' default grader: verdicts from worst to best.
_WORST_FIRST = ("SYSTEM_ERROR", "RUNTIME_ERROR", "MEMORY_LIMIT", "TIME_LIMIT", "OUTPUT_LIMIT", "WRONG_ANSWER",
                "PRESENTATION_ERROR", "ACCEPTED")  # fmt: skip
_KATTIS_CLASS = {"IDLENESS_LIMIT": "TIME_LIMIT", "COMPILE_ERROR": "SYSTEM_ERROR"}


def _rank(verdict: str) -> int:
    return _WORST_FIRST.index(_KATTIS_CLASS.get(verdict, verdict))


@dataclass(frozen=True)
class Graded:
    """A Kattis group's outcome: its verdict and score, as problemtools' default grader gives them."""

    verdict: str
    score: float


def kattis_grade(results: Sequence[Graded], flags: Sequence[str]) -> Graded:
    """problemtools' default grader over a group's children (pure)."""
    verdicts = [r.verdict for r in results]
    scores = [r.score for r in results]
    if "ignore_sample" in flags:
        verdicts = verdicts[-1:]  # the sample group comes first; only the rest counts for the verdict
    verdict_rule, score_rule = "worst_error", "sum"
    for flag in flags:
        if flag in ("worst_error", "no_errors", "first_error", "always_accept"):
            verdict_rule = flag
        elif flag in ("sum", "avg", "max", "min"):
            score_rule = flag
    if "accept_if_any_accepted" in flags and "ACCEPTED" in verdicts:
        verdict = "ACCEPTED"
    elif verdict_rule == "first_error":
        verdict = next((v for v in verdicts if v != "ACCEPTED"), "ACCEPTED")
    elif verdict_rule == "always_accept":
        verdict = "ACCEPTED"
    else:
        verdict = min([*verdicts, "ACCEPTED"], key=_rank)
    if score_rule == "avg":
        score = sum(scores) / len(scores)
    elif score_rule == "max":
        score = max(scores)
    elif score_rule == "min":
        score = min(scores)
    else:
        score = sum(scores)
    return Graded(verdict, float(score))


def kattis_walk(group: KattisGroup, done: dict[int, TestResult]) -> Graded | int | None:
    """Walk a Kattis test data tree as problemtools judges it (pure): the number of the next test
    to run, or the group's outcome once it is decided (None for a group with nothing in it)."""
    children: list[Graded] = []
    for item in group.items:
        if isinstance(item, int):
            result = done.get(item)
            if result is None:
                return item
            if result.verdict == "ACCEPTED":
                score = result.points if result.points is not None else group.accept_score
            else:
                score = group.reject_score
            child = Graded(result.verdict, score)
        else:
            outcome = kattis_walk(item, done)
            if isinstance(outcome, int):
                return outcome
            if outcome is None:
                continue
            child = outcome
        children.append(child)
        if child.verdict != "ACCEPTED" and group.on_reject == "break":
            break
    if not children:
        return None
    failed = next((c for c in children if c.verdict == "SYSTEM_ERROR"), None)
    return failed if failed is not None else kattis_grade(children, group.grader_flags)


def _kattis_tests(group: KattisGroup) -> list[int]:
    return [t for item in group.items for t in ([item] if isinstance(item, int) else _kattis_tests(item))]


def should_run(test: int, done: Sequence[TestResult], scoring: Scoring) -> bool:
    """Whether test ``test`` (1-based) still matters, given the results so far (pure)."""
    if scoring.tree is not None:
        return kattis_walk(scoring.tree, {r.test: r for r in done}) == test
    failed = {r.test for r in done if r.verdict != "ACCEPTED"}
    if not scoring.scored:
        return not failed
    if not scoring.groups:
        return True
    passed = _passed_groups(scoring, done)
    # Skip a test only if every group it belongs to already failed (or lost a dependency).
    return any(
        test in g.tests
        and (g.each_test or not failed.intersection(g.tests))
        and all(passed.get(d, True) for d in g.depends)
        for g in scoring.groups
    )


def finished(done: Sequence[TestResult], scoring: Scoring) -> bool:
    """Whether no test left can change the outcome (pure): a Kattis tree that is decided."""
    return scoring.tree is not None and not isinstance(kattis_walk(scoring.tree, {r.test: r for r in done}), int)


def _passed_groups(scoring: Scoring, done: Sequence[TestResult]) -> dict[str, bool]:
    """For each group: False once one of its tests failed (True while none has)."""
    failed = {r.test for r in done if r.verdict != "ACCEPTED"}
    return {g.name: not failed.intersection(g.tests) for g in scoring.groups}


def _share(result: TestResult | None, points: float | None) -> float:
    """A test's share of its points: 0 unless it passed or a checker gave it partial points."""
    if result is None or result.verdict not in ("ACCEPTED", "WRONG_ANSWER"):
        return 0.0
    if result.points is not None and points:
        return min(1.0, result.points / points)
    return result.score


def summarize(results: Sequence[TestResult], scoring: Scoring, test_count: int) -> Summary:
    """The submission's verdict (first failing test's, or ACCEPTED; a Kattis tree's root verdict)
    and, when scored, its score."""
    ordered = sorted(results, key=lambda r: r.test)
    if scoring.tree is not None:
        return _summarize_tree(scoring.tree, ordered, scoring.tree_scored)
    failing = next((r for r in ordered if r.verdict != "ACCEPTED"), None)
    verdict = failing.verdict if failing is not None else "ACCEPTED"
    if not scoring.scored:
        return Summary(verdict, None, None)
    by_test = {r.test: r for r in ordered}
    groups = scoring.groups or tuple(
        Group(f"test {t}", DEFAULT_POINTS / test_count, (t,)) for t in range(1, test_count + 1)
    )
    complete = {g.name: all(t in by_test and by_test[t].verdict == "ACCEPTED" for t in g.tests) for g in groups}
    report = []
    total = 0.0
    max_score = 0.0
    for g in groups:
        worth = [scoring.test_points[t - 1] if scoring.test_points else None for t in g.tests]
        if g.each_test:
            earned = sum(_share(by_test.get(t), p) * (p or 0.0) for t, p in zip(g.tests, worth, strict=True))
            most = sum(p or 0.0 for p in worth)
        else:
            earned = g.points * min(_share(by_test.get(t), p) for t, p in zip(g.tests, worth, strict=True))
            most = g.points
        if not all(complete.get(d, False) for d in g.depends):
            earned = 0.0
        total += earned
        max_score += most
        report.append({"name": g.name, "points": most, "earned": round(earned, 6), "tests": list(g.tests)})
    return Summary(verdict, round(total, 6), max_score, report if scoring.groups else [])


def _summarize_tree(tree: KattisGroup, ordered: Sequence[TestResult], scored: bool) -> Summary:
    outcome = kattis_walk(tree, {r.test: r for r in ordered})
    if not isinstance(outcome, Graded):  # nothing ran (a budget used up before the first test)
        failing = next((r for r in ordered if r.verdict != "ACCEPTED"), None)
        return Summary(failing.verdict if failing else "ACCEPTED", 0.0 if scored else None, None)
    if not scored:
        return Summary(outcome.verdict, None, None)
    best = kattis_walk(tree, {t: TestResult(t, "ACCEPTED", 1.0) for t in _kattis_tests(tree)})
    most = best.score if isinstance(best, Graded) else 0.0
    groups = []
    for sub in tree.items:
        if isinstance(sub, KattisGroup):
            got, top = (
                kattis_walk(sub, {r.test: r for r in ordered}),
                kattis_walk(sub, {t: TestResult(t, "ACCEPTED", 1.0) for t in _kattis_tests(sub)}),
            )
            earned = got.score if isinstance(got, Graded) else 0.0
            points = top.score if isinstance(top, Graded) else 0.0
            groups.append({"name": sub.name, "points": points, "earned": round(earned, 6), "tests": _kattis_tests(sub)})
    return Summary(outcome.verdict, round(outcome.score, 6), most, groups)
