"""ICPC/Kattis packages as they are: written here in the Kattis format (legacy and 2023-07-draft),
judged by problemtools' own ``verifyproblem`` (the reference) and, after ``upload``, by the program
judge through the worker's cache: every submission the package ships must get the same verdict (and
score) from both, and the verdict its directory names. Default validator with flags, a custom
validator with a header beside it, test data groups with scores, and an interactive problem judged
by Kattis' precedence rules. Needs root (the sandbox) and problemtools (the test extra)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

import asyncpg
import pytest

from judgequeue.core.judges import Verdict
from judgequeue.core.judges.program import ProgramJudge
from judgequeue.core.judges.program.archives import InvalidPackage, read_package
from tests.support.archives import judge_solutions, put, verifyproblem, write_tree

pytestmark = pytest.mark.usefixtures("as_root")


EXPECTED = {"accepted": "ACCEPTED", "partially_accepted": "ACCEPTED", "wrong_answer": "WRONG_ANSWER",
            "time_limit_exceeded": "TIME_LIMIT", "run_time_error": "RUNTIME_ERROR"}  # fmt: skip


#: Judges a package written at the path given; what the program judge said of each submission, by name.
Agree = Callable[[Path], Awaitable[dict[str, Verdict]]]


@pytest.fixture
def agree(package_judge: ProgramJudge, pg_pool: asyncpg.Pool, tmp_path: Path) -> Agree:
    """problemtools and the program judge give every submission of the package the same verdict
    (and score), the one its directory names."""

    async def check(root: Path) -> dict[str, Verdict]:
        reference = verifyproblem(root, tmp_path / "config")
        version = await put(pg_pool, root)
        ours = await judge_solutions(package_judge, root.name, version)
        assert sorted(ours) == sorted(reference), (sorted(ours), sorted(reference))
        for name, verdict in ours.items():
            expected = EXPECTED[name.split("/")[0]]
            assert reference[name].verdict == expected, (name, reference[name])
            assert verdict.status == expected, (name, verdict.details)
            if reference[name].score is not None:
                assert verdict.details["score"] == pytest.approx(reference[name].score), (name, verdict.details)
        return ours

    return check


# --- pass-fail, the default validator with flags (legacy format) -----------------------------------

AVERAGE = {
    "problem.yaml": "name: Average\nlicense: cc0\nsource: judgequeue\nvalidator_flags: float_tolerance 1e-6\n"
                    "limits: {memory: 512}\n",
    "data/sample/1.in": "1 2\n", "data/sample/1.ans": "1.5\n",
    "data/secret/01.in": "10 13\n", "data/secret/01.ans": "11.5\n",
    "data/secret/02.in": "-5 6\n", "data/secret/02.ans": "0.5\n",
    "data/secret/03.in": "1000000 1\n", "data/secret/03.ans": "500000.5\n",
    "submissions/accepted/avg.py": "a, b = map(int, input().split())\nprint((a + b) / 2)\n",
    "submissions/accepted/rounded.py": "a, b = map(int, input().split())\nprint('%.7f' % ((a + b) / 2))\n",
    "submissions/accepted/avg.cc": "#include <cstdio>\nint main(){long a,b;scanf(\"%ld %ld\",&a,&b);"
                                   "printf(\"%.3f\\n\",(a+b)/2.0);}\n",
    "submissions/wrong_answer/floor.py": "a, b = map(int, input().split())\nprint((a + b) // 2)\n",
    "submissions/wrong_answer/words.py": "print('half')\n",
    "submissions/time_limit_exceeded/spin.py": "input()\nwhile True:\n    pass\n",
    "submissions/run_time_error/crash.py": "raise ValueError('no')\n",
}  # fmt: skip


async def test_default_validator_with_flags_agrees_with_problemtools(agree: Agree, tmp_path: Path) -> None:
    root = write_tree(tmp_path / "average", AVERAGE)
    package = read_package(root)
    assert package.manifest["format"] == "kattis" and package.manifest["checker"] == {"type": "kattis"}
    assert [t["name"] for t in package.manifest["tests"]] == ["sample/1", "secret/01", "secret/02", "secret/03"]
    assert package.manifest["tests"][1]["flags"] == ["float_tolerance", "1e-6"]
    assert package.manifest["time_limit_source"] == "default" and package.notes
    ours = await agree(root)
    floor = ours["wrong_answer/floor.py"].details
    assert floor["failed_test"] == 1 and floor["format"] == "kattis" and len(floor["tests"]) == 1
    assert "too large difference" in floor["reason"]


# --- a custom validator, built with the header beside it --------------------------------------------

VALIDATE_H = """\
#include <fstream>
#include <string>
#include <cstdio>
#include <cstdlib>
static std::ifstream judge_in, judge_ans;
static std::string feedback;
static void init_io(int argc, char **argv) {
    judge_in.open(argv[1]); judge_ans.open(argv[2]); feedback = argv[3];
}
static void message(const std::string &text) {
    FILE *f = fopen((feedback + "/judgemessage.txt").c_str(), "a"); fputs(text.c_str(), f); fclose(f);
}
[[noreturn]] static void accept() { exit(42); }
[[noreturn]] static void wrong_answer(const std::string &why) { message(why); exit(43); }
"""
VALIDATE_CC = """\
#include <iostream>
#include "validate.h"
int main(int argc, char **argv) {
    init_io(argc, argv);
    long want, got;
    judge_ans >> want;
    if (!(std::cin >> got)) wrong_answer("no number");
    if (got < want - 1 || got > want + 1) wrong_answer("off by " + std::to_string(got - want));
    std::string more;
    if (std::cin >> more) wrong_answer("trailing output");
    message("close enough");
    accept();
}
"""
#: Two tests whose answer is the input: the custom validator and the scoring one judge the same data.
ECHO_TESTS = {
    "data/secret/1.in": "10\n", "data/secret/1.ans": "10\n",
    "data/secret/2.in": "-3\n", "data/secret/2.ans": "-3\n",
}  # fmt: skip
CLOSE = {
    "problem.yaml": "name: Close\nlicense: cc0\nsource: judgequeue\nvalidation: custom\nlimits: {memory: 512}\n",
    **ECHO_TESTS,
    "output_validators/close/validate.cc": VALIDATE_CC,
    "output_validators/close/validate.h": VALIDATE_H,
    "submissions/accepted/echo.py": "print(input())\n",
    "submissions/accepted/plus_one.py": "print(int(input()) + 1)\n",
    "submissions/wrong_answer/plus_five.py": "print(int(input()) + 5)\n",
    "submissions/wrong_answer/chatty.py": "print(input(), 'and more')\n",
    # C++20: problemtools compiles C++ as GNU C++23, and so must the judge (its default is C++17).
    "submissions/accepted/spaceship.cc": "#include <iostream>\n#include <compare>\nstruct N { long v; };\n"
                                         "int main(){N n{.v = 0}; std::cin >> n.v; auto c = n.v <=> 0L;"
                                         "std::cout << (c < 0 ? n.v : n.v) << '\\n';}\n",
    # A program of several files (a directory): main.py imports the module beside it.
    "submissions/accepted/modules/main.py": "from echo import echo\necho()\n",
    "submissions/accepted/modules/echo.py": "def echo():\n    print(input())\n",
    "submissions/wrong_answer/modules/main.py": "from echo import echo\necho()\n",
    "submissions/wrong_answer/modules/echo.py": "def echo():\n    print(int(input()) + 7)\n",
}  # fmt: skip


async def test_a_custom_validator_with_its_header_agrees_with_problemtools(agree: Agree, tmp_path: Path) -> None:
    root = write_tree(tmp_path / "close", CLOSE)
    checker = read_package(root).manifest["checker"]
    assert (checker["type"], checker["protocol"], checker["name"], list(checker["files"])) == (
        "custom", "kattis", "validate.cc", ["validate.h"],
    )  # fmt: skip
    assert checker["std"] == "gnu++23"  # problemtools' C++
    solutions = {s["name"]: s for s in read_package(root).manifest["solutions"]}
    assert (solutions["accepted/spaceship.cc"]["std"], solutions["accepted/modules"]["files"].keys()) == (
        "gnu++23", {"echo.py"},
    )  # fmt: skip
    ours = await agree(root)
    assert ours["accepted/plus_one.py"].details["tests"][0]["message"] == "close enough"
    assert ours["wrong_answer/plus_five.py"].details["reason"] == "off by 5"
    # The two submissions named modules share their main source, not their build: each got its own echo.py.
    assert ours["wrong_answer/modules"].details["reason"] == "off by 7"


# --- test data groups with scores (2023-07-draft, as problemtools' own oddecho example) ------------

SCORED = {
    "problem.yaml": "problem_format_version: 2023-07-draft\nuuid: 3c1e9f5a-63b2-4a3d-9a57-0b5d5f1b2e11\n"
                    "name: Double\ntype: scoring\nlicense: cc0\ncredits: judgequeue\nsource: judgequeue\n"
                    "limits: {time_limit: 1, memory: 512}\n",
    "data/testdata.yaml": "on_reject: continue\nrange: 0 100\ngrader_flags: ignore_sample\n",
    "data/sample/testdata.yaml": "on_reject: continue\nrange: 0 0\naccept_score: 0\ngrader_flags: first_error\n",
    "data/sample/1.in": "2\n", "data/sample/1.ans": "4\n",
    "data/secret/testdata.yaml": "on_reject: continue\nrange: 0 100\n"
                                 "grader_flags: first_error accept_if_any_accepted\n",
    "data/secret/small/testdata.yaml": "on_reject: break\naccept_score: 40\nrange: 0 40\ngrader_flags: min\n",
    "data/secret/small/1.in": "3\n", "data/secret/small/1.ans": "6\n",
    "data/secret/small/2.in": "5\n", "data/secret/small/2.ans": "10\n",
    "data/secret/large/testdata.yaml": "on_reject: break\naccept_score: 60\nrange: 0 60\ngrader_flags: min\n",
    "data/secret/large/1.in": "123456789012\n", "data/secret/large/1.ans": "246913578024\n",
    "data/secret/large/2.in": "99999999999\n", "data/secret/large/2.ans": "199999999998\n",
    "submissions/accepted/double.py": "print(2 * int(input()))\n",
    "submissions/partially_accepted/small_only.py": "n = int(input())\nprint(2 * n if n < 1000 else 0)\n",
    "submissions/wrong_answer/triple.py": "print(3 * int(input()))\n",
}  # fmt: skip


async def test_groups_and_scores_agree_with_problemtools(agree: Agree, tmp_path: Path) -> None:
    root = write_tree(tmp_path / "double", SCORED)
    ours = await agree(root)
    full, small = ours["accepted/double.py"].details, ours["partially_accepted/small_only.py"].details
    assert (full["score"], full["max_score"]) == (100, 100)
    # problemtools' own rules: the partial submission is ACCEPTED (accept_if_any_accepted) with 40
    # points; group "large" (judged before "small": problemtools sorts by name) stopped at its first
    # rejected test (on_reject: break), so its second test never ran.
    assert small["score"] == 40 and "failed_test" not in small
    assert [g["name"] for g in small["groups"]] == ["sample", "secret"]
    assert [(t["test"], t["verdict"]) for t in small["tests"]] == [
        (1, "ACCEPTED"), (2, "WRONG_ANSWER"), (4, "ACCEPTED"), (5, "ACCEPTED"),
    ]  # fmt: skip


# --- interactive: the output validator is the interactor (Kattis' precedence rules) ----------------

GUESS_VALIDATOR = """\
import sys
secret = int(open(sys.argv[1]).read())
feedback = sys.argv[3]
def said(text, code):
    with open(feedback + "/judgemessage.txt", "a") as f:
        f.write(text)
    sys.exit(code)
for guesses in range(1, 11):
    line = sys.stdin.readline()
    if not line:
        said("no guess before end of file", 43)
    guess = int(line)
    if guess == secret:
        print("correct", flush=True)
        said(f"found in {guesses}", 42)
    print("lower" if secret < guess else "higher", flush=True)
said("ten wrong guesses", 43)
"""
BISECT = """\
lo, hi = 1, 1000
while True:
    mid = (lo + hi) // 2
    print(mid, flush=True)
    said = input()
    if said == "correct":
        break
    lo, hi = (lo, mid - 1) if said == "lower" else (mid + 1, hi)
"""
GUESS = {
    "problem.yaml": "name: Guess\nlicense: cc0\nsource: judgequeue\nvalidation: custom interactive\n"
                    "limits: {memory: 512}\n",
    "data/secret/1.in": "700\n", "data/secret/1.ans": "700\n",
    "data/secret/2.in": "1\n", "data/secret/2.ans": "1\n",
    "output_validators/guess/validate.py": GUESS_VALIDATOR,
    "submissions/accepted/bisect.py": BISECT,
    # Ten wrong guesses (the validator rejects and exits first), then a spin: WRONG_ANSWER, not TIME_LIMIT.
    "submissions/wrong_answer/then_spin.py": "for g in range(2, 12):\n    print(g, flush=True)\n    input()\n"
                                             "while True:\n    pass\n",
    # A crash at once: the validator then sees end of file and rejects, but the crash came first.
    "submissions/run_time_error/crash.py": "import sys\nsys.exit(1)\n",
    "submissions/time_limit_exceeded/spin.py": "while True:\n    pass\n",
}  # fmt: skip


async def test_interactive_precedence_agrees_with_problemtools(agree: Agree, tmp_path: Path) -> None:
    root = write_tree(tmp_path / "guess", GUESS)
    manifest = read_package(root).manifest
    assert manifest["type"] == "interactive" and manifest["interactor"]["protocol"] == "kattis"
    ours = await agree(root)
    assert ours["accepted/bisect.py"].details["tests"][0]["message"] == "found in 9"  # 700 by bisection
    assert ours["wrong_answer/then_spin.py"].details["reason"] == "ten wrong guesses"


def test_what_a_kattis_package_may_not_be(tmp_path: Path) -> None:
    multi = write_tree(tmp_path / "multi", {**CLOSE, "problem.yaml": "problem_format_version: 2023-07-draft\n"
                                            "type: multi-pass\nname: x\n"})  # fmt: skip
    with pytest.raises(InvalidPackage, match="multi-pass is not supported"):
        read_package(multi)
    two = write_tree(tmp_path / "two", {**CLOSE, "output_validators/other.py": "import sys\nsys.exit(42)\n"})
    with pytest.raises(InvalidPackage, match="exactly one validator program, found 2"):
        read_package(two)
    bad = write_tree(tmp_path / "bad", {**AVERAGE, "problem.yaml": "name: x\nvalidator_flags: float_tolerance\n"})
    with pytest.raises(InvalidPackage, match="float_tolerance needs a number"):
        read_package(bad)
    with pytest.raises(InvalidPackage, match="the problem id"):
        read_package(write_tree(tmp_path / "Not An Id", AVERAGE))


# --- a validator that scores (legacy: validation: custom score) -------------------------------------

SCORING_VALIDATOR = """\
import sys
from tolerance import TOLERANCE
want = int(open(sys.argv[2]).read())
feedback = sys.argv[3]
try:
    got = int(sys.stdin.read())
except ValueError:
    sys.exit(43)
if abs(got - want) > TOLERANCE:
    open(feedback + "/judgemessage.txt", "w").write(f"off by {got - want}")
    sys.exit(43)
open(feedback + "/score.txt", "w").write("10" if got == want else "4.5")
sys.exit(42)
"""
NEAR = {
    "problem.yaml": "name: Near\nlicense: cc0\nsource: judgequeue\ntype: scoring\nvalidation: custom score\n"
                    "limits: {memory: 512}\n",
    "data/secret/testdata.yaml": "on_reject: continue\n",
    **ECHO_TESTS,
    "output_validators/near/near.py": SCORING_VALIDATOR,
    "output_validators/near/tolerance.py": "TOLERANCE = 1\n",  # a module the validator imports
    "submissions/accepted/echo.py": "print(input())\n",
    "submissions/partially_accepted/plus_one.py": "print(int(input()) + 1)\n",
    "submissions/wrong_answer/plus_five.py": "print(int(input()) + 5)\n",
}  # fmt: skip


async def test_a_scoring_validator_agrees_with_problemtools(agree: Agree, tmp_path: Path) -> None:
    root = write_tree(tmp_path / "near", NEAR)
    ours = await agree(root)
    assert ours["accepted/echo.py"].details["score"] == 20
    close = ours["partially_accepted/plus_one.py"].details
    assert (close["score"], [t["points"] for t in close["tests"]]) == (9, [4.5, 4.5])
    assert ours["wrong_answer/plus_five.py"].details["reason"] == "off by 5"
