"""The README's path and the operator's edges, each on the real control plane:

- ``helm install`` with the README's flags on a cluster without the Prometheus Operator's CRDs
  succeeds and says what it left out; with the CRDs the monitors are installed;
- the README's manifests apply as written (they create the namespace they use);
- switching ``worker.autoscaling`` from internal to external keeps the workers' count;
- the README's uninstall removes the CRDs Helm leaves behind (Kopf's peering kinds, with peering on;
  the JudgeQueue CRD, which the chart keeps);
- ``--liveness-address`` binds Kopf's ``/healthz`` where it says;
- docs/gitops.md's Argo CD health check calls a JudgeQueue whose reconcile failed Degraded.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.kube import tools
from tests.kube.cluster import ROOT, Cluster, free_port
from tests.kube.conftest import CHART
from tests.support.databases import REDIS_URL
from tests.unit.test_chart_gitops import health

README = ROOT / "README.md"
MONITORING_CRDS = ("podmonitors", "PodMonitor"), ("prometheusrules", "PrometheusRule")


def _install_section() -> str:
    match = re.search(r"^## Install on Kubernetes\n(.*?)(?=^## )", README.read_text(), re.S | re.M)
    assert match, 'README.md has no "Install on Kubernetes" section'
    return match.group(1)


def _readme_command(starts: str) -> list[str]:
    """The README's shell command that starts with ``starts``, continuation lines joined."""
    for block in re.findall(r"```sh\n(.*?)```", _install_section(), re.S):
        joined = block.replace("\\\n", " ")
        for line in joined.splitlines():
            if line.strip().startswith(starts):
                return shlex.split(line, comments=True)
    raise AssertionError(f"README.md's Kubernetes section has no command starting {starts!r}")


@pytest.fixture
def release(kube: Cluster) -> Iterator[tuple[str, str]]:
    suffix = uuid.uuid4().hex[:6]
    name, namespace = f"readme-{suffix}", f"readme-{suffix}"
    yield name, namespace
    kube.helm_cmd("uninstall", name, "-n", namespace, check=False)
    kube.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def _readme_install(kube: Cluster, name: str, namespace: str) -> subprocess.CompletedProcess[str]:
    """README's ``helm install``, flags and all, for a release of its own that runs no operator pod
    (``operator.replicas=0``: the tests run their own operators) and no migration Job (these are about
    the monitors; test_user_path.py and test_chart_real.py run the Job)."""
    argv = _readme_command("helm install")
    assert argv[:4] == ["helm", "install", "judgequeue", "charts/judgequeue"], argv
    flags = argv[4:]
    assert "--set" in flags and "podMonitor.enabled=true" in flags and "prometheusRule.enabled=true" in flags
    flags = [namespace if f == "judgequeue-system" else f for f in flags]
    return kube.helm_cmd("install", name, str(CHART), *flags, "--set", "operator.replicas=0",
                         "--set", f"operator.watchNamespaces={{{namespace}}}", "--set", "migrations.enabled=false",
                         check=False)


def test_readme_helm_install_without_the_prometheus_operator(kube: Cluster, release: tuple[str, str]) -> None:
    name, namespace = release
    for plural, _ in MONITORING_CRDS:
        kube.kubectl("delete", "crd", f"{plural}.monitoring.coreos.com", "--ignore-not-found", "--wait=true")
    result = _readme_install(kube, name, namespace)
    assert result.returncode == 0, result.stderr
    assert "NOT INSTALLED: PodMonitor, PrometheusRule." in result.stdout, result.stdout
    assert "--api-versions monitoring.coreos.com/v1/PodMonitor" in result.stdout
    configmaps = kube.request("GET", f"/api/v1/namespaces/{namespace}/configmaps")["items"]
    assert any(c["metadata"]["name"].endswith("-dashboard") for c in configmaps)  # no CRD needed: installed


def _monitoring_crd(plural: str, kind: str) -> dict[str, Any]:
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": f"{plural}.monitoring.coreos.com"},
            "spec": {"group": "monitoring.coreos.com", "scope": "Namespaced",
                     "names": {"kind": kind, "plural": plural, "singular": kind.lower()},
                     "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
                         "type": "object", "x-kubernetes-preserve-unknown-fields": True}}}]}}


def test_readme_helm_install_with_the_prometheus_operator(kube: Cluster, release: tuple[str, str]) -> None:
    name, namespace = release
    try:
        for plural, kind in MONITORING_CRDS:
            kube.apply(_monitoring_crd(plural, kind))
            kube.wait_established(f"{plural}.monitoring.coreos.com")
        result = _readme_install(kube, name, namespace)
        assert result.returncode == 0, result.stderr
        assert "NOT INSTALLED" not in result.stdout
        for plural, _ in MONITORING_CRDS:
            items = kube.request("GET", f"/apis/monitoring.coreos.com/v1/namespaces/{namespace}/{plural}")["items"]
            assert len(items) == 1, plural
    finally:
        kube.helm_cmd("uninstall", name, "-n", namespace, "--wait", check=False)
        for plural, _ in MONITORING_CRDS:
            kube.kubectl("delete", "crd", f"{plural}.monitoring.coreos.com", "--ignore-not-found", check=False)


def test_readme_manifests_apply_as_written(crd_installed: Cluster) -> None:
    """The README's Namespace, Secrets and JudgeQueue, applied as one user would: no namespace is
    assumed to exist."""
    blocks = re.findall(r"```yaml\n(.*?)```", _install_section(), re.S)
    manifests = [b for b in blocks if "kind: JudgeQueue" in b]
    assert len(manifests) == 1
    namespaces = {d["metadata"].get("namespace") for d in yaml.safe_load_all(manifests[0]) if d} - {None}
    assert namespaces == {"judge"}
    crd_installed.kubectl("delete", "namespace", "judge", "--ignore-not-found", "--wait=true", timeout=120)
    try:
        result = crd_installed.apply(manifests[0], check=False)
        assert result.returncode == 0, result.stderr
        assert "judgequeue.judgequeue.dev/judge created" in result.stdout
    finally:
        crd_installed.kubectl("delete", "namespace", "judge", "--wait=false", check=False)


def test_switching_to_external_autoscaling_keeps_the_workers(
    crd_installed: Cluster, namespace: str, pg_dsn: str, queue_name: str, tmp_path: Path
) -> None:
    kube = crd_installed
    operator = tools.operator_with_secrets(kube, namespace, tmp_path / "operator.log", dsn=pg_dsn)
    worker = f"/apis/apps/v1/namespaces/{namespace}/deployments/judge-worker"

    def replicas() -> int:
        return int((kube.get(worker) or {}).get("spec", {}).get("replicas", -1))

    try:
        kube.request("POST", tools.jq_path(namespace), tools.judgequeue(
            "judge", queue_name, dispatcher={"replicas": 0}, reaper={"replicas": 0},
            worker={"judge": "sleep", "minReplicas": 3, "maxReplicas": 5}))
        tools.wait_for("three workers", lambda: replicas() == 3, timeout=30, check=operator.check)
        generation = kube.request("PATCH", tools.jq_path(namespace, "judge"),
                                  {"spec": {"worker": {"autoscaling": "external"}}},
                                  content_type="application/merge-patch+json")["metadata"]["generation"]
        assert kube.request("GET", tools.jq_path(namespace, "judge"))["spec"]["worker"]["replicas"] == 1

        def switched() -> bool:
            status = kube.request("GET", tools.jq_path(namespace, "judge")).get("status") or {}
            return bool(status.get("observedGeneration") == generation
                        and (status.get("workers") or {}).get("autoscaling") == "external")

        tools.wait_for("the switch observed", switched, timeout=30, check=operator.check)
        tools.wait_ticks(kube, namespace, "judge", 3, check=operator.check)
        assert replicas() == 3, "the workers dropped to spec.worker.replicas at once"
        status = kube.request("GET", tools.jq_path(namespace, "judge"))["status"]
        assert status["autoscaling"]["handoffReplicas"] == 1 and status["autoscaling"]["externalSince"] > 0
        # The external scaler's first word is followed at once.
        kube.kubectl("scale", "-n", namespace, "jq/judge", "--replicas=4")
        tools.wait_for("the scaler's count", lambda: replicas() == 4, timeout=15, check=operator.check)
    finally:
        operator.stop()


def test_readme_uninstall_removes_the_crds_helm_leaves(kube: Cluster, release: tuple[str, str]) -> None:
    name, namespace = release
    peering = ("kopfpeerings.kopf.dev", "clusterkopfpeerings.kopf.dev")
    for crd in peering:  # this release's install brings them (peering on), whatever ran before
        kube.kubectl("delete", "crd", crd, "--ignore-not-found", "--wait=true")
    result = kube.helm_cmd("install", name, str(CHART), "-n", namespace, "--create-namespace",
                           "--set", "operator.replicas=0", "--set", f"operator.watchNamespaces={{{namespace}}}",
                           "--set", "operator.peering.enabled=true", "--set", "migrations.enabled=false")
    assert result.returncode == 0, result.stderr
    kube.helm_cmd("uninstall", name, "-n", namespace, "--wait")
    for crd in peering:  # Helm's rule: crds/ (here the kopf-peering subchart's) are never deleted
        assert kube.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd}") is not None
    # Kept too, by helm.sh/resource-policy: keep (or never this release's: then not Helm's to delete).
    assert kube.get("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/judgequeues.judgequeue.dev")
    argv = _readme_command("kubectl delete crd")
    named = argv[3:]
    assert set(peering) <= set(named) and "judgequeues.judgequeue.dev" in named, argv
    # The README's command, less the JudgeQueue CRD (this session's other tests still use it).
    kube.kubectl("delete", "crd", *[c for c in named if c in peering], "--wait=true")
    for crd in peering:
        assert kube.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd}") is None


def test_liveness_binds_the_address_it_is_given(crd_installed: Cluster, namespace: str, tmp_path: Path) -> None:
    port = free_port()
    operator = tools.start_operator(tools.operator_identity(crd_installed, namespace), namespace,
                                    tmp_path / "operator.log",
                                    extra_args=["--liveness-port", str(port), "--liveness-address", "127.0.0.2"])
    try:
        def healthy() -> bool:
            with urllib.request.urlopen(f"http://127.0.0.2:{port}/healthz", timeout=2) as response:
                return bool(response.status == 200)

        tools.wait_for("/healthz on 127.0.0.2", healthy, timeout=30, check=operator.check)
        with pytest.raises(OSError):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2)
    finally:
        operator.stop()


def test_argo_cd_calls_a_failed_judgequeue_degraded(
    crd_installed: Cluster, namespace: str, pg_dsn: str, queue_name: str, tmp_path: Path
) -> None:
    """A reconcile that fails (a child refused by a quota) gives Argo CD's health check a Degraded
    JudgeQueue with the API server's message, not "Waiting for the operator to observe generation 1"."""
    kube = crd_installed
    tools.connection_secrets(kube, namespace, dsn=pg_dsn, redis_url=REDIS_URL)
    kube.request("POST", f"/api/v1/namespaces/{namespace}/resourcequotas", {
        "apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "no-services"},
        "spec": {"hard": {"services": "0"}}})
    operator = tools.start_operator(tools.operator_identity(kube, namespace), namespace, tmp_path / "operator.log")
    try:
        kube.request("POST", tools.jq_path(namespace), tools.judgequeue(
            "judge", queue_name, dispatcher={"replicas": 0}, reaper={"replicas": 0},
            worker={"judge": "sleep", "minReplicas": 0, "maxReplicas": 1}))
        met, _, out = tools.kubectl_wait(kube, namespace, "judge", "Degraded", timeout=15)
        assert met, out
        status, message = health(kube.request("GET", tools.jq_path(namespace, "judge")))
        assert status == "Degraded", message
        assert message.startswith("ChildRefused: Service judge-metrics:") and "exceeded quota" in message, message
    finally:
        operator.stop()
