"""Helpers of the kube tier: JudgeQueue manifests, Secrets, the operator as a process, an SA's identity."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import asyncpg
import redis

from judgequeue.controllers.rbac import render_rules
from tests.kube.cluster import ROOT, Cluster, wait_until
from tests.support.databases import REDIS_URL
from tests.support.roles import JUDGEQUEUE, RoleProcess, json_events

# A Redis database of its own: the example's queue is named "demo", as other suites' may be.
KUBE_REDIS_URL = REDIS_URL.rsplit("/", 1)[0] + "/13"
JQ_PATH = "/apis/judgequeue.dev/v1alpha1/namespaces/{ns}/judgequeues"
JUDGEQUEUE_BIN = Path(JUDGEQUEUE)


def jq_path(namespace: str, name: str | None = None, subresource: str | None = None) -> str:
    path = JQ_PATH.format(ns=namespace)
    if name:
        path += f"/{name}"
    if subresource:
        path += f"/{subresource}"
    return path


def judgequeue(name: str, queue: str, **spec: Any) -> dict[str, Any]:
    """A JudgeQueue with the test's Secrets (see :func:`connection_secrets`) and ``spec`` merged in."""
    body: dict[str, Any] = {
        "image": "judgequeue:test",
        "queue": queue,
        "postgres": {"secretKeyRef": {"name": "judgequeue-postgres", "key": "dsn"}},
        "redis": {"secretKeyRef": {"name": "judgequeue-redis", "key": "url"}},
    }
    body.update(spec)
    return {"apiVersion": "judgequeue.dev/v1alpha1", "kind": "JudgeQueue", "metadata": {"name": name},
            "spec": body}


def connection_secrets(kube: Cluster, namespace: str, *, dsn: str, redis_url: str) -> None:
    """The two Secrets the README tells a user to create (names as in examples/judgequeue.yaml)."""
    for name, key, value in (("judgequeue-postgres", "dsn", dsn), ("judgequeue-redis", "url", redis_url)):
        kube.request("POST", f"/api/v1/namespaces/{namespace}/secrets", {
            "apiVersion": "v1", "kind": "Secret", "metadata": {"name": name},
            "data": {key: base64.b64encode(value.encode()).decode()},
        })


def operator_identity(kube: Cluster, namespace: str, name: str = "judgequeue-operator") -> Path:
    """A ServiceAccount bound to a ClusterRole with the chart's rules; returns a kubeconfig as it.

    The same rules the chart renders (from controllers/rbac.py), so the operator runs with the
    permissions a real install gives it, not as cluster admin."""
    cluster_role = f"{namespace}-{name}"
    kube.request("POST", f"/api/v1/namespaces/{namespace}/serviceaccounts",
                 {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}})
    kube.request("POST", "/apis/rbac.authorization.k8s.io/v1/clusterroles", {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": cluster_role},
        "rules": render_rules(cluster=True)})
    kube.request("POST", "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": cluster_role},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": cluster_role},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}]})
    return kube.kubeconfig_for(kube.sa_token(namespace, name), f"{namespace}-{name}", namespace)


class OperatorProcess(RoleProcess):
    """``judgequeue operator`` as a child process; its output (JSON lines) goes to ``log_path``."""

    def lines(self) -> list[dict[str, Any]]:
        return json_events(self.log_path)

    def text(self) -> str:
        return self.log()

    def check(self) -> None:
        if self.poll() is not None:
            raise AssertionError(f"operator exited with {self.returncode}:\n{self.text()[-3000:]}")


def start_operator(kubeconfig: Path, namespace: str | Sequence[str], log: Path, *, interval: float = 1.0,
                   extra_env: Mapping[str, str] | None = None, extra_args: Sequence[str] = ()) -> OperatorProcess:
    """Run the installed ``judgequeue operator`` command for one namespace (or several) with a short timer."""
    env = {**os.environ, "JUDGEQUEUE_LOG_LEVEL": "INFO", **(extra_env or {})}
    namespaces = [namespace] if isinstance(namespace, str) else list(namespace)
    watch = [arg for ns in namespaces for arg in ("--namespace", ns)]
    return OperatorProcess("operator", env, log, *watch, "--kubeconfig", str(kubeconfig),
                           "--interval", str(interval), *extra_args, cwd=ROOT, new_session=True, append=True)


def operator_with_secrets(kube: Cluster, namespace: str, log: Path, *, dsn: str, redis_url: str = REDIS_URL,
                          **options: Any) -> OperatorProcess:
    """An operator for ``namespace`` as a user installs one: the README's connection Secrets there
    (:func:`connection_secrets`), and ``judgequeue operator`` running as the chart's ServiceAccount
    (:func:`operator_identity`); ``options`` go to :func:`start_operator`."""
    connection_secrets(kube, namespace, dsn=dsn, redis_url=redis_url)
    return start_operator(operator_identity(kube, namespace), namespace, log, **options)


def actions(lines: Sequence[Mapping[str, Any]], action: str | None = None) -> list[dict[str, Any]]:
    """The operator's action lines (controllers/actions.py): one per create, replace, delete, cutover
    write, scale, claim or release; only ``action`` ones when given."""
    return [dict(e) for e in lines if e.get("logger") == "judgequeue.operator" and "action" in e
            and (action is None or e["action"] == action)]


def kubectl_wait(kube: Cluster, namespace: str, name: str, condition: str, *, timeout: float,
                 value: str | None = None) -> tuple[bool, float, str]:
    """``kubectl wait jq/<name> --for=condition=<condition>[=<value>]``: (met, seconds it took, output)."""
    wanted = condition if value is None else f"{condition}={value}"
    started = time.monotonic()
    result = kube.kubectl("wait", "-n", namespace, f"jq/{name}", f"--for=condition={wanted}",
                          f"--timeout={timeout:g}s", check=False, timeout=timeout + 30)
    return result.returncode == 0, time.monotonic() - started, result.stdout + result.stderr


def wait_ticks(kube: Cluster, namespace: str, name: str, ticks: int, *, check: Callable[[], None] | None = None,
               timeout: float = 30.0) -> None:
    """Wait until the operator's timer has run ``ticks`` more times on JudgeQueue ``name`` (each tick
    rewrites ``status.backlog.readAt``)."""
    def read_at() -> Any:
        return ((kube.request("GET", jq_path(namespace, name)).get("status") or {}).get("backlog") or {}).get("readAt")

    for _ in range(ticks):
        seen = read_at()
        wait_for("another timer tick", lambda seen=seen: read_at() not in (None, seen),  # type: ignore[misc]
                 timeout=timeout, check=check)


def events(kube: Cluster, namespace: str, name: str) -> list[dict[str, Any]]:
    """The Events on JudgeQueue ``name``, oldest first."""
    items = kube.request("GET", f"/api/v1/namespaces/{namespace}/events")["items"]
    return sorted((e for e in items if e["involvedObject"].get("name") == name
                   and e["involvedObject"].get("kind") == "JudgeQueue"),
                  key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime") or ""))


def warning_events(kube: Cluster, namespace: str, name: str, reason: str | None = None) -> list[dict[str, Any]]:
    """Warning Events on JudgeQueue ``name`` (of ``reason``, when given)."""
    return [e for e in events(kube, namespace, name)
            if e.get("type") == "Warning" and (reason is None or e.get("reason") == reason)]


def condition(obj: Mapping[str, Any] | None, type_: str) -> dict[str, Any]:
    for cond in ((obj or {}).get("status") or {}).get("conditions") or []:
        if cond.get("type") == type_:
            return dict(cond)
    return {}


def wait_for(what: str, probe: Callable[[], Any], *, timeout: float = 60.0,
             check: Callable[[], None] | None = None) -> Any:
    return wait_until(what, probe, timeout=timeout, interval=0.1, check=check)


def elapsed_since(start: float) -> float:
    return time.monotonic() - start


def clear_queue_keys(url: str, queue: str) -> None:
    client = redis.Redis.from_url(url)
    try:
        keys = list(client.scan_iter(match=f"jq:{{{queue}}}*", count=1000))
        if keys:
            client.delete(*keys)
    finally:
        client.close()


def ready_pods(kube: Cluster, namespace: str, component: str) -> list[dict[str, Any]]:
    pods = kube.request("GET", f"/api/v1/namespaces/{namespace}/pods?labelSelector="
                               f"app.kubernetes.io/component%3D{component}")["items"]
    return [p for p in pods if not p["metadata"].get("deletionTimestamp")
            and any(c["type"] == "Ready" and c["status"] == "True" for c in p.get("status", {}).get("conditions", []))]


def wait_rollout(kube: Cluster, namespace: str, name: str, image: str, *, timeout: float = 300.0) -> dict[str, Any]:
    """Until Deployment ``name`` runs ``image`` and nothing else: its pod template names it (whoever
    renders it, an operator or Helm), ``kubectl rollout status`` returns (every replica updated and
    available, none of an older ReplicaSet left) and its Progressing condition says so. The
    Deployment as it then is."""
    path = f"/apis/apps/v1/namespaces/{namespace}/deployments/{name}"

    def rendered() -> bool:
        found = kube.get(path)
        containers = (found or {}).get("spec", {}).get("template", {}).get("spec", {}).get("containers", [])
        return bool(containers) and all(c["image"] == image for c in containers)

    wait_for(f"deployment {namespace}/{name} rendered with {image}", rendered, timeout=timeout)
    kube.kubectl("rollout", "status", f"deployment/{name}", "-n", namespace, f"--timeout={timeout:g}s",
                 timeout=timeout + 30)
    deployment: dict[str, Any] = kube.request("GET", path)
    progressing = condition(deployment, "Progressing")
    assert progressing.get("reason") == "NewReplicaSetAvailable", (name, progressing)
    return deployment


def run_sql(dsn: str, sql: str, *args: Any) -> Any:
    """One statement on a connection of its own (these tests are synchronous: they drive processes)."""

    async def go() -> Any:
        conn = await asyncpg.connect(dsn)
        try:
            return await conn.fetch(sql, *args)
        finally:
            await conn.close()

    return asyncio.run(go())


def execute_sql(dsn: str, script: str) -> None:
    """A multi-statement script (no parameters, no results)."""

    async def go() -> None:
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute(script)
        finally:
            await conn.close()

    asyncio.run(go())


def record_figure(name: str, value: Any) -> None:
    """Record a timing figure for docs/performance.md (never asserted: timings are not test outcomes)."""
    path = os.environ.get("JUDGEQUEUE_KUBE_FIGURES")
    if not path:
        return
    try:
        with open(path) as f:
            figures = json.load(f)
    except (OSError, ValueError):
        figures = {}
    figures[name] = value
    with open(path, "w") as f:
        json.dump(figures, f, indent=2, sort_keys=True)
