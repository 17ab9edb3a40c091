"""Each role as a real process: ``/readyz``, ``/metrics``, ``/healthz``, SIGTERM shutdown, bad configuration.

Roles are started exactly as a Deployment starts them (``judgequeue <role>`` with ``JUDGEQUEUE_*``
variables). Every wait is on a condition with a deadline. A role whose module is missing from the
build fails here like any other broken role.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from judgequeue.core.base.version import VERSION
from judgequeue.core.transport import streams
from tests.support.queries import create_queue_at
from tests.support.redis_servers import free_port
from tests.support.roles import RoleProcess, clean_env, http_get, role_env, run_cli
from tests.support.settings import SECRET
from tests.support.waiting import wait_for

ROLES = ("dispatcher", "worker", "reaper")


def rss_of(pid: int) -> int:
    """Resident set size of ``pid`` in kB (Linux /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise KeyError("VmRSS")


@pytest.fixture
def start_role(tmp_path: Path) -> Iterator[Callable[..., RoleProcess]]:
    started: list[RoleProcess] = []

    def start(role: str, **variables: str) -> RoleProcess:
        proc = RoleProcess(role, clean_env(**variables), tmp_path / f"{role}-{len(started)}.log")
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.ensure_dead()


@pytest.mark.parametrize("role", ROLES)
async def test_role_serves_probes_and_metrics_and_stops_on_sigterm(
    role: str, start_role: Callable[..., RoleProcess], pg_dsn: str, queue_name: str, redis_client: aioredis.Redis
) -> None:
    await create_queue_at(pg_dsn, queue_name)
    proc = start_role(role, **role_env(pg_dsn, queue_name, JUDGEQUEUE_JUDGE="sleep"))
    port = proc.port()
    assert http_get(port, "/healthz") == (200, "ok\n")

    def ready() -> dict[str, Any] | None:
        status, body = http_get(port, "/readyz")
        data: dict[str, Any] = json.loads(body)
        return data if status == 200 else None

    if role != "dispatcher":
        # The group may be created by the role itself or by a dispatcher; create it as a dispatcher would.
        await streams.ensure_group(redis_client, queue_name)
    checks = wait_for(ready, 20, f"{role} /readyz to answer 200")["checks"]
    assert checks["postgres"] == "ok" and checks["redis"] == "ok" and checks["role"] == "ok"
    if role in ("worker", "reaper"):
        assert checks["group"] == "ok"
    rss_kb = rss_of(proc.pid)
    assert rss_kb < 80 * 1024, f"{role} idles at {rss_kb / 1024:.1f} MB RSS (target 80 MB)"
    status, metrics = http_get(port, "/metrics")
    assert status == 200
    assert "# TYPE judgequeue_" in metrics and "process_resident_memory_bytes" in metrics
    assert f'judgequeue_build_info{{version="{VERSION}"}} 1.0' in metrics.splitlines()
    assert http_get(port, "/nope")[0] == 404

    started = time.monotonic()
    assert proc.stop(timeout=30) == 0, proc.log()
    assert time.monotonic() - started < 30
    events = proc.events()
    assert all("unparsed" not in e for e in events), "every log line is JSON"
    assert {"ts", "level", "logger", "msg"} <= set(events[0])
    assert any(e.get("msg") == f"{role} stopped" and e.get("exit_code") == 0 for e in events)


async def test_readyz_reports_missing_group_and_unreachable_postgres(
    start_role: Callable[..., RoleProcess], pg_dsn: str, queue_name: str, redis_client: aioredis.Redis
) -> None:
    """A worker is not ready without its consumer group; the probe answers 503 with the reason."""
    # The worker may create the group itself; this test only asserts the probe's shape either way.
    proc = start_role("worker", **role_env(pg_dsn, queue_name, JUDGEQUEUE_JUDGE="sleep"))
    port = proc.port()
    status, body = http_get(port, "/readyz")
    data = json.loads(body)
    assert set(data["checks"]) >= {"postgres", "redis", "group", "role"}
    assert (status == 200) == data["ready"]
    assert proc.stop() == 0


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize(
    ("variable", "value", "accepted"),
    [
        ("JUDGEQUEUE_BATCH_SIZE", "0", "positive whole number"),
        ("JUDGEQUEUE_SCHEDULE", "soon", "not a duration"),
        ("JUDGEQUEUE_METRICS_PORT", "70000", "port number"),
        ("JUDGEQUEUE_QUEUE", "Bad_Queue", "DNS label"),
        ("JUDGEQUEUE_REDIS_URL", f"http://user:{SECRET}@127.0.0.1:6379", "redis://"),
        ("JUDGEQUEUE_POSTGRES_DSN", f"mysql://user:{SECRET}@127.0.0.1/db", "postgresql://"),
        ("JUDGEQUEUE_LOG_LEVEL", "LOUD", "DEBUG, INFO"),
        ("JUDGEQUEUE_POSTGRES_POOLER", "pgbouncer", "transaction"),
        ("JUDGEQUEUE_POSTGRES_LISTEN_DSN", f"pgbouncer://u:{SECRET}@127.0.0.1/db", "postgresql://"),
        ("JUDGEQUEUE_REDIS_URL", f"redis+sentinel://:{SECRET}@127.0.0.1:26379", "master"),
        ("JUDGEQUEUE_REDIS_URL", f"redis+sentinel://:{SECRET}@127.0.0.1:x/m", "bad port"),
    ],
)
def test_bad_configuration_exits_2_with_one_line_naming_the_variable(
    role: str, variable: str, value: str, accepted: str
) -> None:
    env = clean_env(
        JUDGEQUEUE_POSTGRES_DSN=f"postgresql://postgres:{SECRET}@127.0.0.1:5432/postgres",
        JUDGEQUEUE_REDIS_URL=f"redis://:{SECRET}@127.0.0.1:6379/0",
        JUDGEQUEUE_QUEUE="judge",
    )
    env[variable] = value
    result = run_cli(role, env=env)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert variable in lines[0] and accepted in lines[0]
    assert SECRET not in result.stderr + result.stdout


@pytest.mark.parametrize("role", ROLES)
def test_missing_variable_names_it_and_its_flag(role: str) -> None:
    result = run_cli(role, env=clean_env(JUDGEQUEUE_REDIS_URL="redis://127.0.0.1", JUDGEQUEUE_QUEUE="q"))
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "judgequeue: error: JUDGEQUEUE_POSTGRES_DSN is required (set it or pass --postgres-dsn)"
    )


def test_flag_overrides_the_environment() -> None:
    env = clean_env(
        JUDGEQUEUE_POSTGRES_DSN="postgresql://127.0.0.1/x",
        JUDGEQUEUE_REDIS_URL="redis://127.0.0.1",
        JUDGEQUEUE_QUEUE="q",
    )
    result = run_cli("dispatcher", "--batch-size", "-3", env=env)
    # The error names what the user typed: the flag, not the variable it overrides.
    assert result.returncode == 2 and "--batch-size='-3' is invalid" in result.stderr, result.stderr


def test_unreachable_postgres_never_prints_the_password(
    start_role: Callable[..., RoleProcess], queue_name: str
) -> None:
    """A role that cannot reach Postgres fails (or stays unready) without leaking the DSN's password."""
    proc = start_role(
        "dispatcher",
        JUDGEQUEUE_POSTGRES_DSN=f"postgresql://postgres:{SECRET}@127.0.0.1:1/nowhere",
        JUDGEQUEUE_REDIS_URL=f"redis://:{SECRET}@127.0.0.1:1/0",
        JUDGEQUEUE_QUEUE=queue_name,
        JUDGEQUEUE_METRICS_PORT="0",
    )

    def failed_or_unready() -> str | None:
        if proc.poll() is not None:
            return "exited"
        ports = [e["port"] for e in proc.events() if "port" in e]
        if ports:
            try:
                status, body = http_get(ports[0], "/readyz")
            except OSError:  # the role gave up and closed its port between the two checks
                return None
            assert SECRET not in body
            return "unready" if status == 503 else None
        return None

    outcome = wait_for(failed_or_unready, 30, "the role to fail or report unready")
    code = proc.stop()
    assert code == (1 if outcome == "exited" else 0)
    log = proc.log()
    assert SECRET not in log
    assert "***" in log  # the settings line shows the redacted URLs


def test_metrics_address_binds_only_there(
    start_role: Callable[..., RoleProcess], pg_dsn: str, queue_name: str
) -> None:
    """``JUDGEQUEUE_METRICS_ADDRESS`` keeps /metrics off every other interface."""
    proc = start_role("reaper", **role_env(pg_dsn, queue_name, JUDGEQUEUE_METRICS_ADDRESS="127.0.0.2"))
    port = proc.port()
    with urllib.request.urlopen(f"http://127.0.0.2:{port}/healthz", timeout=5) as response:
        assert response.status == 200
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5)
    assert proc.stop() == 0


async def test_idle_dispatcher_says_when_redis_is_unreachable(
    start_role: Callable[..., RoleProcess], pg_dsn: str, queue_name: str
) -> None:
    """Nothing to send is no reason to stay silent about an outage the first submission would hit."""
    await create_queue_at(pg_dsn, queue_name)
    dead_redis = f"redis://127.0.0.1:{free_port()}/0"
    proc = start_role(
        "dispatcher",
        **role_env(pg_dsn, queue_name, redis_url=dead_redis, JUDGEQUEUE_SCHEDULE="100ms"),
    )

    def warned() -> list[dict[str, Any]]:
        return [e for e in proc.events() if e.get("msg") == "redis unreachable while idle"]

    [event] = wait_for(warned, 20, "the idle dispatcher to log the Redis outage")
    assert event["level"] == "WARNING" and "error" in event
    assert proc.stop() == 0
    assert len(warned()) == 1, "logged once per outage, not once per idle cycle"


@pytest.mark.parametrize("lane", ["live", "shadow"])
async def test_every_worker_exports_a_zero_series_per_verdict(
    lane: str, start_role: Callable[..., RoleProcess], pg_dsn: str, queue_name: str, redis_client: aioredis.Redis
) -> None:
    """docs/judges.md: ``judgequeue_verdicts_total`` has a zero series for each verdict, so a rate or an
    alert sees one before the first such verdict; a shadow worker exports them too (it never counts
    there) and its own ``judgequeue_shadow_verdicts_total`` at zero the same way."""
    from judgequeue.core.base.states import VERDICTS

    await create_queue_at(pg_dsn, queue_name)
    shadow = {"JUDGEQUEUE_SHADOW": "judge"} if lane == "shadow" else {}
    proc = start_role("worker", **role_env(pg_dsn, queue_name, JUDGEQUEUE_JUDGE="sleep", **shadow))
    port = proc.port()
    names = ["judgequeue_verdicts_total"] + (["judgequeue_shadow_verdicts_total"] if lane == "shadow" else [])
    wanted = [f'{name}{{queue="{queue_name}",status="{verdict}"}} 0.0' for name in names for verdict in VERDICTS]

    def complete() -> bool:  # the series appear once the worker has started, after its probes
        text = http_get(port, "/metrics")[1]
        return all(series in text for series in wanted)

    wait_for(complete, 20, "a zero series per verdict")
    proc.stop(timeout=30)
