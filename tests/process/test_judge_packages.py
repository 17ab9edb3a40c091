"""The program judge on problem packages, for real: uploaded to Postgres, fetched through the worker's
cache, judged in boxes. Per-test results, subtasks and scores, custom checkers (partial points,
presentation error, a crashing checker), interactive problems (a guessing game), and a new version
uploaded while the old one is being judged. Each test checks the host is clean afterwards. Needs root."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from prometheus_client import REGISTRY

from judgequeue.core.judges import Verdict
from judgequeue.core.judges.program import ProgramJudge
from judgequeue.core.judges.program.languages import LANGUAGES, missing_toolchain
from judgequeue.core.judges.sandbox.isolation import JudgeSettings
from judgequeue.core.store.problems import ProblemCache, attach_package_cache
from tests.support.archives import put
from tests.support.packages import write_package
from tests.support.sandbox_host import assert_host_clean

pytestmark = pytest.mark.usefixtures("as_root")

MEAN_YAML = """\
id: mean
limits: {time: 1, memory_mb: 128}
checker: {type: floats, abs: 1.0e-6, rel: 1.0e-6}
scoring:
  groups:
    - {name: small, points: 40, tests: [1, 2]}
    - {name: large, points: 60, tests: [3, 4]}
"""
MEAN_TESTS = {
    "1": ("2\n1 2\n", "1.5\n"),
    "2": ("1\n7\n", "7\n"),
    "3": ("3\n1 1 2\n", "1.3333333333\n"),
    "4": ("4\n1000000 1 1 1\n", "250000.75\n"),
}
MEAN_OK = "n = int(input())\nxs = list(map(int, input().split()))\nprint(sum(xs) / n)\n"
# Right on small inputs, wrong on large ones (integer division): earns the small group only.
MEAN_SMALL_ONLY = (
    "n = int(input())\nxs = list(map(int, input().split()))\nprint(sum(xs) // n if n > 2 else sum(xs) / n)\n"
)


@pytest.fixture
async def judge(sandbox_dir: str, pg_pool: asyncpg.Pool) -> AsyncIterator[ProgramJudge]:
    """A program judge with a package cache attached the way the worker attaches it."""
    j = ProgramJudge(settings=JudgeSettings(sandbox_dir=sandbox_dir), slots=8)
    assert j.isolation.mode == "full"
    cache = attach_package_cache(j, pg_pool)
    assert isinstance(cache, ProblemCache) and str(cache.root).startswith(sandbox_dir)
    yield j
    await assert_host_clean(j)
    j.close()


def sub(problem: str, version: int, source: str, language: str = "python") -> dict[str, Any]:
    return {"problem": problem, "version": version, "language": language, "source": source}


async def expect(judge: ProgramJudge, payload: dict[str, Any], status: str) -> dict[str, Any]:
    verdict = await judge.judge(payload)
    assert isinstance(verdict, Verdict)
    assert verdict.status == status, verdict.details
    return verdict.details


# --- subtasks, float checker, per-test results ----------------------------------------------------


async def test_subtasks_with_a_float_checker_score_per_group(
    judge: ProgramJudge, pg_pool: asyncpg.Pool, tmp_path: Path
) -> None:
    version = await put(pg_pool, write_package(tmp_path / "mean", MEAN_YAML, MEAN_TESTS))
    ok, small = await asyncio.gather(
        expect(judge, sub("mean", version, MEAN_OK), "ACCEPTED"),
        expect(judge, sub("mean", version, MEAN_SMALL_ONLY), "WRONG_ANSWER"),
    )
    assert (ok["score"], ok["max_score"]) == (100, 100)
    assert ok["problem"]["id"] == "mean" and ok["problem"]["version"] == version and len(ok["problem"]["sha256"]) == 64
    assert [t["test"] for t in ok["tests"]] == [1, 2, 3, 4]
    for t in ok["tests"]:
        assert t["verdict"] == "ACCEPTED" and t["score"] == 1.0 and t["exit_code"] == 0
        assert t["cpu_ms"] > 0 and t["wall_ms"] > 0 and t["memory_kb"] > 0 and t["message"]
    # The large group fails at its first test, so its second is skipped: it cannot change the score.
    assert (small["score"], small["failed_test"]) == (40, 3)
    assert [(t["test"], t["verdict"]) for t in small["tests"]] == [
        (1, "ACCEPTED"),
        (2, "ACCEPTED"),
        (3, "WRONG_ANSWER"),
    ]
    assert "token 1: expected '1.3333333333', got '1'" in small["reason"]
    assert [(g["name"], g["earned"]) for g in small["groups"]] == [("small", 40), ("large", 0)]


async def test_unscored_package_stops_at_the_first_failure_and_inline_tests_still_work(
    judge: ProgramJudge, pg_pool: asyncpg.Pool, tmp_path: Path
) -> None:
    plain = MEAN_YAML.split("scoring:")[0]
    version = await put(pg_pool, write_package(tmp_path / "mean", plain, MEAN_TESTS))
    details = await expect(judge, sub("mean", version, MEAN_SMALL_ONLY), "WRONG_ANSWER")
    assert len(details["tests"]) == 3 and "score" not in details and details["failed_test"] == 3
    inline = {
        "language": "python", "source": "print(input().strip())",
        "tests": [{"input": "a  b\n", "output": "a b"}, {"input": "c\n", "output": "x"}],
        "checker": "tokens", "scoring": {"run_all": True},
    }  # fmt: skip
    run_all = await expect(judge, inline, "WRONG_ANSWER")
    assert (run_all["score"], [t["verdict"] for t in run_all["tests"]]) == (50, ["ACCEPTED", "WRONG_ANSWER"])
    missing = await expect(judge, sub("nosuch", 1, MEAN_OK), "SYSTEM_ERROR")
    assert "no problem package 'nosuch' version 1" in missing["reason"]


# --- custom checkers -------------------------------------------------------------------------------

# testlib's convention: checker INPUT OUTPUT ANSWER; exit 0 ok, 1 wrong, 2 presentation, 7 points.
CHECKER = """\
import sys
given, output, answer = (open(p).read() for p in sys.argv[1:4])
want = int(answer)
if given.startswith("crash"):
    raise RuntimeError("checker bug on purpose")
if output.strip() != output.rstrip("\\n"):
    print("leading spaces", file=sys.stderr); sys.exit(2)
try:
    got = int(output)
except ValueError:
    print("not a number", file=sys.stderr); sys.exit(1)
if got == want:
    print("exact", file=sys.stderr); sys.exit(0)
if abs(got - want) <= 2:
    print("0.5\\nclose enough", file=sys.stderr); sys.exit(7)
print(f"far off: {got}", file=sys.stderr); sys.exit(1)
"""
CHECKED_YAML = """\
id: near
limits: {time: 1, memory_mb: 128}
checker: {type: custom, source: check.py, language: python}
scoring: {run_all: true}
"""
ECHO = "print(input())\n"


async def test_custom_checker_partial_points_presentation_and_a_crash(
    judge: ProgramJudge, pg_pool: asyncpg.Pool, tmp_path: Path
) -> None:
    tests = {"1": ("10\n", "10\n"), "2": ("11\n", "12\n")}
    version = await put(pg_pool, write_package(tmp_path / "near", CHECKED_YAML, tests, {"check.py": CHECKER}))
    partial = await expect(judge, sub("near", version, ECHO), "WRONG_ANSWER")
    assert [(t["verdict"], t["score"], t["message"]) for t in partial["tests"]] == [
        ("ACCEPTED", 1.0, "exact"),
        ("WRONG_ANSWER", 0.5, "close enough"),
    ]
    assert partial["score"] == 75  # two tests of 50 points: 50 + 0.5 * 50
    presentation = await expect(judge, sub("near", version, "print('  ' + input())"), "PRESENTATION_ERROR")
    assert presentation["reason"] == "leading spaces"
    crashing = {"1": ("crash\n", "1\n")}
    broken = await put(pg_pool, write_package(tmp_path / "broken", CHECKED_YAML, crashing, {"check.py": CHECKER}))
    crashed = await expect(judge, sub("near", broken, ECHO), "SYSTEM_ERROR")
    assert "RuntimeError: checker bug on purpose" in crashed["reason"], crashed


C_CHECKER = r"""
#include <stdio.h>
int main(int argc, char **argv) {
    long out, ans;
    FILE *o = fopen(argv[2], "r"), *a = fopen(argv[3], "r");
    if (!o || !a || fscanf(a, "%ld", &ans) != 1) { fprintf(stderr, "cannot read the answer"); return 3; }
    if (fscanf(o, "%ld", &out) != 1) { fprintf(stderr, "no number"); return 1; }
    if (out != ans) { fprintf(stderr, "expected %ld, got %ld", ans, out); return 1; }
    fprintf(stderr, "ok %ld", out);
    return 0;
}
"""


async def test_a_compiled_checker_is_built_once_per_worker(
    judge: ProgramJudge, pg_pool: asyncpg.Pool, tmp_path: Path
) -> None:
    assert "gcc" in judge.tools, "scripts/install installs gcc"
    spec = "id: cchk\nlimits: {time: 1}\nchecker: {type: custom, source: check.c, language: c}\n"
    version = await put(pg_pool, write_package(tmp_path / "cchk", spec, {"1": ("4\n", "4\n")}, {"check.c": C_CHECKER}))
    before = judge.helper_builds
    ok = await expect(judge, sub("cchk", version, ECHO), "ACCEPTED")
    wrong = await expect(judge, sub("cchk", version, "print(5)"), "WRONG_ANSWER")
    assert (ok["tests"][0]["message"], wrong["reason"]) == ("ok 4", "expected 4, got 5")
    assert judge.helper_builds == before + 1, "the second submission reused the first one's build"


# --- interactive: a guessing game ------------------------------------------------------------------

# Input: the secret and the number of queries allowed. The submission asks "? x" and hears "<", ">"
# or "="; it answers "! x". The interactor's exit code is the verdict (testlib's codes).
INTERACTOR = """\
import sys
secret, allowed = map(int, open(sys.argv[1]).read().split())
asked = 0
for line in sys.stdin:
    kind, _, value = line.strip().partition(" ")
    guess = int(value)
    if kind == "!":
        if guess == secret:
            print(f"found in {asked} queries", file=sys.stderr); sys.exit(0)
        print(f"wrong guess {guess}", file=sys.stderr); sys.exit(1)
    asked += 1
    if asked > allowed:
        print(f"more than {allowed} queries", file=sys.stderr); sys.exit(1)
    print("=" if guess == secret else "<" if secret < guess else ">", flush=True)
print("no answer before EOF", file=sys.stderr); sys.exit(1)
"""
GAME_YAML = """\
id: guess
limits: {time: 1, memory_mb: 128}
interactor: {source: interactor.py, language: python}
"""
BISECT = """\
lo, hi = 1, 1000
while True:
    mid = (lo + hi) // 2
    print("?", mid, flush=True)
    said = input()
    if said == "=":
        print("!", mid, flush=True)
        break
    lo, hi = (lo, mid - 1) if said == "<" else (mid + 1, hi)
"""
WRONG_GUESS = "print('! 1', flush=True)\n"
LINEAR = """\
for x in range(1, 1001):
    print("?", x, flush=True)
    if input() == "=":
        print("!", x, flush=True)
        break
"""
SILENT = "input()\n"  # waits for the interactor, which waits for it: nobody speaks


async def test_interactive_guessing_game(judge: ProgramJudge, pg_pool: asyncpg.Pool, tmp_path: Path) -> None:
    tests = {"1": ("700 10\n", "700\n"), "2": ("3 10\n", "3\n")}
    root = write_package(tmp_path / "guess", GAME_YAML, tests, {"interactor.py": INTERACTOR})
    version = await put(pg_pool, root)
    ok, wrong, chatty, silent = await asyncio.gather(
        expect(judge, sub("guess", version, BISECT), "ACCEPTED"),
        expect(judge, sub("guess", version, WRONG_GUESS), "WRONG_ANSWER"),
        expect(judge, sub("guess", version, LINEAR), "WRONG_ANSWER"),
        expect(judge, sub("guess", version, SILENT), "IDLENESS_LIMIT"),
    )
    assert [t["verdict"] for t in ok["tests"]] == ["ACCEPTED", "ACCEPTED"]
    assert ok["tests"][0]["message"].startswith("found in ")
    assert wrong["reason"] == "wrong guess 1"
    # 700 needs more than 10 linear queries; the submission dies writing to a closed pipe, but the
    # interactor's verdict decides.
    assert (chatty["reason"], chatty["failed_test"]) == ("more than 10 queries", 1)
    assert silent["failed_test"] == 1 and "wall time over" in silent["reason"]


# --- versions --------------------------------------------------------------------------------------


async def test_a_new_version_does_not_disturb_judging_of_the_old(
    judge: ProgramJudge, pg_pool: asyncpg.Pool, tmp_path: Path
) -> None:
    root = write_package(tmp_path / "mean", MEAN_YAML, MEAN_TESTS)
    old = await put(pg_pool, root)
    cache = judge.packages
    assert isinstance(cache, ProblemCache)
    misses_before = REGISTRY.get_sample_value("judgequeue_problem_cache_total", {"result": "miss"}) or 0
    async with cache.package("mean", old) as held:  # judging of v1 in progress
        (root / "tests" / "1.ans").write_text("99\n")  # v2 changes an answer
        new = await put(pg_pool, root)
        v1, v2 = await asyncio.gather(
            expect(judge, sub("mean", old, MEAN_OK), "ACCEPTED"),
            expect(judge, sub("mean", new, MEAN_OK), "WRONG_ANSWER"),
        )
        assert held.path(held.manifest["tests"][0]["answer"]).read_text() == "1.5\n"
    assert v1["problem"]["sha256"] != v2["problem"]["sha256"] and v2["failed_test"] == 1
    # v1 was fetched once (a miss) and then found by its judge (a hit); v2 was a miss of its own.
    assert (cache.stats.misses, cache.stats.hits, cache.stats.evictions) == (2, 1, 0)
    assert REGISTRY.get_sample_value("judgequeue_problem_cache_total", {"result": "miss"}) == misses_before + 2


# --- languages -------------------------------------------------------------------------------------


async def test_java_from_the_language_table(judge: ProgramJudge) -> None:
    """Java where a self-contained JDK exists; elsewhere one clear SYSTEM_ERROR naming what is missing."""
    source = (
        "import java.util.*;\npublic class Main { public static void main(String[] a) {"
        " Scanner s = new Scanner(System.in); System.out.println(s.nextInt() + s.nextInt()); } }"
    )
    tests = [{"input": "2 3\n", "output": "5\n"}]
    payload = {"language": "java", "source": source, "tests": tests, "limits": {"time": 5}}
    if "jdk" not in judge.tools:
        details = await expect(judge, payload, "SYSTEM_ERROR")
        assert "on this worker for java" in details["reason"], details
        return
    details = await expect(judge, payload, "ACCEPTED")
    assert details["language"] == "java"


async def test_compile_errors_return_bounded_compiler_output(judge: ProgramJudge) -> None:
    assert "gcc" in judge.tools, "scripts/install installs gcc"
    noisy = "int main(void) {\n" + "  undefined_thing();\n" * 2000 + "}\n"
    details = await expect(judge, {"language": "c", "source": noisy, "tests": [{"output": ""}]}, "COMPILE_ERROR")
    assert details["reason"] == "compilation failed"
    assert "undefined_thing" in details["output"] and len(details["output"]) <= 4000


# --- testlib as shipped: headers beside checkers, points, interactor plus checker, no SIGPIPE race ------

TESTLIB = Path(__file__).resolve().parents[1] / "fixtures" / "third_party" / "testlib"


def shipped_testlib(*names: str) -> dict[str, str]:
    return {name: (TESTLIB / name).read_text() for name in ("testlib.h", *names)}


async def test_a_testlib_checker_is_built_with_the_testlib_h_beside_it(
    judge: ProgramJudge, pg_pool: asyncpg.Pool, tmp_path: Path
) -> None:
    spec = "id: words\nlimits: {time: 1}\nchecker: {type: custom, source: wcmp.cpp, language: cpp}\n"
    tests = {"1": ("a b\n", "a b\n"), "2": ("x\n", "x\n")}
    version = await put(pg_pool, write_package(tmp_path / "words", spec, tests, shipped_testlib("wcmp.cpp")))
    ok = await expect(judge, sub("words", version, ECHO), "ACCEPTED")
    assert ok["tests"][0]["message"].startswith("ok 2 tokens")
    wrong = await expect(judge, sub("words", version, "print('a c')"), "WRONG_ANSWER")
    assert "2nd words differ - expected: 'b', found: 'c'" in wrong["reason"]


async def test_testlib_points_become_the_tests_score(
    judge: ProgramJudge, pg_pool: asyncpg.Pool, tmp_path: Path
) -> None:
    """testlib's pointscmp answers ``quitp(|answer - output|)``: ``points 0.25 ...`` on stderr, exit 7."""
    spec = "id: points\nlimits: {time: 1}\nchecker: {type: custom, source: pointscmp.cpp, language: cpp}\n" \
           "scoring: {run_all: true}\n"  # fmt: skip
    tests = {"1": ("1.25\n", "1\n"), "2": ("2\n", "1\n")}
    version = await put(pg_pool, write_package(tmp_path / "points", spec, tests, shipped_testlib("pointscmp.cpp")))
    details = await expect(judge, sub("points", version, ECHO), "WRONG_ANSWER")
    assert [(t["verdict"], t["score"]) for t in details["tests"]] == [("WRONG_ANSWER", 0.25), ("ACCEPTED", 1.0)]
    assert details["tests"][0]["message"].startswith("ja=1.0000 pa=1.2500")
    assert details["score"] == 62.5


A_PLUS_B_TESTS = {"1": ("2\n1 2\n3 4\n", "3\n7\n"), "2": ("1\n-5 5\n", "0\n")}
A_PLUS_B = "n = 0\nwhile True:\n    try:\n        a, b = map(int, input().split())\n    except EOFError:\n" \
           "        break\n    print(a + b, flush=True)\n"  # fmt: skip


async def test_an_interactor_writes_what_the_checker_judges(
    judge: ProgramJudge, pg_pool: asyncpg.Pool, tmp_path: Path
) -> None:
    """testlib's interactor-a-plus-b copies the sums it hears to its output file; the checker (wcmp)
    compares that with the answer. A submission answering wrong sums is WRONG_ANSWER, though the
    interactor itself accepts every exchange."""
    spec = "id: aplusb\nlimits: {time: 1}\nchecker: {type: custom, source: check/wcmp.cpp, language: cpp}\n" \
           "interactor: {source: interact/interactor-a-plus-b.cpp, language: cpp}\n"  # fmt: skip
    files = {f"check/{k}": v for k, v in shipped_testlib("wcmp.cpp").items()}
    files |= {f"interact/{k}": v for k, v in shipped_testlib("interactor-a-plus-b.cpp").items()}
    for folder in ("check", "interact"):
        (tmp_path / "aplusb" / folder).mkdir(parents=True)
    version = await put(pg_pool, write_package(tmp_path / "aplusb", spec, A_PLUS_B_TESTS, files))
    ok = await expect(judge, sub("aplusb", version, A_PLUS_B), "ACCEPTED")
    assert ok["tests"][0]["message"] == "ok 2 tokens"
    wrong = await expect(judge, sub("aplusb", version, A_PLUS_B.replace("a + b", "a + b + 1")), "WRONG_ANSWER")
    assert wrong["failed_test"] == 1 and "1st words differ - expected: '3', found: '4'" in wrong["reason"]


#: The same game with Python programs: the interactor copies each sum it hears to its output file and
#: accepts every exchange; the checker alone compares the sums with the answer.
PY_INTERACTOR = """\
import sys
given = open(sys.argv[1]).read().split()
with open(sys.argv[2], "w") as out:
    for i in range(int(given[0])):
        print(given[1 + 2 * i], given[2 + 2 * i], flush=True)
        out.write(sys.stdin.readline())
print(f"{given[0]} queries processed", file=sys.stderr)
"""
PY_CHECKER = """\
import sys
got, want = open(sys.argv[2]).read().split(), open(sys.argv[3]).read().split()
if got != want:
    print(f"expected {want}, found {got}", file=sys.stderr); sys.exit(1)
print(f"{len(want)} sums", file=sys.stderr)
"""


async def test_a_checker_judges_an_interactors_output_whatever_the_language(
    judge: ProgramJudge, pg_pool: asyncpg.Pool, tmp_path: Path
) -> None:
    spec = "id: sums\nlimits: {time: 1}\nchecker: {type: custom, source: check.py}\n" \
           "interactor: {source: interactor.py}\n"  # fmt: skip
    files = {"check.py": PY_CHECKER, "interactor.py": PY_INTERACTOR}
    version = await put(pg_pool, write_package(tmp_path / "sums", spec, A_PLUS_B_TESTS, files))
    await expect(judge, sub("sums", version, A_PLUS_B), "ACCEPTED")
    wrong = await expect(judge, sub("sums", version, A_PLUS_B.replace("a + b", "a - b")), "WRONG_ANSWER")
    assert wrong["reason"] == "expected ['3', '7'], found ['-1', '-1']"


#: Reads one query, answers it (after the submission has surely gone, when told to wait), then wants
#: a final answer the submission never sends.
ANSWERING = """\
import sys, time
wait = float(open(sys.argv[1]).read())
line = sys.stdin.readline()
time.sleep(wait)
print("<", flush=True)
print("no answer" if not sys.stdin.readline() else "unexpected", file=sys.stderr)
sys.exit(1)
"""
GUESS_AND_EXIT = "print('? 500', flush=True)\n"


def flake_runs() -> int:
    """How many runs the SIGPIPE race test makes (JUDGEQUEUE_TEST_FLAKE_RUNS; CI's size by default)."""
    return int(os.environ.get("JUDGEQUEUE_TEST_FLAKE_RUNS", "200"))


async def test_an_interactor_answering_a_submission_that_left_is_never_killed_by_sigpipe(
    judge: ProgramJudge, pg_pool: asyncpg.Pool, tmp_path: Path
) -> None:
    """The submission asks once and exits; the interactor answers and then finds no final answer:
    WRONG_ANSWER, every time. Writing to a pipe nobody reads any more used to kill the interactor with
    SIGPIPE (exit 141, a SYSTEM_ERROR) when the submission's box was gone first: always with a slow
    interactor (test 1 waits 0.3 s before answering), now and then with a quick one (the others)."""
    runs = flake_runs()
    spec = "id: leaver\nlimits: {time: 1}\ninteractor: {source: interactor.py, language: python}\n" \
           "scoring: {run_all: true}\n"  # fmt: skip
    tests = {str(i): ("0.3\n" if i == 1 else "0\n", "500\n") for i in range(1, runs + 1)}
    version = await put(pg_pool, write_package(tmp_path / "leaver", spec, tests, {"interactor.py": ANSWERING}))
    details = await expect(judge, sub("leaver", version, GUESS_AND_EXIT), "WRONG_ANSWER")
    verdicts = [(t["verdict"], t["message"]) for t in details["tests"]]
    assert len(verdicts) == runs
    assert [v for v in verdicts if v != ("WRONG_ANSWER", "no answer")] == []


async def test_a_scored_verdicts_stderr_is_its_failed_tests(judge: ProgramJudge) -> None:
    """Test 2 fails without a word on stderr, test 6 crashes with a traceback: the verdict names test
    2 and carries no stderr, rather than test 6's traceback beside test 2's number."""
    source = "import sys\nn = int(input())\nif n == 6:\n    raise RuntimeError('test six')\nprint(0 if n == 2 else n)\n"
    tests = [{"input": f"{n}\n", "output": f"{n}\n"} for n in range(1, 7)]
    payload = {"language": "python", "source": source, "tests": tests, "scoring": {"run_all": True}}
    details = await expect(judge, payload, "WRONG_ANSWER")
    assert [t["verdict"] for t in details["tests"]][1::4] == ["WRONG_ANSWER", "RUNTIME_ERROR"]
    assert details["failed_test"] == 2 and "stderr" not in details, details.get("stderr")


# --- output-only problems and submissions of several files ------------------------------------------


async def test_an_output_only_problem_judges_the_outputs_given(
    judge: ProgramJudge, pg_pool: asyncpg.Pool, tmp_path: Path
) -> None:
    spec = "id: answers\ntype: output-only\nchecker: {type: custom, source: check.py}\nscoring: {run_all: true}\n"
    tests = {"1": ("10\n", "10\n"), "2": ("11\n", "12\n"), "3": ("5\n", "5\n")}
    version = await put(pg_pool, write_package(tmp_path / "answers", spec, tests, {"check.py": CHECKER}))
    outputs = {"1": "10\n", "2": "13\n"}  # test 2 close (half the points), no output for test 3
    details = await expect(judge, {"problem": "answers", "version": version, "outputs": outputs}, "WRONG_ANSWER")
    assert [(t["verdict"], t["score"]) for t in details["tests"]] == [
        ("ACCEPTED", 1.0), ("WRONG_ANSWER", 0.5), ("WRONG_ANSWER", 0.0),
    ]  # fmt: skip
    assert details["tests"][2]["message"] == "no output submitted for test 3" and "language" not in details
    assert details["score"] == pytest.approx(50)
    every = {"1": "10", "2": "12", "3": "5"}
    await expect(judge, {"problem": "answers", "version": version, "outputs": every}, "ACCEPTED")
    program = await expect(judge, sub("answers", version, ECHO), "SYSTEM_ERROR")
    assert "this problem is output-only" in program["reason"]
    inline = {"outputs": {"1": "3", "2": "4"}, "tests": [{"output": "3"}, {"output": "5"}]}
    assert (await expect(judge, inline, "WRONG_ANSWER"))["failed_test"] == 2


async def test_a_submission_of_several_files(judge: ProgramJudge) -> None:
    files = {
        "sum.h": "long add(long a, long b);\n",
        "sum.cpp": '#include "sum.h"\nlong add(long a, long b) { return a + b; }\n',
    }
    main = '#include <cstdio>\n#include "sum.h"\n' \
           'int main(){long a,b;scanf("%ld %ld",&a,&b);printf("%ld\\n",add(a,b));}\n'  # fmt: skip
    payload = {"language": "cpp", "source": main, "files": files, "tests": [{"input": "2 3\n", "output": "5\n"}]}
    await expect(judge, payload, "ACCEPTED")
    no_unit = {**payload, "files": {"sum.h": files["sum.h"]}}  # declared, never defined: the link fails
    assert "undefined reference to" in (await expect(judge, no_unit, "COMPILE_ERROR"))["output"]
    clash = await expect(judge, {**payload, "files": {"main.cpp": "x"}}, "SYSTEM_ERROR")
    assert "files: 'main.cpp' must be a plain file name" in clash["reason"]
    escape = await expect(judge, {**payload, "files": {"../x.h": "x"}}, "SYSTEM_ERROR")
    assert "must be a plain file name" in escape["reason"]
    java = {"language": "java", "source": "public class Sum {}\n", "files": {"Sum.java": "x"}, "tests": TWO}
    assert "files: 'Sum.java' must be a plain file name" in (await expect(judge, java, "SYSTEM_ERROR"))["reason"]


TWO = [{"input": "3\n", "output": "6\n"}]


async def test_a_kept_build_is_the_main_source_and_the_files_beside_it(judge: ProgramJudge) -> None:
    """The same main source with other files beside it is another build: a header it includes, a
    Python module it imports. Each submission gets its own files, never a kept build of another's."""
    kept, hits = judge.builds.kept, judge.builds.hits
    main = '#include <cstdio>\n#include "k.h"\nint main(){int x; scanf("%d", &x); printf("%d\\n", K * x);}\n'
    for k, verdict in ((2, "ACCEPTED"), (3, "WRONG_ANSWER"), (2, "ACCEPTED")):
        payload = {"language": "cpp", "source": main, "files": {"k.h": f"#define K {k}\n"}, "tests": TWO}
        await expect(judge, payload, verdict)
    assert (judge.builds.kept - kept, judge.builds.hits - hits) == (2, 1)
    # Python finds a submission's modules in its directory, each submission its own.
    modules = {"language": "python", "source": "from calc import f\nprint(f(int(input())))\n", "tests": TWO}
    await expect(judge, {**modules, "files": {"calc.py": "def f(x):\n    return 2 * x\n"}}, "ACCEPTED")
    await expect(judge, {**modules, "files": {"calc.py": "def f(x):\n    return 3 * x\n"}}, "WRONG_ANSWER")
    # Every module is syntax checked as the build: an error in one is COMPILE_ERROR, naming the file.
    broken = await expect(judge, {**modules, "files": {"calc.py": "def f(x)\n    return x\n"}}, "COMPILE_ERROR")
    assert 'calc.py", line 1' in broken["output"], broken


async def test_a_java_submission_of_several_classes(judge: ProgramJudge) -> None:
    """javac, run in the box's directory, finds the classes of the other files beside the main one."""
    missing = missing_toolchain(LANGUAGES["java"], judge.tools)
    if missing:
        pytest.skip(missing)
    main = "public class Twice { public static void main(String[] a) {"
    main += " System.out.println(Calc.f(new java.util.Scanner(System.in).nextInt())); } }\n"
    payload = {"language": "java", "source": main, "tests": TWO}
    await expect(judge, {**payload, "files": {"Calc.java": "class Calc { static int f(int x) { return 2 * x; } }"}},
                 "ACCEPTED")  # fmt: skip
    await expect(judge, {**payload, "files": {"Calc.java": "class Calc { static int f(int x) { return 3 * x; } }"}},
                 "WRONG_ANSWER")  # fmt: skip
