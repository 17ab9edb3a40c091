"""``spec.events.webhooks``: parsed for the operator, rendered into the reaper's variable with the URL
and signing key from Secrets mounted beside the connections, read back by the reaper as rendered,
admitted by the CRD as the model admits it, and bad items named."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from judgequeue.controllers import render
from judgequeue.core.roles.reaper.webhooks import Endpoint, load_webhooks
from judgequeue.core.spec import JudgeQueueSpec, WebhookSpec, parse_spec
from tests.support.kube_schema import admit, load_crd, schema_of

BASE: dict[str, Any] = {
    "image": "judgequeue:test",
    "postgres": {"secretKeyRef": {"name": "db", "key": "dsn"}},
    "redis": {"secretKeyRef": {"name": "rd", "key": "url"}},
}
HOOKS = [
    {"name": "scoreboard", "urlSecretKeyRef": {"name": "hooks", "key": "board-url"},
     "secretKeyRef": {"name": "hooks", "key": "board-key"}, "concurrency": 8, "maxAttempts": 50, "deadline": "30s"},
    {"name": "audit", "url": "http://audit.apps.svc:8080/verdicts", "secretKeyRef": {"name": "hooks", "key": "audit"}},
]  # fmt: skip


def spec(webhooks: Any) -> JudgeQueueSpec | list[str]:
    return parse_spec({**BASE, "events": {"webhooks": webhooks}}, name="contest")


def test_webhooks_are_rendered_for_the_reaper_only() -> None:
    parsed = spec(HOOKS)
    assert isinstance(parsed, JudgeQueueSpec), parsed
    env: dict[str, Any] = {e["name"]: e.get("value") for e in render.role_env(parsed, "reaper")}
    assert json.loads(env["JUDGEQUEUE_WEBHOOKS"]) == {
        "scoreboard": {"urlFile": "/var/run/secrets/judgequeue/webhook-scoreboard-url",
                       "secretFile": "/var/run/secrets/judgequeue/webhook-scoreboard-secret",
                       "concurrency": 8, "maxAttempts": 50, "deadline": 30.0},
        "audit": {"url": "http://audit.apps.svc:8080/verdicts",
                  "secretFile": "/var/run/secrets/judgequeue/webhook-audit-secret",
                  "concurrency": 4, "maxAttempts": 20, "deadline": 10.0},
    }  # fmt: skip
    sources = render.credentials_volume(parsed, "reaper")["projected"]["sources"]
    for key, path in (("board-url", "webhook-scoreboard-url"), ("board-key", "webhook-scoreboard-secret"),
                      ("audit", "webhook-audit-secret")):  # fmt: skip
        assert {"secret": {"name": "hooks", "items": [{"key": key, "path": path}]}} in sources
    for role in ("dispatcher", "worker"):
        assert "JUDGEQUEUE_WEBHOOKS" not in {e["name"] for e in render.role_env(parsed, role)}
        assert len(render.credentials_volume(parsed, role)["projected"]["sources"]) == 2


def test_the_reaper_reads_what_the_operator_renders(tmp_path: Path) -> None:
    parsed = spec(HOOKS[1:])
    assert isinstance(parsed, JudgeQueueSpec)
    env = {e["name"]: e.get("value") for e in render.role_env(parsed, "reaper")}
    key = tmp_path / "webhook-audit-secret"
    key.write_text("k3y\n")
    text = str(env["JUDGEQUEUE_WEBHOOKS"]).replace("/var/run/secrets/judgequeue", str(tmp_path))
    assert load_webhooks({"JUDGEQUEUE_WEBHOOKS": text}) == (
        [Endpoint("audit", "http://audit.apps.svc:8080/verdicts", b"k3y")], None
    )
    # The Secret not mounted (it does not exist): the endpoint is named as misconfigured, not dropped.
    key.unlink()
    [missing], _ = load_webhooks({"JUDGEQUEUE_WEBHOOKS": text})
    assert missing.problem is not None and "['audit'].secretFile: cannot read" in missing.problem


@pytest.mark.parametrize(
    ("webhooks", "error"),
    [
        ("x", "spec.events.webhooks: must be a list"),
        ([{"name": "Bad", "url": "http://x", "secretKeyRef": {"name": "s", "key": "k"}}],
         "spec.events.webhooks[0].name: 'Bad' is not a webhook name"),
        ([{"name": "a", "secretKeyRef": {"name": "s", "key": "k"}}],
         "spec.events.webhooks[0]: give exactly one of url and urlSecretKeyRef"),
        ([{"name": "a", "url": "ftp://x", "secretKeyRef": {"name": "s", "key": "k"}}],
         "spec.events.webhooks[0].url: must be an http or https URL"),
        ([{"name": "a", "url": "http://x"}], "spec.events.webhooks[0].secretKeyRef: is required"),
        ([{"name": "a", "url": "http://x", "secretKeyRef": {"name": "s", "key": "k"}, "concurrency": 0}],
         "spec.events.webhooks[0].concurrency: must be an integer between 1 and 256, got 0"),
        ([{"name": "a", "url": "http://x", "secretKeyRef": {"name": "s", "key": "k"}, "deadline": "1h"}],
         "spec.events.webhooks[0].deadline: '1h' is not a duration above 0 and at most 5m"),
        ([{"name": "a", "url": "http://x", "secretKeyRef": {"name": "s", "key": "k"}, "retries": 1}],
         "spec.events.webhooks[0].retries: unknown field"),
    ],
)
def test_bad_webhooks_are_named(webhooks: Any, error: str) -> None:
    parsed = spec(webhooks)
    assert isinstance(parsed, list)
    assert any(e.startswith(error) for e in parsed), parsed


def manifest(webhooks: Any) -> dict[str, Any]:
    return {"apiVersion": "judgequeue.dev/v1alpha1", "kind": "JudgeQueue",
            "metadata": {"name": "contest", "namespace": "default"},
            "spec": {**BASE, "events": {"webhooks": webhooks}}}  # fmt: skip


def test_the_crd_admits_webhooks_with_the_models_defaults_and_refuses_what_it_refuses() -> None:
    events = schema_of(load_crd())["properties"]["spec"]["properties"]["events"]["properties"]
    items = events["webhooks"]["items"]
    _, errors = admit(manifest(HOOKS))
    assert errors == []
    defaults = {k: v.get("default") for k, v in items["properties"].items() if "default" in v}
    assert defaults == {"concurrency": 4, "maxAttempts": 20, "deadline": "10s"}
    model = WebhookSpec("x", secret=None)  # type: ignore[arg-type]
    assert (model.concurrency, model.max_attempts, model.deadline) == (4, 20, 10.0)
    for bad in ([{"name": "a", "url": "http://x"}],  # no signing key
                [{"name": "a", "url": "http://x", "urlSecretKeyRef": {"name": "s", "key": "k"},
                  "secretKeyRef": {"name": "s", "key": "k"}}]):  # fmt: skip
        _, errors = admit(manifest(bad))
        assert errors, bad
        assert isinstance(spec(bad), list)
