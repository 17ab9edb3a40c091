"""Agent/tool jobs (the http-call judge) as real processes, against the example tool server.

A worker SIGKILLed in the middle of a call: the lease expires, the reaper rescues the job (a new
generation of the same request), another worker repeats the call with the same idempotency key,
the tool applies the effect once and one result is stored. And the README's agent example, run as
a newcomer runs it.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from judgequeue.core import api
from judgequeue.core.store import outbox
from tests.support.databases import connection
from tests.support.redis_servers import redis_server
from tests.support.roles import Roles, clean_env, http_get
from tests.support.tool_server import ToolServer, tool_server
from tests.support.waiting import eventually, wait_for

ROOT = Path(__file__).resolve().parents[2]


def endpoints(url: str, **options: float) -> str:
    return json.dumps({"tool": {"url": url + "/effect", **options}})


@contextmanager
def calling(pg_dsn: str, queue: str, tmp_path: Path, *, delay: int) -> Iterator[tuple[ToolServer, Roles]]:
    """The example tool server, applying each effect in ``delay`` seconds, and roles on ``queue`` whose
    http-call judge calls it (a 30 s deadline); none started yet, all stopped when the block ends."""
    with tool_server("--delay", str(delay)) as tool:
        roles = Roles.on(pg_dsn, queue, tmp_path, JUDGEQUEUE_JUDGE="http-call",
                         JUDGEQUEUE_CALL_ENDPOINTS=endpoints(tool.url, deadline=30))  # fmt: skip
        try:
            yield tool, roles
        finally:
            roles.stop()


async def test_a_worker_killed_mid_call_the_call_repeats_with_the_same_key_and_applies_once(
    pg_dsn: str, queue: str, tmp_path: Path
) -> None:
    with calling(pg_dsn, queue, tmp_path, delay=4) as (tool, roles):
        roles.start("dispatcher")
        [first] = roles.start("worker")
        roles.start("reaper")
        async with connection(pg_dsn) as conn, conn.transaction():
            sid = await outbox.submit(conn, queue, {"endpoint": "tool", "body": {"charge": 10}})
        key = f"judgequeue:{queue}:{sid}:1"
        await eventually(lambda: tool.effects()["calls"].get(key) == 1, within=20, what="the first call under way")
        first.send_signal(signal.SIGKILL)  # mid-call: the tool is still applying the effect
        first.wait()
        [second] = roles.start("worker")

        async def done() -> bool:
            async with connection(pg_dsn) as conn:
                status = await conn.fetchval("SELECT status FROM judgequeue.submissions WHERE id = $1", sid)
            return status not in ("PENDING", "JUDGING")

        await eventually(done, within=30, what="the rescued job's verdict")
        async with connection(pg_dsn) as conn:
            row = await conn.fetchrow(
                "SELECT status, generation, request_generation, retry_count, verdict FROM judgequeue.submissions"
                " WHERE id = $1", sid,
            )  # fmt: skip
        assert row is not None
        verdict = json.loads(row["verdict"])
        # Rescued once (a new generation), the same request: the second call used the same key ...
        assert (row["status"], row["generation"], row["request_generation"], row["retry_count"]) == (
            "ACCEPTED", 2, 1, 1,
        )  # fmt: skip
        assert verdict["details"]["idempotency_key"] == key and verdict["generation"] == 2
        # ... the tool saw two calls with it and applied the effect once; one result is stored,
        # the effect's own, written by the second worker.
        assert tool.effects() == {"applied": {key: 1}, "calls": {key: 2}}
        assert verdict["details"]["response"] == {"effect": "applied", "key": key, "echo": {"charge": 10}}
        assert verdict["worker"] != "" and second.poll() is None


async def test_a_rejudge_during_a_call_the_old_attempts_result_is_never_stored(
    pg_dsn: str, queue: str, tmp_path: Path
) -> None:
    with calling(pg_dsn, queue, tmp_path, delay=3) as (tool, roles):
        roles.start("dispatcher")
        roles.start("reaper")
        # A lease far longer than the test: no heartbeat (every third of it) runs before the old try
        # ends, so nothing cancels it, and it meets the fence at write time. With a 30 s lease, a
        # worker slow to start under load began its call near its first heartbeat (10 s), which
        # found the lease rejudged and cancelled the call.
        [old] = roles.start("worker", JUDGEQUEUE_LEASE_TTL="600s", JUDGEQUEUE_VISIBILITY_TIMEOUT="60s",
                            JUDGEQUEUE_CONCURRENCY="1", JUDGEQUEUE_LOG_LEVEL="INFO")  # fmt: skip
        async with connection(pg_dsn) as conn, conn.transaction():
            sid = await outbox.submit(conn, queue, {"endpoint": "tool", "body": {}})
        first, second = (f"judgequeue:{queue}:{sid}:{g}" for g in (1, 2))
        await eventually(lambda: tool.effects()["calls"].get(first) == 1, within=20, what="the old call under way")
        async with connection(pg_dsn) as conn:
            await api.rejudge(conn, sid)
        roles.start("worker")
        port = old.port()

        def dropped() -> float:
            # The old try's verdict is refused by the fence at write time, unless the worker's lease
            # check (cancels.LISTENING_CHECK, every 5 s) ran between the rejudge and the call's end:
            # then the call is stopped as lost and nothing is written either. Which one comes is
            # timing (under load the call often straddles a check).
            _, text = http_get(port, "/metrics")
            total = 0.0
            for why in ("stale_verdict", "lease_lost"):
                series = f'judgequeue_stale_results_dropped_total{{queue="{queue}",reason="{why}"}}'
                match = re.search(re.escape(series) + r" (\S+)", text)
                total += float(match.group(1)) if match else 0.0
            return total

        await eventually(lambda: dropped() == 1.0, within=30, what="the old try's verdict refused or its call stopped")

        async def verdict() -> dict[str, Any] | None:
            async with connection(pg_dsn) as conn:
                row = await conn.fetchrow("SELECT status, verdict FROM judgequeue.submissions WHERE id = $1", sid)
            return json.loads(row["verdict"]) if row and row["status"] == "ACCEPTED" else None

        doc = await eventually(verdict, within=30, what="the new generation's verdict")
        assert doc["generation"] == 2 and doc["details"]["idempotency_key"] == second
        # Two requests, each applied once: the rejudge asked for the call again, with its own key.
        assert tool.effects()["applied"] == {first: 1, second: 1}


# --- the README's example, as a newcomer runs it -----------------------------------------------------


def readme_agent_commands() -> list[str]:
    """The command block under "### Agent and tool jobs" in README.md, one command per line."""
    text = (ROOT / "README.md").read_text()
    section = text.split("### Agent and tool jobs", 1)[1]
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    assert block, "README.md has a sh block under ### Agent and tool jobs"
    return [line.split("#", 1)[0].strip() for line in block.group(1).splitlines() if line.split("#", 1)[0].strip()]


@pytest.fixture
def local_redis() -> Iterator[str]:
    with redis_server() as server:
        yield server.url


def test_the_readme_agent_example_as_written(pg_dsn: str, local_redis: str, tmp_path: Path) -> None:
    """The tool server and ``judgequeue local`` keep running (two terminals); the application runs
    to its end and says each order got its answer and each effect was applied once."""
    server_cmd, local_cmd, app_cmd = readme_agent_commands()
    assert server_cmd.startswith(".venv/bin/python examples/agent/tool_server.py")
    assert local_cmd.startswith(".venv/bin/judgequeue local -f examples/agent/judgequeue.yaml")
    env = clean_env(JUDGEQUEUE_POSTGRES_DSN=pg_dsn, JUDGEQUEUE_REDIS_URL=local_redis)
    background = []
    try:
        for command, name in ((server_cmd, "tool"), (local_cmd, "local")):
            with (tmp_path / f"{name}.log").open("wb") as log:
                background.append(subprocess.Popen(
                    ["bash", "-c", f"exec {command}"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                ))  # fmt: skip
        wait_for(lambda: "listening on" in (tmp_path / "tool.log").read_text(), 20, "the tool server to listen")
        wait_for(lambda: "Ctrl-C stops" in (tmp_path / "local.log").read_text(), 60, "judgequeue local to start")
        result = subprocess.run(["bash", "-c", app_cmd], cwd=ROOT, env=env, capture_output=True, text=True,
                                timeout=180)  # fmt: skip
        assert result.returncode == 0, result.stdout + result.stderr + (tmp_path / "local.log").read_text()
        lines = result.stdout.splitlines()
        assert lines[0] == "placed 5 orders, each with its job in the same transaction"
        assert sum(" ACCEPTED after " in line for line in lines) == 5
        assert lines[-1].endswith("5 effects applied for 5 keys (at most once per key: True)")
    finally:
        for process in reversed(background):
            process.send_signal(signal.SIGINT)  # Ctrl-C in each terminal
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
    assert background[1].returncode == 0, (tmp_path / "local.log").read_text()
    assert "all roles stopped cleanly" in (tmp_path / "local.log").read_text()
