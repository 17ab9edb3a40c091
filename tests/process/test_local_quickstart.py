"""``judgequeue local`` end to end: the README quickstart as written, a demo run, and Ctrl-C.

The quickstart test reads the command block under "## Quickstart" in README.md and runs it from
the repository root. ``scripts/install`` is the step that made the virtualenv these tests run in, so
it is checked to be the first line rather than re-run; every other line runs verbatim through bash,
pointed at this test's own database and a redis-server of its own through the environment (the
quickstart's queue name is fixed, so a shared Redis would be shared with any other suite running).
"""

from __future__ import annotations

import asyncio
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest
import yaml

from judgequeue.core.config import intake_for_fleet
from judgequeue.core.local import GATE_RECHECK
from judgequeue.core.store.migrate import migrate
from judgequeue.core.store.queues import create_queue
from tests.support.redis_servers import redis_server
from tests.support.roles import JUDGEQUEUE, RoleProcess, clean_env
from tests.support.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def local_redis() -> Iterator[str]:
    """A redis-server of this test's own: ``judgequeue local`` and the quickstart name their queues."""
    with redis_server() as server:
        yield server.url


def quickstart_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Quickstart", 1)[1]
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    assert block, "README.md has a sh block under ## Quickstart"
    return [line for line in block.group(1).splitlines() if line.strip()]


def test_readme_quickstart_as_written_shows_verdicts(pg_dsn: str, local_redis: str) -> None:
    commands = quickstart_commands()
    assert commands[0] == "scripts/install"
    env = clean_env(JUDGEQUEUE_POSTGRES_DSN=pg_dsn, JUDGEQUEUE_REDIS_URL=local_redis)
    for command in commands[1:]:
        result = subprocess.run(["bash", "-c", command], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stdout + result.stderr
    table, _, per_test = result.stdout.partition("\n\n")
    rows = [line.split() for line in table.splitlines()[1:]]
    verdicts = {row[0]: (row[2], row[3]) for row in rows}
    assert verdicts["accepted.py"] == ("ACCEPTED", "ACCEPTED")
    assert verdicts["wrong_answer.py"] == ("WRONG_ANSWER", "WRONG_ANSWER")
    assert verdicts["time_limit.py"] == ("TIME_LIMIT", "TIME_LIMIT")
    assert verdicts["runtime_error.py"] == ("RUNTIME_ERROR", "RUNTIME_ERROR")
    # The demo problem is a package with two subtasks and a float checker; each program's tests show.
    assert "problem demo-mean version 1: 4 tests uploaded" in result.stderr
    # The example's intake is auto, decided on the two workers local runs (its minReplicas).
    chosen = intake_for_fleet("auto", 2, bound="workers")
    assert f"intake {chosen.intake} ({chosen.reason})" in result.stderr
    assert "accepted.py (id 1): ACCEPTED, score 100/100 (demo-mean v1)" in per_test
    assert "wrong_answer.py (id 2): WRONG_ANSWER on test 3, score 40/100 (demo-mean v1)" in per_test
    assert "group small: 40/40 (tests 1, 2)" in per_test and "group large: 0/60 (tests 3, 4)" in per_test
    accepted = per_test.split("\n\n")[0].splitlines()
    assert accepted[1].split() == ["test", "verdict", "cpu", "ms", "wall", "ms", "mem", "KiB", "exit", "message"]
    assert [line.split()[:2] for line in accepted[2:6]] == [[str(t), "ACCEPTED"] for t in range(1, 5)]
    assert "all roles stopped cleanly" in result.stderr


def sleep_manifest(tmp_path: Path, queue: str) -> Path:
    """The example manifest with the test judge (the sleep judge accepts every payload)."""
    text = (ROOT / "examples" / "judgequeue.yaml").read_text()
    text = text.replace("judge: program", "judge: sleep").replace("queue: demo", f"queue: {queue}")
    path = tmp_path / "judgequeue.yaml"
    path.write_text(text)
    demo = tmp_path / "demo"
    demo.mkdir()
    (demo / "one.py").write_text("print(1)\n")
    (demo / "two.py").write_text("print(2)\n")
    (demo / "demo.yaml").write_text(
        "problem: {tests: [{input: '', output: '1'}], limits: {time: 1}}\n"
        "programs:\n  - {file: one.py, expect: ACCEPTED}\n  - {file: two.py, expect: ACCEPTED}\n"
    )
    return path


def test_local_demo_runs_every_role_and_prints_verdicts(
    pg_dsn: str, local_redis: str, tmp_path: Path, queue_name: str
) -> None:
    manifest = sleep_manifest(tmp_path, queue_name)
    env = clean_env(JUDGEQUEUE_POSTGRES_DSN=pg_dsn, JUDGEQUEUE_REDIS_URL=local_redis)
    result = subprocess.run(
        [JUDGEQUEUE, "local", "-f", str(manifest), "--demo", "--json", "--log-dir", str(tmp_path / "logs")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    import json

    data = json.loads(result.stdout)
    assert data["queue"] == queue_name
    chosen = intake_for_fleet("auto", 2, bound="workers")  # the example's auto, on its two workers
    assert data["intake"] == {"intake": chosen.intake, "reason": chosen.reason}
    assert [(r["program"], r["verdict"], r["ok"]) for r in data["results"]] == [
        ("one.py", "ACCEPTED", True),
        ("two.py", "ACCEPTED", True),
    ]
    logs = sorted(p.name for p in (tmp_path / "logs").iterdir())
    assert logs == ["dispatcher-0.log", "reaper-0.log", "worker-0.log", "worker-1.log"]


def test_local_ctrl_c_stops_every_role_gracefully(
    pg_dsn: str, local_redis: str, tmp_path: Path, queue_name: str
) -> None:
    manifest = sleep_manifest(tmp_path, queue_name)
    env = clean_env(JUDGEQUEUE_POSTGRES_DSN=pg_dsn, JUDGEQUEUE_REDIS_URL=local_redis)
    out = tmp_path / "local.out"
    local = RoleProcess("local", env, out, "-f", str(manifest), "--workers", "1")
    try:
        wait_for(lambda: "Ctrl-C stops" in out.read_text(), 30, "local to start its roles")
        submitted = subprocess.run(
            [
                JUDGEQUEUE,
                "submit",
                "--payload",
                '{"seconds": 0.1, "status": "WRONG_ANSWER"}',
                "--wait",
                "--timeout",
                "60s",
            ],
            env={**env, "JUDGEQUEUE_QUEUE": queue_name},
            capture_output=True,
            text=True,
            timeout=90,
        )
        assert submitted.returncode == 0 and submitted.stdout.split()[1] == "WRONG_ANSWER", submitted.stderr
        wait_for(lambda: "WRONG_ANSWER=1" in out.read_text(), 30, "the progress line to show the verdict")
        started = time.monotonic()
        local.send_signal(signal.SIGINT)
        assert local.wait(timeout=60) == 0, out.read_text()
        assert time.monotonic() - started < 60
        assert "all roles stopped cleanly" in out.read_text()
    finally:
        local.ensure_dead()


def test_local_bad_manifest_is_one_line_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "apiVersion: judgequeue.dev/v1alpha1\nkind: JudgeQueue\nmetadata: {name: x}\n"
        "spec: {image: judgequeue:test, postgres: {secretKeyRef: {name: db}}, redis: {secretKeyRef: {name: rd}},\n"
        "       dispatcher: {batchSize: 0}}\n"
    )
    result = subprocess.run(
        [JUDGEQUEUE, "local", "-f", str(bad)], env=clean_env(), capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "spec.dispatcher.batchSize: must be between 1 and 10000, got 0" in lines[0]


def _compared(dsn: str, queue: str, first_id: int, matched: int, mismatched: int) -> None:
    """Shadow judging's figures as a shadow worker and a legacy judge leave them: a shadow verdict and
    a legacy verdict per submission, ``matched`` of them the same."""
    async def write() -> None:
        conn = await asyncpg.connect(dsn)
        try:
            for i in range(matched + mismatched):
                legacy = "ACCEPTED" if i < matched else "WRONG_ANSWER"
                await conn.execute("INSERT INTO judgequeue.shadow_verdicts (submission_id, queue, generation, status)"
                                   " VALUES ($1, $2, 1, 'ACCEPTED')", first_id + i, queue)
                await conn.execute("INSERT INTO judgequeue.legacy_verdicts (submission_id, queue, status)"
                                   " VALUES ($1, $2, $3)", first_id + i, queue, legacy)
        finally:
            await conn.close()

    asyncio.run(write())


def _mode(dsn: str, queue: str) -> str:
    async def read() -> str:
        conn = await asyncpg.connect(dsn)
        try:
            return str(await conn.fetchval("SELECT mode FROM judgequeue.queues WHERE name = $1", queue))
        finally:
            await conn.close()

    return asyncio.run(read())


def test_local_holds_a_flip_to_live_back_until_the_gate_is_met(
    pg_dsn: str, local_redis: str, tmp_path: Path, queue_name: str
) -> None:
    """As the operator does: a manifest asking live for a queue in shadow mode whose shadow judging
    agrees 85.7% (6 of 7) with a 90% gate stays in shadow, saying why; once the figures meet the gate
    (9 of 10) the flip is written on the next look, without a restart."""
    async def shadow_queue() -> None:
        conn = await asyncpg.connect(pg_dsn)
        try:
            await migrate(conn)
            await create_queue(conn, queue_name, mode="shadow")
        finally:
            await conn.close()

    asyncio.run(shadow_queue())
    _compared(pg_dsn, queue_name, 1, matched=6, mismatched=1)
    doc = yaml.safe_load(sleep_manifest(tmp_path, queue_name).read_text())
    doc["spec"]["cutover"] = {"mode": "live", "gate": {"minAgreement": "90%", "minSamples": 5}}
    manifest = tmp_path / "gated.yaml"
    manifest.write_text(yaml.safe_dump(doc))
    env = clean_env(JUDGEQUEUE_POSTGRES_DSN=pg_dsn, JUDGEQUEUE_REDIS_URL=local_redis)
    out = tmp_path / "local.out"
    local = RoleProcess("local", env, out, "-f", str(manifest), "--workers", "1")
    try:
        wait_for(lambda: "Ctrl-C stops" in out.read_text(), 30, "local to start its roles")
        text = out.read_text()
        assert "held back by spec.cutover.gate" in text and "85.71% agree, 90% needed" in text, text
        assert f"queue {queue_name}: mode=shadow" in text, text
        assert _mode(pg_dsn, queue_name) == "shadow"
        time.sleep(GATE_RECHECK + 1)
        assert _mode(pg_dsn, queue_name) == "shadow"  # looked again: still not met
        _compared(pg_dsn, queue_name, 100, matched=3, mismatched=0)
        wait_for(lambda: _mode(pg_dsn, queue_name) == "live", GATE_RECHECK + 10, "the flip to live")
        wait_for(lambda: "the gate is met, flipped to live" in out.read_text(), 10, "local to say so")
        local.send_signal(signal.SIGINT)
        assert local.wait(timeout=60) == 0, out.read_text()
    finally:
        local.ensure_dead()


def test_local_demo_with_each_roles_own_credentials(
    pg_dsn: str, local_redis: str, tmp_path: Path, queue_name: str
) -> None:
    """The split ``spec.credentials`` makes on Kubernetes, run by ``local``: each role on a login user
    and ACL user of its own (JUDGEQUEUE_<ROLE>_POSTGRES_DSN/_REDIS_URL), the demo judged, and no role
    warning of broad credentials, as every one does on the shared superuser URL."""
    import json
    import uuid

    from tests.support.credentials import drop_component_users, make_component_users, with_user
    from tests.support.roles import json_events

    manifest = sleep_manifest(tmp_path, queue_name)
    # the database the demo migrates first, so the group roles exist before the users are made
    asyncio.run(_migrated(pg_dsn))
    users = asyncio.run(make_component_users(pg_dsn, local_redis, queue_name, ("dispatcher", "worker", "reaper"),
                                             prefix=f"jql_{uuid.uuid4().hex[:8]}", password="local-split"))
    try:
        env = clean_env(JUDGEQUEUE_POSTGRES_DSN=pg_dsn, JUDGEQUEUE_REDIS_URL=local_redis)
        for role, made in users.items():
            env[f"JUDGEQUEUE_{role.upper()}_POSTGRES_DSN"] = with_user(pg_dsn, made.user, "local-split")
            env[f"JUDGEQUEUE_{role.upper()}_REDIS_URL"] = with_user(local_redis, made.user, "local-split")
        logs = tmp_path / "logs"
        result = subprocess.run([JUDGEQUEUE, "local", "-f", str(manifest), "--demo", "--json", "--log-dir", str(logs)],
                                env=env, capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stdout + result.stderr
        data = json.loads(result.stdout)
        assert [(r["program"], r["verdict"]) for r in data["results"]] == [("one.py", "ACCEPTED"),
                                                                           ("two.py", "ACCEPTED")]
        assert "each component connects with its own" in result.stderr, result.stderr
        for log in sorted(logs.iterdir()):  # dispatcher-0.log, worker-1.log, ...
            role = log.name.split("-")[0]
            starting = [e for e in json_events(log) if e.get("msg") == f"{role} starting"]
            assert starting, log.name
            connections = json.dumps(starting[0]["settings"])
            assert users[role].user in connections, (log.name, connections)
            others = [u.user for r, u in users.items() if r != role]
            assert not [u for u in others if u in connections], (log.name, connections)
            # each role runs only statements its group role may: a step refused is a gap in the grants
            refused = [e for e in json_events(log) if "permission denied" in json.dumps(e)]
            assert not refused, (log.name, refused[:3])
    finally:
        asyncio.run(drop_component_users(pg_dsn, local_redis, users.values()))


async def _migrated(dsn: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await migrate(conn)
    finally:
        await conn.close()
