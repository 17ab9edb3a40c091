"""The JudgeQueue CRD: structure, defaults and CEL rules evaluated on good and bad objects."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from celpy.adapter import json_to_cel
from celpy.evaluation import CELEvalError

from judgequeue.core.spec import parse_spec
from tests.support.kube_schema import admit, cel_program, load_crd, schema_of

MINIMAL: dict[str, Any] = {
    "apiVersion": "judgequeue.dev/v1alpha1",
    "kind": "JudgeQueue",
    "metadata": {"name": "judge", "namespace": "default"},
    "spec": {
        "image": "ghcr.io/example/judgequeue:1.0",
        "postgres": {"secretKeyRef": {"name": "jq-db"}},
        "redis": {"secretKeyRef": {"name": "jq-redis"}},
    },
}


def with_spec(**sections: Any) -> dict[str, Any]:
    obj = copy.deepcopy(MINIMAL)
    for key, value in sections.items():
        obj["spec"][key] = value
    return obj


def test_crd_names_and_subresources() -> None:
    crd = load_crd()
    assert crd["metadata"]["name"] == "judgequeues.judgequeue.dev"
    names = crd["spec"]["names"]
    assert (names["kind"], names["plural"], names["shortNames"]) == ("JudgeQueue", "judgequeues", ["jq"])
    version = crd["spec"]["versions"][0]
    assert version["name"] == "v1alpha1" and version["served"] and version["storage"]
    assert version["subresources"]["status"] == {}
    scale = version["subresources"]["scale"]
    assert scale["specReplicasPath"] == ".spec.worker.replicas"
    assert scale["statusReplicasPath"] == ".status.workers.replicas"
    assert scale["labelSelectorPath"] == ".status.workers.selector"
    columns = [c["name"] for c in version["additionalPrinterColumns"]]
    assert columns == ["Mode", "Agreement", "Workers", "Intake", "Backlog", "Ready", "Age"]
    status = schema_of(crd)["properties"]["status"]["properties"]["workers"]["properties"]
    assert {"intake", "intakeReason"} <= set(status)  # written by the operator, so declared (never pruned)


def test_defaults_applied_and_minimal_object_valid() -> None:
    obj, errors = admit(MINIMAL)
    assert errors == []
    spec = obj["spec"]
    assert spec["dispatcher"] == {
        "replicas": 1, "batchSize": 100, "schedule": "1s", "maxAttempts": 10, "backoff": {"base": "1s", "max": "5m"},
    }
    assert spec["worker"]["minReplicas"] == 1 and spec["worker"]["maxReplicas"] == 8
    assert spec["worker"]["autoscaling"] == "internal" and spec["worker"]["judge"] == "program"
    assert spec["worker"]["intake"] == "auto" and spec["worker"]["offers"] == 32
    assert spec["reaper"]["retention"] == "7d" and spec["reaper"]["leaseTtl"] == "30s"
    assert spec["cutover"] == {"mode": "live", "driftPolicy": "restore"}
    assert spec["paused"] is False
    assert spec["postgres"]["secretKeyRef"]["key"] == "dsn" and spec["redis"]["secretKeyRef"]["key"] == "url"
    # The defaulted spec is what the operator parses; both agree on it.
    parsed = parse_spec(spec, name="judge")
    assert not isinstance(parsed, list)


def test_schema_is_structural_enough() -> None:
    """Every object node has a type; status is a subresource with preserved unknown fields."""
    def walk(node: dict[str, Any], path: str) -> None:
        assert "type" in node or "x-kubernetes-int-or-string" in node, path
        for name, sub in (node.get("properties") or {}).items():
            walk(sub, f"{path}.{name}")
        if isinstance(node.get("additionalProperties"), dict):
            walk(node["additionalProperties"], f"{path}.*")
    walk(schema_of(load_crd()), "")


BAD: list[tuple[str, dict[str, Any], str]] = [
    ("min>max", {"worker": {"minReplicas": 5, "maxReplicas": 2}}, "minReplicas must not exceed"),
    ("negative batch", {"dispatcher": {"batchSize": -1}}, "batchSize: should be greater"),
    ("bad duration", {"dispatcher": {"schedule": "soon"}}, "schedule: should match"),
    ("day unit where CEL compares", {"reaper": {"visibilityTimeout": "1d"}}, "visibilityTimeout: should match"),
    ("backoff base>max", {"dispatcher": {"backoff": {"base": "10m", "max": "1m"}}}, "backoff.base must not exceed"),
    ("interval>visibility", {"reaper": {"interval": "2m", "visibilityTimeout": "1m", "leaseTtl": "30s"}},
     "interval must not exceed"),
    ("lease>visibility", {"reaper": {"leaseTtl": "5m"}}, "leaseTtl must not exceed"),
    ("bad mode", {"cutover": {"mode": "half"}}, "Unsupported value"),
    ("bad autoscaling", {"worker": {"autoscaling": "keda"}}, "Unsupported value"),
    ("bad intake", {"worker": {"intake": "fast"}}, "Unsupported value"),
    ("intake is lowercase", {"worker": {"intake": "Auto"}}, "Unsupported value"),
    ("negative offers", {"worker": {"offers": -1}}, "offers: should be greater"),
    ("bad queue", {"queue": "Not_A_Label"}, "queue: should match"),
    ("huge grace", {"worker": {"gracePeriod": "2h"}}, "gracePeriod must be under 1h"),
    ("bad judge name", {"worker": {"judge": "Rm -rf"}}, "judge: should match"),
]


@pytest.mark.parametrize(("case", "sections", "expected"), BAD, ids=[b[0] for b in BAD])
def test_bad_objects_rejected(case: str, sections: dict[str, Any], expected: str) -> None:
    _, errors = admit(with_spec(**sections))
    assert any(expected in e for e in errors), errors


def test_missing_secret_ref_rejected() -> None:
    obj = with_spec()
    del obj["spec"]["postgres"]
    _, errors = admit(obj)
    assert any("postgres: Required" in e for e in errors)


def test_good_variants_accepted() -> None:
    good = with_spec(
        worker={"minReplicas": 2, "maxReplicas": 2, "gracePeriod": "59m", "autoscaling": "external", "replicas": 3,
                "intake": "direct"},
        dispatcher={"backoff": {"base": "250ms", "max": "250ms"}, "schedule": "1.5s"},
        reaper={"interval": "60s", "visibilityTimeout": "1m", "leaseTtl": "1m", "retention": "30d"},
        cutover={"mode": "shadow", "watermark": "2025-01-31T12:00:00Z"},
    )
    _, errors = admit(good)
    assert errors == []


def test_watermark_transition_rule() -> None:
    old = with_spec(cutover={"mode": "live", "watermark": "2025-01-31T12:00:00Z"})
    forward = with_spec(cutover={"mode": "live", "watermark": "2025-02-01T00:00:00Z"})
    same = with_spec(cutover={"mode": "shadow", "watermark": "2025-01-31T12:00:00Z"})
    back = with_spec(cutover={"mode": "live", "watermark": "2025-01-01T00:00:00Z"})
    cleared = with_spec(cutover={"mode": "live"})
    assert admit(forward, old)[1] == []
    assert admit(same, old)[1] == []
    for bad in (back, cleared):
        errors = admit(bad, old)[1]
        assert any("may only move forward" in e for e in errors), errors
    # Setting a first watermark, or creating with one, is fine.
    assert admit(old, with_spec())[1] == []
    assert admit(old)[1] == []


def _defaults(node: dict[str, Any], path: str) -> list[tuple[str, dict[str, Any]]]:
    found = [(path, node)] if "default" in node else []
    for name, sub in (node.get("properties") or {}).items():
        found += _defaults(sub, f"{path}.{name}")
    return found


def test_every_default_passes_its_own_rules_as_written() -> None:
    """The API server evaluates each CEL rule against a ``default:`` as written, before nested defaults
    are filled in (a CRD whose object default is ``{}`` is refused); checked here without a server too."""
    for path, node in _defaults(schema_of(load_crd()), ""):
        for rule in node.get("x-kubernetes-validations", []):
            if "oldSelf" in rule["rule"]:
                continue
            program = cel_program(rule["rule"])
            result = program.evaluate({"self": json_to_cel(copy.deepcopy(node["default"]))})
            assert not isinstance(result, CELEvalError) and bool(result), (path, rule["message"], result)
