"""The chart with the real helm binary against the real API server, beyond the README's default path."""

from __future__ import annotations

import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.kube.cluster import ROOT, Cluster
from tests.kube.conftest import CHART
from tests.kube.node import NodeAgent
from tests.kube.tools import run_sql
from tests.support.databases import ADMIN_DSN

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
        "--set", "migrations.enabled=false", check=False)
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
                           "--set", "migrations.enabled=false", check=False)
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


def test_helm_template_renders_offline_without_a_kube_version(kube: Cluster) -> None:
    """``helm template`` with no cluster and no --kube-version assumes helm's default Kubernetes
    version: the one of the client-go helm was built with (build-kube links it as helm's release
    builds do), which the chart's kubeVersion accepts. A plain ``go build`` of helm assumes v1.20.0
    and refused the chart ("incompatible with Kubernetes v1.20.0")."""
    rendered = kube.helm_cmd("template", "x", str(CHART), check=False)
    assert rendered.returncode == 0, rendered.stderr
    assert "kind: Deployment" in rendered.stdout and "kind: Job" in rendered.stdout


def test_helm_lint_strict_with_every_ci_values_file(kube: Cluster) -> None:
    """The real helm binary lints the chart with each values file the chart's ci/ folder ships."""
    for values in sorted((CHART / "ci").glob("*.yaml")):
        result = kube.helm_cmd("lint", "--strict", str(CHART), "-f", str(values), "--kube-version",
                               kube.version.lstrip("v"), check=False)
        assert result.returncode == 0, (values.name, result.stdout, result.stderr)


# --- the migration hook Job ---------------------------------------------------------------------------


class Watched:
    """A helm command run in a thread while the test watches the API server for the migration Job
    (a hook-succeeded Job is gone by the time helm returns)."""

    def __init__(self, kube: Cluster, job_path: str, *args: str) -> None:
        self.kube, self.job_path = kube, job_path
        self.result: subprocess.CompletedProcess[str] | None = None
        self.jobs: list[dict[str, Any]] = []
        thread = threading.Thread(target=self._run, args=args, daemon=True)
        thread.start()
        while thread.is_alive():
            job = kube.get(job_path)
            if job is not None:
                self.jobs.append(job)
            time.sleep(0.2)
        thread.join()

    def _run(self, *args: str) -> None:
        self.result = self.kube.helm_cmd(*args, check=False, timeout=240)


@pytest.fixture
def migration_release(kube: Cluster, node: NodeAgent) -> Iterator[tuple[str, str, str]]:
    """A release name, its namespace (with the migrations Secret) and a new database the Secret names."""
    suffix = uuid.uuid4().hex[:6]
    release = namespace = f"mig-{suffix}"
    database = f"jq_kube_mig_{suffix}"
    dsn = ADMIN_DSN.rsplit("/", 1)[0] + f"/{database}"
    run_sql(ADMIN_DSN, f'CREATE DATABASE "{database}"')
    kube.apply(yaml.safe_dump_all([
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "db-owner", "namespace": namespace},
         "type": "Opaque", "stringData": {"owner-dsn": dsn}},
    ]))
    try:
        yield release, namespace, dsn
    finally:
        kube.helm_cmd("uninstall", release, "-n", namespace, "--wait", check=False)
        kube.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
        run_sql(ADMIN_DSN, f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')


def _migrated(dsn: str) -> list[int]:
    rows = run_sql(dsn, "SELECT to_regclass('judgequeue.schema_migrations') IS NOT NULL AS migrated")
    if not rows[0]["migrated"]:
        return []
    return [r["version"] for r in run_sql(dsn, "SELECT version FROM judgequeue.schema_migrations ORDER BY version")]


def test_install_and_upgrade_run_the_migration_hook_job(
    kube: Cluster, migration_release: tuple[str, str, str]
) -> None:
    """``helm install`` creates the migration Job with its hook annotations before anything of the
    release, waits for it (the node agent runs ``judgequeue migrate`` with the DSN read from the
    mounted Secret) and deletes it once it succeeded; ``helm upgrade`` runs it again."""
    release, namespace, dsn = migration_release
    job_path = f"/apis/batch/v1/namespaces/{namespace}/jobs/{release}-judgequeue-migrations"
    settings = ("--set", "operator.replicas=0", "--set", f"operator.watchNamespaces={{{namespace}}}",
                "--set", "migrations.postgres.secretKeyRef.name=db-owner",
                "--set", "migrations.postgres.secretKeyRef.key=owner-dsn")
    assert _migrated(dsn) == []
    installed = Watched(kube, job_path, "install", release, str(CHART), "-n", namespace, *settings,
                        "--wait", "--timeout", "3m")
    assert installed.result is not None and installed.result.returncode == 0, installed.result
    assert installed.jobs, "the migration Job was never seen"
    job = installed.jobs[0]
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade"
    assert job["metadata"]["annotations"]["helm.sh/hook-delete-policy"] == "before-hook-creation,hook-succeeded"
    assert job["spec"]["backoffLimit"] == 2
    pod = job["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["containers"][0]["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert pod["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is True
    assert {v["name"]: v for v in pod["volumes"]}["postgres"]["secret"]["secretName"] == "db-owner"
    assert _migrated(dsn), "the hook ran but the database has no schema"
    assert kube.get(job_path) is None, "hook-succeeded: the finished Job is deleted"
    assert "Database: migrated" in installed.result.stdout

    run_sql(dsn, "DROP SCHEMA judgequeue CASCADE")  # what an upgrade's migrations would find to do
    upgraded = Watched(kube, job_path, "upgrade", release, str(CHART), "-n", namespace, *settings,
                       "--wait", "--timeout", "3m")
    assert upgraded.result is not None and upgraded.result.returncode == 0, upgraded.result
    assert upgraded.jobs, "pre-upgrade: the migration Job runs on upgrade too"
    assert _migrated(dsn), "the upgrade's hook did not migrate"
    assert kube.get(job_path) is None


def test_a_failed_migration_stops_the_install_and_keeps_its_job(
    kube: Cluster, migration_release: tuple[str, str, str]
) -> None:
    """A migration that fails (here: a database nobody listens for) fails ``helm install`` before
    the operator is created, and leaves the Job for ``kubectl logs`` (no hook-succeeded)."""
    release, namespace, _ = migration_release
    kube.apply(yaml.safe_dump({"apiVersion": "v1", "kind": "Secret",
                               "metadata": {"name": "db-owner", "namespace": namespace}, "type": "Opaque",
                               "stringData": {"owner-dsn": "postgresql://nobody@127.0.0.1:9/none"}}))
    job_path = f"/apis/batch/v1/namespaces/{namespace}/jobs/{release}-judgequeue-migrations"
    result = kube.helm_cmd("install", release, str(CHART), "-n", namespace, "--set", "operator.replicas=0",
                           "--set", f"operator.watchNamespaces={{{namespace}}}",
                           "--set", "migrations.postgres.secretKeyRef.name=db-owner",
                           "--set", "migrations.postgres.secretKeyRef.key=owner-dsn",
                           "--set", "migrations.backoffLimit=0", "--timeout", "2m", check=False, timeout=180)
    assert result.returncode != 0
    assert "pre-install" in result.stderr and "migrations" in result.stderr, result.stderr
    job = kube.get(job_path)
    assert job is not None and (job.get("status") or {}).get("failed"), job
    deployments = kube.request("GET", f"/apis/apps/v1/namespaces/{namespace}/deployments")["items"]
    assert deployments == [], "the operator was created although the schema could not be migrated"


# --- CHANGELOG.md's upgrade notes, from chart 0.1.0 -----------------------------------------------

#: The commit chart 0.1.0 is recorded at (CHANGELOG.md).
CHART_0_1_0_COMMIT = "3d16a5f"


def test_upgrade_from_chart_0_1_0_as_the_changelog_says(
    kube: Cluster, migration_release: tuple[str, str, str], tmp_path: Path
) -> None:
    """A release of chart 0.1.0 (its CRD from crds/, no migration Job) moves to this chart by the
    upgrade notes' steps: ``--reuse-values`` is refused (0.1.0's values lack the new defaults); with
    the Secret created and the CRD adopted, ``helm upgrade`` migrates the database in its
    pre-upgrade hook and the CRD becomes the release's, kept on uninstall."""
    release, namespace, dsn = migration_release
    subprocess.run(f"git -C {ROOT} archive {CHART_0_1_0_COMMIT} charts/judgequeue | tar -x -C {tmp_path}",
                   shell=True, check=True)
    old_chart = tmp_path / "charts" / "judgequeue"
    assert yaml.safe_load((old_chart / "Chart.yaml").read_text())["version"] == "0.1.0"
    settings = ("--set", "operator.replicas=0", "--set", f"operator.watchNamespaces={{{namespace}}}")
    installed = kube.helm_cmd("install", release, str(old_chart), "-n", namespace, *settings, check=False)
    assert installed.returncode == 0, installed.stderr

    reused = kube.helm_cmd("upgrade", release, str(CHART), "-n", namespace, "--reuse-values", check=False)
    assert reused.returncode != 0 and "crds" in reused.stderr and "migrations" in reused.stderr, reused.stderr

    crd = "judgequeues.judgequeue.dev"
    kube.apply(yaml.safe_dump({"apiVersion": "v1", "kind": "Secret",
                               "metadata": {"name": "judgequeue-migrations", "namespace": namespace},
                               "type": "Opaque", "stringData": {"dsn": dsn}}))
    kube.kubectl("label", "crd", crd, "app.kubernetes.io/managed-by=Helm", "--overwrite")
    kube.kubectl("annotate", "crd", crd, f"meta.helm.sh/release-name={release}",
                 f"meta.helm.sh/release-namespace={namespace}", "--overwrite")
    upgraded = kube.helm_cmd("upgrade", release, str(CHART), "-n", namespace, *settings, "--wait",
                             "--timeout", "3m", check=False, timeout=240)
    assert upgraded.returncode == 0, upgraded.stderr
    assert "Database: migrated" in upgraded.stdout and "is this release's" in upgraded.stdout, upgraded.stdout
    assert _migrated(dsn), "the pre-upgrade hook did not migrate the database"
    owned = kube.request("GET", f"{CRDS}/{crd}")
    version = yaml.safe_load((CHART / "Chart.yaml").read_text())["version"]
    assert owned["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert owned["metadata"]["labels"]["helm.sh/chart"] == f"judgequeue-{version}"
    kube.helm_cmd("uninstall", release, "-n", namespace, "--wait")
    assert kube.get(f"{CRDS}/{crd}") is not None, "the CRD went with the release"
