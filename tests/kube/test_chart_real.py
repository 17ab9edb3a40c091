"""The chart with the real helm binary against the real API server, beyond the README's default path."""

from __future__ import annotations

import uuid

from tests.kube.cluster import Cluster
from tests.kube.conftest import CHART

PEERING_CRDS = ("kopfpeerings.kopf.dev", "clusterkopfpeerings.kopf.dev")
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"


def test_peering_install_ships_its_crds(kube: Cluster) -> None:
    """peering.enabled renders KopfPeering objects; the chart must bring their CRDs."""
    for crd in PEERING_CRDS:  # a cluster without Kopf's CRDs, whatever ran before
        kube.kubectl("delete", "crd", crd, "--ignore-not-found", "--wait=true")
    suffix = uuid.uuid4().hex[:6]
    release, namespaces = f"peer-{suffix}", [f"judge-a-{suffix}", f"judge-b-{suffix}"]
    for ns in namespaces:
        kube.create_namespace(ns)
    result = kube.helm_cmd(
        "install", release, str(CHART), "-n", namespaces[0], "-f", str(CHART / "ci" / "peering-values.yaml"),
        "--set", f"operator.watchNamespaces={{{','.join(namespaces)}}}", "--set", "operator.replicas=1",
        check=False)
    try:
        assert result.returncode == 0, result.stderr
        for ns in namespaces:
            assert kube.get(f"/apis/kopf.dev/v1/namespaces/{ns}/kopfpeerings/judgequeue-peering") is not None
    finally:
        kube.helm_cmd("uninstall", release, "-n", namespaces[0], "--wait", check=False)
        for ns in namespaces:
            kube.kubectl("delete", "namespace", ns, "--wait=false", check=False)


def test_install_without_peering_brings_no_peering_crds(kube: Cluster) -> None:
    """Kopf's peering CRDs come with operator.peering.enabled only (the kopf-peering subchart it
    enables); a default install leaves a cluster without them as it was."""
    for crd in PEERING_CRDS:
        kube.kubectl("delete", "crd", crd, "--ignore-not-found", "--wait=true")
    suffix = uuid.uuid4().hex[:6]
    release = namespace = f"nopeer-{suffix}"
    result = kube.helm_cmd("install", release, str(CHART), "-n", namespace, "--create-namespace",
                           "--set", "operator.replicas=0", "--set", f"operator.watchNamespaces={{{namespace}}}",
                           check=False)
    try:
        assert result.returncode == 0, result.stderr
        for crd in PEERING_CRDS:
            assert kube.get(f"{CRDS}/{crd}") is None, f"{crd} installed with peering off"
    finally:
        kube.helm_cmd("uninstall", release, "-n", namespace, "--wait", check=False)
        kube.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def test_peering_crds_render_only_with_peering(kube: Cluster) -> None:
    """``helm template --include-crds`` (what Argo CD and a GitOps pipeline apply): the peering CRDs
    are in it with peering on, and not otherwise."""
    version = kube.version.lstrip("v")
    plain = kube.helm_cmd("template", "x", str(CHART), "--include-crds", "--kube-version", version).stdout
    peering = kube.helm_cmd("template", "x", str(CHART), "--include-crds", "--kube-version", version,
                            "-f", str(CHART / "ci" / "peering-values.yaml")).stdout
    for crd in PEERING_CRDS:
        assert f"name: {crd}" not in plain
        assert f"name: {crd}" in peering
    for rendered in (plain, peering):  # the JudgeQueue CRD is a template: there either way
        assert "name: judgequeues.judgequeue.dev" in rendered


def test_chart_claims_the_kube_version_it_is_checked_on(kube: Cluster) -> None:
    """helm refuses a cluster older than kubeVersion; the pinned current one is inside the claim."""
    rendered = kube.helm_cmd("template", "x", str(CHART), "--kube-version", "1.29.0", check=False)
    assert rendered.returncode != 0 and "kubeVersion" in rendered.stderr
    rendered = kube.helm_cmd("template", "x", str(CHART), "--kube-version", kube.version.lstrip("v"))
    assert "kind: Deployment" in rendered.stdout


def test_helm_lint_strict_with_every_ci_values_file(kube: Cluster) -> None:
    """The real helm binary lints the chart with each values file the chart's ci/ folder ships."""
    for values in sorted((CHART / "ci").glob("*.yaml")):
        result = kube.helm_cmd("lint", "--strict", str(CHART), "-f", str(values), "--kube-version",
                               kube.version.lstrip("v"), check=False)
        assert result.returncode == 0, (values.name, result.stdout, result.stderr)
