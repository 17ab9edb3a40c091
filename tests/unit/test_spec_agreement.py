"""The operator and ``judgequeue local`` must accept and refuse the same JudgeQueue manifests,
and every role must be able to load the settings either of them renders from an accepted one."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from judgequeue.controllers import render
from judgequeue.core.base.errors import ConfigError
from judgequeue.core.config import load_settings
from judgequeue.core.manifest import ManifestError, parse_manifest
from judgequeue.core.spec import ROLES, parse_spec

BASE: dict[str, Any] = {
    "image": "judgequeue:test",
    "postgres": {"secretKeyRef": {"name": "db", "key": "dsn"}},
    "redis": {"secretKeyRef": {"name": "rd", "key": "url"}},
}
CONNECTIONS = {"JUDGEQUEUE_POSTGRES_DSN": "postgresql://h/db", "JUDGEQUEUE_REDIS_URL": "redis://h/0"}


def with_spec(**sections: Any) -> dict[str, Any]:
    spec = copy.deepcopy(BASE)
    spec.update(sections)
    return spec


def operator_accepts(spec: dict[str, Any]) -> bool:
    """The operator's verdict, including whether every rendered role's settings load."""
    parsed = parse_spec(spec, name="judge")
    if isinstance(parsed, list):
        return False
    for role in ROLES:
        env = {e["name"]: e["value"] for e in render.role_env(parsed, role) if not e["name"].endswith("_FILE")}
        try:
            load_settings({**env, **CONNECTIONS})
        except ConfigError:
            return False
    return True


def local_accepts(spec: dict[str, Any]) -> bool:
    """``judgequeue local``'s verdict on the same spec, as a manifest document."""
    doc = {"apiVersion": "judgequeue.dev/v1alpha1", "kind": "JudgeQueue", "metadata": {"name": "judge"},
           "spec": copy.deepcopy(spec)}
    try:
        manifest = parse_manifest(doc)
        for role in ROLES:
            load_settings({**manifest.env(role), **CONNECTIONS})
    except (ManifestError, ConfigError):
        return False
    return True


# (case, spec, accepted): the issue's divergences first, then the edges of each kind of rule.
CASES: list[tuple[str, dict[str, Any], bool]] = [
    ("a plugin judge (installed in the image, not built in)", with_spec(worker={"judge": "gpu"}), True),
    ("batchSize above the schema's 10000", with_spec(dispatcher={"batchSize": 50000}), False),
    ("reaper interval longer than the visibility timeout",
     with_spec(reaper={"interval": "2m", "visibilityTimeout": "60s"}), False),
    ("maxRetries 0 (the schema's minimum: give up at the first expiry)", with_spec(reaper={"maxRetries": 0}), True),
    ("a bare number where the schema wants a duration string", with_spec(reaper={"interval": 2}), False),
    ("a judge name the schema's pattern refuses", with_spec(worker={"judge": "Rm -rf"}), False),
    ("lease TTL longer than the visibility timeout", with_spec(reaper={"leaseTtl": "5m"}), False),
    ("grace period of an hour", with_spec(worker={"gracePeriod": "1h"}), False),
    ("backoff base above max", with_spec(dispatcher={"backoff": {"base": "10m", "max": "1m"}}), False),
    ("a day unit where CEL compares durations", with_spec(reaper={"visibilityTimeout": "1d"}), False),
    ("an unknown field", with_spec(worker={"concurency": 3}), False),
    ("no image", {k: v for k, v in BASE.items() if k != "image"}, False),
    ("the minimal spec", with_spec(), True),
    ("every bound at its edge", with_spec(
        dispatcher={"replicas": 0, "batchSize": 10000, "maxAttempts": 1000, "schedule": "1ms",
                    "backoff": {"base": "5m", "max": "5m"}},
        worker={"minReplicas": 0, "maxReplicas": 1000, "concurrency": 64, "gracePeriod": "59m"},
        reaper={"interval": "1m", "visibilityTimeout": "1m", "leaseTtl": "1m", "maxDeliveries": 1000,
                "maxRetries": 100, "retention": "30d"},
    ), True),
]


@pytest.mark.parametrize(("case", "spec", "accepted"), CASES, ids=[c[0] for c in CASES])
def test_operator_and_local_agree(case: str, spec: dict[str, Any], accepted: bool) -> None:
    assert (operator_accepts(spec), local_accepts(spec)) == (accepted, accepted), case
