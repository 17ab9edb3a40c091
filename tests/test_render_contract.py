"""The operator (controllers.render) and `judgequeue local` (core.manifest) turn the same JudgeQueue
spec into environment variables independently; a role must get the same settings from both."""

from __future__ import annotations

from typing import Any

import pytest

from judgequeue.controllers import render
from judgequeue.controllers.spec import JudgeQueueSpec, parse_spec
from judgequeue.core.config import Settings, load_settings
from judgequeue.core.manifest import render_env

SPEC: dict[str, Any] = {
    "image": "judgequeue:test",
    "queue": "contract",
    "logLevel": "DEBUG",
    "postgres": {"secretKeyRef": {"name": "db", "key": "dsn"}},
    "redis": {"secretKeyRef": {"name": "rd", "key": "url"}},
    "dispatcher": {"batchSize": 77, "schedule": "3s", "maxAttempts": 4, "backoff": {"base": "2s", "max": "90s"}},
    "worker": {"minReplicas": 1, "maxReplicas": 3, "concurrency": 6, "judge": "sleep", "gracePeriod": "12s"},
    "reaper": {
        "interval": "4s",
        "visibilityTimeout": "45s",
        "maxDeliveries": 7,
        "leaseTtl": "20s",
        "maxRetries": 5,
        "retention": "3d",
    },
}
CONNECTIONS = {"JUDGEQUEUE_POSTGRES_DSN": "postgresql://h/db", "JUDGEQUEUE_REDIS_URL": "redis://h/0"}


def operator_settings(role: render.Role) -> Settings:
    parsed = parse_spec(SPEC, name="judge")
    assert isinstance(parsed, JudgeQueueSpec), parsed
    env = {e["name"]: e["value"] for e in render.role_env(parsed, role) if "value" in e}
    return load_settings({**env, **CONNECTIONS})


def local_settings() -> Settings:
    return load_settings({**render_env(SPEC), **CONNECTIONS})


@pytest.mark.parametrize("role", ["dispatcher", "worker", "reaper"])
def test_operator_and_local_mode_give_a_role_the_same_settings(role: render.Role) -> None:
    op, local = operator_settings(role), local_settings()
    assert (op.queue, op.log_level) == (local.queue, local.log_level)
    # Each role's Deployment carries its own section; every value of it must match local mode's.
    assert getattr(op, role) == getattr(local, role)
