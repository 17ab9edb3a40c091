"""``judgequeue problem verify``: a package checked before a contest, outcome by outcome against
problemtools' own ``verifyproblem`` (the reference, in the test extra) for Kattis packages.

Each package is written by the test. The program judge verifies it in its sandbox (needs root)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest

from judgequeue.core.judges.program import ProgramJudge
from judgequeue.core.judges.program.archives import InvalidPackage, read_package
from judgequeue.core.judges.program.archives.common import timing_of
from judgequeue.core.judges.sandbox.isolation import JudgeSettings
from judgequeue.core.store.problems import upload
from judgequeue.core.verify import Verification, derive_time_limit, verify
from tests.support.archives import VERIFYPROBLEM, verifyproblem, write_tree
from tests.support.roles import clean_env, run_cli
from tests.support.sandbox_host import box_leftovers

pytestmark = pytest.mark.usefixtures("as_root")

#: About half a second of CPU in CPython, whatever the machine's load (it counts CPU, not wall).
SLOW = "import time\nn = int(input())\nend = time.process_time() + 0.5\nwhile time.process_time() < end:\n" \
       "    pass\nprint(2 * n)\n"  # fmt: skip
DIGITS = ('import sys\ntext = sys.stdin.read()\n'
          'sys.exit(42 if text.strip().isdigit() and text.endswith("\\n") else 43)\n')

#: A legacy Kattis package with no time limit: problemtools derives one from its accepted solutions.
DOUBLE = {
    "problem.yaml": "name: Double\nlicense: cc0\n",
    "data/sample/1.in": "3\n", "data/sample/1.ans": "6\n",
    "data/secret/1.in": "5\n", "data/secret/1.ans": "10\n",
    "data/secret/2.in": "21\n", "data/secret/2.ans": "42\n",
    "input_validators/digits.py": DIGITS,
    "submissions/accepted/double.py": "print(2 * int(input()))\n",
    "submissions/accepted/slow.py": SLOW,
    "submissions/wrong_answer/same.py": "print(int(input()))\n",
    "submissions/time_limit_exceeded/spin.py": "input()\nwhile True:\n    pass\n",
    "submissions/run_time_error/crash.py": "raise SystemExit(3)\n",
}  # fmt: skip


@pytest.fixture
def judge(sandbox_dir: str) -> Iterator[ProgramJudge]:
    judge = ProgramJudge(settings=JudgeSettings(sandbox_dir=sandbox_dir), slots=2)
    yield judge
    assert box_leftovers(judge) == []
    judge.close()


def reference_time_limit(root: Path, config_home: Path) -> float:
    """The time limit problemtools sets for a package (its "setting timelim to N secs" line)."""
    config = config_home / "problemtools" / "languages.yaml"
    assert config.is_file(), "verifyproblem() writes its configuration first"
    done = subprocess.run(
        [str(VERIFYPROBLEM), str(root), "-p", "submissions", "-l", "info"], capture_output=True, text=True,
        timeout=300, env={**os.environ, "XDG_CONFIG_HOME": str(config_home)}, check=False,
    )  # fmt: skip
    found = re.search(r"setting timelim to ([0-9.]+) secs", done.stdout + done.stderr)
    assert found, done.stdout + done.stderr
    return float(found[1])


async def verified(judge: ProgramJudge, root: Path, **options: object) -> Verification:
    return await verify(read_package(root, **options), judge)  # type: ignore[arg-type]


async def test_verify_agrees_with_verifyproblem_outcome_by_outcome(
    judge: ProgramJudge, tmp_path: Path
) -> None:
    """Every submission the same verdict as problemtools gives it, the same time limit derived from
    the slowest accepted one (0.5 s times 5, a legacy package's multiplier: 3 s), and the same
    outcome: a submission in the wrong folder is an error for both."""
    root = write_tree(tmp_path / "double", {**DOUBLE, "submissions/wrong_answer/right.py": "print(2 * int(input()))\n"})
    reference = verifyproblem(root, tmp_path / "config")
    found = await verified(judge, root)
    ours = {s.name: s for s in found.solutions}
    assert sorted(ours) == sorted(reference)
    for name, outcome in ours.items():
        assert outcome.verdict == reference[name].verdict, (name, outcome, reference[name])
        # problemtools: "OK" for each but the misplaced one ("got AC", an error).
        assert outcome.outcome == ("disagrees" if name == "wrong_answer/right.py" else "ok"), (name, outcome)
    assert found.errors == ["wrong_answer/right.py got ACCEPTED at 3 s (ACCEPTED at 6 s), expected WRONG_ANSWER"]
    assert found.time_limit_source == "derived"
    assert found.slowest_accepted is not None and 0.45 < found.slowest_accepted < 0.9
    assert found.time_limit == found.derived_time_limit == reference_time_limit(root, tmp_path / "config") == 3
    assert [(c.test, c.valid) for c in found.inputs] == [("sample/1", True), ("secret/1", True), ("secret/2", True)]


async def test_a_2023_package_uses_its_own_multipliers(judge: ProgramJudge, tmp_path: Path) -> None:
    """2023-07's defaults (2 and 1.5, in steps of 1 s) and the package's own multipliers, as
    problemtools reads them; a limit the package gives is kept, and one without problemtools'
    margin is an error."""
    files = {k: v for k, v in DOUBLE.items() if not k.startswith("submissions/") or "accepted" in k}
    new = write_tree(tmp_path / "new" / "double", {
        **files, "problem.yaml": "problem_format_version: 2023-07-draft\nname: Double\nlimits:\n  "
                                 "time_multipliers: {ac_to_time_limit: 3, time_limit_to_tle: 1.2}\n"})  # fmt: skip
    found = await verified(judge, new)
    assert found.ok, found.errors
    timing = timing_of(read_package(new).manifest)
    assert found.time_limit == derive_time_limit(found.slowest_accepted or 0, timing) == 2
    assert read_package(new).manifest["timing"] == {"ac_to_time_limit": 3, "time_limit_to_tle": 1.2, "resolution": 1}
    tight = write_tree(tmp_path / "tight" / "double", {**files, "problem.yaml": "name: Double\n", ".timelimit": "1\n"})
    assert "timing" not in read_package(tight).manifest  # the format's defaults are not stored
    found = await verified(judge, tight)
    assert (found.time_limit, found.time_limit_source) == (1, "package")
    assert len(found.errors) == 1 and found.errors[0].startswith(
        "the time limit 1 s is tighter than the accepted solutions allow: the slowest takes 0.5"
    ), found.errors
    with pytest.raises(InvalidPackage, match=r"^problem\.yaml: limits\.time_multiplier must be at least 1, got 0\.5$"):
        read_package(write_tree(tmp_path / "b" / "double", {**files, "problem.yaml": "limits: {time_multiplier: .5}"}))


AT_MOST = ("import sys\nlimit = int(sys.argv[sys.argv.index('max') + 1])\n"
           "sys.exit(42 if int(input()) <= limit else 43)\n")


async def test_an_input_the_validators_refuse_fails_verification(judge: ProgramJudge, tmp_path: Path) -> None:
    """Each validator on each test, with its group's ``input_validator_flags`` as problemtools runs it."""
    root = write_tree(tmp_path / "double", {**DOUBLE, "data/secret/3.in": "-4\n", "data/secret/3.ans": "-8\n",
                                            "input_validators/crash.py": "raise SystemExit(1)\n",
                                            "input_validators/at_most.py": AT_MOST,
                                            "data/testdata.yaml": "input_validator_flags: max 100\n",
                                            "data/secret/testdata.yaml": "input_validator_flags: max 20"})  # fmt: skip
    found = await verified(judge, root, time_limit=1.0)
    refused = [e for e in found.errors if "refuses" in e]
    assert refused == ["input validator input_validators/at_most.py refuses test secret/2",  # 21 > 20
                       "input validator input_validators/digits.py refuses test secret/3"]  # fmt: skip
    failed = [e for e in found.errors if e.startswith("input validator input_validators/crash.py")]
    assert failed == [f"input validator input_validators/crash.py failed on test {t}: the validator exited 1"
                      for t in ("sample/1", "secret/1", "secret/2", "secret/3")]  # fmt: skip
    # Without a validator, a warning: nothing checked the inputs.
    unchecked = {k: v for k, v in DOUBLE.items() if not k.startswith("input_validators/")}
    alone = await verified(judge, write_tree(tmp_path / "alone" / "double", unchecked), time_limit=3.0)
    assert alone.ok and "no input validator: the tests' inputs are not checked" in alone.warnings

POLYGON = {
    "problem.xml": '<problem short-name="double" revision="1"><judging><testset name="tests">'
                   "<time-limit>1000</time-limit><memory-limit>268435456</memory-limit><test-count>2</test-count>"
                   "<input-path-pattern>tests/%02d</input-path-pattern>"
                   "<answer-path-pattern>tests/%02d.a</answer-path-pattern>"
                   '<tests><test method="manual"/><test method="manual"/></tests></testset></judging><assets>'
                   '<checker type="testlib"><source path="files/check.py" type="python.3"/></checker>'
                   '<validators><validator><source path="files/val.py" type="python.3"/></validator></validators>'
                   '<solutions><solution tag="main"><source path="solutions/double.py" type="python.3"/></solution>'
                   '<solution tag="wrong-answer"><source path="solutions/same.py" type="python.3"/></solution>'
                   '<solution tag="time-limit-exceeded-or-accepted"><source path="solutions/slow.py" '
                   'type="python.3"/></solution></solutions></assets></problem>',
    "tests/01": "3\n", "tests/01.a": "6\n", "tests/02": "5\n", "tests/02.a": "10\n",
    "files/check.py": "import sys\nout, ans = (open(p).read().split() for p in sys.argv[2:4])\n"
                      "sys.exit(0 if out == ans else 1)\n",
    "files/val.py": "import sys\nsys.exit(0 if sys.stdin.read().strip().isdigit() else 3)\n",
    "solutions/double.py": "print(2 * int(input()))\n", "solutions/same.py": "print(int(input()))\n",
    "solutions/slow.py": SLOW,
}  # fmt: skip


async def test_a_polygon_package_by_its_tags_and_its_testlib_validator(judge: ProgramJudge, tmp_path: Path) -> None:
    found = await verified(judge, write_tree(tmp_path / "p", POLYGON))
    assert found.ok, found.errors
    assert {s.name: (s.verdict, s.outcome) for s in found.solutions} == {
        "solutions/double.py": ("ACCEPTED", "ok"), "solutions/same.py": ("WRONG_ANSWER", "ok"),
        "solutions/slow.py": ("ACCEPTED", "ok"),
    }  # fmt: skip
    assert [(c.validator, c.valid) for c in found.inputs] == [("files/val.py", True)] * 2
    # An input every solution handles, but the validator refuses: only the validator says so.
    bad = await verified(judge, write_tree(tmp_path / "q", {**POLYGON, "tests/02": "-5\n", "tests/02.a": "-10\n"}))
    assert bad.errors == ["input validator files/val.py refuses test 02"]


def test_the_command_line_exits_1_on_any_error_and_says_why(sandbox_dir: str, tmp_path: Path) -> None:
    env = clean_env(JUDGEQUEUE_SANDBOX_DIR=sandbox_dir)
    good = write_tree(tmp_path / "good" / "double", {k: v for k, v in DOUBLE.items() if "slow" not in k})
    done = run_cli("problem", "verify", str(good), env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("double (kattis package): time limit 1 s (derived), slowest accepted solution 0.0")
    assert "  wrong_answer/same.py: WRONG_ANSWER" in done.stdout and lines[-1] == "verified: ready for a contest"
    assert "suggested time limit: 1 s (upload with --time-limit 1, or give limits.time_limit)" in lines
    wrong = write_tree(tmp_path / "wrong" / "double", {**DOUBLE, "submissions/accepted/slow.py": "print(0)\n"})
    failed = run_cli("problem", "verify", str(wrong), "--json", env=env)
    assert failed.returncode == 1, failed.stdout + failed.stderr
    report = json.loads(failed.stdout)
    assert report["ok"] is False and report["errors"][0].startswith("accepted/slow.py got WRONG_ANSWER at 1 s")
    plain = run_cli("problem", "verify", str(wrong), env=env)
    *_, error, last = plain.stdout.splitlines()  # 2 s: a legacy package's time_safety_margin is 2
    assert plain.returncode == 1 and last == "1 error: not ready for a contest", plain.stdout
    assert error.startswith("error: accepted/slow.py got WRONG_ANSWER at 1 s (WRONG_ANSWER at 2 s), expected "
                            "ACCEPTED: "), error  # and the checker's words
    # A package the upload would refuse is refused here too, with the same one line.
    link = tmp_path / "wrong" / "double" / "data" / "secret" / "env.in"
    link.symlink_to("/proc/self/environ")
    refused = run_cli("problem", "verify", str(wrong), env=env)
    assert refused.returncode == 2 and refused.stderr == (
        "judgequeue: error: data/secret/env.in is a symbolic link to '/proc/self/environ', outside the package: a link "
        "may only name a file inside it\n"
    )


# --- problemtools' own example packages -----------------------------------------------------------

EXAMPLES = Path(__file__).resolve().parents[1] / "fixtures" / "third_party" / "problemtools"
#: Where the program judge and problemtools disagree on a shipped submission, on purpose: a C++
#: program that allocates past the memory limit is MEMORY_LIMIT here (the cgroup says so), a
#: runtime error to problemtools, whose folder expects that. Verify reports it as an error.
KNOWN = {("hello", "run_time_error/memory_limit.cc"): ("MEMORY_LIMIT", "RUNTIME_ERROR")}


@pytest.mark.parametrize("example", ["hello", "guess", "oddecho"])
async def test_problemtools_examples_agree_with_verifyproblem(
    judge: ProgramJudge, tmp_path: Path, example: str
) -> None:
    """Every submission of problemtools' examples gets the verdict ``verifyproblem`` gives it and the
    same outcome (ok, or an error), and the time limit derived the same way from the slowest
    accepted one. ``hello``'s slowest, ``hello_alarm.c``, spins until a one-second alarm, so its CPU
    time is about 1 s, a step boundary of 5 times it: the two may derive limits one second apart."""
    root = shutil.copytree(EXAMPLES / example, tmp_path / example)
    reference = verifyproblem(root, tmp_path / "config", timeout=900)
    found = await verify(read_package(root), judge, cap=20)
    ours = {s.name: s for s in found.solutions}
    # problemtools judges what its host can build: here not Java 21 or Kotlin, which the judge
    # builds (its own toolchains), and which must then be ok by their folders.
    assert set(reference) <= set(ours), sorted(set(reference) - set(ours))
    for name in sorted(set(ours) - set(reference)):
        assert name.endswith((".java", ".kt")) and ours[name].outcome == "ok", ours[name]
    for name, outcome in ours.items():
        if name not in reference:
            continue
        known = KNOWN.get((example, name))
        if known is not None:
            assert (outcome.verdict, reference[name].verdict, outcome.outcome) == (*known, "disagrees")
            continue
        assert outcome.verdict == reference[name].verdict, (name, outcome, reference[name])
        assert outcome.outcome == "ok", (name, outcome)
        if reference[name].score is not None:
            assert outcome.score == pytest.approx(reference[name].score), (name, outcome, reference[name])
    assert [e.split(" got ")[0] for e in found.errors] == [n for (ex, n) in KNOWN if ex == example]
    assert found.time_limit_source == "derived" and found.slowest_accepted is not None
    theirs = reference_time_limit(root, tmp_path / "config")
    assert found.time_limit == derive_time_limit(found.slowest_accepted, timing_of(read_package(root).manifest))
    assert abs(found.time_limit - theirs) <= (1 if example == "hello" else 0), (found.time_limit, theirs)
    assert found.inputs and all(c.valid for c in found.inputs), found.inputs


async def test_a_stored_package_is_verified_from_the_database(
    sandbox_dir: str, pg_pool: asyncpg.Pool, pg_dsn: str, tmp_path: Path
) -> None:
    """``--problem ID --version N``: the version as stored, its files copied out of Postgres. A
    Kattis package uploaded without a time limit gets its limit derived, as from its directory; its
    own multipliers are stored with it (the ``guess`` example's ``time_limit_to_tle: 4``)."""
    root = shutil.copytree(EXAMPLES / "guess", tmp_path / "guess")
    async with pg_pool.acquire() as conn:
        done = await upload(conn, root, judge_env={"JUDGEQUEUE_SANDBOX_DIR": sandbox_dir})
    env = clean_env(JUDGEQUEUE_POSTGRES_DSN=pg_dsn, JUDGEQUEUE_SANDBOX_DIR=sandbox_dir)
    stored = run_cli("problem", "verify", "--problem", "guess", "--version", str(done.version), "--json", env=env)
    assert stored.returncode == 0, stored.stdout + stored.stderr
    report = json.loads(stored.stdout)
    assert report["ok"] and report["time_limit_source"] == "derived" and report["problem"] == "guess"
    assert {s["name"]: s["outcome"] for s in report["solutions"]} == dict.fromkeys(
        (f"{s.parent.name}/{s.name}" for s in (root / "submissions").glob("*/*")), "ok"
    )
    manifest = json.loads(await pg_pool.fetchval("SELECT manifest::text FROM judgequeue.problems"))
    assert manifest["timing"] == {"ac_to_time_limit": 2.0, "time_limit_to_tle": 4.0, "resolution": 1.0}
    high = [s for s in report["solutions"] if s["name"] == "time_limit_exceeded/guess_no_flush.cc"]
    assert high and high[0]["verdict_high"] == "TIME_LIMIT"
    missing = run_cli("problem", "verify", "--problem", "guess", "--version", "99", env=env)
    assert missing.returncode == 1 and missing.stderr == (
        "judgequeue: error: no problem package 'guess' version 99 (upload it first)\n"
    ), missing.stderr
    both = run_cli("problem", "verify", str(root), "--problem", "guess", "--version", "1", env=env)
    assert both.returncode == 2 and both.stderr == (
        "judgequeue: error: problem verify takes a package directory (or zip), or --problem ID --version N (stored)\n"
    )
