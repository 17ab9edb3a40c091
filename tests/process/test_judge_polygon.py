"""Polygon packages as they are: ``problem.xml`` with its tests, groups and points, a testlib checker
with ``testlib.h`` beside it in ``files/``, an interactor whose output the checker judges, and
solutions tagged with the verdicts they must get. Uploaded, fetched through the worker's cache and
judged: every solution gets a verdict its tag allows, and the scores Polygon's group rules give.
Needs root (the sandbox)."""

from __future__ import annotations

from pathlib import Path

import asyncpg
import pytest

from judgequeue.core.judges.program import ProgramJudge
from judgequeue.core.judges.program.archives import InvalidPackage, read_package
from tests.support.archives import judge_solutions, polygon_xml, put, write_tree

pytestmark = pytest.mark.usefixtures("as_root")
TESTLIB = Path(__file__).resolve().parents[1] / "fixtures" / "third_party" / "testlib"


def problem_xml(name: str, tests: str, groups: str, assets: str) -> str:
    return polygon_xml(name, tests, groups=groups, assets=assets)


CHECKER = '<checker name="std::wcmp.cpp" type="testlib"><source path="files/check.cpp" type="cpp.g++17"/>' \
          '<copy path="check.cpp"/></checker>'  # fmt: skip
SUM_CPP = "#include <cstdio>\nint main(){long a,b;scanf(\"%ld %ld\",&a,&b);printf(\"%ld\\n\",a+b);}\n"
# C++20 (designated initialisers, <=>): compiles only under the standard its Polygon type names.
SUM_CPP20 = (
    "#include <cstdio>\n#include <compare>\nstruct P { long a, b; };\n"
    "int main(){long a,b;scanf(\"%ld %ld\",&a,&b);P p{.a = a, .b = b};"
    "printf(\"%ld\\n\",(p.a <=> p.b) == 0 ? 2 * p.a : p.a + p.b);}\n"
)
SUMS = {
    "tests/01": "1 2\n", "tests/01.a": "3\n",
    "tests/02": "10 20\n", "tests/02.a": "30\n",
    "tests/03": "-4 4\n", "tests/03.a": "0\n",
    "tests/04": "123456789 987654321\n", "tests/04.a": "1111111110\n",
    "tests/05": "-1000000 5\n", "tests/05.a": "-999995\n",
    "files/testlib.h": (TESTLIB / "testlib.h").read_text(),
    "files/check.cpp": (TESTLIB / "wcmp.cpp").read_text(),
    "solutions/main.cpp": SUM_CPP,
    "solutions/sum.py": "a, b = map(int, input().split())\nprint(a + b)\n",
    "solutions/diff.py": "a, b = map(int, input().split())\nprint(a - b)\n",
    "solutions/small.py": "a, b = map(int, input().split())\nprint(a + b if abs(a) < 1000 else 0)\n",
    "solutions/slow.py": "input()\nwhile True:\n    pass\n",
    "solutions/crash.py": "raise SystemExit(2)\n",
}  # fmt: skip
SUM_TESTS = ('<test method="manual" sample="true" group="samples" points="0"/>'
             '<test method="manual" group="small" points="20"/><test method="generated" cmd="gen 1" group="small" '
             'points="20"/><test method="manual" group="large" points="30"/><test method="manual" group="large" '
             'points="30"/>')  # fmt: skip
SUM_GROUPS = """<groups>
        <group name="samples" points="0" points-policy="complete-group" feedback-policy="complete"/>
        <group name="small" points-policy="each-test" feedback-policy="icpc"/>
        <group name="large" points="60" points-policy="complete-group" feedback-policy="icpc">
          <dependencies><dependency group="small"/></dependencies>
        </group>
      </groups>"""
SUM_SOLUTIONS = """<solutions>
      <solution tag="main"><source path="solutions/main.cpp" type="cpp.g++17"/></solution>
      <solution tag="accepted"><source path="solutions/sum.py" type="python.3"/></solution>
      <solution tag="wrong-answer"><source path="solutions/diff.py" type="python.3"/></solution>
      <solution tag="rejected"><source path="solutions/small.py" type="python.3"/></solution>
      <solution tag="time-limit-exceeded"><source path="solutions/slow.py" type="python.3"/></solution>
      <solution tag="failed"><source path="solutions/crash.py" type="python.3"/></solution>
      <solution tag="accepted"><source path="solutions/sum20.cpp" type="cpp.gcc13-64-winlibs-g++20"/></solution>
      <solution tag="accepted"><source path="solutions/sum.cs" type="csharp.mono"/></solution>
      <solution tag="accepted"><source path="solutions/sum.d" type="d"/></solution>
    </solutions>"""


async def test_a_polygon_package_round_trip_with_groups_points_and_tagged_solutions(
    package_judge: ProgramJudge, pg_pool: asyncpg.Pool, tmp_path: Path
) -> None:
    files = {**SUMS, "solutions/sum20.cpp": SUM_CPP20, "solutions/sum.cs": "class P {}\n", "solutions/sum.d": "",
             "problem.xml": problem_xml("a-plus-b", SUM_TESTS, SUM_GROUPS, CHECKER + SUM_SOLUTIONS)}  # fmt: skip
    root = write_tree(tmp_path / "package", files)
    package = read_package(root)
    assert (package.id, package.version, package.manifest["format"]) == ("a-plus-b", 7, "polygon")
    checker = package.manifest["checker"]
    assert (checker["protocol"], checker["language"], sorted(checker["files"])) == ("testlib", "cpp", ["testlib.h"])
    assert package.manifest["limits"] == {"time": 1.0, "memory_mb": 256}
    assert checker["std"] == "gnu++17"  # cpp.g++17
    # Each solution is the table's row (and C++ standard) its type names; C# (no runtime that starts
    # in a box) and D (no row) are not recorded.
    assert [(s["name"], s["language"], s.get("std")) for s in package.manifest["solutions"]] == [
        ("solutions/main.cpp", "cpp", "gnu++17"), ("solutions/sum.py", "python", None),
        ("solutions/diff.py", "python", None), ("solutions/small.py", "python", None),
        ("solutions/slow.py", "python", None), ("solutions/crash.py", "python", None),
        ("solutions/sum20.cpp", "cpp", "gnu++20"),
    ]  # fmt: skip
    version = await put(pg_pool, root)
    verdicts = await judge_solutions(package_judge, "a-plus-b", version)
    expected = {s["name"]: s["expected"] for s in package.manifest["solutions"]}
    for name, verdict in verdicts.items():
        assert verdict.status in expected[name], (name, verdict.status, verdict.details)
        assert verdict.details["format"] == "polygon"
    # The C++20 solution was judged under the standard its type names: the row's default refuses it.
    default = {"problem": "a-plus-b", "version": version, "language": "cpp", "source": SUM_CPP20}
    assert (await package_judge.judge(default)).status == "COMPILE_ERROR"
    main, small = verdicts["solutions/main.cpp"].details, verdicts["solutions/small.py"].details
    assert (main["score"], main["max_score"]) == (100, 100)
    assert main["tests"][0]["message"] == 'ok "3"'
    # "small" earns its two tests (each-test); "large" fails at test 4, so test 5 is skipped.
    assert (small["score"], small["failed_test"]) == (40, 4)
    assert [g["earned"] for g in small["groups"]] == [0, 40, 0]
    assert [t["test"] for t in small["tests"]] == [1, 2, 3, 4]
    # A dependency that failed: "large" earns nothing and is not even run.
    diff = verdicts["solutions/diff.py"].details
    assert diff["score"] == 0 and [t["test"] for t in diff["tests"]] == [1, 2, 3]


INTERACTOR = '<interactor><source path="files/interactor.cpp" type="cpp.g++17"/></interactor>'
A_PLUS_B = "import sys\nfor line in sys.stdin:\n    a, b = map(int, line.split())\n    print(a + b, flush=True)\n"
INTERACTIVE = {
    "tests/01": "2\n1 2\n3 4\n", "tests/01.a": "3\n7\n",
    "tests/02": "1\n-5 5\n", "tests/02.a": "0\n",
    "files/testlib.h": (TESTLIB / "testlib.h").read_text(),
    "files/check.cpp": (TESTLIB / "wcmp.cpp").read_text(),
    "files/interactor.cpp": (TESTLIB / "interactor-a-plus-b.cpp").read_text(),
    "solutions/ok.py": A_PLUS_B,
    "solutions/plus_one.py": A_PLUS_B.replace("a + b", "a + b + 1"),
    "solutions/silent.py": "import time\ntime.sleep(60)\n",
}  # fmt: skip


async def test_a_polygon_interactive_package_its_checker_judges_the_interactors_output(
    package_judge: ProgramJudge, pg_pool: asyncpg.Pool, tmp_path: Path
) -> None:
    solutions = """<solutions>
      <solution tag="main"><source path="solutions/ok.py" type="python.3"/></solution>
      <solution tag="wrong-answer"><source path="solutions/plus_one.py" type="python.3"/></solution>
      <solution tag="time-limit-exceeded"><source path="solutions/silent.py" type="python.3"/></solution>
    </solutions>"""
    tests = '<test method="manual" sample="true"/><test method="manual"/>'
    xml = problem_xml("a-plus-b-interactive", tests, "", CHECKER + INTERACTOR + solutions)
    files = {**INTERACTIVE, "problem.xml": xml}
    root = write_tree(tmp_path / "package", files)
    version = await put(pg_pool, root)
    verdicts = await judge_solutions(package_judge, "a-plus-b-interactive", version)
    assert {name: v.status for name, v in verdicts.items()} == {
        "solutions/ok.py": "ACCEPTED", "solutions/plus_one.py": "WRONG_ANSWER", "solutions/silent.py": "IDLENESS_LIMIT",
    }  # fmt: skip
    wrong = verdicts["solutions/plus_one.py"].details
    assert "1st words differ - expected: '3', found: '4'" in wrong["reason"] and "score" not in wrong


def test_what_a_polygon_package_may_not_be(tmp_path: Path) -> None:
    files = {**SUMS, "problem.xml": problem_xml("a-plus-b", SUM_TESTS, SUM_GROUPS, CHECKER)}
    (write_tree(tmp_path / "p", files) / "tests" / "03").unlink()
    # Test 3 is generated ("gen 1"): its files may be left out, but then its generator must be in the package.
    with pytest.raises(InvalidPackage, match=r"test 3: generator 'gen' \(of 'gen 1'\) is no <files><executables>"):
        read_package(tmp_path / "p")
    (tmp_path / "p" / "tests" / "02").unlink()
    with pytest.raises(InvalidPackage, match=r"test 2: tests/02 must exist \(a manual test is in the package\)"):
        read_package(tmp_path / "p")
    stdin_only = problem_xml("x", SUM_TESTS, "", CHECKER).replace('input-file=""', 'input-file="input.txt"')
    with pytest.raises(InvalidPackage, match="only standard input and output"):
        read_package(write_tree(tmp_path / "q", {**SUMS, "problem.xml": stdin_only}))
    with pytest.raises(InvalidPackage, match="no <assets><checker>"):
        read_package(write_tree(tmp_path / "r", {**SUMS, "problem.xml": problem_xml("x", SUM_TESTS, "", "")}))
