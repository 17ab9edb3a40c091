"""Render the children of a ``JudgeQueue`` from its validated spec (pure; no I/O).

Three Deployments (dispatcher, worker, reaper) run the one image with ``judgequeue <role>``, each with
only the ``JUDGEQUEUE_*`` variables its role reads (so a dispatcher-only change rolls only the
dispatchers), a Service exposes every pod's metrics port, and workers that run the program judge get
an egress NetworkPolicy. With ``spec.worker.shadow.enabled`` a fourth Deployment,
``<name>-shadow-worker``, runs workers with ``JUDGEQUEUE_SHADOW=judge`` (shadow judging: the same
judge, sandbox, resources and egress policy as the workers), scaled to none once the queue row is live.
Connections come from the referenced Secrets as files of a projected volume
(``JUDGEQUEUE_*_FILE`` names them); the operator never copies credentials into a child, and no
credential is ever an environment variable of a pod.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from judgequeue.core.config import FILE_SUFFIX, JUDGE_REFUSED_VARIABLE
from judgequeue.core.spec import (
    ENDPOINT_URL_DIR,
    NAME_MAX_LENGTH,
    EgressPeer,
    JudgeQueueSpec,
    endpoint_secrets,
    parse_quantity,
    role_secrets,
    role_settings,
    webhook_secrets,
)
from judgequeue.core.spec import ROLES as ROLES
from judgequeue.core.spec import Role as Role

GROUP = "judgequeue.dev"
VERSION = "v1alpha1"
KIND = "JudgeQueue"
PLURAL = "judgequeues"
API_VERSION = f"{GROUP}/{VERSION}"

METRICS_PORT = 9090
GRACE_MARGIN_SECONDS = 10
ROLE_GRACE_SECONDS = 30
RUN_AS_USER = 10001
MANAGED_BY = "judgequeue-operator"

#: Connections reach the roles as files of one projected Secret volume (core/config.py reads the
#: ``*_FILE`` variables), mode 0440: the container's user, or the pod's fsGroup.
CREDENTIALS_DIR = "/var/run/secrets/judgequeue"
assert CREDENTIALS_DIR == ENDPOINT_URL_DIR  # endpoint URLs from Secrets are mounted in the same volume
CREDENTIALS_VOLUME = "credentials"
CREDENTIALS_MODE = 0o440

#: What the program judge's sandbox needs in a worker container (docs/judges.md, "On Kubernetes"):
#: root inside the container to give each box its own uid (SETUID/SETGID), own and clean its
#: directory (CHOWN, DAC_OVERRIDE, FOWNER) and kill what is left of it (KILL); user namespaces, which
#: RuntimeDefault seccomp forbids, for bubblewrap; and a writable cgroup v1 hierarchy for the limits.
SANDBOX_CAPABILITIES = ("SETUID", "SETGID", "CHOWN", "DAC_OVERRIDE", "FOWNER", "KILL")
CGROUP_ROOT = "/sys/fs/cgroup"
MIB = 1024 * 1024
WORKER_BASE_MEMORY_MIB = 256  # the worker process itself
PER_SLOT_MEMORY_MIB = 1024  # the limit: one box at a time per slot; compiling is the largest (1 GiB)
PER_SLOT_REQUEST_MIB = 256  # the request: what a slot's box typically holds (a run, not a compile)
DNS_PORT = 53
#: Dispatchers and reapers without explicit ``resources``: peak RSS is ~41 MB under the end-to-end
#: load (docs/performance.md), so 128Mi requested and 256Mi as the ceiling; a whole core at most.
DEFAULT_ROLE_RESOURCES: dict[str, dict[str, str]] = {
    "requests": {"cpu": "100m", "memory": "128Mi"},
    "limits": {"cpu": "1", "memory": "256Mi"},
}


@dataclass(frozen=True)
class Owner:
    """The JudgeQueue object that owns the children."""

    name: str
    namespace: str
    uid: str


@dataclass(frozen=True)
class Child:
    """One rendered object: its API coordinates and full desired body."""

    api_version: str
    kind: str
    name: str
    body: dict[str, Any]


#: The component (and name suffix) of the shadow workers' Deployment.
SHADOW_WORKER: Literal["shadow-worker"] = "shadow-worker"


def child_name(owner: str, role: Role | Literal["metrics", "shadow-worker"]) -> str:
    return f"{owner}-{role}"


def name_errors(owner: str) -> list[str]:
    """Why ``owner`` cannot name a JudgeQueue's children (empty if it can): the longest child name,
    ``<name>-worker-egress``, must fit 63 characters, as must the metrics Service's, a DNS label. The
    CRD refuses such a name at the door (metadata.name maxLength); this catches an object stored
    before that rule."""
    longest = network_policy_name(owner)
    if len(owner) > NAME_MAX_LENGTH:
        return [f"metadata.name: {owner!r} is {len(owner)} characters; at most {NAME_MAX_LENGTH}, so that"
                f" child names such as {longest!r} ({len(longest)}) fit 63"]
    return []


def selector_labels(owner: str, role: Role | None = None) -> dict[str, str]:
    """Labels that select pods; stable forever because Deployment selectors are immutable."""
    labels = {"app.kubernetes.io/name": "judgequeue", "app.kubernetes.io/instance": owner}
    if role is not None:
        labels["app.kubernetes.io/component"] = role
    return labels


def common_labels(owner: str, role: str) -> dict[str, str]:
    return {
        **selector_labels(owner),
        "app.kubernetes.io/component": role,
        "app.kubernetes.io/part-of": "judgequeue",
        "app.kubernetes.io/managed-by": MANAGED_BY,
    }


def owner_reference(owner: Owner) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": owner.name,
        "uid": owner.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def credential_file(variable: str) -> str:
    """Where the pod finds the value of connection ``variable`` (``JUDGEQUEUE_POSTGRES_DSN`` ->
    ``/var/run/secrets/judgequeue/postgres-dsn``)."""
    return f"{CREDENTIALS_DIR}/{variable.removeprefix('JUDGEQUEUE_').lower().replace('_', '-')}"


def credentials_volume(spec: JudgeQueueSpec, role: Role) -> dict[str, Any]:
    """One projected volume with exactly the Secret keys ``role`` reads, each at its
    :func:`credential_file` name, readable by the owner and the pod's fsGroup only."""
    sources = [
        {"secret": {"name": ref.name, "items": [{"key": ref.key, "path": credential_file(name).rsplit("/", 1)[1]}]}}
        for name, ref in role_secrets(spec, role).items()
    ]
    if role == "worker":  # the http-call judge's endpoint URLs kept in Secrets, beside the connections
        sources += [
            {"secret": {"name": ref.name, "items": [{"key": ref.key, "path": path}]}}
            for path, ref in endpoint_secrets(spec).items()
        ]
    if role == "reaper":  # the webhooks' URLs and signing keys kept in Secrets, beside the connections
        sources += [
            {"secret": {"name": ref.name, "items": [{"key": ref.key, "path": path}]}}
            for path, ref in webhook_secrets(spec).items()
        ]
    return {"name": CREDENTIALS_VOLUME, "projected": {"sources": sources, "defaultMode": CREDENTIALS_MODE}}


def role_env(spec: JudgeQueueSpec, role: Role) -> list[dict[str, Any]]:
    """One role's environment: where the connections it reads are mounted, as ``*_FILE`` variables
    (the values come from the Secrets as files, never as environment variables, which any process of
    the pod's uid can read from ``/proc``; the dispatcher's direct LISTEN DSN only to dispatchers,
    :func:`judgequeue.core.spec.role_secrets`), the metrics port, then exactly the ``JUDGEQUEUE_*``
    settings the role reads (:func:`judgequeue.core.spec.role_settings`)."""
    env: list[dict[str, Any]] = [
        {"name": f"{name}{FILE_SUFFIX}", "value": credential_file(name)} for name in role_secrets(spec, role)
    ]
    env.append({"name": "JUDGEQUEUE_METRICS_PORT", "value": str(METRICS_PORT)})
    env.extend({"name": k, "value": v} for k, v in role_settings(spec, role).items())
    env.extend({"name": k, "value": v} for k, v in pod_only_settings(role).items())
    return env


def pod_only_settings(role: Role) -> dict[str, str]:
    """Variables a pod gets that ``judgequeue local`` does not: a worker whose judge cannot isolate
    stays up and unready, naming what is missing on ``/readyz`` (a local worker exits instead)."""
    return {JUDGE_REFUSED_VARIABLE: "unready"} if role == "worker" else {}


def _resources(resources: Mapping[str, Any]) -> dict[str, Any]:
    return {k: {n: str(a) for n, a in v.items()} for k, v in resources.items() if k in ("requests", "limits") and v}


def sandboxed(spec: JudgeQueueSpec, role: Role) -> bool:
    """Worker pods that run the program judge with its sandbox get the privileges it needs."""
    return role == "worker" and spec.worker.judge == "program" and spec.worker.sandbox == "isolated"


def default_worker_resources(spec: JudgeQueueSpec) -> dict[str, dict[str, str]]:
    """Requests and limits for workers whose spec sets none. The limit has room for every slot's
    largest box at once (a compile, 1 GiB); the request, what the scheduler reserves, a typical box
    per slot, so a worker of the largest concurrency (64) still fits a node (16.25 GiB requested). An
    http-call worker runs no boxes: the process alone, whatever its concurrency."""
    c = spec.worker.concurrency
    if spec.worker.judge == "http-call":
        # Its slots wait on sockets: no box per slot, an answer of at most 1 MiB each (64 at most).
        return {"requests": {"cpu": "250m", "memory": f"{WORKER_BASE_MEMORY_MIB}Mi"},
                "limits": {"cpu": "1", "memory": f"{2 * WORKER_BASE_MEMORY_MIB}Mi"}}
    return {
        "requests": {"cpu": "500m", "memory": f"{WORKER_BASE_MEMORY_MIB + c * PER_SLOT_REQUEST_MIB}Mi"},
        "limits": {"cpu": str(c), "memory": f"{WORKER_BASE_MEMORY_MIB + c * PER_SLOT_MEMORY_MIB}Mi"},
    }


#: The CPU shadow workers request unless ``spec.worker.shadow.resources`` says otherwise: on a node shared
#: with live workers (which request 500m by default) they take idle CPU and yield under contention, as
#: Kubernetes turns requests into CPU shares (docs/performance.md, "Shadow judging beside live queues").
SHADOW_CPU_REQUEST = "100m"


def shadow_resources(workers: Mapping[str, Any]) -> dict[str, Any]:
    """Shadow workers' resources from the workers' (pure): the same limits and memory, and a CPU request
    of :data:`SHADOW_CPU_REQUEST` (no more than a CPU limit below it)."""
    out = {k: dict(v) for k, v in workers.items()}
    requests = out.setdefault("requests", {})
    limit = out.get("limits", {}).get("cpu")
    low = parse_quantity(SHADOW_CPU_REQUEST)
    request = SHADOW_CPU_REQUEST
    if limit is not None and (value := parse_quantity(limit)) is not None and low is not None and value < low:
        request = str(limit)
    requests["cpu"] = request
    return out


def termination_grace_seconds(spec: JudgeQueueSpec, role: Role) -> int:
    """Workers get their in-flight grace period plus a margin for shutdown; others a fixed 30s."""
    if role == "worker":
        return math.ceil(spec.worker.grace_period) + GRACE_MARGIN_SECONDS
    return ROLE_GRACE_SECONDS


def render_deployment(
    spec: JudgeQueueSpec, owner: Owner, role: Role, *, replicas: int | None, shadow: bool = False
) -> Child:
    """One role's Deployment; ``replicas=None`` leaves the count to someone else (autoscaler, HPA).
    ``shadow`` (workers only): the shadow workers' Deployment, a worker's with ``JUDGEQUEUE_SHADOW=judge``
    under a component of its own."""
    component: Role | Literal["shadow-worker"] = SHADOW_WORKER if shadow else role
    name = child_name(owner.name, component)
    labels = common_labels(owner.name, component)
    container = _container(spec, role, shadow=shadow)
    pod = _pod_spec(spec, role, container)
    spec_body: dict[str, Any] = {
        "progressDeadlineSeconds": max(1, math.ceil(spec.progress_deadline)),
        "selector": {"matchLabels": {**selector_labels(owner.name), "app.kubernetes.io/component": component}},
        "template": {"metadata": {"labels": labels}, "spec": pod},
    }
    if replicas is not None:
        spec_body["replicas"] = replicas
    body = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": name,
            "namespace": owner.namespace,
            "labels": labels,
            "ownerReferences": [owner_reference(owner)],
        },
        "spec": spec_body,
    }
    return Child("apps/v1", "Deployment", name, body)


def _container(spec: JudgeQueueSpec, role: Role, *, shadow: bool) -> dict[str, Any]:
    """The role's one container: its command and environment, probes on the metrics port, a locked
    down security context, and its resources."""
    container: dict[str, Any] = {
        "name": role,
        "image": spec.image,
        "imagePullPolicy": spec.image_pull_policy,
        "args": [role],
        "command": ["judgequeue"],
        "env": role_env(spec, role) + ([{"name": "JUDGEQUEUE_SHADOW", "value": "judge"}] if shadow else []),
        "ports": [{"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"}],
        "livenessProbe": {
            "httpGet": {"path": "/healthz", "port": "metrics"},
            "periodSeconds": 10,
            "timeoutSeconds": 2,
            "failureThreshold": 3,
        },
        "readinessProbe": {
            "httpGet": {"path": "/readyz", "port": "metrics"},
            "periodSeconds": 5,
            "timeoutSeconds": 2,
            "failureThreshold": 2,
        },
        "securityContext": {
            "runAsNonRoot": True,
            "readOnlyRootFilesystem": True,
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"},
                         {"name": CREDENTIALS_VOLUME, "mountPath": CREDENTIALS_DIR, "readOnly": True}],
        # A role that exits on bad configuration writes its one error line to the termination log
        # (and prints it last): either way the pod's status carries it, and the operator reports it.
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    resources = _container_resources(spec, role, shadow=shadow)
    if resources:
        container["resources"] = resources
    return container


def _container_resources(spec: JudgeQueueSpec, role: Role, *, shadow: bool) -> dict[str, Any]:
    """The spec's resources for the role (shadow workers: their own, else the workers' shrunk by
    :func:`shadow_resources`), or the defaults when the spec gives none."""
    resources = {"dispatcher": spec.dispatcher.resources, "worker": spec.worker.resources,
                 "reaper": spec.reaper.resources}[role]
    own = shadow and bool(spec.worker.shadow.resources)
    if own:
        resources = spec.worker.shadow.resources
    rendered = _resources(resources)
    if not rendered:
        rendered = default_worker_resources(spec) if role == "worker" else dict(DEFAULT_ROLE_RESOURCES)
    if shadow and not own:
        rendered = shadow_resources(rendered)
    return rendered


def _pod_spec(spec: JudgeQueueSpec, role: Role, container: dict[str, Any]) -> dict[str, Any]:
    """The pod around the container: non-root, RuntimeDefault seccomp, no service account token, the
    credential files' volume; a sandboxing worker gets what its boxes need (:func:`_grant_sandbox`)."""
    pod: dict[str, Any] = {
        "containers": [container],
        "terminationGracePeriodSeconds": termination_grace_seconds(spec, role),
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": RUN_AS_USER,
            "runAsGroup": RUN_AS_USER,
            "fsGroup": RUN_AS_USER,  # the group that may read the credential files
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "automountServiceAccountToken": False,
        "volumes": [{"name": "tmp", "emptyDir": {}}, credentials_volume(spec, role)],
    }
    if role == "worker" and spec.worker.priority_class is not None:
        pod["priorityClassName"] = spec.worker.priority_class
    if sandboxed(spec, role):
        _grant_sandbox(container, pod)
    return pod


def _grant_sandbox(container: dict[str, Any], pod: dict[str, Any]) -> None:
    """Root in the container with only the sandbox's capabilities, unconfined seccomp (bubblewrap
    makes user namespaces and loads its own allow-list into every box) and the node's cgroup v1
    hierarchy writable for the boxes' groups."""
    container["securityContext"] = {
        "runAsUser": 0,
        "runAsGroup": 0,
        "runAsNonRoot": False,
        "readOnlyRootFilesystem": True,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"], "add": list(SANDBOX_CAPABILITIES)},
        "seccompProfile": {"type": "Unconfined"},
    }
    container["volumeMounts"] = [*container["volumeMounts"], {"name": "cgroup", "mountPath": CGROUP_ROOT}]
    pod["securityContext"] = {"seccompProfile": {"type": "RuntimeDefault"}}
    pod["volumes"] = [*pod["volumes"], {"name": "cgroup", "hostPath": {"path": CGROUP_ROOT, "type": "Directory"}}]


def render_service(owner: Owner) -> Child:
    """A Service over every role's metrics port (for a ServiceMonitor or a scrape config)."""
    name = child_name(owner.name, "metrics")
    body = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": name,
            "namespace": owner.namespace,
            "labels": common_labels(owner.name, "metrics"),
            "ownerReferences": [owner_reference(owner)],
        },
        "spec": {
            "selector": selector_labels(owner.name),
            "ports": [{"name": "metrics", "port": METRICS_PORT, "targetPort": "metrics", "protocol": "TCP"}],
        },
    }
    return Child("v1", "Service", name, body)


def network_policy_name(owner: str) -> str:
    return f"{child_name(owner, 'worker')}-egress"


def wants_network_policy(spec: JudgeQueueSpec) -> bool:
    """Workers that run the program judge (isolated or trusted) get the egress policy unless disabled."""
    return spec.worker.judge == "program" and spec.worker.network_policy.enabled


def _egress_rule(peer: EgressPeer, ports: list[int]) -> dict[str, Any]:
    rule: dict[str, Any] = {"ports": [{"protocol": "TCP", "port": p} for p in ports]}
    if peer.cidr is not None:
        rule["to"] = [{"ipBlock": {"cidr": peer.cidr}}]
    return rule


def render_network_policy(spec: JudgeQueueSpec, owner: Owner) -> Child:
    """The worker pods' egress allow-list: DNS (UDP and TCP 53) anywhere, Postgres' port and Redis'
    (and Sentinel's) ports, each to its CIDR if the spec names one. Nothing else leaves a worker pod,
    so code that escaped its box still reaches neither the cloud's metadata service, nor the API
    server, nor the internet. Ingress (metrics scrapes) is not restricted."""
    policy = spec.worker.network_policy
    redis_ports = [policy.redis.port] + ([policy.sentinel_port] if policy.sentinel_port else [])
    selector: dict[str, Any] = {"matchLabels": selector_labels(owner.name, "worker")}
    if spec.worker.shadow.enabled:  # shadow workers run the same untrusted code
        selector = {"matchLabels": selector_labels(owner.name),
                    "matchExpressions": [{"key": "app.kubernetes.io/component", "operator": "In",
                                          "values": ["worker", SHADOW_WORKER]}]}
    name = network_policy_name(owner.name)
    body = {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": name,
            "namespace": owner.namespace,
            "labels": common_labels(owner.name, "worker"),
            "ownerReferences": [owner_reference(owner)],
        },
        "spec": {
            "podSelector": selector,
            "policyTypes": ["Egress"],
            "egress": [
                {"ports": [{"protocol": "UDP", "port": DNS_PORT}, {"protocol": "TCP", "port": DNS_PORT}]},
                _egress_rule(policy.postgres, [policy.postgres.port]),
                _egress_rule(policy.redis, redis_ports),
            ],
        },
    }
    return Child("networking.k8s.io/v1", "NetworkPolicy", name, body)


def render_children(
    spec: JudgeQueueSpec, owner: Owner, *, worker_replicas: int | None, shadow_mode: bool = False
) -> list[Child]:
    """Everything the JudgeQueue owns, in creation order. ``shadow_mode``: the queue row is in shadow
    mode, so shadow workers (if enabled) run their replicas; otherwise none."""
    children = [
        render_deployment(spec, owner, "dispatcher", replicas=spec.dispatcher.replicas),
        render_deployment(spec, owner, "worker", replicas=worker_replicas),
        render_deployment(spec, owner, "reaper", replicas=spec.reaper.replicas),
        render_service(owner),
    ]
    if spec.worker.shadow.enabled:
        children.append(render_deployment(spec, owner, "worker", shadow=True,
                                          replicas=spec.worker.shadow.replicas if shadow_mode else 0))
    if wants_network_policy(spec):
        children.append(render_network_policy(spec, owner))
    return children


def optional_children(owner: Owner) -> list[tuple[str, str]]:
    """(kind, name) of every child the operator may render or not: one that is live but no longer
    rendered is deleted."""
    return [("NetworkPolicy", network_policy_name(owner.name)), ("Deployment", child_name(owner.name, SHADOW_WORKER))]


def clamp(value: int, lo: int, hi: int) -> int:
    return max(lo, min(hi, value))


def worker_replicas(spec: JudgeQueueSpec, live: int | None) -> int | None:
    """The worker count reconcile asks for, given the live Deployment's (None if it does not exist).

    Internal autoscaling: the autoscaler owns the count, reconcile only pulls it into the bounds.
    External: ``spec.worker.replicas`` (the scale subresource) if set, else hands off entirely.
    """
    w = spec.worker
    if w.autoscaling == "external":
        if w.replicas is not None:
            return w.replicas
        return None if live is not None else w.min_replicas
    if live is None:
        return w.min_replicas
    return clamp(live, w.min_replicas, w.max_replicas)
