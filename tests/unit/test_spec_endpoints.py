"""``spec.worker.endpoints``: parsed the same for the operator and ``judgequeue local``, rendered into
the http-call judge's variable, URLs from Secrets mounted beside the connections, bad items named."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from judgequeue.controllers import render
from judgequeue.core.judges.http_call import load_call_settings
from judgequeue.core.manifest import load_manifest, parse_manifest
from judgequeue.core.spec import EndpointSpec, JudgeQueueSpec, parse_spec
from tests.support.kube_schema import admit, load_crd, schema_of

BASE: dict[str, Any] = {
    "image": "judgequeue:test",
    "postgres": {"secretKeyRef": {"name": "db", "key": "dsn"}},
    "redis": {"secretKeyRef": {"name": "rd", "key": "url"}},
}
ENDPOINTS = [
    {"name": "summarise", "secretKeyRef": {"name": "tools", "key": "summarise-url"}, "concurrency": 2,
     "deadline": "5m", "tries": 8},
    {"name": "lookup", "url": "http://lookup.tools.svc:8080/v1", "rate": "600/m"},
]


def spec(**worker: Any) -> JudgeQueueSpec | list[str]:
    return parse_spec({**BASE, "worker": {"judge": "http-call", **worker}}, name="agents")


def test_endpoints_are_parsed_and_rendered_for_the_judge() -> None:
    parsed = spec(endpoints=ENDPOINTS)
    assert isinstance(parsed, JudgeQueueSpec), parsed
    env: dict[str, Any] = {e["name"]: e.get("value") for e in render.role_env(parsed, "worker")}
    doc = json.loads(env["JUDGEQUEUE_CALL_ENDPOINTS"])
    assert doc == {
        "summarise": {"urlFile": "/var/run/secrets/judgequeue/endpoint-summarise-url", "concurrency": 2,
                      "deadline": 300.0, "tries": 8},
        "lookup": {"url": "http://lookup.tools.svc:8080/v1", "concurrency": 4, "deadline": 60.0, "tries": 5,
                   "rate": 10.0},
    }  # fmt: skip
    # The Secret's key is mounted where the judge reads it, in the connections' volume (mode 0440).
    volume = render.credentials_volume(parsed, "worker")
    assert {"secret": {"name": "tools", "items": [{"key": "summarise-url", "path": "endpoint-summarise-url"}]}} in (
        volume["projected"]["sources"]
    )
    # Only workers get them.
    assert "JUDGEQUEUE_CALL_ENDPOINTS" not in {e["name"] for e in render.role_env(parsed, "dispatcher")}
    assert len(render.credentials_volume(parsed, "dispatcher")["projected"]["sources"]) == 2


def test_the_judge_reads_what_the_operator_renders() -> None:
    parsed = spec(endpoints=[{"name": "lookup", "url": "http://lookup.tools.svc:8080/v1", "deadline": "90s"}])
    assert isinstance(parsed, JudgeQueueSpec)
    env: dict[str, Any] = {e["name"]: e.get("value") for e in render.role_env(parsed, "worker")}
    settings = load_call_settings({"JUDGEQUEUE_CALL_ENDPOINTS": env["JUDGEQUEUE_CALL_ENDPOINTS"]})
    assert settings.endpoints["lookup"].deadline == 90.0
    limited = spec(endpoints=[{"name": "lookup", "url": "http://lookup.tools.svc:8080/v1", "rate": "90/m"}])
    assert isinstance(limited, JudgeQueueSpec)
    env = {e["name"]: e.get("value") for e in render.role_env(limited, "worker")}
    settings = load_call_settings({"JUDGEQUEUE_CALL_ENDPOINTS": env["JUDGEQUEUE_CALL_ENDPOINTS"]})
    assert settings.endpoints["lookup"].rate == 1.5


def test_local_renders_the_same_endpoints() -> None:
    doc = {"apiVersion": "judgequeue.dev/v1alpha1", "kind": "JudgeQueue", "metadata": {"name": "agents"},
           "spec": {**BASE, "worker": {"judge": "http-call", "endpoints": ENDPOINTS}}}  # fmt: skip
    parsed = spec(endpoints=ENDPOINTS)
    assert isinstance(parsed, JudgeQueueSpec)
    operator = {e["name"]: e.get("value") for e in render.role_env(parsed, "worker")}
    assert parse_manifest(doc).env("worker")["JUDGEQUEUE_CALL_ENDPOINTS"] == operator["JUDGEQUEUE_CALL_ENDPOINTS"]


@pytest.mark.parametrize(
    ("endpoints", "error"),
    [
        (None, "spec.worker.endpoints: is required when spec.worker.judge is http-call"),
        ("x", "spec.worker.endpoints: must be a list"),
        ([{"name": "Bad Name", "url": "http://x"}], "spec.worker.endpoints[0].name: 'Bad Name' is not an endpoint"),
        ([{"name": "a"}], "spec.worker.endpoints[0]: give exactly one of url and secretKeyRef"),
        ([{"name": "a", "url": "ftp://x"}], "spec.worker.endpoints[0].url: must be an http or https URL"),
        ([{"name": "a", "url": "http://x", "concurrency": 0}],
         "spec.worker.endpoints[0].concurrency: must be an integer between 1 and 1024, got 0"),
        ([{"name": "a", "url": "http://x", "deadline": "soon"}],
         "spec.worker.endpoints[0].deadline: 'soon' is not a positive duration"),
        ([{"name": "a", "url": "http://x"}, {"name": "a", "url": "http://y"}],
         "spec.worker.endpoints[1].name: 'a' is given twice"),
        ([{"name": "a", "secretKeyRef": {"name": "s"}}], "spec.worker.endpoints[0].secretKeyRef: must name"),
        ([{"name": "a", "url": "http://x", "retries": 2}], "spec.worker.endpoints[0].retries: unknown field"),
        ([{"name": "a", "url": "http://x", "rate": "fast"}],
         "spec.worker.endpoints[0].rate: must be calls per time unit, like 10/s, 600/m or 1000/h, got 'fast'"),
        ([{"name": "a", "url": "http://x", "rate": "0/s"}], "spec.worker.endpoints[0].rate: must be above 0"),
    ],
)
def test_bad_endpoints_are_named(endpoints: Any, error: str) -> None:
    parsed = spec() if endpoints is None else spec(endpoints=endpoints)
    assert isinstance(parsed, list)
    assert any(e.startswith(error) for e in parsed), parsed


def manifest(endpoints: Any) -> dict[str, Any]:
    return {"apiVersion": "judgequeue.dev/v1alpha1", "kind": "JudgeQueue",
            "metadata": {"name": "agents", "namespace": "default"},
            "spec": {**BASE, "worker": {"judge": "http-call", "endpoints": endpoints}}}  # fmt: skip


def test_the_crd_admits_endpoints_with_defaults_and_refuses_what_the_model_refuses() -> None:
    worker = schema_of(load_crd())["properties"]["spec"]["properties"]["worker"]["properties"]
    items = worker["endpoints"]["items"]
    assert set(items["properties"]) == {"name", "url", "secretKeyRef", "concurrency", "deadline", "tries", "rate"}
    _, errors = admit(manifest(ENDPOINTS))
    assert errors == []
    # The item defaults are the model's (an absent field means the same to both).
    defaults = {k: v.get("default") for k, v in items["properties"].items() if "default" in v}
    assert defaults == {"concurrency": 4, "deadline": "60s", "tries": 5}
    model = EndpointSpec("x")
    assert (model.concurrency, model.deadline, model.tries) == (4, 60.0, 5)
    written = [{"name": "a", "url": "http://x", **defaults}]
    assert isinstance(parse_spec({**BASE, "worker": {"judge": "http-call", "endpoints": written}}, name="a"),
                      JudgeQueueSpec)
    both = [{"name": "a", "url": "http://x", "secretKeyRef": {"name": "s", "key": "k"}}]
    _, errors = admit(manifest(both))
    assert any("give exactly one of url and secretKeyRef" in e for e in errors), errors
    assert isinstance(spec(endpoints=both), list)


def test_the_agent_example_manifest_is_valid_for_local_and_the_api_server() -> None:
    path = Path(__file__).resolve().parents[2] / "examples" / "agent" / "judgequeue.yaml"
    m = load_manifest(str(path))
    assert m.spec.worker.judge == "http-call"
    assert [e.name for e in m.spec.worker.endpoints] == ["tool"]
    doc = yaml.safe_load(path.read_text())
    doc["metadata"]["namespace"] = "default"
    _, errors = admit(doc)
    assert errors == []


def test_http_call_workers_reserve_no_memory_per_slot() -> None:
    parsed = spec(concurrency=64, endpoints=ENDPOINTS)
    assert isinstance(parsed, JudgeQueueSpec)
    assert render.default_worker_resources(parsed) == {
        "requests": {"cpu": "250m", "memory": "256Mi"}, "limits": {"cpu": "1", "memory": "512Mi"},
    }  # fmt: skip
