"""The chart with the real helm binary against the real API server, beyond the README's default path."""

from __future__ import annotations

import uuid

from tests.kube.cluster import Cluster
from tests.kube.conftest import CHART

PEERING_CRDS = ("kopfpeerings.kopf.dev", "clusterkopfpeerings.kopf.dev")


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
