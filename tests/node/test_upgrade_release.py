"""Release 0.1.0 upgraded to this one on a real node through ``helm upgrade``, as a user does it,
under load.

Release 0.1.0 is main at :data:`PREVIOUS` (untagged; CHANGELOG.md). Its tree is taken from git
(tests/support/revisions.py) and its image built by that tree's own ``scripts/build-image``
(cached by content, so a run after the first only imports it). It is installed as its own README
says: ``helm install`` of its chart (the CRD comes from its ``crds/``), its ``migrate`` as a
one-off pod, the Namespace, the Secrets and the JudgeQueue, ``kubectl wait`` until Ready. The test
submits program-judge submissions (C and Python programs with known verdicts) all along.

Then it is upgraded as CHANGELOG.md's upgrade notes say, with this README's commands: the
migration Job's Secret, the CRD adopted by the release, ``helm upgrade`` of this chart with this
image (its pre-upgrade Job migrates while 0.1.0's roles serve, then Helm upgrades the CRD and rolls
the operator), then the new image in the JudgeQueue (the user's manifests of this README). The
operator rolls the dispatcher, worker and reaper Deployments; the test waits on their rollout
conditions.

At the end, DESIGN section 9 with the chaos audit (invariants 1, 2 and 10): every submission
committed before, during and after the upgrade has exactly one terminal verdict, the one its
program must get, and none was written by a stale generation or attempt; the database records this
release's migrations; the JudgeQueue is Ready for the spec naming the new image and every role pod
runs it; ``judgequeue --version`` in a new pod is this release's, not the old one's. README's
uninstall then takes it all away.
"""

from __future__ import annotations

import asyncio
import random
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from judgequeue.core.store.migrate import applied_versions, current_versions
from tests.kube.cluster import ROOT
from tests.kube.tools import clear_queue_keys, condition, jq_path, ready_pods, run_sql, wait_for, wait_rollout
from tests.node import readme
from tests.node.conftest import (
    NodeCluster,
    readme_helm_install,
    readme_migrate,
    readme_uninstall,
    recreated_database,
    release_installed,
)
from tests.node.realnode import script_output
from tests.support.flow import Flow, check_flow, install_audit, terminal_count
from tests.support.language_programs import case
from tests.support.revisions import source_tree
from tests.support.waiting import eventually

#: Release 0.1.0: main at this commit (no tag).
PREVIOUS = "3d16a5f"
NAMESPACE = "judge"  # the README's, as its JudgeQueue and its queue name
QUEUE = "judge"
RELEASE_NS = "judgequeue-system"
DATABASE = "judge_upgrade"
ROLES = ("dispatcher", "worker", "reaper")
#: The submissions of the load: each case in C and in Python, with the verdict it must get.
CASES = [case(language, name) for language in ("c", "python")
         for name in ("ok", "wrong_answer", "compile_error", "runtime_error")]  # fmt: skip


@dataclass(frozen=True)
class Release:
    tree: Path  # its sources, README and chart
    image: str  # as the node's containerd holds it

    @property
    def readme(self) -> Path:
        return self.tree / "README.md"


@pytest.fixture(scope="module")
def previous_release(node_cluster: NodeCluster) -> Release:
    """0.1.0's tree, and its image built by its own scripts/build-image and imported into the node."""
    started = time.monotonic()
    tree = source_tree(PREVIOUS)
    built = script_output("build-image", "--print", tree=tree)
    archive = Path(built["ARCHIVE"])
    archive.touch()  # used now: build-image keeps the archives used last
    ready = time.monotonic()
    node_cluster.node.import_images(archive)
    print(f"\n[upgrade] {PREVIOUS}'s image ready in {ready - started:.0f} s, imported in "
          f"{time.monotonic() - ready:.0f} s")
    return Release(tree, built["IMAGE"])


@pytest.fixture(scope="module")
def this_release(node_cluster: NodeCluster) -> Release:
    return Release(ROOT, node_cluster.image)


@pytest.fixture(scope="module")
def no_release_yet(node_cluster: NodeCluster) -> Iterator[None]:
    """No judgequeue chart installed, so the test installs 0.1.0 as a new user would; README's
    uninstall after it. A release ``helm_installed`` made earlier in the session is uninstalled
    first and installed again after, for the tests that follow."""
    installed_before = release_installed(node_cluster)
    if installed_before:
        readme_uninstall(node_cluster)
    clear_queue_keys(node_cluster.pod_redis_url, QUEUE)
    yield
    readme_uninstall(node_cluster)
    clear_queue_keys(node_cluster.pod_redis_url, QUEUE)
    if installed_before:
        readme_helm_install(node_cluster)


def role_pods(cluster: NodeCluster) -> list[dict[str, Any]]:
    """The JudgeQueue's role pods that are not on their way out."""
    pods = cluster.kube.request("GET", f"/api/v1/namespaces/{NAMESPACE}/pods")["items"]
    return [p for p in pods if p["metadata"].get("labels", {}).get("app.kubernetes.io/component") in ROLES
            and not p["metadata"].get("deletionTimestamp")]


def version_in_worker(cluster: NodeCluster, image: str) -> str:
    """``judgequeue --version`` run in a ready worker pod of ``image``."""
    pods = [p for p in ready_pods(cluster.kube, NAMESPACE, "worker")
            if p["spec"]["containers"][0]["image"] == image]
    assert pods, f"no ready worker pod runs {image}"
    done = cluster.kube.kubectl("exec", "-n", NAMESPACE, pods[0]["metadata"]["name"], "--",
                                "judgequeue", "--version", timeout=60)
    return done.stdout.strip()


def wait_jq_ready(cluster: NodeCluster) -> dict[str, Any]:
    """README's ``kubectl wait`` for the JudgeQueue's Ready, then until Ready speaks of the spec as it
    is now (its observedGeneration); the JudgeQueue (failing with the status and the operator's log)."""
    kube = cluster.kube

    def jq() -> dict[str, Any]:
        return dict(kube.request("GET", jq_path(NAMESPACE, "judge")))

    def ready_now() -> dict[str, Any] | None:
        found = jq()
        ready = condition(found, "Ready")
        current = ready.get("observedGeneration") == found["metadata"]["generation"]
        return found if ready.get("status") == "True" and current else None

    waited = kube.kubectl("wait", "-n", NAMESPACE, "jq/judge", "--for=condition=Ready", "--timeout=5m",
                          check=False, timeout=330)
    try:
        assert waited.returncode == 0, waited.stderr
        found: dict[str, Any] = wait_for("Ready for the current spec", ready_now, timeout=60)
    except (AssertionError, TimeoutError):
        logs = kube.kubectl("logs", "-n", RELEASE_NS, "deploy/judgequeue", "--tail=20", check=False)
        pytest.fail(f"JudgeQueue not Ready: {jq().get('status')}\noperator log: {logs.stdout[-3000:]}")
    return found


def install(cluster: NodeCluster, release: Release) -> None:
    """The release as its README installs it: the chart, migrate, the user's manifests, Ready."""
    kube = cluster.kube
    kube.helm_cmd(*readme.helm_install(release.image, readme=release.readme)[1:], "--wait", "--timeout", "5m")
    recreated_database(cluster, DATABASE)
    readme_migrate(cluster, release.image, DATABASE, readme_path=release.readme)
    # Every status and generation change of a submission recorded from here on (before any job).
    asyncio.run(install_audit(cluster.local_dsn(DATABASE)))
    kube.apply(readme.user_manifests(release.image, cluster.pod_dsn(DATABASE), cluster.pod_redis_url,
                                     readme=release.readme))
    wait_jq_ready(cluster)


def upgrade(cluster: NodeCluster, release: Release) -> tuple[dict[str, float], str]:
    """The installed 0.1.0 release upgraded to ``release`` as CHANGELOG.md's upgrade notes say, with
    its README's commands; the seconds each step took, and what ``helm upgrade`` printed."""
    kube = cluster.kube
    took: dict[str, float] = {}
    started = time.monotonic()
    # Once, for a release of chart 0.1.0: the migration Job's Secret (the schema owner's DSN) and the
    # CRD that 0.1.0's crds/ installed adopted by the release, so that helm upgrade upgrades it.
    secret = readme.find("kubectl", "create", "secret", "judgequeue-migrations", readme=release.readme)
    dsn = f"--from-literal=dsn={cluster.pod_dsn(DATABASE)}"
    kube.kubectl(*[dsn if w.startswith("--from-literal=dsn=") else w for w in secret[1:]])
    for verb in ("label", "annotate"):
        kube.kubectl(*readme.find("kubectl", verb, "crd", readme=release.readme)[1:])
    # helm upgrade with the values it was installed with and the new image: the pre-upgrade Job
    # migrates while 0.1.0's roles serve, then the CRD and the operator.
    upgraded = kube.helm_cmd(*readme.helm_upgrade(release.image, readme=release.readme)[1:], "--wait",
                             "--timeout", "5m", timeout=360)
    wait_rollout(kube, RELEASE_NS, "judgequeue", release.image)
    took["chart"] = time.monotonic() - started
    # The user's manifests of this README, with the new image in the JudgeQueue; the roles roll.
    kube.apply(readme.user_manifests(release.image, cluster.pod_dsn(DATABASE), cluster.pod_redis_url,
                                     readme=release.readme))
    for role in ROLES:
        wait_rollout(kube, NAMESPACE, f"judge-{role}", release.image)
    took["roles"] = time.monotonic() - started - took["chart"]
    return took, upgraded.stdout


def recorded_migrations(dsn: str) -> list[int]:
    async def read() -> list[int]:
        conn = await asyncpg.connect(dsn)
        try:
            return await applied_versions(conn)
        finally:
            await conn.close()

    return asyncio.run(read())


def load(rng: random.Random) -> tuple[object, str]:
    return rng.choice(CASES)


async def test_previous_release_upgrades_through_helm_under_load(
    node_cluster: NodeCluster, previous_release: Release, this_release: Release, no_release_yet: None
) -> None:
    cluster = node_cluster
    started = time.monotonic()
    await asyncio.to_thread(install, cluster, previous_release)
    installed_at = time.monotonic()
    old_version = await asyncio.to_thread(version_in_worker, cluster, previous_release.image)

    flow = Flow(cluster.local_dsn(DATABASE), QUEUE, submitters=1, pace=0.5, job=load)
    try:
        await flow.wait_verdicts(20, within=180, what="verdicts by the previous release's roles")
        await flow.wait_judging(1, within=60)
        upgrade_started = time.monotonic()
        recorded_before = await asyncio.to_thread(recorded_migrations, flow.dsn)
        took, notes = await asyncio.to_thread(upgrade, cluster, this_release)
        upgraded_at = time.monotonic()
        jq = await asyncio.to_thread(wait_jq_ready, cluster)

        async def judged_after_upgrade() -> bool:
            after = flow.committed_after(upgraded_at)
            return len(after) >= 20 and await terminal_count(flow.dsn, after) >= 20

        await eventually(judged_after_upgrade, within=180, every=0.5,
                         what="20 verdicts of submissions made after the upgrade")
        expected = await flow.stop()
        report = await check_flow(cluster.local_dsn(DATABASE), cluster.pod_redis_url, QUEUE, expected, None,
                                  within=180)
    finally:
        await flow.stop()
    finished = time.monotonic()

    before = [s for s, at in flow.committed_at.items() if at < upgrade_started]
    during = [s for s, at in flow.committed_at.items() if upgrade_started <= at < upgraded_at]
    after = flow.committed_after(upgraded_at)
    new_version = await asyncio.to_thread(version_in_worker, cluster, this_release.image)
    recorded_after = await asyncio.to_thread(recorded_migrations, flow.dsn)
    pods = await asyncio.to_thread(role_pods, cluster)
    print(f"\n[upgrade] {PREVIOUS} -> this tree: installed in {installed_at - started:.0f} s; upgrade "
          + ", ".join(f"{k} {v:.0f} s" for k, v in took.items())
          + f"; {len(expected)} submissions ({len(before)} before, {len(during)} during, {len(after)} after);"
          f" re-executions {report.duplicate_executions}, generation bumps {report.generation_bumps},"
          f" system errors {report.system_errors}; {old_version!r} -> {new_version!r}; migrations recorded"
          f" {recorded_before} -> {recorded_after};"
          f" {finished - started:.0f} s in all")
    # 1 and 2: one verdict each, the right one, none from a stale generation or attempt.
    assert report.violations == [], report.violations
    assert report.lost_submissions == report.multiple_terminal_verdicts == report.stale_writes_accepted == 0
    wrong = await asyncio.to_thread(run_sql, flow.dsn, "SELECT id, status, verdict FROM judgequeue.submissions"
                                    " WHERE id = ANY($1::bigint[]) ORDER BY id", list(expected))
    wrong = [{**dict(r), "want": expected[r["id"]]} for r in wrong if r["status"] != expected[r["id"]]]
    assert report.wrong_verdicts == report.system_errors == 0, wrong[:5]
    assert before and during and after, (len(before), len(during), len(after))
    # The pre-upgrade Job migrated the database; the CRD is the release's now.
    assert "Database: migrated" in notes and "is this release's" in notes, notes
    assert recorded_after == current_versions(), recorded_after
    # Ready for the spec that names the new image, and nothing else runs.
    assert jq["spec"]["image"] == this_release.image
    ready = condition(jq, "Ready")
    assert ready["status"] == "True" and ready["observedGeneration"] == jq["metadata"]["generation"], ready
    assert {c["image"] for p in pods for c in p["spec"]["containers"]} == {this_release.image}
    assert {p["metadata"]["labels"]["app.kubernetes.io/component"] for p in pods} == set(ROLES)
    this_version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert new_version == f"judgequeue {this_version}" != old_version, (old_version, new_version)
