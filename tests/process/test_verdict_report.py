"""Per-test results for people: the lines ``submit --wait``, ``status --submission`` and ``local --demo``
print from a stored verdict, and the CLI reading a real stored verdict back."""

from __future__ import annotations

import json

import asyncpg

from judgequeue.core.judges.report import render_verdict
from judgequeue.core.store.outbox import submit
from judgequeue.core.store.queues import create_queue
from tests.process.test_cli import jq

DETAILS = {
    "isolation": "full",
    "problem": {"id": "mean", "version": 2, "sha256": "0" * 64},
    "tests": [
        {"test": 1, "verdict": "ACCEPTED", "score": 1.0, "cpu_ms": 21, "wall_ms": 40, "memory_kb": 9000,
         "exit_code": 0, "message": "1 token"},
        {"test": 3, "verdict": "RUNTIME_ERROR", "score": 0.0, "cpu_ms": 5, "wall_ms": 9, "memory_kb": 800,
         "signal": 11, "message": "killed by signal 11"},
    ],
    "failed_test": 3,
    "reason": "killed by signal 11",
    "score": 40.0,
    "max_score": 100.0,
    "groups": [{"name": "small", "points": 40, "earned": 40, "tests": [1, 2]},
               {"name": "large", "points": 60, "earned": 0, "tests": [3]}],
}  # fmt: skip


def test_render_shows_each_test_the_groups_and_the_score() -> None:
    lines = render_verdict("RUNTIME_ERROR", DETAILS)
    assert lines[0] == "RUNTIME_ERROR on test 3, score 40/100 (mean v2)"
    assert lines[1].split() == ["test", "verdict", "cpu", "ms", "wall", "ms", "mem", "KiB", "exit", "message"]
    assert lines[2].split() == ["1", "ACCEPTED", "21", "40", "9000", "0", "1", "token"]
    assert lines[3].split() == ["3", "RUNTIME_ERROR", "5", "9", "800", "sig", "11", "killed", "by", "signal", "11"]
    assert lines[4:] == ["  group small: 40/40 (tests 1, 2)", "  group large: 0/60 (tests 3)"]
    # A verdict with no tests (a compile error) shows its reason and the compiler's output instead.
    compile_error = render_verdict("COMPILE_ERROR", {"reason": "compilation failed", "output": "main.c:1: error"})
    assert compile_error == [
        "COMPILE_ERROR",
        "  reason: compilation failed",
        "  compiler output:",
        "    main.c:1: error",
    ]


async def test_status_of_a_submission_shows_its_tests(pg: asyncpg.Connection, pg_dsn: str, queue_name: str) -> None:
    await create_queue(pg, queue_name)
    async with pg.transaction():
        judged = await submit(pg, queue_name, {"problem": "mean", "version": 2})
        waiting = await submit(pg, queue_name, {"problem": "mean", "version": 2})
    # Stands in for a worker's fenced write: only the stored document matters to the CLI.
    await pg.execute(
        "UPDATE judgequeue.submissions SET status = 'RUNTIME_ERROR', verdict = $2::jsonb WHERE id = $1",
        judged,
        json.dumps({"status": "RUNTIME_ERROR", "details": DETAILS}),
    )
    shown = jq("status", "--submission", str(judged), "--submission", str(waiting), dsn=pg_dsn)
    assert shown.returncode == 0, shown.stderr
    out = shown.stdout.splitlines()
    assert out[0] == f"{judged} RUNTIME_ERROR on test 3, score 40/100 (mean v2)"
    assert out[2].split()[:2] == ["1", "ACCEPTED"] and out[3].split()[:2] == ["3", "RUNTIME_ERROR"]
    assert out[-1] == f"{waiting} PENDING"
    as_json = json.loads(jq("status", "--submission", str(judged), "--json", dsn=pg_dsn).stdout)
    assert as_json[0]["verdict"]["details"]["tests"][1]["signal"] == 11
    missing = jq("status", "--submission", "999999", dsn=pg_dsn)
    assert missing.returncode == 1 and "no submission 999999" in missing.stderr
