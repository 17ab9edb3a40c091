"""Hostile archives: an archive is untrusted input, and an upload must never read outside it, store
more than its bounds, or leave anything behind when it is refused.

Every archive here is written by the test (nothing large is committed). Each one is uploaded after a
well-formed package is already stored, and must be refused with one clear line naming the file and
the rule, with the problem tables (rows and bytes) exactly as they were. Needs root (the sandbox
builds checkers at upload)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import stat
import struct
import time
import warnings
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from judgequeue.core.config import ArchiveSettings
from judgequeue.core.judges.program import ProgramJudge
from judgequeue.core.judges.program.archives import Files, named_files
from judgequeue.core.judges.sandbox.isolation import JudgeSettings
from judgequeue.core.store import problems
from judgequeue.core.store.problems import InvalidPackage, VersionConflict, upload
from tests.support.archives import write_tree
from tests.support.queries import problem_tables
from tests.support.roles import clean_env, run_cli
from tests.support.sandbox_host import box_leftovers

pytestmark = pytest.mark.usefixtures("as_root")

KATTIS: dict[str, str | bytes] = {
    "problem.yaml": "name: Hello\nlicense: cc0\n",
    "data/sample/1.in": "", "data/sample/1.ans": "hello\n",
    "data/secret/1.in": "1\n", "data/secret/1.ans": "hello\n",
    "submissions/accepted/hello.py": "print('hello')\n",
}  # fmt: skip
CHECK_PY = ("import sys\ninp, out, ans = (open(p).read().split() for p in sys.argv[1:4])\n"
            "sys.exit(0 if out == ans else 1)\n")


MANUAL = '<test method="manual"/>'


def polygon_xml(input_pattern: str = "tests/%02d", answer_pattern: str = "tests/%02d.a", tests: int = 2) -> str:
    return (
        '<problem short-name="echo" revision="3"><judging><testset name="tests">'
        "<time-limit>500</time-limit><memory-limit>67108864</memory-limit>"
        f"<test-count>{tests}</test-count><input-path-pattern>{input_pattern}</input-path-pattern>"
        f"<answer-path-pattern>{answer_pattern}</answer-path-pattern>"
        f"<tests>{MANUAL * tests}</tests></testset></judging>"
        '<assets><checker type="testlib"><source path="files/check.py" type="python.3"/></checker>'
        '<solutions><solution tag="main"><source path="solutions/echo.py" type="python.3"/></solution></solutions>'
        "</assets></problem>"
    )


POLYGON: dict[str, str | bytes] = {
    "problem.xml": polygon_xml(),
    "tests/01": "x\n", "tests/01.a": "x\n", "tests/02": "y\n", "tests/02.a": "y\n",
    "files/check.py": CHECK_PY,
    "solutions/echo.py": "print(input())\n", "solutions/echo.py.desc": "File name: echo.py\nTag: MAIN\n",
}  # fmt: skip


@dataclass(frozen=True)
class Site:
    """Where a test uploads: its database, and the judge that builds checkers at upload."""

    pool: asyncpg.Pool
    judge: ProgramJudge


@pytest.fixture
def site(pg_pool: asyncpg.Pool, sandbox_dir: str) -> Iterator[Site]:
    """A program judge builds at upload as it builds to judge. Nothing of its boxes may be left; its
    uids are not scanned for processes (they are shared with any judge on this host that holds the
    same range of another sandbox directory)."""
    judge = ProgramJudge(settings=JudgeSettings(sandbox_dir=sandbox_dir), slots=2)
    yield Site(pg_pool, judge)
    assert box_leftovers(judge) == []
    judge.close()


async def stored(site: Site, root: Path, **options: Any) -> Any:
    async with site.pool.acquire() as conn:
        return await upload(conn, root, judge=site.judge, **options)


async def refused(site: Site, root: Path, match: str, **options: Any) -> str:
    """Upload ``root``: it must be refused with one line matching ``match``, storing nothing. The message."""
    before = await problem_tables(site.pool)
    with pytest.raises(InvalidPackage, match=match) as caught:
        await stored(site, root, **options)
    message = str(caught.value)
    assert "\n" not in message and "Traceback" not in message, message
    assert await problem_tables(site.pool) == before, "a refused upload stored something"
    return message


@pytest.fixture
async def baseline(site: Site, tmp_path: Path) -> None:
    """A well-formed package already stored, so 'unchanged' is about tables that hold something."""
    await stored(site, write_tree(tmp_path / "good" / "hello", KATTIS))
    assert (await problem_tables(site.pool))["problems"][0] == 1


def kattis(tmp_path: Path, change: Callable[[Path], object]) -> Path:
    root = write_tree(tmp_path / "hostile" / "hello", KATTIS)
    change(root)
    return root


def link(path: Path, target: str | Path) -> Path:
    """``path`` made (or replaced by) a symbolic link to ``target``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    path.symlink_to(target)
    return path


def device(path: Path) -> Path:
    """``path`` made a character device (the kernel's /dev/null)."""
    os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(1, 3))
    return path


@pytest.mark.usefixtures("baseline")
@pytest.mark.parametrize(
    ("change", "error"),
    [
        # The uploader's environment (the database password among it) as a test input.
        (lambda r: (link(r / "data/secret/env.in", "/proc/self/environ"), (r / "data/secret/env.ans").write_text("")),
         r"^data/secret/env\.in is a symbolic link to '/proc/self/environ', outside the package"),
        (lambda r: link(r / "data/secret/etc", "/etc"), r"^data/secret/etc is a symbolic link to '/etc', outside"),
        (lambda r: link(r / "output_validators/v/validate.h", "/etc/passwd"),
         r"^output_validators/v/validate\.h is a symbolic link to '/etc/passwd', outside the package"),
        (lambda r: link(r / "submissions/accepted/env.py", "../" * 40 + "proc/self/environ"),
         r"^submissions/accepted/env\.py is a symbolic link to '(\.\./)+proc/self/environ', outside the package"),
        # A link back up the tree: 41 copies of the same tests, or a walk without end.
        (lambda r: link(r / "data/secret/loop", ".."),
         r"^data/secret/loop is a symbolic link to the directory '\.\.': links to directories are refused"),
        (lambda r: link(r / "data/sample/again", "../secret"),
         r"^data/sample/again is a symbolic link to the directory"),
        (lambda r: link(r / "data/secret/2.in", "2.in"),
         r"^data/secret/2\.in is a symbolic link to '2\.in', which loops"),
        (lambda r: link(r / "data/secret/3.in", "nowhere.in"),
         r"^data/secret/3\.in is a symbolic link to 'nowhere\.in', which names nothing"),
        (lambda r: os.mkfifo(r / "data/secret/4.in"), r"^data/secret/4\.in is a FIFO: a package holds only regular"),
        (lambda r: device(r / "data/secret/5.in"),
         r"^data/secret/5\.in is a device: a package holds only regular files"),
        (lambda r: (link(r / "data/secret/6.in", "5.in"), device(r / "data/secret/5.in")),
         r"^data/secret/5\.in is a device"),
    ],
)
async def test_a_kattis_package_reaching_outside_itself_is_refused(
    site: Site, tmp_path: Path, change: Callable[[Path], object], error: str
) -> None:
    await refused(site, kattis(tmp_path, change), error)


@pytest.mark.usefixtures("baseline")
@pytest.mark.parametrize(
    ("change", "error"),
    [
        (lambda r: link(r / "tests/02", "/proc/self/environ"),
         r"^tests/02 is a symbolic link to '/proc/self/environ', outside the package"),
        (lambda r: link(r / "files/testlib.h", "/etc/hostname"),
         r"^files/testlib\.h is a symbolic link to '/etc/hostname', outside the package"),
        # 63 tests read from a directory beside the package.
        (lambda r: (r / "problem.xml").write_text(polygon_xml("../../outside/%02d")),
         r"^problem\.xml: input-path-pattern '\.\./\.\./outside/%02d' leaves the package"),
        (lambda r: (r / "problem.xml").write_text(polygon_xml(answer_pattern="/etc/%02d.a")),
         r"^problem\.xml: answer-path-pattern '/etc/%02d\.a' leaves the package"),
        (lambda r: (r / "problem.xml").write_text(polygon_xml().replace("<answer-path-pattern>",
            "<output-path-pattern>../../outside/%02d</output-path-pattern><answer-path-pattern>")),
         r"^problem\.xml: output-path-pattern '\.\./\.\./outside/%02d' leaves the package"),
        (lambda r: (r / "problem.xml").write_text(polygon_xml("tests/01")),
         r"^problem\.xml: input-path-pattern 'tests/01' must number the tests with one %d"),
        (lambda r: (r / "problem.xml").write_text(polygon_xml("tests/%02d-%s")), "must number the tests with one %d"),
        (lambda r: (r / "problem.xml").write_text(polygon_xml("tests/%d/%d")), "must number the tests with one %d"),
    ],
)
async def test_a_polygon_package_reaching_outside_itself_is_refused(
    site: Site, tmp_path: Path, change: Callable[[Path], object], error: str
) -> None:
    outside = write_tree(tmp_path / "outside", {f"{i:02d}": "secret\n" for i in range(1, 64)})
    root = write_tree(tmp_path / "p" / "q", POLYGON)
    assert (root / "../../outside").resolve() == outside.resolve()
    change(root)
    await refused(site, root, error)


LAUGHS = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 10)}]\n" for i in range(8)
)


@pytest.mark.usefixtures("baseline")
@pytest.mark.parametrize(
    ("files", "error"),
    [
        # A billion values from a few lines, once the manifest is written out as JSON.
        ({"problem.yaml": "id: mean\nscoring:\n  " + LAUGHS.replace("\n", "\n  "), "tests/1.in": "",
          "tests/1.ans": ""}, r"^.*/problem\.yaml: YAML aliases are refused in a package \(line \d+: \*a;"),
        ({**KATTIS, "data/secret/testdata.yaml": LAUGHS + "grader_flags: *i\n"},
         r"^.*/data/secret/testdata\.yaml: YAML aliases are refused in a package"),
    ],
)
async def test_yaml_that_expands_without_bound_is_refused(
    site: Site, tmp_path: Path, files: dict[str, str | bytes], error: str
) -> None:
    await refused(site, write_tree(tmp_path / "hostile" / "hello", files), error)


@pytest.mark.usefixtures("baseline")
async def test_a_package_under_proc_is_refused(site: Site) -> None:
    await refused(site, Path("/proc/self"), r"^/proc/self: a package is never read from /proc, /sys, /dev$")


async def test_a_link_to_a_file_inside_the_package_is_read_as_that_file(site: Site, tmp_path: Path) -> None:
    root = write_tree(tmp_path / "hello", KATTIS)
    link(root / "data/secret/2.in", "../sample/1.in")
    link(root / "data/secret/2.ans", "1.ans")
    done = await stored(site, root)
    assert done.tests == 3
    assert (await problem_tables(site.pool))["problem_files"][0] == 4  # "", "1\n", "hello\n", hello.py


@pytest.mark.usefixtures("baseline")
async def test_a_file_over_the_bound_is_refused_before_anything_is_read(site: Site, tmp_path: Path) -> None:
    root = write_tree(tmp_path / "hello", KATTIS)
    with (root / "data/secret/2.in").open("wb") as big:
        big.truncate(2 << 30)  # 2 GiB, sparse: refused by its size, never read
    (root / "data/secret/2.ans").write_text("hello\n")
    started = time.monotonic()
    await refused(site, root, r"^data/secret/2\.in is 2048\.0 MiB, more than the 256 MiB a file of a package may be "
                                 r"\(JUDGEQUEUE_ARCHIVE_MAX_FILE_MB\)$")
    assert time.monotonic() - started < 5
    # Anywhere in the package, stored or not: a statement is read by nobody, but still bounded.
    (root / "data/secret/2.in").unlink()
    (root / "problem_statement").mkdir()
    with (root / "problem_statement/big.pdf").open("wb") as pdf:
        pdf.truncate(300 << 20)
    await refused(site, root, r"^problem_statement/big\.pdf is 300\.0 MiB, more than the 256 MiB")


@pytest.mark.usefixtures("baseline")
async def test_a_package_over_its_bound_is_refused_before_anything_is_stored(
    site: Site, pg_dsn: str, tmp_path: Path
) -> None:
    tests = {f"data/secret/{i}.in": os.urandom(1 << 20) for i in range(5)}
    root = write_tree(tmp_path / "hello", {**KATTIS, **tests, **{f"data/secret/{i}.ans": "hello\n" for i in range(5)}})
    small = ArchiveSettings(max_file_mb=2, max_package_mb=4)
    over = r"^the package's files come to more than the 4 MiB a package may store \(at data/secret/\d\.in; " \
           r"JUDGEQUEUE_ARCHIVE_MAX_PACKAGE_MB\)$"
    await refused(site, root, over, bounds=small)
    assert (await stored(site, root, bounds=ArchiveSettings(max_file_mb=2, max_package_mb=6))).tests == 6
    # From the command line, the bound is a flag (or the variable), and the refusal one line.
    before = await problem_tables(site.pool)
    env = clean_env(JUDGEQUEUE_POSTGRES_DSN=pg_dsn)
    done = run_cli("problem", "upload", str(root), "--id", "other", "--archive-max-package-mb", "4", env=env)
    assert done.returncode == 2 and done.stderr.startswith("judgequeue: error: the package's files come to more than")
    assert len(done.stderr.splitlines()) == 1
    env["JUDGEQUEUE_ARCHIVE_MAX_FILE_MB"] = "0"
    bad = run_cli("problem", "upload", str(root), env=env)
    assert bad.returncode == 2 and bad.stderr == (
        "judgequeue: error: JUDGEQUEUE_ARCHIVE_MAX_FILE_MB='0' is invalid: must be a positive whole number "
        "(1, 2, 3, ...)\n"
    )
    assert await problem_tables(site.pool) == before


def test_a_file_is_counted_while_it_is_read_whatever_its_size_said(tmp_path: Path) -> None:
    """The survey judges a file by its size; the read counts its bytes (a file that grew since, or
    one whose size says nothing), so the bound holds either way."""
    grown = tmp_path / "grown.in"
    grown.write_bytes(b"x" * ((1 << 20) + 1))
    with pytest.raises(InvalidPackage, match=r"^grown\.in is more than the 1 MiB a file of a package may be"):
        Files(tmp_path, ArchiveSettings(max_file_mb=1, max_package_mb=1)).take(grown)
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(InvalidPackage, match=r"^fifo is a FIFO"):
        Files(tmp_path).take(tmp_path / "fifo")
    (tmp_path / "link").symlink_to("/etc/hostname")
    with pytest.raises(InvalidPackage, match=r"^link is not a file inside the package"):
        Files(tmp_path).take(tmp_path / "link")


async def stored_files(pool: asyncpg.Pool) -> tuple[set[str], set[str]]:
    """(every stored file, every file a stored manifest names)."""
    files = {r["sha256"] for r in await pool.fetch("SELECT sha256 FROM judgequeue.problem_files")}
    manifests = [json.loads(r["manifest"]) for r in await pool.fetch("SELECT manifest::text FROM judgequeue.problems")]
    return files, set().union(*(named_files(m) for m in manifests))


async def test_a_refused_reupload_stores_none_of_its_files(site: Site, tmp_path: Path) -> None:
    root = write_tree(tmp_path / "p", POLYGON)
    first = await stored(site, root)
    assert (first.id, first.version) == ("echo", 3)
    # The same revision with two answers changed: refused, and its two new answers are not left behind.
    (root / "tests/01.a").write_text("changed\n")
    (root / "tests/02.a").write_text("changed too\n")
    before = await problem_tables(site.pool)
    with pytest.raises(VersionConflict, match=r"^echo version 3 exists with other content; versions never change"):
        await stored(site, root)
    assert await problem_tables(site.pool) == before
    files, named = await stored_files(site.pool)
    assert files == named
    # As a new version it is stored, with just the two new files.
    again = await stored(site, root, version=4)
    assert (again.version, again.new_files) == (4, 2)


async def test_only_what_the_manifest_names_is_stored(site: Site, tmp_path: Path) -> None:
    """Polygon's solutions/*.desc, a solution's neighbours, a statement: read or not, never stored."""
    root = write_tree(tmp_path / "p", {**POLYGON, "solutions/wrong.py": "print(0)\n",
                                       "solutions/wrong.py.desc": "Tag: WRONG_ANSWER\n",
                                       "statements/english/problem.tex": "Echo.\n"})  # fmt: skip
    done = await stored(site, root)
    files, named = await stored_files(site.pool)
    assert files == named and len(files) == done.new_files
    manifest = json.loads(await site.pool.fetchval("SELECT manifest::text FROM judgequeue.problems"))
    assert manifest["solutions"][0].keys() == {"language", "file", "name", "expected"}  # nothing beside it
    sizes = await site.pool.fetch("SELECT size FROM judgequeue.problem_files")
    assert done.total_bytes == sum(r["size"] for r in sizes)


@pytest.mark.usefixtures("baseline")
async def test_an_upload_that_fails_while_storing_stores_nothing(
    site: Site, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One transaction: a file that changed after it was read (hashed) fails the store midway, and
    what was written before it goes too."""
    root = write_tree(tmp_path / "hello", {**KATTIS, **{f"data/secret/{i}.in": f"{i}\n" for i in range(2, 9)},
                                           **{f"data/secret/{i}.ans": "hello\n" for i in range(2, 9)}})  # fmt: skip
    build = problems.build_helpers

    async def change_after_reading(*args: Any, **kwargs: Any) -> None:
        await build(*args, **kwargs)
        (root / "data/secret/8.in").write_text("not what was read\n")

    monkeypatch.setattr(problems, "build_helpers", change_after_reading)
    await refused(site, root, r"^8\.in changed while the package was uploaded: upload it again$")


TESTLIB = Path(__file__).resolve().parents[1] / "fixtures" / "third_party" / "testlib"
BROKEN_CPP = "#include \"testlib.h\"\nint main(int argc, char* argv[]) {\n    registerTestlibCmd(argc, argv)\n}\n"


@pytest.mark.usefixtures("baseline")
@pytest.mark.parametrize(
    ("files", "error"),
    [
        # Polygon: a testlib checker missing a semicolon (testlib.h beside it, as Polygon ships it).
        ({**POLYGON, "problem.xml": polygon_xml().replace('path="files/check.py" type="python.3"',
                                                          'path="files/check.cpp" type="cpp.g++17"'),
          "files/check.cpp": BROKEN_CPP, "files/testlib.h": (TESTLIB / "testlib.h").read_text()},
         r"^the checker check\.cpp does not build \(cpp, gnu\+\+17\), so the package is refused:\n(.|\n)*expected ';'"),
        # Polygon: a Python checker that is no Python.
        ({**POLYGON, "files/check.py": "def check(:\n"},
         r"^the checker check\.py does not build \(python\), so the package is refused:\n(.|\n)*SyntaxError"),
        # Kattis: an output validator (a directory of C++) and an interactor.
        ({**KATTIS, "problem.yaml": "name: Hello\nvalidation: custom\n",
          "output_validators/v/validate.cpp": "int main() { return 42 }\n"},
         r"^the checker validate\.cpp does not build \(cpp, gnu\+\+23\)"),
        ({**KATTIS, "problem.yaml": "name: Hello\nvalidation: custom interactive\n",
          "output_validators/v/interact.py": "while True print(1)\n"},
         r"^the interactor interact\.py does not build \(python\)"),
        # Input validators: Kattis (a file, and a directory of C++), Polygon (testlib, as it ships).
        ({**KATTIS, "input_validators/validate.py": "import sys\nfor line in sys.stdin\n    pass\n"},
         r"^the input validator input_validators/validate\.py does not build \(python\), so the package is "
         r"refused:\n(.|\n)*SyntaxError"),
        ({**KATTIS, "input_validators/good.py": "import sys\nsys.exit(42)\n",
          "input_validators/v/main.cpp": "#include \"v.h\"\nint main() { return answer() }\n",
          "input_validators/v/v.h": "int answer() { return 42; }\n"},
         r"^the input validator input_validators/v does not build \(cpp, gnu\+\+23\)(.|\n)*expected ';'"),
        ({**POLYGON, "problem.xml": polygon_xml().replace(
            "</checker>", '</checker><validators><validator><source path="files/val.cpp" type="cpp.g++17"/>'
                          "</validator></validators>"),
          "files/val.cpp": BROKEN_CPP.replace("registerTestlibCmd", "registerValidation"),
          "files/testlib.h": (TESTLIB / "testlib.h").read_text()},
         r"^the input validator files/val\.cpp does not build \(cpp, gnu\+\+17\)(.|\n)*expected ';'"),
    ],
)
async def test_a_checker_that_does_not_build_refuses_the_upload_with_the_compilers_words(
    site: Site, tmp_path: Path, files: dict[str, str | bytes], error: str
) -> None:
    """Stored, a checker would make every submission SYSTEM_ERROR and a validator could check no
    test; at upload, the author reads why."""
    root = write_tree(tmp_path / "hostile" / "hello", files)
    before = await problem_tables(site.pool)
    with pytest.raises(InvalidPackage, match=error):
        await stored(site, root)
    assert await problem_tables(site.pool) == before


async def test_the_command_line_builds_the_checker_in_the_judges_sandbox(
    site: Site, pg_dsn: str, tmp_path: Path
) -> None:
    """Without a judge given, the upload makes one from its environment: JUDGEQUEUE_SANDBOX_DIR and
    the rest of the program judge's settings, the sandbox judging builds in."""
    sandbox = f"/tmp/jq-upload-{os.getpid()}"
    env = clean_env(JUDGEQUEUE_POSTGRES_DSN=pg_dsn, JUDGEQUEUE_SANDBOX_DIR=sandbox)
    try:
        good = run_cli("problem", "upload", str(write_tree(tmp_path / "good", POLYGON)), env=env)
        assert good.returncode == 0, good.stderr
        exported = run_cli("problem", "upload", str(zip_of(tmp_path / "echo-3$linux.zip", POLYGON)), env=env)
        assert exported.returncode == 0 and exported.stdout.startswith("echo version 3 (polygon package): 2 tests")
        built = await asyncio.to_thread(os.path.isdir, os.path.join(sandbox, "helpers"))
        assert built, "the checker was built in the sandbox directory given"
        before = await problem_tables(site.pool)
        broken = write_tree(tmp_path / "broken", {**POLYGON, "files/check.py": "def check(:\n"})
        done = run_cli("problem", "upload", str(broken), "--version", "9", env=env)
        assert done.returncode == 2, done.stderr
        first, *compiler = done.stderr.splitlines()
        assert first == "judgequeue: error: the checker check.py does not build (python), so the package is refused:"
        assert any("SyntaxError" in line for line in compiler), done.stderr
        assert await problem_tables(site.pool) == before
        wrong = run_cli("problem", "upload", str(broken), env={**env, "JUDGEQUEUE_SANDBOX_DIR": "relative/dir"})
        assert wrong.returncode == 2 and wrong.stderr == (
            "judgequeue: error: a package's checker and interactor are built before it is stored: "
            "JUDGEQUEUE_SANDBOX_DIR must be an absolute path, got 'relative/dir'\n"
        )
    finally:
        shutil.rmtree(sandbox, ignore_errors=True)


async def test_input_validators_are_stored_and_built_with_the_package(site: Site, tmp_path: Path) -> None:
    """Every input validator a judge can run is stored with the package and built at upload; a
    checktestdata specification, which no language here runs, is left out with a note."""
    kattis_root = write_tree(tmp_path / "hello", {
        **KATTIS, "input_validators/lines.py": "import sys\nsys.exit(42)\n",
        "input_validators/v/main.cpp": "#include \"v.h\"\nint main() { return answer(); }\n",
        "input_validators/v/v.h": "int answer() { return 42; }\n",
        "input_validators/format.ctd": "INT(1, 10) NEWLINE EOF\n",
    })  # fmt: skip
    done = await stored(site, kattis_root)
    assert done.notes[1:] == ("input_validators/format.ctd: no program in a language this judge runs "
                              "(checktestdata, VIVA?): not stored",)  # fmt: skip
    manifest = json.loads(await site.pool.fetchval("SELECT manifest::text FROM judgequeue.problems"))
    assert [(v["name"], v["language"]) for v in manifest["validators"]] == [
        ("input_validators/lines.py", "python"), ("input_validators/v", "cpp")
    ]
    assert manifest["validators"][1]["files"].keys() == {"v.h"}
    polygon_root = write_tree(tmp_path / "p", {
        **POLYGON, "problem.xml": polygon_xml().replace(
            "</checker>", '</checker><validators><validator><source path="files/val.py" type="python.3"/>'
                          "</validator></validators>"),
        "files/val.py": "import sys\nsys.exit(0)\n",
    })  # fmt: skip
    await stored(site, polygon_root)
    polygon = json.loads(await site.pool.fetchval(
        "SELECT manifest::text FROM judgequeue.problems WHERE id = 'echo'"))  # fmt: skip
    assert [v["name"] for v in polygon["validators"]] == ["files/val.py"]
    assert polygon["validators"][0]["files"].keys() == {"check.py"}  # the files beside it, as a checker's
    files, named = await stored_files(site.pool)
    assert files == named


@pytest.mark.usefixtures("baseline")
@pytest.mark.parametrize(
    ("desc", "error"),
    [
        ("File name: echo.py\nTag: WRONG_ANSWER\n",
         r"^solutions/echo\.py\.desc tags the solution 'WRONG_ANSWER' but problem\.xml tags it 'main': the package is "
         r"inconsistent$"),
        ("File name: other.py\nTag: MAIN\n",
         r"^solutions/echo\.py\.desc describes 'other\.py', not 'echo\.py': the package is inconsistent$"),
    ],
)
async def test_a_desc_file_that_disagrees_with_problem_xml_is_refused(
    site: Site, tmp_path: Path, desc: str, error: str
) -> None:
    await refused(site, write_tree(tmp_path / "p", {**POLYGON, "solutions/echo.py.desc": desc}), error)


async def test_a_desc_file_that_agrees_is_read_but_not_stored(site: Site, tmp_path: Path) -> None:
    tags = {"main": "MAIN", "time-limit-exceeded-or-accepted": "TIME_LIMIT_EXCEEDED_OR_ACCEPTED"}
    xml = polygon_xml().replace(
        "</solutions>", '<solution tag="time-limit-exceeded-or-accepted"><source path="solutions/slow.py" '
                        'type="python.3"/></solution></solutions>')  # fmt: skip
    root = write_tree(tmp_path / "p", {
        **POLYGON, "problem.xml": xml, "solutions/slow.py": "print(input())\n",
        **{f"solutions/{n}.py.desc": f"File name: {n}.py\nTag: {t}\n" for n, t in
           (("echo", tags["main"]), ("slow", tags["time-limit-exceeded-or-accepted"]))},
    })  # fmt: skip
    done = await stored(site, root)
    files, named = await stored_files(site.pool)
    assert files == named and len(files) == done.new_files


# --- zip archives ----------------------------------------------------------------------------------


def zip_of(path: Path, files: dict[str, str | bytes], *, top: str = "", method: int = zipfile.ZIP_DEFLATED) -> Path:
    """``files`` (relative paths) as the zip ``path``, under the directory ``top`` when given."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w", compression=method) as zf:
        for name, content in files.items():
            zf.writestr(f"{top}/{name}" if top else name, content)
    return path


def entry(name: str, *, mode: int = stat.S_IFREG | 0o644) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name)
    info.create_system = 3  # Unix: the mode is in the high bits of external_attr
    info.external_attr = mode << 16
    info.compress_type = zipfile.ZIP_DEFLATED
    return info


def hostile_zip(path: Path, base: dict[str, str | bytes], extra: list[tuple[zipfile.ZipInfo | str, bytes]]) -> Path:
    zip_of(path, base)
    with warnings.catch_warnings(), zipfile.ZipFile(path, "a", compression=zipfile.ZIP_DEFLATED) as zf:
        warnings.simplefilter("ignore")  # a duplicate name is what the test writes
        for info, data in extra:
            zf.writestr(info, data)
    return path


def patch_headers(path: Path, name: str, field: str, value: int) -> Path:
    """Rewrite a field both of ``path``'s headers give entry ``name``: ``size`` (uncompressed) or
    ``flags`` (general purpose bits), in its local file header and its central directory entry."""
    fmt, local_at, central_at = {"size": ("<I", 22, 24), "flags": ("<H", 6, 8)}[field]
    data = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as zf:
        local = zf.getinfo(name).header_offset
    struct.pack_into(fmt, data, local + local_at, value)
    at = data.find(b"PK\x01\x02")
    while data[at + 46 : at + 46 + len(name)] != name.encode():
        at = data.find(b"PK\x01\x02", at + 4)
    struct.pack_into(fmt, data, at + central_at, value)
    path.write_bytes(bytes(data))
    return path


ZEROS = b"\0" * (64 << 20)


@pytest.mark.usefixtures("baseline")
@pytest.mark.parametrize(
    ("extra", "error"),
    [
        ([("../evil.in", b"x")], r"^hello\.zip: entry '\.\./evil\.in' climbs out of the package \('\.\.'\), refused$"),
        ([("data/../../evil.in", b"x")], r"^hello\.zip: entry 'data/\.\./\.\./evil\.in' climbs out"),
        ([("/etc/cron.d/evil", b"x")], r"^hello\.zip: entry '/etc/cron\.d/evil' is an absolute name"),
        ([("C:/evil", b"x")], r"^hello\.zip: entry 'C:/evil' is an absolute name"),
        ([("..\\evil.in", b"x")], r"^hello\.zip: entry '\.\.\\\\evil\.in' holds a backslash or NUL"),
        ([(entry("data/secret/env.in", mode=stat.S_IFLNK | 0o777), b"/proc/self/environ")],
         r"^hello\.zip: entry 'data/secret/env\.in' is a symbolic link: a package holds only regular files"),
        ([(entry("data/secret/pipe.in", mode=stat.S_IFIFO | 0o644), b"")],
         r"^hello\.zip: entry 'data/secret/pipe\.in' is a FIFO"),
        ([("data/secret/1.in", b"2\n")], r"^hello\.zip: entry 'data/secret/1\.in' appears twice$"),
        ([("data/secret/1.in/x", b"2\n")], r"^hello\.zip: 'data/secret/1\.in' is both a file and a directory$"),
    ],
)
async def test_a_zip_whose_entries_leave_the_package_or_are_links_is_refused(
    site: Site, tmp_path: Path, extra: list[tuple[zipfile.ZipInfo | str, bytes]], error: str
) -> None:
    archive = hostile_zip(tmp_path / "in" / "hello.zip", KATTIS, extra)
    await refused(site, archive, error)
    assert not (tmp_path / "evil.in").exists() and not (tmp_path / "in" / "evil.in").exists()


@pytest.mark.usefixtures("baseline")
async def test_a_zip_bomb_is_refused_while_it_expands(site: Site, tmp_path: Path) -> None:
    """The bounds are counted on the bytes decompressed, never taken from the headers."""
    small = ArchiveSettings(max_file_mb=8, max_package_mb=16, max_ratio=1100)
    # One entry larger than a file may be: refused at 8 MiB, not after 64.
    one = zip_of(tmp_path / "one" / "hello.zip", {**KATTIS, "data/secret/2.in": ZEROS, "data/secret/2.ans": "x\n"})
    await refused(site, one, r"^hello\.zip: data/secret/2\.in expands to more than the 8 MiB a file of a package may "
                             r"be \(JUDGEQUEUE_ARCHIVE_MAX_FILE_MB\)$", bounds=small)  # fmt: skip
    # Entries each within the file bound, together past the package's.
    many = {f"data/secret/{i}.in": ZEROS[: 6 << 20] for i in range(2, 6)}
    total = zip_of(tmp_path / "many" / "hello.zip", {**KATTIS, **many})
    await refused(site, total, r"^hello\.zip expands to more than the 16 MiB a package may be \(at data/secret/\d\.in; "
                               r"JUDGEQUEUE_ARCHIVE_MAX_PACKAGE_MB\)$", bounds=small)  # fmt: skip
    # bzip2 reaches ratios deflate cannot: stopped by its ratio after its first MiB, whatever the bounds.
    bz = zip_of(tmp_path / "bz" / "hello.zip", {**KATTIS, "data/secret/2.in": ZEROS}, method=zipfile.ZIP_BZIP2)
    bomb = r"^hello\.zip: data/secret/2\.in expands more than 1100 times \(.* MiB from \d+ bytes read\), refused as " \
           r"a zip bomb \(JUDGEQUEUE_ARCHIVE_MAX_RATIO\)$"
    await refused(site, bz, bomb)
    ratio = ArchiveSettings(max_ratio=100)
    await refused(site, one, r"^hello\.zip: data/secret/2\.in expands more than 100 times", bounds=ratio)
    # A header that says an entry is small does not make it small: its CRC fails where its size lied.
    honest = zip_of(tmp_path / "liar" / "hello.zip", {**KATTIS, "data/secret/2.in": ZEROS[: 3 << 20]})
    liar = patch_headers(honest, "data/secret/2.in", "size", 10)
    await refused(site, liar, r"^hello\.zip is not a readable zip archive: Bad CRC-32 for file 'data/secret/2\.in'$")


@pytest.mark.usefixtures("baseline")
async def test_what_is_no_zip_is_refused(site: Site, tmp_path: Path) -> None:
    junk = tmp_path / "hello.zip"
    junk.write_bytes(b"PK\x03\x04 but nothing after")
    await refused(site, junk, r"^hello\.zip is not a readable zip archive: File is not a zip file$")
    encrypted = patch_headers(zip_of(tmp_path / "e" / "hello.zip", KATTIS), "data/secret/1.in", "flags", 0x1)
    await refused(site, encrypted, r"^hello\.zip: entry 'data/secret/1\.in' is encrypted$")
    # A reader's refusal names the file inside the archive, not where it was extracted.
    await refused(site, zip_of(tmp_path / "y" / "hello.zip", {**KATTIS, "problem.yaml": "- a list\n"}),
                  r"^hello\.zip/problem\.yaml must be a mapping$")  # fmt: skip


async def test_a_polygon_zip_is_the_same_package_as_its_directory(site: Site, tmp_path: Path) -> None:
    """As Polygon exports it (problem.xml at the top), or wrapped in a directory: the same manifest,
    the same digest, no file stored twice."""
    from_dir = await stored(site, write_tree(tmp_path / "dir", POLYGON))
    exported = await stored(site, zip_of(tmp_path / "echo-3$linux.zip", POLYGON))
    wrapped = await stored(site, zip_of(tmp_path / "wrapped.zip", POLYGON, top="echo-3"))
    for done in (exported, wrapped):
        assert (done.id, done.version, done.sha256, done.tests, done.total_bytes, done.new_files) == (
            from_dir.id, from_dir.version, from_dir.sha256, from_dir.tests, from_dir.total_bytes, 0
        )
    # A Kattis package's id is its directory's name: the zip's, or its top directory's.
    kattis_zip = await stored(site, zip_of(tmp_path / "hello.zip", KATTIS))
    kattis_top = await stored(site, zip_of(tmp_path / "other.zip", KATTIS, top="hello"), version=kattis_zip.version)
    assert (kattis_zip.id, kattis_top.id, kattis_top.sha256, kattis_top.new_files) == (
        "hello", "hello", kattis_zip.sha256, 0
    )
    files, named = await stored_files(site.pool)
    assert files == named
