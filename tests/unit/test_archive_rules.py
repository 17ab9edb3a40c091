"""The pure rules the package formats bring: testlib's points, the Kattis default validator and its
flags, a Kattis validator's exit codes and feedback, problemtools' default grader over a test data
tree, Polygon's group policies, and who wins an interactive test under each format's rules."""

from __future__ import annotations

from typing import Any

import pytest

from judgequeue.core.judges.checkers import (
    CheckerSpec,
    CheckResult,
    InvalidChecker,
    KattisFlags,
    custom_outcome,
    kattis_default,
    kattis_flags,
    kattis_outcome,
    parse_testlib_points,
)
from judgequeue.core.judges.program import Case, Problem, classify_interactive, verdict_details
from judgequeue.core.judges.sandbox import Limits, RunFacts
from judgequeue.core.judges.scoring import (
    Graded,
    TestResult,
    kattis_grade,
    kattis_walk,
    parse_scoring,
    should_run,
    summarize,
)


def test_testlib_points_as_testlib_writes_them() -> None:
    assert parse_testlib_points("points 0.25 ja=1.0000 pa=1.2500") == (0.25, "ja=1.0000 pa=1.2500")
    assert parse_testlib_points("points 3") == (3.0, "")
    assert parse_testlib_points("0.5\nclose enough") == (0.5, "close enough")  # judgequeue's older form
    assert parse_testlib_points("points_info=12 fine")[0] is None
    pointscmp = custom_outcome(7, None, b"points 0.25 ja=1.0000 pa=1.2500\n", timed_out=False)
    assert pointscmp == CheckResult("WRONG_ANSWER", 0.25, "ja=1.0000 pa=1.2500", 0.25)
    # Polygon counts testlib points as the test's own points: 12 is a number of points, not a share.
    assert custom_outcome(7, None, b"points 12", timed_out=False).verdict == "SYSTEM_ERROR"
    absolute = custom_outcome(7, None, b"points 12 good", timed_out=False, absolute_points=True)
    assert (absolute.verdict, absolute.points, absolute.message) == ("ACCEPTED", 12.0, "good")
    assert custom_outcome(8, None, b"unexpected eof", timed_out=False).verdict == "PRESENTATION_ERROR"


@pytest.mark.parametrize(
    ("output", "answer", "flags", "verdict"),
    [
        (b"Yes 3\n", b"YES   3", [], "ACCEPTED"),  # case-insensitive, any whitespace
        (b"Yes 3\n", b"YES 3\n", ["case_sensitive"], "WRONG_ANSWER"),
        (b"1 2\n", b"1  2\n", ["space_change_sensitive"], "WRONG_ANSWER"),
        (b"1  2\n", b"1  2\n", ["space_change_sensitive"], "ACCEPTED"),
        (b"1 2", b"1 2\n", ["space_change_sensitive"], "WRONG_ANSWER"),  # the trailing newline too
        (b"0.3333", b"0.333333", ["float_tolerance", "1e-3"], "ACCEPTED"),
        (b"3.14000000e-2", b"0.0314", ["float_absolute_tolerance", "1e-9"], "ACCEPTED"),
        (b"0x1p-1", b"0.5", ["float_tolerance", "0"], "ACCEPTED"),  # C's strtod reads hex floats
        (b"0.34", b"0.333", ["float_relative_tolerance", "1e-3"], "WRONG_ANSWER"),
        (b"2.0e2", b"200", [], "WRONG_ANSWER"),  # without a tolerance, numbers are plain tokens
        (b"1_0", b"10", ["float_tolerance", "1e-6"], "WRONG_ANSWER"),
        (b"1 2 3", b"1 2", [], "WRONG_ANSWER"),  # trailing output
        (b"1", b"1 2", [], "WRONG_ANSWER"),
    ],
)
def test_the_kattis_default_validator(output: bytes, answer: bytes, flags: list[str], verdict: str) -> None:
    assert kattis_default(output, answer, kattis_flags(flags)).verdict == verdict


def test_kattis_flags_are_checked_as_the_default_validator_checks_them() -> None:
    assert kattis_flags(["float_tolerance", "1e-6", "case_sensitive"]) == KattisFlags(True, False, 1e-6, 1e-6)
    for bad in (["float_tolerance"], ["float_tolerance", "abc"], ["ignore_case"]):
        with pytest.raises(InvalidChecker):
            kattis_flags(bad)


def test_a_kattis_validators_exit_codes_and_feedback() -> None:
    def said(code: int | None, feedback: dict[str, bytes], *, scored: bool = False) -> CheckResult:
        return kattis_outcome(code, None, feedback, b"", timed_out=False, score_allowed=scored)

    assert said(42, {"judgemessage.txt": b"fine\n"}) == CheckResult("ACCEPTED", 1.0, "fine")
    assert said(43, {"teammessage.txt": b"bad"}) == CheckResult("WRONG_ANSWER", 0.0, "bad")
    assert said(42, {"score.txt": b"12.5\n"}, scored=True).points == 12.5
    assert said(42, {"score.txt": b"12.5"}).verdict == "SYSTEM_ERROR"  # custom scores not allowed
    assert said(43, {"score.txt": b"1"}, scored=True).verdict == "SYSTEM_ERROR"
    assert said(1, {}).verdict == "SYSTEM_ERROR"  # neither 42 nor 43: a judge error
    assert said(0, {}).verdict == "SYSTEM_ERROR"  # not even testlib's 0


def test_problemtools_default_grader() -> None:
    ac, wa, tle = Graded("ACCEPTED", 10), Graded("WRONG_ANSWER", 0), Graded("TIME_LIMIT", 0)
    assert kattis_grade([ac, wa, tle], []) == Graded("TIME_LIMIT", 10)  # worst error, sum
    assert kattis_grade([ac, wa, tle], ["first_error", "min"]) == Graded("WRONG_ANSWER", 0)
    assert kattis_grade([ac, wa], ["accept_if_any_accepted", "max"]) == Graded("ACCEPTED", 10)
    assert kattis_grade([wa, ac], ["ignore_sample"]) == Graded("ACCEPTED", 10)  # the sample's verdict is dropped
    assert kattis_grade([ac, Graded("ACCEPTED", 20)], ["avg"]) == Graded("ACCEPTED", 15)


def _tree(scored: bool = True) -> dict[str, Any]:
    group = {"on_reject": "break", "accept_score": 50, "grader_flags": ["min"]}
    return {"kattis": {"items": [{"name": "a", "items": [1, 2], **group}, {"name": "b", "items": [3, 4], **group}],
                       "on_reject": "continue"}, "scored": scored}  # fmt: skip


def test_a_test_data_tree_is_walked_as_problemtools_walks_it() -> None:
    scoring = parse_scoring(_tree(), 4)
    done = [TestResult(1, "ACCEPTED", 1.0), TestResult(2, "ACCEPTED", 1.0), TestResult(3, "WRONG_ANSWER")]
    assert kattis_walk(scoring.tree, {}) == 1  # type: ignore[arg-type]
    assert not should_run(4, done, scoring), "group b broke at its first rejected test"
    summary = summarize(done, scoring, 4)
    assert (summary.verdict, summary.score, summary.max_score) == ("WRONG_ANSWER", 50, 100)
    assert [g["earned"] for g in summary.groups] == [50, 0]
    plain = parse_scoring(_tree(scored=False), 4)
    assert summarize(done, plain, 4).score is None


def test_polygon_group_policies() -> None:
    spec = {
        "groups": [
            {"name": "samples", "points": 0, "tests": [1]},
            {"name": "each", "tests": [2, 3], "each_test": True},
            {"name": "all", "points": 60, "tests": [4, 5], "depends": ["each"]},
        ],
        "test_points": [0, 20, 20, 30, 30],
    }
    scoring = parse_scoring(spec, 5)
    ok = [TestResult(t, "ACCEPTED", 1.0) for t in range(1, 6)]
    assert summarize(ok, scoring, 5).score == 100
    one_wrong = [ok[0], TestResult(2, "WRONG_ANSWER"), ok[2]]
    assert not should_run(4, one_wrong, scoring), "a failed dependency: group 'all' cannot score"
    assert summarize(one_wrong, scoring, 5).score == 20
    # testlib points in a Polygon package are the test's points: 10 of the test's 20.
    partial = [ok[0], TestResult(2, "WRONG_ANSWER", 0.5, points=10.0), ok[2], ok[3], ok[4]]
    assert summarize(partial, scoring, 5).score == 30  # "all" needs every test of "each" to pass


def facts(**given: Any) -> RunFacts:
    base: dict[str, Any] = {"exit_code": 0, "signal": None, "stdout": b"", "stderr": b"", "wall": 0.1, "cpu": 0.05,
                            "memory_peak": 1 << 20, "oom_killed": False}  # fmt: skip
    return RunFacts(**{**base, **given})


LIMITS = Limits(cpu=1.0, wall=2.5)


def test_who_wins_an_interactive_test_under_each_formats_rules() -> None:
    wrong, accepted = CheckResult("WRONG_ANSWER", 0.0, "wrong guess"), CheckResult("ACCEPTED", 1.0, "found")
    spin = facts(cpu=1.0, killed_for="cpu", ended=20.0)  # a wrong guess, then a spin until the CPU limit
    early_validator = facts(exit_code=43, ended=10.0)
    assert classify_interactive(spin, LIMITS, early_validator, wrong, "kattis")[0] == "WRONG_ANSWER"
    assert classify_interactive(spin, LIMITS, facts(exit_code=1), wrong, "judgequeue")[0] == "TIME_LIMIT"
    crash = facts(exit_code=1, ended=10.0)  # a crash at once; the validator then sees end of file
    late_validator = facts(exit_code=43, ended=11.0)
    assert classify_interactive(crash, LIMITS, late_validator, wrong, "kattis")[0] == "RUNTIME_ERROR"
    assert classify_interactive(crash, LIMITS, facts(exit_code=1), wrong, "polygon")[0] == "WRONG_ANSWER"
    idle = facts(killed_for="wall", cpu=0.01, ended=30.0)
    assert classify_interactive(idle, LIMITS, facts(ended=31.0), accepted, "kattis")[0] == "TIME_LIMIT"
    assert classify_interactive(facts(ended=1.0), LIMITS, facts(ended=2.0), accepted, "kattis")[0] == "ACCEPTED"


def test_the_failed_test_and_its_stderr_agree() -> None:
    """A scored run: test 2 failed silently, test 6 crashed with a traceback. The verdict names test
    2 (the first failure of the verdict's kind) and carries test 2's stderr (none), not test 6's."""
    cases = tuple(Case(str(i), b"", b"") for i in range(1, 7))
    problem = Problem(cases, 1, 64, 64, CheckerSpec("lines"), parse_scoring({"run_all": True}, 6))
    results = [TestResult(t, "ACCEPTED", 1.0) for t in (1, 3, 4, 5)]
    results += [TestResult(2, "WRONG_ANSWER", message="line 1"), TestResult(6, "RUNTIME_ERROR", message="exit 1")]
    details = verdict_details(results, problem, {}, {6: b"Traceback (most recent call last): ..."}).details
    assert details["failed_test"] == 2 and details["reason"] == "line 1" and "stderr" not in details
    details = verdict_details(results, problem, {}, {2: b"to stderr", 6: b"Traceback"}).details
    assert details["stderr"] == "to stderr"
