"""Every row of the program judge's languages table, judged for real in the sandbox: a program that
reads two numbers and prints their sum (ACCEPTED), one that does not build (COMPILE_ERROR with the
compiler's message), one that crashes (RUNTIME_ERROR) and one that spins (TIME_LIMIT). A language
whose toolchain this machine lacks is skipped with the reason only then (``scripts/install
--languages`` installs them all). Also: Java's any-public-class rule, the C/C++ standard a payload
chooses, the build cache, and the languages that are refused with their reason. Needs root."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from judgequeue.core.judges import Verdict
from judgequeue.core.judges.program import ProgramJudge
from judgequeue.core.judges.program.languages import LANGUAGES, missing_toolchain
from judgequeue.core.judges.sandbox.isolation import JudgeSettings
from tests.support.language_programs import PROGRAMS, VERDICTS, payload
from tests.support.sandbox_host import assert_host_clean

pytestmark = pytest.mark.usefixtures("as_root")

CASES = ("ok", "compile_error", "runtime_error", "time_limit")


@pytest.fixture
def judge(sandbox_dir: str) -> Iterator[ProgramJudge]:
    j = ProgramJudge(settings=JudgeSettings(sandbox_dir=sandbox_dir), slots=4)
    assert j.isolation.mode == "full"
    yield j
    j.close()


def require(judge: ProgramJudge, language: str) -> None:
    """Skip when (and only when) this machine lacks the language's toolchain, saying which."""
    missing = missing_toolchain(LANGUAGES[language], judge.tools)
    if missing:
        pytest.skip(missing)


def test_every_language_has_its_four_programs() -> None:
    assert set(PROGRAMS) == set(LANGUAGES)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("language", list(LANGUAGES))
async def test_language(judge: ProgramJudge, language: str, case: str) -> None:
    require(judge, language)
    programs = PROGRAMS[language]
    verdict = await judge.judge(payload(language, getattr(programs, case)))
    for _ in range(2):
        # A spinning box that got under half a CPU (other work on this 2-core machine) meets the wall
        # guard (2 x time + 0.5 s) first: IDLENESS_LIMIT. Only then is it judged again.
        run = verdict.details.get("tests", [{}])[0]
        if verdict.status != "IDLENESS_LIMIT" or run["cpu_ms"] > 0.5 * run["wall_ms"]:
            break
        verdict = await judge.judge(payload(language, getattr(programs, case)))
    assert isinstance(verdict, Verdict)
    details = verdict.details
    expected = VERDICTS[case]
    assert verdict.status == expected, details
    assert details["language"] == language
    if case == "compile_error":
        assert details["reason"] == "compilation failed", details
        assert programs.message.lower() in details["output"].lower(), details["output"]
    elif case == "time_limit":
        assert details["tests"][0]["cpu_ms"] >= 1000, details
    await assert_host_clean(judge)


CPP20 = "#include <iostream>\nstruct P { int a, b; };\nint main() { P p{.a = 2, .b = 3}; auto c = p.a <=> p.b;"
CPP20 += " std::cout << (c < 0 ? p.a + p.b : 0) << '\\n'; }\n"


async def test_the_c_and_cpp_standard_is_the_submissions_choice(judge: ProgramJudge) -> None:
    require(judge, "cpp")
    # GNU C17 by default: pid_t comes with <unistd.h>; strict ISO C17 does not declare it there.
    assert (await judge.judge(payload("c", PROGRAMS["c"].ok))).status == "ACCEPTED"
    strict = await judge.judge(payload("c", PROGRAMS["c"].ok, std="c17"))
    assert strict.status == "COMPILE_ERROR" and "pid_t" in strict.details["output"], strict.details
    # The three-way comparison <=> is C++20.
    assert (await judge.judge(payload("cpp", CPP20, std="c++20"))).status == "ACCEPTED"
    assert (await judge.judge(payload("cpp", CPP20, std="gnu++23"))).status == "ACCEPTED"
    older = await judge.judge(payload("cpp", CPP20, std="c++17"))
    assert older.status == "COMPILE_ERROR" and "expected primary-expression" in older.details["output"], older.details
    bad = await judge.judge(payload("cpp", CPP20, std="c++98"))
    assert bad.status == "SYSTEM_ERROR" and bad.details["reason"].startswith(
        "invalid payload: std must be one of c++11"
    )
    await assert_host_clean(judge)


async def test_a_build_is_kept_and_reused_for_the_same_source_language_and_standard(judge: ProgramJudge) -> None:
    require(judge, "cpp")
    first = await judge.judge(payload("cpp", CPP20, std="c++20"))
    assert (first.status, judge.builds.kept, judge.builds.hits) == ("ACCEPTED", 1, 0)
    again = await judge.judge(payload("cpp", CPP20, std="c++20", limits={"time": 2, "memory_mb": 64}))
    assert (again.status, judge.builds.kept, judge.builds.hits) == ("ACCEPTED", 1, 1)
    # Another standard, or another source, is another build.
    assert (await judge.judge(payload("cpp", CPP20, std="gnu++20"))).status == "ACCEPTED"
    assert (judge.builds.kept, judge.builds.hits) == (2, 1)
    # A failed build is not kept: the same broken source fails the same way, compiled again.
    for _ in range(2):
        broken = await judge.judge(payload("cpp", PROGRAMS["cpp"].compile_error))
        assert broken.status == "COMPILE_ERROR" and "undeclared_thing" in broken.details["output"]
    assert (judge.builds.kept, judge.builds.hits) == (2, 1)
    # A JVM program restored from the cache still finds its class (the file is named after it).
    require(judge, "java")
    for hits in (1, 2):
        java = await judge.judge(payload("java", PROGRAMS["java"].ok))
        assert java.status == "ACCEPTED" and judge.builds.hits == hits, java.details
    await assert_host_clean(judge)


OCAML_LIBRARIES = """let () =
  let line = read_line () in
  let sum = List.fold_left (fun a x -> a + int_of_string x) 0 (Str.split (Str.regexp " +") line) in
  ignore (Unix.getpid ());
  ignore (Bigarray.Array1.create Bigarray.int Bigarray.c_layout 1);
  print_int sum;
  print_newline ()
"""


async def test_ocaml_links_unix_str_and_bigarray_as_problemtools_does(judge: ProgramJudge) -> None:
    require(judge, "ocaml")
    verdict = await judge.judge(payload("ocaml", OCAML_LIBRARIES))
    assert verdict.status == "ACCEPTED", verdict.details
    await assert_host_clean(judge)


async def test_a_prolog_submission_of_several_files_loads_them_all(judge: ProgramJudge) -> None:
    """main/0 in main.pl calls a predicate of another file of the submission (a Kattis submission of
    several files): every .pl file is loaded, in the build's check and in the run."""
    require(judge, "prolog")
    main = "main :- read_sum(S), write(S), nl.\n"
    util = "read_sum(S) :- read(A), read(B), S is A + B.\n"
    verdict = await judge.judge(payload("prolog", main, files={"util.pl": util}))
    assert verdict.status == "ACCEPTED", verdict.details
    broken = await judge.judge(payload("prolog", main, files={"util.pl": "read_sum(S) :- S is .\n"}))
    assert broken.status == "COMPILE_ERROR", broken.details
    await assert_host_clean(judge)


async def test_a_language_without_its_toolchain_is_a_verdict_naming_what_is_missing(judge: ProgramJudge) -> None:
    judge.tools = {k: v for k, v in judge.tools.items() if k != "rustc"}
    verdict = await judge.judge(payload("rust", PROGRAMS["rust"].ok))
    assert verdict.status == "SYSTEM_ERROR"
    assert verdict.details["reason"] == (
        "no rust toolchain on this worker: rustc missing "
        "(install Debian packages rustc-web: scripts/install --languages=rust)"
    )
