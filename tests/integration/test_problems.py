"""Problem packages: upload (CLI, chunked, content-addressed, immutable versions) and the worker cache."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path

import asyncpg
import pytest

from judgequeue.core.store.problems import (
    CHUNK,
    InvalidPackage,
    ProblemCache,
    UnknownProblem,
    manifest_of,
    read_package_dir,
    upload,
)
from tests.support.archives import write_tree
from tests.support.packages import write_package
from tests.support.roles import clean_env, run_cli

PROBLEM_YAML = """\
id: mean
limits: {time: 1, memory_mb: 256}
checker: {type: floats, abs: 1.0e-6, rel: 1.0e-6}
scoring:
  groups:
    - {name: small, points: 40, tests: [1, 2]}
    - {name: large, points: 60, tests: [3]}
"""


def make_package(root: Path, *, yaml_text: str = PROBLEM_YAML, big: int = 0) -> Path:
    cases = {"1": ("2\n1 2\n", "1.5\n"), "2": ("1\n7\n", "7\n"), "10": ("3\n1 1 2\n", "1.3333333333\n")}
    write_package(root, yaml_text, cases)
    if big:
        (root / "tests" / "10.in").write_bytes(b"3\n1 1 2\n" + b" " * big)
    return root


def cli(*args: str, dsn: str) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, env=clean_env(JUDGEQUEUE_POSTGRES_DSN=dsn))


def test_read_package_dir_orders_tests_naturally_and_validates(tmp_path: Path) -> None:
    package = read_package_dir(make_package(tmp_path))
    assert [t["name"] for t in package.manifest["tests"]] == ["1", "2", "10"]  # 10 after 2
    assert package.manifest["checker"] == {"type": "floats", "abs": 1e-6, "rel": 1e-6}
    assert package.id == "mean" and package.version is None
    # A checker or interactor may name its C/C++ standard (the language's default otherwise).
    interactor = "interactor: {source: tests/1.in, language: cpp, std: c++20}\n"
    (tmp_path / "problem.yaml").write_text(PROBLEM_YAML + interactor)
    assert read_package_dir(tmp_path).manifest["interactor"]["std"] == "c++20"


@pytest.mark.parametrize(
    ("change", "error"),
    [
        (lambda r: (r / "tests" / "2.ans").unlink(), "test 2.in has no answer"),
        (lambda r: (r / "problem.yaml").write_text("id: Bad Id\n"), "id must be lowercase"),
        (lambda r: (r / "problem.yaml").write_text(PROBLEM_YAML.replace("tests: [3]", "tests: [4]")),
         r"4 is not a test number 1\.\.3"),
        (lambda r: (r / "problem.yaml").write_text(PROBLEM_YAML + "checker: regex\n"), "checker type must be one of"),
        (lambda r: (r / "problem.yaml").write_text(PROBLEM_YAML + "interactor: {source: ../../etc/passwd}\n"),
         "is not a file inside the package"),
        (lambda r: (r / "problem.yaml").write_text("id: x\n  bad: [\n"), "is not YAML"),
        (lambda r: (r / "problem.yaml").write_text(PROBLEM_YAML + "interactor: {source: tests/1.in, language: cpp,"
                                                   " std: c++98}\n"), "interactor: std must be one of c\\+\\+11"),
        (lambda r: (r / "problem.yaml").write_text(PROBLEM_YAML + "interactor: {source: tests/1.in, language: "
                                                   "csharp}\n"), "interactor: language 'csharp' is not offered here"),
    ],
)
def test_bad_packages_are_refused_naming_what(tmp_path: Path, change: object, error: str) -> None:
    root = make_package(tmp_path)
    change(root)  # type: ignore[operator]
    with pytest.raises(InvalidPackage, match=error):
        read_package_dir(root)


def test_upload_by_cli_then_versions_are_immutable(pg_dsn: str, tmp_path: Path) -> None:
    root = make_package(tmp_path / "p")
    first = cli("problem", "upload", str(root), "--json", dsn=pg_dsn)
    assert first.returncode == 0, first.stderr
    done = json.loads(first.stdout)
    assert (done["id"], done["version"], done["tests"], done["new_files"]) == ("mean", 1, 3, 6)
    # Same content again without a version: a new version, no file stored twice.
    again = json.loads(cli("problem", "upload", str(root), "--json", dsn=pg_dsn).stdout)
    assert (again["version"], again["new_files"]) == (2, 0)
    # An explicit existing version with the same content is idempotent...
    same = cli("problem", "upload", str(root), "--version", "1", "--json", dsn=pg_dsn)
    assert same.returncode == 0 and json.loads(same.stdout)["sha256"] == done["sha256"]
    # ...and with other content it is refused: versions never change.
    (root / "tests" / "1.ans").write_text("1.25\n")
    conflict = cli("problem", "upload", str(root), "--version", "1", dsn=pg_dsn)
    assert conflict.returncode == 1 and "version 1 exists with other content" in conflict.stderr
    bad = cli("problem", "upload", str(tmp_path / "nowhere"), dsn=pg_dsn)
    assert bad.returncode == 2 and "cannot read" in bad.stderr and len(bad.stderr.splitlines()) == 1
    listed = cli("problem", "list", dsn=pg_dsn)
    assert listed.stdout.count("mean  version=") == 2


def test_the_cli_recognises_kattis_and_polygon_packages(pg_dsn: str, tmp_path: Path) -> None:
    kattis = write_tree(tmp_path / "hello", {
        "problem.yaml": "name: Hello\nlicense: cc0\n", "data/secret/1.in": "", "data/secret/1.ans": "hello\n",
        "submissions/accepted/hello.py": "print('hello')\n",
    })  # fmt: skip
    first = cli("problem", "upload", str(kattis), dsn=pg_dsn)
    assert first.returncode == 0, first.stderr
    assert first.stdout.startswith("hello version 1 (kattis package): 1 tests")
    assert "note: no time limit in the package: 1 s" in first.stdout
    timed = json.loads(cli("problem", "upload", str(kattis), "--time-limit", "2.5", "--id", "hi", "--json",
                           dsn=pg_dsn).stdout)  # fmt: skip
    assert (timed["id"], timed["version"], timed["format"], timed["notes"]) == ("hi", 1, "kattis", [])
    polygon = write_tree(tmp_path / "p", {
        "problem.xml": '<problem short-name="echo" revision="3"><judging><testset name="tests">'
                       "<time-limit>500</time-limit><memory-limit>67108864</memory-limit><test-count>1</test-count>"
                       '<tests><test method="manual"/></tests></testset></judging>'
                       '<assets><checker type="testlib"><source path="files/check.py" type="python.3"/></checker>'
                       "</assets></problem>",
        "tests/01": "x\n", "tests/01.a": "x\n", "files/check.py": "import sys\n",
    })  # fmt: skip
    done = json.loads(cli("problem", "upload", str(polygon), "--json", dsn=pg_dsn).stdout)
    assert (done["id"], done["version"], done["format"], done["tests"]) == ("echo", 3, "polygon", 1)
    refused = cli("problem", "upload", str(tmp_path), dsn=pg_dsn)
    assert refused.returncode == 2 and "not a problem package" in refused.stderr


async def test_large_files_are_chunked_and_read_back_exactly(pg: asyncpg.Connection, tmp_path: Path) -> None:
    root = make_package(tmp_path / "p", big=int(2.5 * CHUNK))
    done = await upload(pg, root)
    manifest, digest = await manifest_of(pg, "mean", done.version)
    assert digest == done.sha256
    big = manifest["tests"][2]["input"]
    assert await pg.fetchval("SELECT chunks FROM judgequeue.problem_files WHERE sha256 = $1", big) == 3
    with pytest.raises(UnknownProblem, match="no problem package 'mean' version 9"):
        await manifest_of(pg, "mean", 9)


async def test_cache_hit_miss_eviction_and_a_new_version_while_the_old_is_judged(
    pg_pool: asyncpg.Pool, pg_dsn: str, tmp_path: Path
) -> None:
    root = make_package(tmp_path / "p")
    async with pg_pool.acquire() as conn:
        v1 = await upload(conn, root)
        (root / "tests" / "1.ans").write_text("1.5000000\n")  # a fix: new content, new version
        v2 = await upload(conn, root)
        other_yaml = PROBLEM_YAML.replace("id: mean", "id: other")
        other = await upload(conn, make_package(tmp_path / "q", yaml_text=other_yaml))
    size = v1.total_bytes
    cache = ProblemCache(tmp_path / "cache", max_bytes=2 * size + size // 2, pool=pg_pool)
    async with cache.package("mean", 1) as old:
        assert (cache.stats.misses, cache.stats.hits) == (1, 0)
        answer = old.path(old.manifest["tests"][0]["answer"])
        assert answer.read_text() == "1.5\n"
        # A new version arrives while the old one is being judged: both are on disk, apart.
        async with cache.package("mean", 2) as new:
            assert new.root != old.root
            assert new.path(new.manifest["tests"][0]["answer"]).read_text() == "1.5000000\n"
        # A third package does not fit beside both: the idle one (v2) goes, the pinned v1 stays.
        async with cache.package("other", 1):
            pass
        assert cache.stats.evictions == 1
        assert answer.read_text() == "1.5\n", "a package in use is never evicted"
    async with cache.package("mean", 1):
        pass
    assert (cache.stats.misses, cache.stats.hits) == (3, 1)
    assert cache.used_bytes <= cache.max_bytes
    assert {v1.version, v2.version, other.version} == {1, 2}
    assert oct((tmp_path / "cache").stat().st_mode & 0o777) == "0o700"


async def test_concurrent_misses_fetch_once(pg_pool: asyncpg.Pool, tmp_path: Path) -> None:
    async with pg_pool.acquire() as conn:
        await upload(conn, make_package(tmp_path / "p"))
    cache = ProblemCache(tmp_path / "cache", max_bytes=10**9, pool=pg_pool)

    async def use() -> Path:
        async with cache.package("mean", 1) as p:
            return p.root

    roots = await asyncio.gather(*(use() for _ in range(8)))
    assert len(set(roots)) == 1 and cache.stats.misses == 1 and cache.stats.hits == 7


async def test_leftovers_of_a_crashed_worker_are_removed_and_nothing_else(
    pg_pool: asyncpg.Pool, tmp_path: Path
) -> None:
    root = tmp_path / "cache"
    (root / ".incoming-dead").mkdir(parents=True)
    (root / "mean@1-0123456789abcdef").mkdir()
    (root / "unrelated.txt").write_text("keep me")
    ProblemCache(root, max_bytes=1, pool=pg_pool)
    assert sorted(p.name for p in root.iterdir()) == ["unrelated.txt"]
