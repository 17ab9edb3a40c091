"""What a worker pod with the program judge needs, measured on a real node, and what admission says.

Each privilege the operator renders for a sandboxed worker (controllers/render.py,
``_grant_sandbox``) is taken away in turn from the pod the operator renders, on the real kubelet:
without any one of them the judge must refuse to start with a line naming what is missing, or the
verdicts of an ordinary and a hostile submission change. So none is there for nothing. The same
pod as rendered judges both correctly. Then PodSecurity: under ``baseline`` (a common namespace
default) the sandboxed worker is refused by admission and the JudgeQueue's status names the
admission's message; a trusted worker, the dispatcher and the reaper are admitted even under
``restricted``. docs/judges.md's table per admission level and node kind is these tests.
"""

from __future__ import annotations

import copy
import json
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from judgequeue.controllers.render import SANDBOX_CAPABILITIES, Owner, render_deployment
from judgequeue.core.spec import JudgeQueueSpec, parse_spec
from tests.kube.tools import condition, jq_path, wait_for
from tests.node.conftest import NodeCluster, migrated_database

#: Judges two submissions in the pod with the worker's own judge and prints the verdicts (or the
#: judge's refusal) as one JSON line.
PROBE = r"""
import asyncio, json
from judgequeue.core.judges.program import ProgramJudge
from judgequeue.core.judges.sandbox.isolation import SandboxUnavailable
try:
    judge = ProgramJudge()
except SandboxUnavailable as exc:
    print(json.dumps({"refused": str(exc)}))
    raise SystemExit(0)
async def main():
    ok = {"language": "python", "source": "print(2 + 3)", "tests": [{"input": "", "output": "5"}]}
    bomb = {"language": "python", "source": "x = bytearray(400 << 20)\nprint(len(x))",
            "tests": [{"input": "", "output": ""}], "limits": {"memory_mb": 64}}
    return [(await judge.judge(p)).status for p in (ok, bomb)]
print(json.dumps({"verdicts": asyncio.run(main())}))
"""
JUDGED = {"verdicts": ["ACCEPTED", "MEMORY_LIMIT"]}


def worker_spec(image: str, **worker: Any) -> JudgeQueueSpec:
    parsed = parse_spec({
        "image": image, "queue": "privileges",
        "postgres": {"secretKeyRef": {"name": "judgequeue-postgres", "key": "dsn"}},
        "redis": {"secretKeyRef": {"name": "judgequeue-redis", "key": "url"}},
        "worker": {"judge": "program", **worker},
    }, name="privileges")  # fmt: skip
    assert isinstance(parsed, JudgeQueueSpec), parsed
    return parsed


def rendered_worker_pod(image: str, **worker: Any) -> dict[str, Any]:
    """The pod template the operator renders for a program worker, as a bare pod running PROBE."""
    owner = Owner("privileges", "default", str(uuid.uuid4()))
    template = render_deployment(worker_spec(image, **worker), owner, "worker", replicas=1).body["spec"]["template"]
    pod = copy.deepcopy(template["spec"])
    container = pod["containers"][0]
    container["command"] = ["python3", "-c", PROBE]
    container.pop("args", None)
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        container.pop(probe, None)
    container["imagePullPolicy"] = "Never"
    # The probe reads no credentials: the Secrets need not exist.
    pod["volumes"] = [v for v in pod["volumes"] if v["name"] != "credentials"]
    container["volumeMounts"] = [m for m in container["volumeMounts"] if m["name"] != "credentials"]
    pod["restartPolicy"] = "Never"
    return dict(pod)


def without_capability(name: str) -> Callable[[dict[str, Any]], None]:
    def change(pod: dict[str, Any]) -> None:
        caps = pod["containers"][0]["securityContext"]["capabilities"]
        caps["add"] = [c for c in caps["add"] if c != name]
    return change


def runtime_default_seccomp(pod: dict[str, Any]) -> None:
    pod["containers"][0]["securityContext"]["seccompProfile"] = {"type": "RuntimeDefault"}


def no_cgroup_mount(pod: dict[str, Any]) -> None:
    pod["volumes"] = [v for v in pod["volumes"] if v["name"] != "cgroup"]
    container = pod["containers"][0]
    container["volumeMounts"] = [m for m in container["volumeMounts"] if m["name"] != "cgroup"]


def run_probe(cluster: NodeCluster, namespace: str, pod_spec: dict[str, Any]) -> dict[str, Any]:
    name = f"probe-{uuid.uuid4().hex[:8]}"
    cluster.kube.request("POST", f"/api/v1/namespaces/{namespace}/pods",
                         {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": pod_spec})

    def finished() -> str | None:
        pod = cluster.kube.get(f"/api/v1/namespaces/{namespace}/pods/{name}") or {}
        phase = pod.get("status", {}).get("phase")
        return phase if phase in ("Succeeded", "Failed") else None

    phase = wait_for(f"pod {name} finished", finished, timeout=180, check=cluster.node.check_alive)
    log = cluster.kube.kubectl("logs", "-n", namespace, name, check=False).stdout.strip()
    cluster.kube.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}")
    lines = [line for line in log.splitlines() if line.startswith("{")]
    assert phase == "Succeeded" and lines, (phase, log[-2000:])
    return dict(json.loads(lines[-1]))


@pytest.fixture(scope="module")
def privileged_namespace(node_cluster: NodeCluster) -> str:
    name = f"priv-{uuid.uuid4().hex[:6]}"
    node_cluster.kube.create_namespace(name)
    return name


def test_the_rendered_worker_pod_judges(node_cluster: NodeCluster, privileged_namespace: str) -> None:
    assert run_probe(node_cluster, privileged_namespace, rendered_worker_pod(node_cluster.image)) == JUDGED


@pytest.mark.parametrize(("taken", "named"), [
    *(pytest.param(without_capability(c), c, id=f"no-{c}") for c in SANDBOX_CAPABILITIES),
    pytest.param(runtime_default_seccomp, "bubblewrap cannot create namespaces", id="runtime-default-seccomp"),
    pytest.param(no_cgroup_mount, "cgroup", id="no-cgroup-hostpath"),
])  # fmt: skip
def test_without_any_one_privilege_the_judge_refuses_naming_it(
    node_cluster: NodeCluster, privileged_namespace: str, taken: Callable[[dict[str, Any]], None], named: str
) -> None:
    """None of them is there for nothing, and a worker without one fails closed saying which."""
    pod = rendered_worker_pod(node_cluster.image)
    taken(pod)
    outcome = run_probe(node_cluster, privileged_namespace, pod)
    assert "refused" in outcome, f"judged without it ({outcome}): take it out of _grant_sandbox"
    assert "the program judge cannot isolate untrusted code" in outcome["refused"], outcome
    assert named in outcome["refused"], outcome


def labelled_namespace(cluster: NodeCluster, level: str) -> str:
    name = f"pss-{level}-{uuid.uuid4().hex[:6]}"
    cluster.kube.request("POST", "/api/v1/namespaces", {
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": name, "labels": {"pod-security.kubernetes.io/enforce": level}},
    })  # fmt: skip
    return name


@pytest.mark.usefixtures("helm_installed")
def test_podsecurity_baseline_refuses_the_sandboxed_worker_and_status_says_why(node_cluster: NodeCluster) -> None:
    kube = node_cluster.kube
    namespace = labelled_namespace(node_cluster, "baseline")
    kube.apply(_secrets(node_cluster, namespace), namespace=namespace)
    kube.apply({"apiVersion": "judgequeue.dev/v1alpha1", "kind": "JudgeQueue", "metadata": {"name": "judge"},
                "spec": {"image": node_cluster.image, "queue": f"pss-{uuid.uuid4().hex[:6]}",
                         "postgres": {"secretKeyRef": {"name": "judgequeue-postgres", "key": "dsn"}},
                         "redis": {"secretKeyRef": {"name": "judgequeue-redis", "key": "url"}},
                         "worker": {"judge": "program", "minReplicas": 1, "maxReplicas": 1}}},
               namespace=namespace)
    started = time.monotonic()

    def refused() -> dict[str, Any] | None:
        jq = kube.request("GET", jq_path(namespace, "judge"))
        degraded = condition(jq, "Degraded")
        return degraded if degraded.get("reason") == "PodsRefused" else None

    degraded = wait_for("Degraded PodsRefused", refused, timeout=120)
    print(f"\n[node tier] PodSecurity refusal named in status after {time.monotonic() - started:.1f} s")
    assert 'violates PodSecurity "baseline:latest"' in degraded["message"], degraded
    assert "hostPath volumes" in degraded["message"] and "worker" in degraded["message"], degraded
    ready = condition(kube.request("GET", jq_path(namespace, "judge")), "Ready")
    assert ready.get("status") == "False" and ready.get("reason") != "ReplicasUnavailable", ready


@pytest.mark.usefixtures("helm_installed")
@pytest.mark.parametrize("level", ["baseline", "restricted"])
def test_trusted_workers_dispatchers_and_reapers_are_admitted(node_cluster: NodeCluster, level: str) -> None:
    kube = node_cluster.kube
    namespace = labelled_namespace(node_cluster, level)
    kube.apply(_secrets(node_cluster, namespace), namespace=namespace)
    kube.apply({"apiVersion": "judgequeue.dev/v1alpha1", "kind": "JudgeQueue", "metadata": {"name": "judge"},
                "spec": {"image": node_cluster.image, "queue": f"pss-{uuid.uuid4().hex[:6]}",
                         "postgres": {"secretKeyRef": {"name": "judgequeue-postgres", "key": "dsn"}},
                         "redis": {"secretKeyRef": {"name": "judgequeue-redis", "key": "url"}},
                         "worker": {"judge": "program", "sandbox": "trusted", "minReplicas": 1, "maxReplicas": 1}}},
               namespace=namespace)

    def pods_created() -> bool:
        pods = kube.request("GET", f"/api/v1/namespaces/{namespace}/pods")["items"]
        roles = {p["metadata"]["labels"].get("app.kubernetes.io/component") for p in pods}
        return {"dispatcher", "worker", "reaper"} <= roles

    wait_for(f"every role's pod admitted under {level}", pods_created, timeout=120)
    jq = kube.request("GET", jq_path(namespace, "judge"))
    assert condition(jq, "Degraded").get("reason") != "PodsRefused", jq.get("status")


def _secrets(cluster: NodeCluster, namespace: str) -> list[dict[str, Any]]:
    """The connection Secrets, to a database of the namespace's own."""
    return [
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "judgequeue-postgres", "namespace": namespace},
         "stringData": {"dsn": cluster.pod_dsn(migrated_database(cluster))}},
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "judgequeue-redis", "namespace": namespace},
         "stringData": {"url": cluster.pod_redis_url}},
    ]
