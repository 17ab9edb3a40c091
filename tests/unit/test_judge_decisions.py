"""The program judge's pure decisions: package payloads, the language table, interactive verdicts,
and how per-test results become the submission's verdict and score."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from judgequeue.core.base.errors import ConfigError
from judgequeue.core.judges.program import (
    InvalidProgramPayload,
    Problem,
    classify_interactive,
    helper_outcome,
    inline_problem,
    package_problem,
    parse_payload,
    verdict_details,
)
from judgequeue.core.judges.program.checkers import CheckResult
from judgequeue.core.judges.program.languages import (
    COMPILE_LIMITS,
    LANGUAGES,
    Language,
    compile_failure,
    expand,
    missing_tools,
    template_values,
)
from judgequeue.core.judges.program.scoring import TestResult, parse_scoring
from judgequeue.core.judges.sandbox import Limits, RunFacts
from judgequeue.core.judges.sandbox.isolation import load_judge_settings

SRC = {"language": "python", "source": "print(1)"}
LIMITS = Limits(cpu=1, wall=2.5, memory=64 << 20, output=1024)


def facts(**kw: Any) -> RunFacts:
    base: dict[str, Any] = {
        "exit_code": 0, "signal": None, "stdout": b"", "stderr": b"", "wall": 0.1, "cpu": 0.05,
        "memory_peak": 4 << 20, "oom_killed": False,
    }  # fmt: skip
    return RunFacts(**{**base, **kw})


# --- payloads -----------------------------------------------------------------------------------------


def test_a_payload_names_a_package_or_carries_tests_never_both() -> None:
    program = parse_payload({**SRC, "problem": "mean", "version": 3})
    assert (program.problem, program.version, program.tests) == ("mean", 3, [])
    bad = {
        "version must be a positive integer": {**SRC, "problem": "mean"},
        "version must be a positive integer .* got True": {**SRC, "problem": "mean", "version": True},
        "problem must be a package id": {**SRC, "problem": 7, "version": 1},
        "tests: a payload naming a problem package takes its tests from it": {
            **SRC, "problem": "mean", "version": 1, "tests": [{"output": "1"}],
        },
        "checker: a custom checker comes with a problem package": {
            **SRC, "tests": [{"output": "1"}], "checker": {"type": "custom"},
        },
        r"scoring.groups\[0\].tests: 2 is not a test number 1..1": {
            **SRC, "tests": [{"output": "1"}], "scoring": {"groups": [{"points": 5, "tests": [2]}]},
        },
        "checker.abs must be a number": {**SRC, "tests": [{"output": "1"}], "checker": {"type": "floats", "abs": 2}},
    }  # fmt: skip
    for message, payload in bad.items():
        with pytest.raises(InvalidProgramPayload, match=message):
            parse_payload(payload)


def test_inline_tests_with_a_checker_and_scoring() -> None:
    program = parse_payload(
        {**SRC, "tests": [{"input": "1", "output": "1"}] * 2, "checker": "tokens", "scoring": {"run_all": True}}
    )
    problem = inline_problem(program)
    assert [c.name for c in problem.tests] == ["1", "2"] and problem.tests[0].answer == b"1"
    assert problem.checker.kind == "tokens" and problem.scoring.run_all


def manifest(**kw: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "limits": {"time": 1}, "tests": [{"name": "1", "input": "a" * 64, "answer": "b" * 64}],
        "checker": {"type": "lines"}, "scoring": {},
    }  # fmt: skip
    return {**base, **kw}


def test_a_stored_package_becomes_a_problem_or_an_error_naming_it() -> None:
    ref = {"id": "mean", "version": 2, "sha256": "c" * 64}
    problem = package_problem(manifest(), lambda sha: Path("/cache") / sha, ref, max_tests=10)
    assert problem.tests[0].input == Path("/cache") / ("a" * 64) and problem.ref == ref
    assert problem.checker_program is None and problem.interactor is None and not problem.scoring.scored
    custom = manifest(checker={"type": "custom", "language": "cpp", "file": "d" * 64}, interactor=None)
    checker = package_problem(custom, lambda sha: Path(sha), ref, max_tests=10).checker_program
    assert checker is not None and (checker.language, checker.path) == ("cpp", Path("d" * 64))
    bad = {
        "problem mean version 2: limits.time must be between": manifest(limits={"time": 99}),
        "problem mean version 2: 1 tests, at most 0 per submission": manifest(),
        "problem mean version 2: checker: a custom checker needs its program file": manifest(
            checker={"type": "custom"}
        ),
        "problem mean version 2: interactor.language 'cobol' is not known here": manifest(
            interactor={"language": "cobol", "file": "e" * 64}
        ),
    }
    for message, m in bad.items():
        with pytest.raises(InvalidProgramPayload, match=message):
            package_problem(m, Path, ref, max_tests=0 if "at most 0" in message else 10)


# --- languages ----------------------------------------------------------------------------------------


def test_the_language_table_is_the_only_place_a_language_is_described() -> None:
    assert set(LANGUAGES) >= {"python", "c", "cpp", "java"}
    for name, lang in LANGUAGES.items():
        assert lang.name == name and parse_payload({"language": name, "source": "", "tests": [{"output": ""}]})
        assert lang.artifact is None or lang.compile is not None, f"{name}: only a build leaves a file"
    tools = {"gcc": "/usr/bin/gcc-12", "python3": "/usr/bin/python3.11"}
    values = template_values(LANGUAGES["c"], "", None, 64)
    assert expand(LANGUAGES["c"].compile or (), "/box", tools, values)[:4] == [
        "/usr/bin/gcc-12", "-O2", "-pipe", "-std=gnu17",
    ]  # fmt: skip
    assert expand(LANGUAGES["c"].run, "/box", tools) == ["/box/main"]
    assert missing_tools(LANGUAGES["cpp"], tools) == ["g++"] and missing_tools(LANGUAGES["python"], tools) == []
    jvm = {"ld.so": "/lib/ld.so", "jdk": "/usr/lib/jvm/x"}
    java = expand(LANGUAGES["java"].run, "/box", jvm, template_values(LANGUAGES["java"], "", None, 256))
    assert java[:4] == ["/lib/ld.so", "--library-path", "/usr/lib/jvm/x/lib", "/usr/lib/jvm/x/bin/java"]
    # One entry is a new language: its tools come from its templates.
    ruby = Language("ruby", "main.rb", ("{ruby}", "{dir}/main.rb"))
    assert ruby.tools() == {"ruby"} and expand(ruby.run, "/box", {"ruby": "/usr/bin/ruby"})[1] == "/box/main.rb"


def test_a_build_that_exceeds_its_limits_says_so() -> None:
    assert compile_failure("cpu", False, COMPILE_LIMITS) == "compile time limit: the build used 60s of CPU"
    assert compile_failure("wall", False, COMPILE_LIMITS) == "compile time limit: the build ran for 60s"
    assert compile_failure(None, True, COMPILE_LIMITS).startswith("compile memory limit")
    assert compile_failure(None, False, COMPILE_LIMITS) == "compilation failed"


def test_problem_cache_settings_name_the_bad_variable() -> None:
    settings = load_judge_settings({"JUDGEQUEUE_SANDBOX_DIR": "/srv/box"})
    assert settings.cache_dir == "/srv/box/problems" and settings.problem_cache_mb == 1024
    with pytest.raises(ConfigError, match="JUDGEQUEUE_PROBLEM_CACHE_MB must be an integer"):
        load_judge_settings({"JUDGEQUEUE_PROBLEM_CACHE_MB": "lots"})
    with pytest.raises(ConfigError, match="JUDGEQUEUE_PROBLEM_CACHE_DIR must be an absolute path"):
        load_judge_settings({"JUDGEQUEUE_PROBLEM_CACHE_DIR": "cache"})


# --- checkers and interactors as programs ----------------------------------------------------------------


def test_a_checker_program_that_cannot_judge_is_a_system_error() -> None:
    assert helper_outcome(facts(exit_code=7, stderr=b"0.25\nhalf right")) == CheckResult(
        "WRONG_ANSWER", 0.25, "half right", 0.25
    )
    assert helper_outcome(facts(exit_code=2, stderr=b"spaces")).verdict == "PRESENTATION_ERROR"
    assert helper_outcome(facts(exit_code=139)).verdict == "SYSTEM_ERROR"  # bubblewrap's report of a SIGSEGV
    assert helper_outcome(facts(exit_code=None, killed_for="cpu")).verdict == "SYSTEM_ERROR"
    assert helper_outcome(facts(exit_code=3, stderr=b"RuntimeError: bug")).message.endswith("RuntimeError: bug")


def test_interactive_verdicts_in_order() -> None:
    accepted, wrong = CheckResult.accepted("found"), CheckResult.wrong("more than 10 queries")
    broken = CheckResult("SYSTEM_ERROR", 0.0, "checker failed (exit 3): bad input")
    idle = facts(exit_code=None, killed_for="wall", cpu=0.01)
    piped = facts(exit_code=1, stderr=b"BrokenPipeError")
    # An interactor that cannot judge is the system's fault, whatever the submission did.
    assert classify_interactive(idle, LIMITS, facts(), broken)[0] == "SYSTEM_ERROR"
    assert classify_interactive(facts(), LIMITS, facts(stuck=True), accepted)[0] == "SYSTEM_ERROR"
    # A silent submission is IDLENESS_LIMIT even though the interactor then complains about EOF.
    assert classify_interactive(idle, LIMITS, facts(exit_code=1), wrong)[0] == "IDLENESS_LIMIT"
    assert classify_interactive(facts(cpu=1.5, killed_for="cpu"), LIMITS, facts(), wrong)[0] == "TIME_LIMIT"
    # The interactor's verdict beats the submission dying on the pipe the interactor closed.
    assert classify_interactive(piped, LIMITS, facts(exit_code=1), wrong) == (
        "WRONG_ANSWER", 0.0, "more than 10 queries",
    )  # fmt: skip
    assert classify_interactive(piped, LIMITS, facts(), accepted)[0] == "RUNTIME_ERROR"
    assert classify_interactive(facts(), LIMITS, facts(), accepted) == ("ACCEPTED", 1.0, "found")


# --- from tests to the submission's verdict -----------------------------------------------------------------


def problem_of(n: int, scoring: Any = None) -> Problem:
    program = parse_payload({**SRC, "tests": [{"output": ""}] * n})
    return Problem(inline_problem(program).tests, 1, 64, 64, program.checker, parse_scoring(scoring, n))


def test_the_first_failing_test_decides_and_the_score_is_recorded() -> None:
    results = [
        TestResult(1, "ACCEPTED", 1.0, 10, 20, 3000, 0, None, "ok"),
        TestResult(2, "PRESENTATION_ERROR", 0.0, 10, 20, 3000, 0, None, "leading spaces"),
        TestResult(3, "WRONG_ANSWER", 0.5, 10, 20, 3000, 0, None, "close"),
    ]
    plain = verdict_details(results[:2], problem_of(3), {"isolation": "full"}, {2: b"Traceback"})
    assert plain.status == "PRESENTATION_ERROR"
    assert (plain.details["failed_test"], plain.details["reason"], plain.details["stderr"]) == (
        2, "leading spaces", "Traceback",
    )  # fmt: skip
    assert "score" not in plain.details and plain.details["tests"][0]["cpu_ms"] == 10
    groups = {"groups": [{"name": "a", "points": 30, "tests": [1]}, {"name": "b", "points": 70, "tests": [2, 3]}]}
    scored = verdict_details(results, problem_of(3, groups), {})
    assert (scored.status, scored.details["score"], scored.details["max_score"]) == ("PRESENTATION_ERROR", 30, 100)
    assert "signal" not in scored.details["tests"][0]  # absent facts are left out, not null
    everything = verdict_details([results[0], replace(results[2], test=2)], problem_of(2, {"run_all": True}), {})
    assert (everything.status, everything.details["score"]) == ("WRONG_ANSWER", 75)
    assert verdict_details([results[0]], problem_of(1), {}).status == "ACCEPTED"
