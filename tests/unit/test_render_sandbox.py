"""How the operator renders worker pods for the program judge's sandbox (pure rendering)."""

from __future__ import annotations

from typing import Any

from judgequeue.controllers import render
from judgequeue.core.spec import JudgeQueueSpec, parse_spec

OWNER = render.Owner(name="judge", namespace="ns", uid="uid-1")
BASE = {
    "queue": "judge",
    "image": "judgequeue:test",
    "postgres": {"secretKeyRef": {"name": "pg", "key": "dsn"}},
    "redis": {"secretKeyRef": {"name": "redis", "key": "url"}},
}


def spec_with(worker: dict[str, Any]) -> JudgeQueueSpec:
    spec = parse_spec({**BASE, "worker": worker}, name="judge")
    assert isinstance(spec, JudgeQueueSpec), spec
    return spec


def pod(spec: JudgeQueueSpec, role: render.Role = "worker") -> dict[str, Any]:
    body: dict[str, Any] = render.render_deployment(spec, OWNER, role, replicas=1).body
    return body["spec"]["template"]["spec"]  # type: ignore[no-any-return]


def test_program_workers_get_exactly_what_the_sandbox_needs_by_default() -> None:
    p = pod(spec_with({}))
    container = p["containers"][0]
    ctx = container["securityContext"]
    assert ctx["runAsUser"] == 0 and ctx["allowPrivilegeEscalation"] is False and ctx["readOnlyRootFilesystem"]
    assert ctx["capabilities"] == {"drop": ["ALL"], "add": ["SETUID", "SETGID", "CHOWN", "DAC_OVERRIDE", "FOWNER",
                                                            "KILL"]}  # fmt: skip
    assert ctx["seccompProfile"] == {"type": "Unconfined"}  # bubblewrap loads its own filter into each box
    assert {"name": "cgroup", "mountPath": "/sys/fs/cgroup"} in container["volumeMounts"]
    assert {"name": "cgroup", "hostPath": {"path": "/sys/fs/cgroup", "type": "Directory"}} in p["volumes"]
    assert not any(e["name"] == "JUDGEQUEUE_SANDBOX" for e in container["env"])  # required: fail closed
    # The worker plus a typical box per slot requested, a compile-sized one per slot as the limit (concurrency 4).
    assert container["resources"] == {
        "requests": {"cpu": "500m", "memory": "1280Mi"},
        "limits": {"cpu": "4", "memory": "4352Mi"},
    }


def test_trusted_and_other_judges_keep_the_non_root_pod() -> None:
    for worker in ({"sandbox": "trusted"}, {"judge": "noop"}):
        p = pod(spec_with(worker))
        container = p["containers"][0]
        assert container["securityContext"]["runAsNonRoot"] is True
        assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
        assert p["securityContext"]["runAsUser"] == render.RUN_AS_USER
        assert all(v["name"] != "cgroup" for v in p["volumes"])
    trusted = pod(spec_with({"sandbox": "trusted"}))["containers"][0]["env"]
    assert {"name": "JUDGEQUEUE_SANDBOX", "value": "trusted"} in trusted
    assert "runAsUser" not in pod(spec_with({}), "dispatcher")["containers"][0]["securityContext"]


def test_explicit_resources_win_and_bad_sandbox_is_named() -> None:
    resources = {"limits": {"memory": "1Gi"}}
    assert pod(spec_with({"resources": resources}))["containers"][0]["resources"] == {"limits": {"memory": "1Gi"}}
    errors = parse_spec({**BASE, "worker": {"sandbox": "off"}}, name="judge")
    assert errors == ["spec.worker.sandbox: must be one of isolated, trusted, got 'off'"]


def test_priority_class_reaches_live_and_shadow_worker_pods_only() -> None:
    spec = spec_with({"priorityClassName": "contest-judges", "shadow": {"enabled": True}})
    assert pod(spec)["priorityClassName"] == "contest-judges"
    shadow = render.render_deployment(spec, OWNER, "worker", replicas=1, shadow=True).body
    assert shadow["spec"]["template"]["spec"]["priorityClassName"] == "contest-judges"
    assert "priorityClassName" not in pod(spec, "dispatcher") and "priorityClassName" not in pod(spec, "reaper")
    assert "priorityClassName" not in pod(spec_with({}))  # absent: the cluster's default


def test_a_bad_priority_class_is_one_error_naming_the_field() -> None:
    errors = parse_spec({**BASE, "worker": {"priorityClassName": "Not_A_Name"}}, name="judge")
    assert isinstance(errors, list) and len(errors) == 1 and "priorityClassName" in errors[0], errors
