"""Polygon packages as Polygon exports them without their tests: ``tests/`` holds the manual tests'
inputs only, every other test is a generator command in problem.xml (``cmd="gen 100 1"``; with
``from-file`` for a generator that writes several tests), and the answers are the main solution's.
Uploaded as a zip, the tests are made in the sandbox, validated, stored like manual ones and judged;
the same package makes the same bytes; a generator that crashes, loops, writes too much or makes an
input the validator refuses is refused with one line naming the test and the command, the problem
tables unchanged. Needs root (the sandbox)."""

from __future__ import annotations

import json
import re
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from judgequeue.core.config import ArchiveSettings
from judgequeue.core.judges.program import ProgramJudge
from judgequeue.core.judges.program.archives import InvalidPackage, open_package
from judgequeue.core.store.problems import ProblemCache, upload
from tests.support.archives import judge_solutions, polygon_xml
from tests.support.queries import problem_tables
from tests.support.roles import clean_env, run_cli

pytestmark = pytest.mark.usefixtures("as_root")
TESTLIB = Path(__file__).resolve().parents[1] / "fixtures" / "third_party" / "testlib"

GEN = """#include "testlib.h"
int main(int argc, char* argv[]) {
    registerGen(argc, argv, 1);
    long long limit = atoll(argv[1]);
    println(rnd.next(-limit, limit), rnd.next(-limit, limit));
}
"""
# Writes tests 1..n to files named 1, 2, ... in its directory (a Polygon "from-file" generator).
MULTIGEN = """#include "testlib.h"
#include <cstdio>
int main(int argc, char* argv[]) {
    registerGen(argc, argv, 1);
    int n = atoi(argv[1]);
    for (int i = 1; i <= n; i++) {
        FILE* f = fopen(std::to_string(i).c_str(), "w");
        fprintf(f, "%d %d\\n", rnd.next(0, 1000 * i), -i);
        fclose(f);
    }
}
"""
VALIDATOR = """#include "testlib.h"
int main(int argc, char* argv[]) {
    registerValidation(argc, argv);
    inf.readLong(-1000000000LL, 1000000000LL, "a");
    inf.readSpace();
    inf.readLong(-1000000000LL, 1000000000LL, "b");
    inf.readEoln();
    inf.readEof();
}
"""
MAIN = '#include <cstdio>\nint main(){long long a,b;scanf("%lld %lld",&a,&b);printf("%lld\\n",a+b);}\n'
TESTS = """
        <test method="manual" sample="true"/>
        <test method="manual"/>
        <test cmd="gen 10 1" method="generated"/>
        <test cmd="gen 1000000 2" method="generated"/>
        <test cmd="gen 1000000000 3" method="generated"/>
        <test cmd="multigen 2" from-file="1" method="generated"/>
        <test cmd="multigen 2" from-file="2" method="generated"/>"""


ASSETS = """
    <checker name="std::wcmp.cpp" type="testlib"><source path="files/check.cpp" type="cpp.g++17"/></checker>
    <validators><validator><source path="files/val.cpp" type="cpp.g++17"/></validator></validators>
    <solutions>
      <solution tag="main"><source path="solutions/main.cpp" type="cpp.g++17"/></solution>
      <solution tag="accepted"><source path="solutions/sum.py" type="python.3"/></solution>
      <solution tag="wrong-answer"><source path="solutions/diff.py" type="python.3"/></solution>
      <solution tag="time-limit-exceeded"><source path="solutions/slow.py" type="python.3"/></solution>
      <solution tag="failed"><source path="solutions/crash.py" type="python.3"/></solution>
    </solutions>
  """


def problem_xml(tests: str = TESTS, generators: tuple[str, ...] = ("gen", "multigen")) -> str:
    """problem.xml as Polygon writes it for a package exported without its tests."""
    executables = "".join(
        f'<executable><source path="files/{name}.cpp" type="cpp.g++17"/>'
        f'<binary path="files/{name}.exe" type="exe.win32"/></executable>'
        for name in (*generators, "val")
    )
    return polygon_xml("gen-sum", tests, title="Generated sums", revision=4,
                       executables=f"\n    <executables>{executables}</executables>", assets=ASSETS)


def package_files(**changed: str) -> dict[str, str | bytes]:
    files: dict[str, str | bytes] = {
        "problem.xml": problem_xml(),
        "tests/01": "1 2\n",
        "tests/02": "-5 5\n",
        "files/testlib.h": (TESTLIB / "testlib.h").read_text(),
        "files/check.cpp": (TESTLIB / "wcmp.cpp").read_text(),
        "files/gen.cpp": GEN,
        "files/multigen.cpp": MULTIGEN,
        "files/val.cpp": VALIDATOR,
        "solutions/main.cpp": MAIN,
        "solutions/main.cpp.desc": "File name: main.cpp\nTag: MAIN\n",
        "solutions/sum.py": "a, b = map(int, input().split())\nprint(a + b)\n",
        "solutions/diff.py": "a, b = map(int, input().split())\nprint(a - b)\n",
        "solutions/slow.py": "input()\nwhile True:\n    pass\n",
        "solutions/crash.py": "raise SystemExit(2)\n",
        "doall.sh": "#!/bin/bash\n# Polygon's script; never run by an upload\n",
    }
    files.update(changed)
    return files


def zipped(directory: Path, files: Mapping[str, str | bytes]) -> Path:
    """The package as Polygon exports it: a zip of the package's files, at its top."""
    archive = directory / "gen-sum-4$linux.zip"
    directory.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(archive, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name, content in sorted(files.items()):
            zf.writestr(name, content)
    return archive


@pytest.fixture
def judge(package_judge: ProgramJudge) -> ProgramJudge:
    return package_judge


async def put(pool: asyncpg.Pool, judge: ProgramJudge, path: Path, **options: Any) -> Any:
    async with pool.acquire() as conn:
        return await upload(conn, path, judge=judge, **options)


async def stored_tests(judge: ProgramJudge, version: int, problem: str = "gen-sum") -> list[tuple[bytes, bytes]]:
    """Every stored test of ``problem`` ``version``, input and answer, read back through the worker's cache."""
    cache = judge.packages
    assert isinstance(cache, ProblemCache)
    async with cache.package(problem, version) as package:
        return [
            (package.path(t["input"]).read_bytes(), package.path(t["answer"]).read_bytes())
            for t in package.manifest["tests"]
        ]


async def test_a_polygon_zip_with_generated_tests_is_made_stored_and_judged_to_its_tags(
    judge: ProgramJudge, pg_pool: asyncpg.Pool, tmp_path: Path
) -> None:
    archive = zipped(tmp_path, package_files())
    done = await put(pg_pool, judge, archive)
    assert (done.id, done.version, done.format, done.tests) == ("gen-sum", 4, "polygon", 7)
    tests = await stored_tests(judge, 4)
    # The manual tests as given, the generated ones within their commands' ranges, the two tests
    # of the from-file generator the files it wrote; every answer the main solution's a+b.
    assert [given for given, _ in tests[:2]] == [b"1 2\n", b"-5 5\n"]
    for (given, _answer), limit in zip(tests[2:5], (10, 1_000_000, 1_000_000_000), strict=True):
        a, b = map(int, given.split())
        assert abs(a) <= limit and abs(b) <= limit and given.endswith(b"\n")
    assert [given.split()[1] for given, _ in tests[5:]] == [b"-1", b"-2"]
    for given, answer in tests:
        assert answer == f"{sum(map(int, given.split()))}\n".encode()
    assert len({given for given, _ in tests}) == 7  # each command made a test of its own
    verdicts = await judge_solutions(judge, "gen-sum", 4)
    assert {name: v.status for name, v in verdicts.items()} == {
        "solutions/main.cpp": "ACCEPTED", "solutions/sum.py": "ACCEPTED", "solutions/diff.py": "WRONG_ANSWER",
        "solutions/slow.py": "TIME_LIMIT", "solutions/crash.py": "RUNTIME_ERROR",
    }  # fmt: skip
    accepted = verdicts["solutions/sum.py"].details
    assert len(accepted["tests"]) == 7
    async with pg_pool.acquire() as conn:
        manifest = await conn.fetchval("SELECT manifest FROM judgequeue.problems WHERE id = 'gen-sum'")
    assert '"cmd": "gen 10 1"' in manifest  # the stored manifest says how each test was made


async def test_the_same_package_makes_the_same_bytes(
    judge: ProgramJudge, pg_pool: asyncpg.Pool, tmp_path: Path
) -> None:
    first = await put(pg_pool, judge, zipped(tmp_path / "a", package_files()), version=11)
    # Made again from scratch (another directory, another judge's boxes): the same manifest digest,
    # so the same test bytes, and uploading it again as the same version is the idempotent no-op.
    second = await put(pg_pool, judge, zipped(tmp_path / "b", package_files()), version=12)
    again = await put(pg_pool, judge, zipped(tmp_path / "c", package_files()), version=11)
    assert await stored_tests(judge, 11) == await stored_tests(judge, 12)
    assert (again.sha256, again.new_files) == (first.sha256, 0)
    assert second.new_files == 0  # every made file was already stored, byte for byte


LOOP = '#include "testlib.h"\nint main(int argc, char* argv[]) { registerGen(argc, argv, 1); for (;;) {} }\n'
CRASH = ('#include "testlib.h"\n#include <cstdio>\nint main(int argc, char* argv[]) { registerGen(argc, argv, 1); '
         'fprintf(stderr, "cannot make test %s\\n", argv[1]); return 3; }\n')  # fmt: skip
FLOOD = ('#include "testlib.h"\nint main(int argc, char* argv[]) { registerGen(argc, argv, 1); '
         "for (long i = 0; i < 3L * 1024 * 1024; i++) putchar('1'); putchar('\\n'); }\n")  # fmt: skip
OUT_OF_RANGE = ('#include "testlib.h"\nint main(int argc, char* argv[]) { registerGen(argc, argv, 1); '
                'println("5000000000 1"); }\n')  # fmt: skip
NO_FILE = '#include "testlib.h"\nint main(int argc, char* argv[]) { registerGen(argc, argv, 1); }\n'


#: (what is changed in the package, the refusal) by case.
REFUSALS: dict[str, tuple[dict[str, str], str]] = {
    "crashes": (
        {"files/gen.cpp": CRASH},
        r"^test 3: generator command 'gen 10 1' failed \(exited 3\): cannot make test 10$",
    ),
    "loops": (
        {"files/gen.cpp": LOOP},
        r"^test 3: generator command 'gen 10 1' ran out of its 10 s of CPU time$",
    ),
    "writes-too-much": (
        {"files/gen.cpp": FLOOD},
        r"^test 3: generator command 'gen 10 1' wrote more than the 2.0 MiB a file of a package may be "
        r"\(JUDGEQUEUE_ARCHIVE_MAX_FILE_MB\)$",
    ),
    "invalid-input": (
        {"files/gen.cpp": OUT_OF_RANGE},
        r"^test 3: generator command 'gen 10 1' makes an input that is refused by the validator files/val.cpp: "
        r".*Integer parameter \[name=a\] equals to 5000000000",
    ),
    "no-from-file": (
        {"files/multigen.cpp": NO_FILE},
        r"^test 6: generator command 'multigen 2' wrote no file '1' \(its test's from-file\)$",
    ),
    "main-fails": (
        {"solutions/main.cpp": "int main(){return 1;}\n"},
        r"^test 1: the main solution solutions/main.cpp failed \(exited 1\)$",
    ),
    "unknown-generator": (
        {"problem.xml": problem_xml(TESTS.replace("gen 10 1", "gem 10 1"))},
        r"^problem.xml: test 3: generator 'gem' \(of 'gem 10 1'\) is no <files><executables> entry$",
    ),
}


async def test_a_generator_that_fails_is_refused_naming_the_test_and_command_and_stores_nothing(
    judge: ProgramJudge, pg_pool: asyncpg.Pool, tmp_path: Path
) -> None:
    """Every case with one judge, as a worker would: the programs no case changes are built once."""
    await put(pg_pool, judge, zipped(tmp_path / "good", package_files()), version=1)
    before = await problem_tables(pg_pool)
    bounds = ArchiveSettings(max_file_mb=2)
    for case, (changed, error) in REFUSALS.items():
        with pytest.raises(InvalidPackage, match=error) as caught:
            await put(pg_pool, judge, zipped(tmp_path / case, package_files(**changed)), version=2, bounds=bounds)
        assert "\n" not in str(caught.value), case
        assert await problem_tables(pg_pool) == before, f"{case}: a refused upload stored something"


GUESS_ARRAY = Path(__file__).resolve().parents[1] / "fixtures" / "third_party" / "polygon2domjudge"
GUESS_ARRAY_ZIP = GUESS_ARRAY / "guess-array-1$linux.zip"


def without_built_tests(archive: Path, into: Path) -> Path:
    """``archive`` as Polygon's package without built tests has it: of ``tests/``, only the manual
    tests' inputs (problem.xml says which tests are generated)."""
    with zipfile.ZipFile(archive) as zf:
        xml = zf.read("problem.xml").decode()
        testset = xml[xml.index('<testset name="tests">') : xml.index("</testset>")]
        tests = re.findall(r"<test\s[^>]*>", testset)
        generated = {f"tests/{n:02d}" for n, t in enumerate(tests, 1) if 'method="generated"' in t}
        into.mkdir(parents=True)
        stripped = into / archive.name
        with zipfile.ZipFile(stripped, "w", compression=zipfile.ZIP_DEFLATED) as out:
            for info in zf.infolist():
                if info.filename in generated or (info.filename.startswith("tests/") and info.filename.endswith(".a")):
                    continue
                out.writestr(info, zf.read(info))
    return stripped


async def test_a_public_polygon_package_imported_unchanged_and_its_generated_tests_made_as_polygon_made_them(
    judge: ProgramJudge, pg_pool: asyncpg.Pool, tmp_path: Path
) -> None:
    # As published (tests built in): stored unchanged, its solution judged to its tag.
    done = await put(pg_pool, judge, GUESS_ARRAY_ZIP)
    assert (done.id, done.version, done.tests) == ("guess-array", 1, 18)
    verdicts = await judge_solutions(judge, "guess-array", 1)
    assert {name: v.status for name, v in verdicts.items()} == {"solutions/std.cpp": "ACCEPTED"}
    # As Polygon's package without built tests: 13 inputs made by its generator, 18 answers by its
    # main solution talking to its interactor, byte for byte what Polygon made.
    stripped = without_built_tests(GUESS_ARRAY_ZIP, tmp_path / "stripped")
    with open_package(stripped) as package:
        assert package.generation is not None
        assert sum(1 for m in package.generation.tests if m.cmd) == 13
    remade = await put(pg_pool, judge, stripped, version=2)
    assert remade.tests == 18
    assert await stored_tests(judge, 2, "guess-array") == await stored_tests(judge, 1, "guess-array")
    verdicts = await judge_solutions(judge, "guess-array", 2)
    assert {name: v.status for name, v in verdicts.items()} == {"solutions/std.cpp": "ACCEPTED"}


def test_what_is_left_to_make_is_read_from_problem_xml(tmp_path: Path) -> None:
    """The reader alone (no sandbox): which tests are made and how, and what it refuses."""
    with open_package(zipped(tmp_path, package_files())) as package:
        plan = package.generation
        assert plan is not None
        assert [(m.test, m.generator, m.args, m.from_file, m.answer) for m in plan.tests] == [
            (1, None, (), None, True), (2, None, (), None, True), (3, "gen", ("10", "1"), None, True),
            (4, "gen", ("1000000", "2"), None, True), (5, "gen", ("1000000000", "3"), None, True),
            (6, "multigen", ("2",), "1", True), (7, "multigen", ("2",), "2", True),
        ]  # fmt: skip
        assert sorted(plan.generators) == ["gen", "multigen"]
        assert plan.main is not None and plan.main["name"] == "solutions/main.cpp"
        # Nothing made is stored yet: a test's files are named once they are made.
        assert [sorted(t) for t in package.manifest["tests"][1:3]] == [["input", "name"], ["cmd", "name"]]
    no_main = package_files(**{"problem.xml": problem_xml().replace('tag="main"', 'tag="accepted"')})
    del no_main["solutions/main.cpp.desc"]
    refusal = "test 1: its answer is not in the package and no solution is tagged main"
    with pytest.raises(InvalidPackage, match=refusal), open_package(zipped(tmp_path / "no-main", no_main)):
        pass
    manual = package_files()
    del manual["tests/02"]
    refusal = r"test 2: tests/02 must exist \(a manual test is in the package\)"
    with pytest.raises(InvalidPackage, match=refusal), open_package(zipped(tmp_path / "manual", manual)):
        pass


def test_verify_makes_the_tests_a_package_leaves_to_be_made(sandbox_dir: str, tmp_path: Path) -> None:
    """``judgequeue problem verify`` on Polygon's package without built tests: the tests are made as
    an upload makes them, then validated and judged."""
    stripped = without_built_tests(GUESS_ARRAY_ZIP, tmp_path / "stripped")
    done = run_cli("problem", "verify", str(stripped), "--json", env=clean_env(JUDGEQUEUE_SANDBOX_DIR=sandbox_dir),
                   timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert report["ok"] is True, report
    assert [(s["name"], s["verdict"], s["outcome"]) for s in report["solutions"]] == [
        ("solutions/std.cpp", "ACCEPTED", "ok")
    ]
    assert [c["valid"] for c in report["inputs"]] == [True] * 18
