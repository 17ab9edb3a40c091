"""Cancelling a running job as real processes (docs/cancel.md), and a submission's history from the CLI.

A worker process runs a program that spins for 10 s (the program judge, in its sandbox), on both
intakes, and an http-call job whose tool never answers. The test cancels the submission with the
CLI and watches the job stop: the sandboxed process gone, the worker's in-flight gauge back to
zero, within :data:`DEADLINE` of the cancel's commit. Nothing is written for the cancelled attempt
(the status stays CANCELLED, the history holds only the cancellation), and the same worker judges
the next job. Needs root for the sandbox (CI runs as root).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from pathlib import Path

import pytest

from judgequeue.core import api
from tests.support.databases import connection
from tests.support.proc_tree import alive, metric, spinning_under
from tests.support.roles import RoleProcess, Roles, run_cli
from tests.support.tool_server import tool_server
from tests.support.waiting import eventually, wait_for

#: Seconds from the cancel's commit to the job stopped: the issue's 1 s, with room for a loaded
#: 2-core machine shared with other suites (the benchmark, bench/cancel.py, measures p50/p99).
DEADLINE = 1.5

SPIN_SECONDS = 10
SPINNER = {
    "language": "python",
    "source": f"import time\nend = time.monotonic() + {SPIN_SECONDS}\nwhile time.monotonic() < end:\n    pass\n",
    "tests": [{"input": "", "output": ""}],
    "limits": {"time": 30},
}
QUICK = {"language": "python", "source": "print(42)\n", "tests": [{"input": "", "output": "42\n"}]}


async def _submit(pg_dsn: str, queue: str, payload: Mapping[str, object]) -> int:
    async with connection(pg_dsn) as conn, conn.transaction():
        return await api.submit(conn, queue, dict(payload))


async def _status(pg_dsn: str, sid: int) -> str:
    async with connection(pg_dsn) as conn:
        return (await api.result(conn, sid)).status


async def _history(pg_dsn: str, queue: str, sid: int) -> list[tuple[int, str, str]]:
    async with connection(pg_dsn) as conn:
        return [(e.generation, e.status, e.cause) for e in await api.history(conn, queue, sid)]


def _cancel_cli(roles: Roles, sid: int) -> float:
    """Cancel with the CLI; the instant its commit was certain (the command returned)."""
    done = run_cli("submission", "cancel", str(sid), "--reason", "user gave up", "--json", env=roles.env)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"id": sid, "generation": 2, "cancelled_now": True}
    return time.monotonic()


async def _stopped_and_healthy(
    pg_dsn: str, queue: str, worker: RoleProcess, port: int, sid: int, next_payload: Mapping[str, object]
) -> None:
    """The cancelled job wrote nothing, and the worker judges the next job."""
    assert metric(port, "judgequeue_jobs_cancelled_total", queue) == 1
    nxt = await _submit(pg_dsn, queue, next_payload)
    async def judged() -> bool:
        return await _status(pg_dsn, nxt) not in ("PENDING", "JUDGING")

    await eventually(judged, within=60, what="the next job judged")
    assert await _status(pg_dsn, nxt) == "ACCEPTED"
    assert await _status(pg_dsn, sid) == "CANCELLED"
    assert await _history(pg_dsn, queue, sid) == [(2, "CANCELLED", "cancelled")]
    assert worker.poll() is None, worker.log()
    assert any(e.get("msg") == "submission cancelled; judge stopped" for e in worker.events())


@pytest.mark.usefixtures("as_root")
@pytest.mark.parametrize("intake", ["direct", "stream"])
async def test_a_running_spinner_is_stopped_within_the_deadline(
    pg_dsn: str, queue: str, tmp_path: Path, sandbox_dir: str, intake: str
) -> None:
    roles = Roles.on(pg_dsn, queue, tmp_path, JUDGEQUEUE_JUDGE="program", JUDGEQUEUE_SANDBOX_DIR=sandbox_dir,
                     JUDGEQUEUE_INTAKE=intake, JUDGEQUEUE_LEASE_TTL="60s", JUDGEQUEUE_LOG_LEVEL="INFO")  # fmt: skip
    try:
        roles.start("dispatcher")
        [worker] = roles.start("worker")
        port = worker.port()
        sid = await _submit(pg_dsn, queue, SPINNER)

        # The spinner: a process under the worker that has burnt half a second of CPU.
        spinner: int = wait_for(lambda: spinning_under(worker.pid), 60, "the spinner running in its box")
        assert await _status(pg_dsn, sid) == "JUDGING"
        committed = _cancel_cli(roles, sid)
        wait_for(lambda: not alive(spinner), 10, "the spinner killed")
        killed = time.monotonic() - committed
        wait_for(lambda: metric(port, "judgequeue_jobs_in_flight", queue) == 0, 10, "the job ended")
        ended = time.monotonic() - committed
        assert killed < DEADLINE, f"the spinner was killed {killed:.3f}s after the cancel"
        assert ended < DEADLINE + 0.5, f"the job ended {ended:.3f}s after the cancel"
        await _stopped_and_healthy(pg_dsn, queue, worker, port, sid, QUICK)
    finally:
        roles.stop()


async def test_a_running_http_call_is_aborted_within_the_deadline(pg_dsn: str, queue: str, tmp_path: Path) -> None:
    with tool_server("--hang") as hanging, tool_server("--delay", "0") as quick:
        endpoints = {"slow": {"url": hanging.url + "/effect", "deadline": 60},
                     "fast": {"url": quick.url + "/effect", "deadline": 10}}  # fmt: skip
        roles = Roles.on(pg_dsn, queue, tmp_path, JUDGEQUEUE_JUDGE="http-call",
                         JUDGEQUEUE_CALL_ENDPOINTS=json.dumps(endpoints), JUDGEQUEUE_LEASE_TTL="60s",
                         JUDGEQUEUE_LOG_LEVEL="INFO")  # fmt: skip
        try:
            roles.start("dispatcher")
            [worker] = roles.start("worker")
            port = worker.port()
            sid = await _submit(pg_dsn, queue, {"endpoint": "slow", "body": {"charge": 1}})
            key = f"judgequeue:{queue}:{sid}:1"
            await eventually(lambda: hanging.effects()["calls"].get(key) == 1, within=30, what="the call under way")
            committed = _cancel_cli(roles, sid)
            wait_for(lambda: metric(port, "judgequeue_jobs_in_flight", queue) == 0, 10, "the call aborted")
            ended = time.monotonic() - committed
            assert ended < DEADLINE, f"the call ended {ended:.3f}s after the cancel"
            await _stopped_and_healthy(pg_dsn, queue, worker, port, sid, {"endpoint": "fast", "body": {"n": 2}})
        finally:
            roles.stop()


async def test_history_through_judged_rejudged_cancelled_rejudged_from_the_cli(
    pg_dsn: str, queue: str, tmp_path: Path
) -> None:
    roles = Roles.on(pg_dsn, queue, tmp_path, JUDGEQUEUE_JUDGE="sleep")
    try:
        roles.start("dispatcher")
        roles.start("worker")
        sid = await _submit(pg_dsn, queue, {"status": "WRONG_ANSWER"})

        async def judged(n: int) -> bool:
            return len(await _history(pg_dsn, queue, sid)) == n

        await eventually(lambda: judged(1), within=30, what="the first verdict")
        done = run_cli("rejudge", str(sid), env=roles.env)
        assert done.returncode == 0, done.stderr
        await eventually(lambda: judged(2), within=30, what="the rejudged verdict")
        done = run_cli("submission", "cancel", str(sid), "--reason", "duplicate of 41", env=roles.env)
        assert (done.returncode, done.stdout) == (0, f"{sid} cancelled as generation 3\n"), done.stderr
        again = run_cli("submission", "cancel", str(sid), "--reason", "duplicate of 41", env=roles.env)
        assert again.returncode == 0 and "was cancelled already (generation 3); nothing changed" in again.stdout
        done = run_cli("rejudge", str(sid), env=roles.env)
        assert done.returncode == 0, done.stderr
        await eventually(lambda: judged(4), within=30, what="the verdict after the cancellation")

        shown = run_cli("submission", "history", str(sid), "--json", env=roles.env)
        assert shown.returncode == 0, shown.stderr
        history = json.loads(shown.stdout)
        assert [(e["generation"], e["status"], e["cause"]) for e in history] == [
            (1, "WRONG_ANSWER", "judged"),
            (2, "WRONG_ANSWER", "rejudged"),
            (3, "CANCELLED", "cancelled"),
            (4, "WRONG_ANSWER", "rejudged"),
        ]
        assert history[2]["reason"] == "duplicate of 41"
        text = run_cli("submission", "history", str(sid), env=roles.env)
        lines = text.stdout.splitlines()
        assert text.returncode == 0 and len(lines) == 4, text
        assert "generation 3  CANCELLED" in lines[2] and lines[2].endswith("cancelled  reason=duplicate of 41")

        unknown = run_cli("submission", "history", "999999999", env=roles.env)
        assert unknown.returncode == 1
        assert unknown.stderr.strip() == f"judgequeue: error: unknown submission 999999999 in queue '{queue}'"
        blank = run_cli("submission", "cancel", str(sid), "--reason", " ", env=roles.env)
        assert blank.returncode == 2 and "reason must be 1 to 1000 characters" in blank.stderr
    finally:
        roles.stop()
