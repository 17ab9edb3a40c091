"""The operator (controllers.render) and ``judgequeue local`` (core.manifest) run the same JudgeQueue
spec; both render a role's variables through core.spec, and a role must get the same ones from both."""

from __future__ import annotations

from typing import Any

import pytest

from judgequeue.controllers import render
from judgequeue.core.config import DIRECT_INTAKE_MAX_WORKERS, load_settings
from judgequeue.core.manifest import parse_manifest
from judgequeue.core.spec import JudgeQueueSpec, Role, parse_spec

SPEC: dict[str, Any] = {
    "image": "judgequeue:test",
    "queue": "contract",
    "logLevel": "DEBUG",
    "postgres": {"secretKeyRef": {"name": "db", "key": "dsn"}, "pooler": "session"},
    "redis": {"secretKeyRef": {"name": "rd", "key": "url"}},
    "dispatcher": {"batchSize": 77, "schedule": "3s", "maxAttempts": 4, "backoff": {"base": "2s", "max": "90s"}},
    "worker": {"minReplicas": 1, "maxReplicas": 3, "concurrency": 6, "judge": "sleep", "gracePeriod": "12s",
               "intake": "direct", "offers": 8, "reservePercent": 25},
    "reaper": {
        "interval": "4s",
        "visibilityTimeout": "45s",
        "maxDeliveries": 7,
        "leaseTtl": "20s",
        "maxRetries": 0,
        "retention": "3d",
    },
    "events": {"progress": True, "progressInterval": "500ms"},
}
CONNECTIONS = {"JUDGEQUEUE_POSTGRES_DSN": "postgresql://h/db", "JUDGEQUEUE_REDIS_URL": "redis://h/0"}


def operator_env(role: Role) -> dict[str, str]:
    parsed = parse_spec(SPEC, name="judge")
    assert isinstance(parsed, JudgeQueueSpec), parsed
    # Connections are *_FILE paths of the Secrets' volume (connections, not settings): left out, as
    # are the pod-only variables (a refused judge leaves a pod unready; a local worker exits).
    pod_only = render.pod_only_settings(role)
    return {e["name"]: e["value"] for e in render.role_env(parsed, role)
            if not e["name"].endswith("_FILE") and e["name"] not in pod_only}


def local_env(role: Role) -> dict[str, str]:
    doc = {"apiVersion": "judgequeue.dev/v1alpha1", "kind": "JudgeQueue", "metadata": {"name": "judge"}, "spec": SPEC}
    return parse_manifest(doc).env(role)


@pytest.mark.parametrize("role", render.ROLES)
def test_operator_and_local_mode_give_a_role_the_same_settings(role: Role) -> None:
    op, local = operator_env(role), local_env(role)
    # The operator adds only the metrics port (connections come from Secrets, not values).
    assert {k: v for k, v in op.items() if k != "JUDGEQUEUE_METRICS_PORT"} == local
    settings = load_settings({**op, **CONNECTIONS})
    assert (settings.queue, settings.log_level, settings.postgres_pooler) == ("contract", "DEBUG", "session")


def test_each_spec_value_reaches_the_role_that_reads_it() -> None:
    dispatcher = load_settings({**operator_env("dispatcher"), **CONNECTIONS}).dispatcher
    worker = load_settings({**operator_env("worker"), **CONNECTIONS}).worker
    reaper = load_settings({**operator_env("reaper"), **CONNECTIONS})
    assert (dispatcher.batch_size, dispatcher.schedule, dispatcher.max_attempts) == (77, 3.0, 4)
    assert (dispatcher.backoff_base, dispatcher.backoff_max) == (2.0, 90.0)
    assert (worker.concurrency, worker.judge, worker.grace_period, worker.lease_ttl) == (6, "sleep", 12.0, 20.0)
    assert (worker.progress, worker.progress_interval) == ("on", 0.5)
    assert worker.reserve_percent == 25
    assert (reaper.reaper.interval, reaper.reaper.visibility_timeout, reaper.reaper.max_deliveries) == (4.0, 45.0, 7)
    assert (reaper.reaper.max_retries, reaper.reaper.retention) == (0, 3 * 86400.0)
    assert reaper.dispatcher.schedule == 3.0  # the reaper prunes dispatcher waiters by it
    # Direct intake changes what both do: the dispatcher holds live rows back for the workers.
    assert worker.intake == "direct"
    assert load_settings({**operator_env("dispatcher"), **CONNECTIONS}).worker.intake == "direct"
    assert "JUDGEQUEUE_INTAKE" not in operator_env("reaper")


def test_pooler_goes_to_every_role_and_the_listen_dsn_to_listeners_only() -> None:
    """A direct LISTEN DSN is a Secret reference rendered only where it is read (the dispatcher, and
    the worker for direct intake), so adding one rolls no reaper; the pooler reaches every role,
    since each connects through it."""
    spec = {**SPEC, "postgres": {"secretKeyRef": {"name": "db"}, "pooler": "transaction",
                                 "listen": {"secretKeyRef": {"name": "direct", "key": "listen-dsn"}}}}
    parsed = parse_spec(spec, name="judge")
    assert isinstance(parsed, JudgeQueueSpec), parsed
    for role in render.ROLES:
        env = {e["name"]: e for e in render.role_env(parsed, role)}
        assert env["JUDGEQUEUE_POSTGRES_POOLER"]["value"] == "transaction"
        assert "JUDGEQUEUE_POSTGRES_DSN" not in env  # a file of the Secret, never inline or in env
        assert env["JUDGEQUEUE_POSTGRES_DSN_FILE"]["value"] == "/var/run/secrets/judgequeue/postgres-dsn"
        listen = env.get("JUDGEQUEUE_POSTGRES_LISTEN_DSN_FILE")
        sources = render.credentials_volume(parsed, role)["projected"]["sources"]
        if role in ("dispatcher", "worker"):
            assert listen == {"name": "JUDGEQUEUE_POSTGRES_LISTEN_DSN_FILE",
                              "value": "/var/run/secrets/judgequeue/postgres-listen-dsn"}
            assert {"secret": {"name": "direct", "items": [{"key": "listen-dsn", "path": "postgres-listen-dsn"}]}} \
                in sources
        else:
            assert listen is None, role
            assert all(s["secret"]["name"] != "direct" for s in sources), role
    without = parse_spec(SPEC, name="judge")
    assert isinstance(without, JudgeQueueSpec)
    assert "JUDGEQUEUE_POSTGRES_LISTEN_DSN_FILE" not in {e["name"] for e in render.role_env(without, "dispatcher")}


@pytest.mark.parametrize(("postgres", "error"), [
    ({"pooler": "pgbouncer"}, "spec.postgres.pooler: must be one of none, session, transaction, got 'pgbouncer'"),
    ({"listen": {"secretKeyRef": {"key": "dsn"}}}, "spec.postgres.listen.secretKeyRef.name: is required"),
    ({"listen": {"secretKeyRef": {"name": "Bad_Name"}}},
     "spec.postgres.listen.secretKeyRef.name: 'Bad_Name' is not a valid Secret name"),
])
def test_bad_connection_options_are_named(postgres: dict[str, Any], error: str) -> None:
    spec = {**SPEC, "postgres": {"secretKeyRef": {"name": "db"}, **postgres}}
    assert parse_spec(spec, name="judge") == [error]


def test_bad_intake_is_one_error_naming_the_field() -> None:
    """What the operator reports in status (it never crash-loops on it), and what local mode prints."""
    spec = {**SPEC, "worker": {**SPEC["worker"], "intake": "fast"}}
    assert parse_spec(spec, name="judge") == ["spec.worker.intake: must be one of auto, stream, direct, got 'fast'"]


def test_bad_offers_is_one_error_naming_the_field() -> None:
    spec = {**SPEC, "worker": {**SPEC["worker"], "offers": -3}}
    errors = parse_spec(spec, name="judge")
    assert isinstance(errors, list) and len(errors) == 1 and errors[0].startswith("spec.worker.offers:"), errors


def test_bad_reserve_is_one_error_naming_the_field_and_its_range() -> None:
    """The roles refuse JUDGEQUEUE_RESERVE_PERCENT above 50 (never all of a worker's slots), so the spec does too."""
    spec = {**SPEC, "worker": {**SPEC["worker"], "reservePercent": 60}}
    errors = parse_spec(spec, name="judge")
    assert isinstance(errors, list) and len(errors) == 1, errors
    assert errors[0].startswith("spec.worker.reservePercent:") and "50" in errors[0], errors


def _deployment_env(worker: dict[str, Any]) -> dict[str, dict[str, str]]:
    """Each Deployment's JUDGEQUEUE_INTAKE (None: not set) as the operator renders the spec's children."""
    parsed = parse_spec({**SPEC, "worker": worker}, name="judge")
    assert isinstance(parsed, JudgeQueueSpec), parsed
    owner = render.Owner("judge", "ns", "uid-1")
    out: dict[str, dict[str, str]] = {}
    for child in render.render_children(parsed, owner, worker_replicas=1):
        if child.kind == "Deployment":
            env = child.body["spec"]["template"]["spec"]["containers"][0]["env"]
            out[child.name] = {e["name"]: e["value"] for e in env if e["name"] == "JUDGEQUEUE_INTAKE"}
    return out


@pytest.mark.parametrize(("worker", "intake"), [
    ({"maxReplicas": DIRECT_INTAKE_MAX_WORKERS}, "direct"),  # auto (the default), a fleet at the bound
    ({"minReplicas": 1, "maxReplicas": DIRECT_INTAKE_MAX_WORKERS + 1}, "stream"),  # auto, a larger fleet
    ({"intake": "auto", "maxReplicas": DIRECT_INTAKE_MAX_WORKERS + 1}, "stream"),
    ({"intake": "direct", "maxReplicas": DIRECT_INTAKE_MAX_WORKERS + 1}, "direct"),  # explicit values are kept
    ({"intake": "stream", "maxReplicas": 1}, "stream"),
    # External autoscaling: the static maxReplicas decides, not the scale subresource's count.
    ({"autoscaling": "external", "replicas": DIRECT_INTAKE_MAX_WORKERS + 5, "maxReplicas": 2}, "direct"),
])
def test_workers_and_dispatchers_get_the_resolved_intake(worker: dict[str, Any], intake: str) -> None:
    """Workers and dispatchers read the intake (the dispatcher holds live rows back for direct), so both
    Deployments get the same resolved value, never ``auto``; the reaper, which does not read it, none."""
    env = _deployment_env(worker)
    assert env == {"judge-dispatcher": {"JUDGEQUEUE_INTAKE": intake}, "judge-worker": {"JUDGEQUEUE_INTAKE": intake},
                   "judge-reaper": {}}
    load_settings({"JUDGEQUEUE_INTAKE": intake, **CONNECTIONS, "JUDGEQUEUE_QUEUE": "q"})  # a value a role accepts
