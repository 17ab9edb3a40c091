"""Pure parts of ``judgequeue local``: manifest validation and rendering, the child plan, the display."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from judgequeue.core.base.errors import Failure
from judgequeue.core.config import DIRECT_INTAKE_MAX_WORKERS, IntakeChoice, load_settings
from judgequeue.core.local import (
    LocalOptions,
    check_endpoints,
    check_webhooks,
    local_intake,
    plan_children,
    role_env,
)
from judgequeue.core.local.demo import DemoProgram, load_demo, verdict_table
from judgequeue.core.local.display import Progress, progress_line
from judgequeue.core.manifest import ManifestError, load_manifest, parse_manifest
from judgequeue.core.spec import ROLES
from judgequeue.core.status import Figures
from judgequeue.core.store.outbox import OUTBOX_STATES

ROOT = Path(__file__).resolve().parents[2]


REQUIRED: dict[str, Any] = {
    "image": "judgequeue:test",
    "postgres": {"secretKeyRef": {"name": "db"}},
    "redis": {"secretKeyRef": {"name": "rd"}},
}


def manifest(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "judgequeue.dev/v1alpha1",
        "kind": "JudgeQueue",
        "metadata": {"name": "judge"},
        "spec": {**REQUIRED, **spec},
    }


def test_each_role_gets_the_settings_the_manifest_writes_for_it() -> None:
    m = parse_manifest(
        manifest(
            queue="judge",
            logLevel="DEBUG",
            dispatcher={"batchSize": 50, "schedule": "250ms", "backoff": {"base": "2s", "max": "1m"}},
            worker={"concurrency": 8, "judge": "sleep", "gracePeriod": "5s"},
            reaper={"leaseTtl": "20s", "interval": "2s", "visibilityTimeout": "45s", "retention": "1d"},
        )
    )
    common = {"JUDGEQUEUE_QUEUE": "judge", "JUDGEQUEUE_LOG_LEVEL": "DEBUG"}
    assert m.env("dispatcher") == {
        **common,
        "JUDGEQUEUE_BATCH_SIZE": "50",
        "JUDGEQUEUE_SCHEDULE": "250ms",
        "JUDGEQUEUE_BACKOFF_BASE": "2s",
        "JUDGEQUEUE_BACKOFF_MAX": "1m",
    }
    assert m.env("worker") == {
        **common,
        "JUDGEQUEUE_SCHEDULE": "250ms",  # direct intake polls on it
        "JUDGEQUEUE_CONCURRENCY": "8",
        "JUDGEQUEUE_JUDGE": "sleep",
        "JUDGEQUEUE_GRACE_PERIOD": "5s",
        "JUDGEQUEUE_LEASE_TTL": "20s",
    }
    assert m.env("reaper") == {
        **common,
        "JUDGEQUEUE_SCHEDULE": "250ms",
        "JUDGEQUEUE_REAPER_INTERVAL": "2s",
        "JUDGEQUEUE_VISIBILITY_TIMEOUT": "45s",
        "JUDGEQUEUE_RETENTION": "1d",
    }
    settings = load_settings(
        {**m.env("worker"), "JUDGEQUEUE_POSTGRES_DSN": "postgresql://h/db", "JUDGEQUEUE_REDIS_URL": "redis://h"}
    )
    assert settings.worker.lease_ttl == 20 and settings.worker.concurrency == 8


def test_bad_values_name_the_manifest_field() -> None:
    with pytest.raises(ManifestError, match=r"spec\.dispatcher\.batchSize: must be between 1 and 10000, got 0"):
        parse_manifest(manifest(dispatcher={"batchSize": 0}))
    with pytest.raises(ManifestError, match=r"spec\.reaper\.interval: 'soon' is not a duration"):
        parse_manifest(manifest(reaper={"interval": "soon"}))
    with pytest.raises(ManifestError, match=r"spec\.image: is required"):
        parse_manifest({**manifest(), "spec": {k: v for k, v in REQUIRED.items() if k != "image"}})
    with pytest.raises(ManifestError, match=r"spec\.worker\.concurency: unknown field"):
        parse_manifest(manifest(worker={"concurency": 3}))
    with pytest.raises(ManifestError, match=r"spec\.queue: .*DNS label"):
        parse_manifest(manifest(queue="Not_A_Label"))
    with pytest.raises(ManifestError, match=r"spec\.worker\.minReplicas: worker\.minReplicas must not exceed"):
        parse_manifest(manifest(worker={"minReplicas": 3, "maxReplicas": 2}))
    with pytest.raises(ManifestError, match=r"spec\.cutover\.mode"):
        parse_manifest(manifest(cutover={"mode": "dark"}))
    with pytest.raises(ManifestError, match=r"spec\.cutover\.watermark: .*with a zone"):
        parse_manifest(manifest(cutover={"watermark": "2025-01-01T00:00:00"}))
    with pytest.raises(ManifestError, match=r"apiVersion"):
        parse_manifest({**manifest(), "apiVersion": "v1"})


def test_defaults_queue_from_name_and_cutover() -> None:
    m = parse_manifest(manifest(cutover={"mode": "shadow", "watermark": "2025-01-31T12:00:00Z"}, paused=True))
    assert m.queue == "judge" and all(m.env(role)["JUDGEQUEUE_QUEUE"] == "judge" for role in ROLES)
    assert m.cutover.mode == "shadow" and m.cutover.paused
    assert m.cutover.watermark == datetime(2025, 1, 31, 12, tzinfo=UTC)
    assert (m.replicas.dispatcher, m.replicas.worker, m.replicas.reaper) == (1, 1, 1)


def test_example_manifest_and_demo_set_load(tmp_path: Path) -> None:
    m = load_manifest(ROOT / "examples" / "judgequeue.yaml")
    assert m.queue == "demo" and m.cutover.mode == "live" and not m.cutover.paused
    assert plan_children(m, None) == ["dispatcher", "worker", "worker", "reaper"]
    assert plan_children(m, 1) == ["dispatcher", "worker", "reaper"]
    programs, package = load_demo(ROOT / "examples" / "demo")
    assert package is not None and (package / "problem.yaml").is_file()
    expected = {p.expect for p in programs}
    assert {"ACCEPTED", "WRONG_ANSWER", "TIME_LIMIT", "RUNTIME_ERROR"} <= expected
    for program in programs:
        assert set(program.payload) == {"language", "source", "problem", "version"}
        assert program.payload["language"] == "python" and program.payload["problem"] == "demo-mean"
    bad = tmp_path / "bad.yaml"
    bad.write_text("apiVersion: [unclosed\n")
    with pytest.raises(ManifestError, match="not valid YAML"):
        load_manifest(bad)
    with pytest.raises(ManifestError, match="No such file"):
        load_manifest(tmp_path / "missing.yaml")


def test_role_env_layers_caller_env_manifest_then_connections() -> None:
    m = parse_manifest(manifest(worker={"concurrency": 3}))
    options = LocalOptions(manifest="x", postgres_dsn="postgresql://h/db", redis_url="redis://h/1")
    base = {"PATH": "/bin", "JUDGEQUEUE_CONCURRENCY": "9", "JUDGEQUEUE_LOG_LEVEL": "DEBUG"}
    env = role_env(base, m, "worker", options, port=9191)
    assert env["PATH"] == "/bin"
    assert env["JUDGEQUEUE_CONCURRENCY"] == "3"  # the manifest wins over the caller's environment
    assert env["JUDGEQUEUE_LOG_LEVEL"] == "DEBUG"  # the caller's value stays where the manifest is silent
    assert env["JUDGEQUEUE_POSTGRES_DSN"] == "postgresql://h/db" and env["JUDGEQUEUE_METRICS_PORT"] == "9191"


def test_live_progress_reaches_the_workers_only_from_the_manifest() -> None:
    """``spec.events.progress: true`` renders ``JUDGEQUEUE_PROGRESS=on`` for the workers (a shadow
    worker takes it too and ignores it: its verdicts are not events), for no other role."""
    options = LocalOptions(manifest="x", postgres_dsn="postgresql://h/db", redis_url="redis://h/1")
    on = parse_manifest(manifest(events={"progress": True}))
    assert role_env({}, on, "worker", options, port=0)["JUDGEQUEUE_PROGRESS"] == "on"
    assert load_settings(role_env({}, on, "worker", options, port=0)).worker.progress == "on"
    assert all("JUDGEQUEUE_PROGRESS" not in role_env({}, on, r, options, port=0) for r in ("dispatcher", "reaper"))
    off = parse_manifest(manifest())
    assert load_settings(role_env({}, off, "worker", options, port=0)).worker.progress == "off"
    with pytest.raises(ManifestError, match=r"spec\.events\.progress"):
        parse_manifest(manifest(events={"progress": "yes"}))


def test_http_call_endpoints_run_locally_and_secret_ones_need_the_callers() -> None:
    """An endpoint with a url runs as the manifest says; one whose URL is a Kubernetes Secret's is
    refused before anything starts, naming the way out, unless the caller gives its endpoints."""
    options = LocalOptions(manifest="x", postgres_dsn="postgresql://h/db", redis_url="redis://h/1")
    inline = parse_manifest(manifest(worker={"judge": "http-call", "endpoints": [
        {"name": "tool", "url": "http://127.0.0.1:1/x"}]}))  # fmt: skip
    check_endpoints(role_env({}, inline, "worker", options, port=0))
    secret = parse_manifest(manifest(worker={"judge": "http-call", "endpoints": [
        {"name": "tool", "secretKeyRef": {"name": "tools", "key": "url"}}]}))  # fmt: skip
    with pytest.raises(Failure, match="judgequeue local cannot read Kubernetes Secrets"):
        check_endpoints(role_env({}, secret, "worker", options, port=0))
    mine = '{"tool": {"url": "http://127.0.0.1:2/y"}}'
    env = role_env({"JUDGEQUEUE_CALL_ENDPOINTS": mine}, secret, "worker", options, port=0)
    assert env["JUDGEQUEUE_CALL_ENDPOINTS"] == mine
    check_endpoints(env)
    check_endpoints(role_env({}, parse_manifest(manifest()), "worker", options, port=0))  # no endpoints: nothing


def test_shadow_workers_run_locally_as_the_operator_runs_them() -> None:
    """``spec.worker.shadow`` in a shadow-mode manifest: that many ``judgequeue worker`` children with
    the workers' settings and JUDGEQUEUE_SHADOW=judge; none once the manifest says live."""
    options = LocalOptions(manifest="x", postgres_dsn="postgresql://h/db", redis_url="redis://h/1")
    shadow = parse_manifest(
        manifest(cutover={"mode": "shadow"}, worker={"concurrency": 3, "shadow": {"enabled": True, "replicas": 2}})
    )
    assert plan_children(shadow, None) == ["dispatcher", "worker", "reaper", "shadow-worker", "shadow-worker"]
    env = role_env({}, shadow, "shadow-worker", options, port=0)
    assert env["JUDGEQUEUE_SHADOW"] == "judge" and env["JUDGEQUEUE_CONCURRENCY"] == "3"
    assert "JUDGEQUEUE_SHADOW" not in role_env({}, shadow, "worker", options, port=0)
    live = parse_manifest(manifest(worker={"shadow": {"enabled": True, "replicas": 2}}))
    assert "shadow-worker" not in plan_children(live, None)


def test_verdict_table_and_progress_line() -> None:
    programs = [
        DemoProgram("accepted.py", "ACCEPTED", {}),
        DemoProgram("slow.py", "TIME_LIMIT", {}),
        DemoProgram("free.py", None, {}),
    ]
    rows = {
        1: {"status": "ACCEPTED", "verdict": {"status": "ACCEPTED"}},
        2: {"status": "WRONG_ANSWER", "verdict": None},
    }
    table = verdict_table(programs, [1, 2, 3], rows)
    assert [r["ok"] for r in table] == [True, False, True]
    assert table[0]["detail"] == {"status": "ACCEPTED"} and table[2]["verdict"] == "UNKNOWN"
    outbox: dict[str, int] = {**dict.fromkeys(OUTBOX_STATES, 0), "PENDING": 3}
    figures = Figures(queue="q", outbox=outbox, oldest_pending_age=1.0, lag=2, pel=1)
    line = progress_line(Progress(figures, {"ACCEPTED": 4, "JUDGING": 1}, 2.5), 3, 4)
    assert "backlog 6" in line and "judging 1" in line and "2.5 verdicts/s" in line
    assert "roles 3/4" in line and "ACCEPTED=4" in line


N = DIRECT_INTAKE_MAX_WORKERS
OPTIONS = LocalOptions(manifest="x", postgres_dsn="postgresql://h/db", redis_url="redis://h/1")


def _intakes(m: Any, base: dict[str, str], options: LocalOptions = OPTIONS) -> dict[str, str | None]:
    return {
        role: role_env(base, m, role, options, port=0).get("JUDGEQUEUE_INTAKE")
        for role in ("dispatcher", "worker", "shadow-worker", "reaper")
    }


def test_local_decides_auto_on_the_workers_it_runs() -> None:
    """``local`` runs a fixed count of workers (the floor, or --workers), so auto is decided on that, not
    on maxReplicas; workers and dispatchers get the same value."""
    m = parse_manifest(manifest(worker={"minReplicas": 2, "maxReplicas": N + 10}))
    assert local_intake({}, m, 2) == IntakeChoice("direct", f"auto: workers 2 <= {N}, direct")
    assert _intakes(m, {}) == {"dispatcher": "direct", "worker": "direct", "shadow-worker": "direct", "reaper": None}
    many = LocalOptions(manifest="x", postgres_dsn="postgresql://h/db", redis_url="redis://h/1", workers=N + 1)
    assert _intakes(m, {}, many) == {
        "dispatcher": "stream",
        "worker": "stream",
        "shadow-worker": "stream",
        "reaper": None,
    }
    written_auto = parse_manifest(manifest(worker={"minReplicas": N + 1, "maxReplicas": N + 1, "intake": "auto"}))
    assert local_intake({}, written_auto, N + 1).reason == f"auto: workers {N + 1} > {N}, stream"


def test_an_explicit_intake_is_kept_and_the_callers_fills_in_where_the_manifest_is_silent() -> None:
    explicit = parse_manifest(manifest(worker={"intake": "stream"}))
    assert _intakes(explicit, {"JUDGEQUEUE_INTAKE": "direct"})["worker"] == "stream"  # the manifest wins
    assert local_intake({}, explicit, 1) == IntakeChoice("stream", "stream: set in spec.worker.intake")
    silent = parse_manifest(manifest())
    assert _intakes(silent, {"JUDGEQUEUE_INTAKE": "stream"})["dispatcher"] == "stream"
    assert (
        local_intake({"JUDGEQUEUE_INTAKE": "stream"}, silent, 1).reason
        == "stream: JUDGEQUEUE_INTAKE from the environment"
    )


def test_webhooks_run_locally_only_with_the_callers() -> None:
    """The manifest's webhooks take their signing key from a Kubernetes Secret: ``local`` refuses them
    before anything starts, naming the way out, unless the caller gives its own JUDGEQUEUE_WEBHOOKS."""
    options = LocalOptions(manifest="x", postgres_dsn="postgresql://h/db", redis_url="redis://h/1")
    hooked = parse_manifest(manifest(events={"webhooks": [
        {"name": "board", "url": "http://127.0.0.1:1/x", "secretKeyRef": {"name": "hooks", "key": "k"}}]}))  # fmt: skip
    with pytest.raises(Failure, match=r"secretFile: cannot read .*judgequeue local cannot read Kubernetes Secrets"):
        check_webhooks(role_env({}, hooked, "reaper", options, port=0))
    mine = '{"board": {"url": "http://127.0.0.1:2/y", "secret": "s3"}}'
    env = role_env({"JUDGEQUEUE_WEBHOOKS": mine}, hooked, "reaper", options, port=0)
    assert env["JUDGEQUEUE_WEBHOOKS"] == mine
    check_webhooks(env)
    assert "JUDGEQUEUE_WEBHOOKS" not in role_env({}, hooked, "worker", options, port=0)
    with pytest.raises(Failure, match="exactly one of secret and secretFile"):
        check_webhooks({"JUDGEQUEUE_WEBHOOKS": '{"board": {"url": "http://127.0.0.1:2/y"}}'})
    check_webhooks(role_env({}, parse_manifest(manifest()), "reaper", options, port=0))  # no webhooks: nothing


def test_each_local_role_connects_with_its_own_credentials_when_given() -> None:
    """``JUDGEQUEUE_<COMPONENT>_POSTGRES_DSN``/``_REDIS_URL``: the split ``spec.credentials`` makes on
    Kubernetes; each child gets its own and never another component's, the shared URL otherwise."""
    from judgequeue.core.local import component_variables, shared_components

    m = parse_manifest(manifest(worker={"judge": "sleep"}))
    options = LocalOptions(manifest="x", postgres_dsn="postgresql://admin@h/db", redis_url="redis://admin@h/0")
    base = {"JUDGEQUEUE_WORKER_POSTGRES_DSN": "postgresql://w@h/db", "JUDGEQUEUE_WORKER_REDIS_URL": "redis://w@h/0",
            "JUDGEQUEUE_DISPATCHER_POSTGRES_DSN": "postgresql://d@h/db"}
    worker = role_env(base, m, "worker", options, port=0)
    assert (worker["JUDGEQUEUE_POSTGRES_DSN"], worker["JUDGEQUEUE_REDIS_URL"]) == ("postgresql://w@h/db",
                                                                                  "redis://w@h/0")
    dispatcher = role_env(base, m, "dispatcher", options, port=0)
    assert (dispatcher["JUDGEQUEUE_POSTGRES_DSN"], dispatcher["JUDGEQUEUE_REDIS_URL"]) == (
        "postgresql://d@h/db", "redis://admin@h/0")  # no own Redis URL given: the shared one
    reaper = role_env(base, m, "reaper", options, port=0)
    assert reaper["JUDGEQUEUE_POSTGRES_DSN"] == "postgresql://admin@h/db"
    for env in (worker, dispatcher, reaper):
        assert not set(component_variables()) & set(env), "another component's credentials leaked in"
        assert "postgresql://w@h/db" not in env.values() or env is worker
    assert shared_components(base) == ["reaper"]
    assert shared_components({}) == ["dispatcher", "worker", "reaper"]
