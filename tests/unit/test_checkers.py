"""Checkers and scoring: the pure decisions of the program judge."""

from __future__ import annotations

import pytest

from judgequeue.core.judges.program.checkers import (
    CheckerSpec,
    InvalidChecker,
    check,
    custom_outcome,
    parse_spec,
)
from judgequeue.core.judges.program.scoring import (
    InvalidScoring,
    Scoring,
    TestResult,
    parse_scoring,
    should_run,
    summarize,
)

EXACT, LINES, TOKENS = CheckerSpec("exact"), CheckerSpec("lines"), CheckerSpec("tokens")
FLOATS = parse_spec({"type": "floats", "abs": 1e-6, "rel": 1e-6})


@pytest.mark.parametrize(
    ("spec", "output", "answer", "verdict"),
    [
        (EXACT, b"1 2\n", b"1 2\n", "ACCEPTED"),
        (EXACT, b"1 2 \n", b"1 2\n", "WRONG_ANSWER"),
        (EXACT, b"1 2", b"1 2\n", "WRONG_ANSWER"),
        (LINES, b"1 2  \n\n\n", b"1 2\n", "ACCEPTED"),
        (LINES, b"1  2\n", b"1 2\n", "WRONG_ANSWER"),
        (LINES, b"1\n2\n", b"1\n", "WRONG_ANSWER"),
        (LINES, b"", b"\n", "ACCEPTED"),
        (TOKENS, b"1\n\n  2\t3", b"1 2 3\n", "ACCEPTED"),
        (TOKENS, b"1 2", b"1 2 3", "WRONG_ANSWER"),
        (FLOATS, b"0.3333333", b"0.333333333333", "ACCEPTED"),  # within 1e-6 absolute
        (FLOATS, b"1000000.5", b"1000000", "ACCEPTED"),  # within 1e-6 relative
        (FLOATS, b"0.334", b"0.333333", "WRONG_ANSWER"),
        (FLOATS, b"nan", b"0.5", "WRONG_ANSWER"),  # NaN is never close to anything
        (FLOATS, b"inf", b"1e308", "WRONG_ANSWER"),
        (FLOATS, b"YES 1.0000001", b"YES 1", "ACCEPTED"),  # words compared exactly
        (FLOATS, b"yes 1", b"YES 1", "WRONG_ANSWER"),
        (FLOATS, b"\xff\xfe", b"1", "WRONG_ANSWER"),  # bytes that are not text
        # Python's float() syntax is not a contest's: no digit separators, no words (testlib rejects them).
        (FLOATS, b"1_0", b"10", "WRONG_ANSWER"),
        (FLOATS, b"infinity", b"1e308", "WRONG_ANSWER"),
        (FLOATS, b" 10", b"10.0", "ACCEPTED"),  # whitespace separates tokens, it is not part of one
        (FLOATS, b"1e1", b"10", "ACCEPTED"),
        (FLOATS, b".5", b"0.5", "ACCEPTED"),
    ],
)
def test_builtin_checkers(spec: CheckerSpec, output: bytes, answer: bytes, verdict: str) -> None:
    result = check(spec, output, answer)
    assert result.verdict == verdict, result
    assert result.score == (1.0 if verdict == "ACCEPTED" else 0.0)
    assert len(result.message) <= 300


def test_mismatch_messages_say_where() -> None:
    assert check(LINES, b"a\nb\n", b"a\nc\n").message == "line 2: expected 'c', got 'b'"
    assert check(TOKENS, b"1 2", b"1 3").message == "token 2: expected '3', got '2'"
    assert "error" in check(FLOATS, b"0.5", b"0.25").message
    long = b"x" * 10_000
    assert len(check(LINES, long, b"y").message) < 120


@pytest.mark.parametrize(
    ("spec", "error"),
    [
        ({"type": "regex"}, "checker type must be one of"),
        ({"type": "floats", "abs": -1}, "checker.abs must be a number in"),
        ({"type": "floats", "rel": "1e-6"}, "checker.rel must be a number"),
        (42, "checker must be a name or an object"),
    ],
)
def test_bad_checker_specs_are_named(spec: object, error: str) -> None:
    with pytest.raises(InvalidChecker, match=error):
        parse_spec(spec)


@pytest.mark.parametrize(
    ("exit_code", "signal", "message", "timed_out", "verdict", "score"),
    [
        (0, None, b"ok 3 numbers", False, "ACCEPTED", 1.0),
        (1, None, b"wrong answer 2nd number differs", False, "WRONG_ANSWER", 0.0),
        (2, None, b"extra tokens", False, "PRESENTATION_ERROR", 0.0),
        (7, None, b"0.25\nthree of twelve", False, "WRONG_ANSWER", 0.25),
        (7, None, b"1\nall", False, "ACCEPTED", 1.0),
        (7, None, b"lots\n", False, "SYSTEM_ERROR", 0.0),  # partial points without a score
        (7, None, b"1.5", False, "SYSTEM_ERROR", 0.0),
        (3, None, b"FAIL answer file is broken", False, "SYSTEM_ERROR", 0.0),
        (None, 11, b"Segmentation fault", False, "SYSTEM_ERROR", 0.0),  # a crashing checker
        (None, 9, b"", True, "SYSTEM_ERROR", 0.0),
    ],
)
def test_custom_checker_outcomes(
    exit_code: int | None, signal: int | None, message: bytes, timed_out: bool, verdict: str, score: float
) -> None:
    result = custom_outcome(exit_code, signal, message, timed_out=timed_out)
    assert (result.verdict, result.score) == (verdict, score)
    if verdict == "SYSTEM_ERROR":
        assert "checker" in result.message  # never passed off as the contestant's wrong answer


def ok(test: int) -> TestResult:
    return TestResult(test, "ACCEPTED", 1.0)


def bad(test: int, verdict: str = "WRONG_ANSWER", score: float = 0.0) -> TestResult:
    return TestResult(test, verdict, score)


def test_first_failure_policy_stops_and_takes_that_verdict() -> None:
    scoring = Scoring()
    assert should_run(2, [ok(1)], scoring)
    assert not should_run(3, [ok(1), bad(2, "TIME_LIMIT")], scoring)
    summary = summarize([ok(1), bad(2, "TIME_LIMIT")], scoring, 5)
    assert (summary.verdict, summary.score) == ("TIME_LIMIT", None)
    assert summarize([ok(1), ok(2)], scoring, 2).verdict == "ACCEPTED"


def test_subtasks_score_only_when_every_test_passes() -> None:
    scoring = parse_scoring({"groups": [{"name": "small", "points": 30, "tests": [1, 2]},
                                        {"name": "large", "points": 70, "tests": [3, 4, 5]}]}, 5)
    done = [ok(1), ok(2), ok(3), bad(4)]
    assert not should_run(5, done, scoring), "group 'large' already failed: test 5 cannot change the score"
    summary = summarize(done, scoring, 5)
    assert summary.verdict == "WRONG_ANSWER" and summary.score == 30 and summary.max_score == 100
    assert [g["earned"] for g in summary.groups] == [30, 0]
    assert summarize([ok(t) for t in range(1, 6)], scoring, 5).score == 100


def test_a_test_shared_by_two_groups_runs_while_one_of_them_can_still_score() -> None:
    scoring = parse_scoring({"groups": [{"points": 40, "tests": [1, 2]}, {"points": 60, "tests": [2, 3]}]}, 3)
    assert should_run(2, [bad(1)], scoring)  # group 2 still needs it
    assert not should_run(3, [bad(1), bad(2)], scoring)


def test_partial_points_scale_a_group_by_its_weakest_test() -> None:
    scoring = parse_scoring({"groups": [{"name": "all", "points": 50, "tests": [1, 2]}]}, 2)
    summary = summarize([ok(1), bad(2, score=0.5)], scoring, 2)
    assert summary.score == 25 and summary.verdict == "WRONG_ANSWER"


def test_run_all_without_groups_shares_100_points() -> None:
    scoring = parse_scoring({"run_all": True}, 4)
    assert should_run(4, [bad(1), bad(2), ok(3)], scoring)
    assert summarize([bad(1), ok(2), ok(3), bad(4, score=0.5)], scoring, 4).score == 62.5


@pytest.mark.parametrize(
    ("spec", "error"),
    [
        ({"groups": [{"points": 10, "tests": [1, 9]}]}, r"9 is not a test number 1\.\.3"),
        ({"groups": [{"points": 10, "tests": [1]}]}, r"tests \[2, 3\] belong to no group"),
        ({"groups": [{"points": "ten", "tests": [1, 2, 3]}]}, "points must be a number"),
        ({"run_all": "yes"}, "run_all must be true or false"),
    ],
)
def test_bad_scoring_is_named(spec: object, error: str) -> None:
    with pytest.raises(InvalidScoring, match=error):
        parse_scoring(spec, 3)
