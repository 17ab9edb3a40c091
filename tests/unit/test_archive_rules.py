"""The pure rules the package formats bring: testlib's points, the Kattis default validator and its
flags, a Kattis validator's exit codes and feedback, problemtools' default grader over a test data
tree, Polygon's group policies, and who wins an interactive test under each format's rules."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import problemtools
import pytest
import yaml

from judgequeue.core.config import ArchiveSettings
from judgequeue.core.judges.program import Case, Problem, classify_interactive, verdict_details
from judgequeue.core.judges.program.archives import kattis, polygon, zipped
from judgequeue.core.judges.program.archives.bounds import DEFAULT_BOUNDS
from judgequeue.core.judges.program.archives.common import Files, InvalidPackage, program
from judgequeue.core.judges.program.checkers import (
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
from judgequeue.core.judges.program.languages import LANGUAGES, UNAVAILABLE
from judgequeue.core.judges.program.scoring import (
    Graded,
    TestResult,
    kattis_grade,
    kattis_walk,
    parse_scoring,
    should_run,
    summarize,
)
from judgequeue.core.judges.sandbox import Limits, RunFacts


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


# --- the archives' languages as rows of the judge's table -------------------------------------------


def test_kattis_languages_are_problemtools_own_mapped_onto_the_table() -> None:
    """Every problemtools language the table runs has problemtools' file globs and priority, and C
    and C++ problemtools' standard (read from problemtools' own languages.yaml)."""
    config = yaml.safe_load((Path(problemtools.__file__).parent / "config" / "languages.yaml").read_text())
    for kattis_id, (row, suffixes, priority, std) in kattis.KATTIS_LANGUAGES.items():
        assert row in LANGUAGES or row in UNAVAILABLE, row
        theirs = config[kattis_id]
        ours = {f"*{s}" for s in suffixes} | ({"*.py"} if kattis_id == "python2" else set())  # by shebang
        assert ours == set(theirs["files"].split()) - ({"*.c"} if kattis_id == "haskell" else set()), kattis_id
        assert priority == theirs["priority"], kattis_id
        flag = re.search(r"-std=(\S+)", theirs.get("compile", ""))
        assert std == (flag.group(1) if flag and row in ("c", "cpp") else None), kattis_id
    assert set(config) - set(kattis.KATTIS_LANGUAGES) == {"cobol", "fsharp", "objectivec"}


def kattis_language(*names: str) -> tuple[str, str | None, list[str]] | None:
    found = kattis.language_of([Path(n) for n in names])
    return None if found is None else (found[0], found[1], [p.name for p in found[2]])


def test_the_language_of_a_kattis_program_as_problemtools_detects_it() -> None:
    assert kattis_language("validate.cc", "validate.h") == ("cpp", "gnu++23", ["validate.cc"])
    assert kattis_language("a.c") == ("c", "gnu17", ["a.c"])
    assert kattis_language("b.py", "a.py3", "notes.txt") == ("python", None, ["a.py3", "b.py"])
    assert kattis_language("Main.java", "Util.java")[:2] == ("java", None)  # type: ignore[index]
    assert kattis_language("solve.pl") == ("prolog", None, ["solve.pl"])  # .pl is Prolog on Kattis
    for name, row in (("m.kt", "kotlin"), ("m.rs", "rust"), ("m.hs", "haskell"), ("m.lisp", "lisp"),
                      ("m.sc", "scala"), ("m.pas", "pascal"), ("m.ml", "ocaml"), ("m.go", "go")):  # fmt: skip
        assert kattis_language(name) == (row, None, [name])
    assert kattis_language("a.c", "b.cc")[:2] == ("cpp", "gnu++23")  # type: ignore[index]  # tie: priority
    assert kattis_language("a.c", "b.c", "m.cc")[:2] == ("c", "gnu17")  # type: ignore[index]  # more files
    assert kattis_language("a.cs")[:2] == ("csharp", None)  # type: ignore[index]  # refused when read, with why
    assert kattis_language("README.md", "x.h") is None


def test_a_python_2_program_is_python_2s_by_its_shebang(tmp_path: Path) -> None:
    (tmp_path / "old.py").write_text("#!/usr/bin/env python2\nprint 'hi'\n")
    (tmp_path / "new.py").write_text("#!/usr/bin/env python3\nprint('hi')\n")
    assert kattis.language_of([tmp_path / "old.py"]) == ("python2", None, [tmp_path / "old.py"])
    assert kattis.language_of([tmp_path / "new.py"]) == ("python", None, [tmp_path / "new.py"])


def test_polygon_source_types_are_rows_of_the_table_with_the_standard_they_name() -> None:
    cases = {
        "cpp.g++17": ("cpp", "gnu++17"), "cpp.gcc13-64-winlibs-g++20": ("cpp", "gnu++20"),
        "cpp.gcc14-64-msys2-g++23": ("cpp", "gnu++23"), "cpp.msys2-mingw64-9-g++17": ("cpp", "gnu++17"),
        "cpp.g++11": ("cpp", "gnu++11"), "cpp.g++14": ("cpp", "gnu++14"), "cpp.g++": ("cpp", None),
        "cpp.ms2017": ("cpp", None), "c.gcc": ("c", "gnu11"), "java8": ("java", None), "java21": ("java", None),
        "kotlin19": ("kotlin", None), "scala": ("scala", None), "python.3": ("python", None),
        "python.pypy3": ("pypy", None), "python.pypy3-64": ("pypy", None), "python.2": ("python2", None),
        "go": ("go", None), "rust.2021": ("rust", None), "ruby.3": ("ruby", None), "php.5": ("php", None),
        "perl.5": ("perl", None), "haskell.ghc": ("haskell", None), "ocaml": ("ocaml", None),
        "pas.fpc": ("pascal", None), "js.v8": ("javascript", None), "csharp.mono": ("csharp", None),
        "pas.dpr": None, "pas.pascalabc": None, "d": None, "": None, None: None,
    }  # fmt: skip
    for kind, row in cases.items():
        assert polygon.language_of(kind) == row, kind
    for _prefix, language in polygon.POLYGON_TYPES:
        assert language in LANGUAGES or language in UNAVAILABLE, language


def test_a_package_program_names_a_row_and_a_standard_it_has(tmp_path: Path) -> None:
    main = tmp_path / "check.cpp"
    main.write_text("int main() {}\n")
    entry = program(main, "cpp", Files(tmp_path), std="c++20", where="checker")
    assert (entry["language"], entry["std"]) == ("cpp", "c++20")
    assert "std" not in program(main, "cpp", Files(tmp_path), where="checker")  # the row's default
    with pytest.raises(InvalidPackage, match="checker: std must be one of c\\+\\+11"):
        program(main, "cpp", Files(tmp_path), std="c++98", where="checker")
    with pytest.raises(InvalidPackage, match="checker: std: python has no standard to choose"):
        program(main, "python", Files(tmp_path), std="c++17", where="checker")
    with pytest.raises(InvalidPackage, match="checker: language 'csharp' is not offered here: "):
        program(main, "csharp", Files(tmp_path), where="checker")


@pytest.mark.parametrize("pattern", ["tests/%02d", "tests/%02d.a", "tests/%d", "t%%/%03d.in", "%d"])
def test_a_polygon_path_pattern_numbers_files_inside_the_package(pattern: str) -> None:
    assert polygon.path_pattern(pattern, "input-path-pattern") == pattern


@pytest.mark.parametrize(
    ("pattern", "error"),
    [
        ("tests/01", "must number the tests with one %d"),
        ("tests/%s", "must number the tests with one %d"),
        ("tests/%d/%d", "must number the tests with one %d"),
        ("tests/%d%", "must number the tests with one %d"),
        ("../../outside/%02d", "leaves the package"),
        ("tests/../../%02d", "leaves the package"),
        ("/etc/%02d", "leaves the package"),
        ("C:/tests/%02d", "leaves the package"),
        ("..\\tests\\%02d", "leaves the package"),
    ],
)
def test_a_polygon_path_pattern_that_leaves_the_package_is_refused(pattern: str, error: str) -> None:
    with pytest.raises(InvalidPackage, match=f"^problem.xml: input-path-pattern {re.escape(repr(pattern))} {error}"):
        polygon.path_pattern(pattern, "input-path-pattern")


@pytest.mark.parametrize(
    ("name", "parts"),
    [("problem.xml", ("problem.xml",)), ("./tests//01", ("tests", "01")), ("echo-3/tests/", ("echo-3", "tests"))],
)
def test_a_zip_entry_names_a_path_under_the_package(name: str, parts: tuple[str, ...]) -> None:
    assert zipped.entry_parts(name, "p.zip") == parts


@pytest.mark.parametrize(
    ("name", "error"),
    [
        ("../x", "climbs out of the package"),
        ("a/../../x", "climbs out of the package"),
        ("/etc/passwd", "is an absolute name"),
        ("C:/x", "is an absolute name"),
        ("a\\..\\x", "holds a backslash or NUL"),
        ("a\x00b", "holds a backslash or NUL"),
        ("./", "has no name"),
    ],
)
def test_a_zip_entry_that_leaves_the_package_is_refused(name: str, error: str) -> None:
    with pytest.raises(InvalidPackage, match=f"^p.zip: .*{error}"):
        zipped.entry_parts(name, "p.zip")


@pytest.mark.parametrize(
    ("cmd", "generator", "args"),
    [
        ("gen 10 20", "gen", ("10", "20")),
        ("gen -n 10 1", "gen", ("-n", "10", "1")),
        ("gen 1 2 > 5", "gen", ("1", "2")),
        ("gen 1 2 > $", "gen", ("1", "2")),
        ("multigen 3 > {3-5}", "multigen", ("3",)),
        ("gen 'a b' c >7", "gen", ("a b", "c")),
    ],
)
def test_a_polygon_generator_command_is_its_executable_and_arguments(
    cmd: str, generator: str, args: tuple[str, ...]
) -> None:
    assert polygon.command(cmd, 3) == (generator, args)


@pytest.mark.parametrize(("cmd", "error"), [("", "names no generator"), ("> 5", "names no generator"),
                                            ("gen 'open", "cannot be read")])  # fmt: skip
def test_a_polygon_generator_command_that_names_nothing_is_refused(cmd: str, error: str) -> None:
    with pytest.raises(InvalidPackage, match=f"test 3: generator command .*{error}"):
        polygon.command(cmd, 3)


def test_the_readers_default_bounds_are_the_upload_settings_defaults() -> None:
    """The archive readers sit below the roles' settings and hold their own defaults for a caller
    that gives no bounds: the same as ``ArchiveSettings()``, the upload's defaults."""
    settings = ArchiveSettings()
    names = ("max_file_mb", "max_file_bytes", "max_package_mb", "max_package_bytes", "max_ratio")
    assert {n: getattr(DEFAULT_BOUNDS, n) for n in names} == {n: getattr(settings, n) for n in names}
