"""Fixtures of the real-node tier: a control plane, one real node, the image, and the servers pods use.

Every test in tests/node/ is marked ``node`` (leave the tier out with ``-m "not node"``). It needs
root (network and mount namespaces, cgroups) and builds what it runs on demand, cached by version
or content: the control plane and kubelet (``scripts/build-kube``), the pause image and the node's
Debian packages (``scripts/build-node``), the judgequeue image from the Dockerfile
(``scripts/build-image``). Missing tools fail the tests with the build's own message: this tier is
the proof that the local-process node agent of tests/kube cannot give.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import pytest

from judgequeue.core.store.migrate import migrate
from tests.kube.cluster import Cluster, control_plane
from tests.node import readme
from tests.node.realnode import Addresses, RealNode, script_output
from tests.node.services import HostServices, host_services
from tests.support.pg_servers import PostgresServer


@dataclass
class NodeCluster:
    """The control plane, the node, the image its pods run, and the servers they reach."""

    kube: Cluster
    node: RealNode
    image: str
    host: HostServices

    @property
    def addresses(self) -> Addresses:
        return self.host.addresses

    @property
    def postgres(self) -> PostgresServer:
        return self.host.postgres

    def pod_dsn(self, database: str) -> str:
        """A DSN as a pod uses it (the host end of the node's veth, with the password)."""
        return self.host.dsn(database)

    def local_dsn(self, database: str) -> str:
        """The same database as the test process reaches it."""
        return self.host.local_dsn(database)

    @property
    def pod_redis_url(self) -> str:
        return self.host.redis_url


@contextlib.contextmanager
def node_cluster_up(workdir: Path) -> Iterator[NodeCluster]:
    """Build what is missing, then start the servers, the control plane and the node; stop them after."""
    started = time.monotonic()
    image = script_output("build-image", "--print")
    pause = script_output("build-node", "--print")
    built = time.monotonic() - started
    with host_services(workdir) as host, control_plane(workdir / "control-plane", address=host.addresses.host) as kube:
        node = RealNode(kube, workdir / "node", host.addresses, suffix=host.suffix)
        try:
            node.start(pause=(pause["PAUSE_IMAGE"], Path(pause["PAUSE_ARCHIVE"])), images=[Path(image["ARCHIVE"])])
            print(f"\n[node tier] artefacts ready in {built:.0f} s, node Ready "
                  f"{time.monotonic() - started - built:.0f} s later")
            yield NodeCluster(kube, node, image["IMAGE"], host)
        finally:
            node.stop()


@pytest.fixture(scope="package")
def node_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeCluster]:
    """One real node for the session (its pods are the tests' to make and delete)."""
    if os.geteuid() != 0:
        pytest.fail("the real-node tier needs root (namespaces, cgroups, containerd)")
    with node_cluster_up(tmp_path_factory.mktemp("realnode")) as cluster:
        yield cluster


@pytest.fixture(scope="package")
def helm_installed(node_cluster: NodeCluster) -> None:
    """The chart installed with README.md's command (the user's image in place of its example):
    the operator runs as a pod of the node, watching every namespace. Without the chart's migration
    Job: the tier's databases are made after the chart (one per test), and test_user_path_real.py
    migrates its own with the README's `kubectl run ... migrate` (the chart's Job is run by
    tests/kube/test_chart_real.py and test_user_path.py)."""
    readme_helm_install(node_cluster)


def readme_helm_install(cluster: NodeCluster) -> None:
    """What :func:`helm_installed` installs (a test that uninstalls it puts it back with this)."""
    helm = readme.set_value(readme.helm_install(cluster.image), "migrations.enabled", "false")
    cluster.kube.helm_cmd(*helm[1:], "--wait", "--timeout", "5m")


def release_installed(cluster: NodeCluster, release: str = "judgequeue",
                      namespace: str = "judgequeue-system") -> bool:
    return cluster.kube.helm_cmd("status", release, "-n", namespace, check=False).returncode == 0


def readme_uninstall(cluster: NodeCluster) -> None:
    """README's uninstall: the JudgeQueues (each released by the operator), the chart, the CRDs. Its
    CRD command names Kopf's peering CRDs too, which only an install with peering (or chart 0.1.0)
    brought: one that is not there is no error here."""
    for words in readme.uninstall():
        if words[0] == "helm":
            cluster.kube.helm_cmd(*words[1:], "--wait", "--timeout", "3m")
        else:
            cluster.kube.kubectl(*words[1:], "--timeout=180s", "--ignore-not-found", timeout=210)


def recreated_database(cluster: NodeCluster, name: str) -> None:
    """An empty database ``name`` on the pods' Postgres (dropped first if a run left one)."""

    async def make() -> None:
        admin = await asyncpg.connect(cluster.local_dsn("postgres"))
        try:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            await admin.execute(f'CREATE DATABASE "{name}"')
        finally:
            await admin.close()

    asyncio.run(make())


def readme_migrate(cluster: NodeCluster, image: str, database: str, *, readme_path: Path = readme.README) -> str:
    """README's one-off ``kubectl run ... migrate`` pod with ``image`` on ``database``; its output."""
    words = readme.migrate_run(image, cluster.pod_dsn(database), readme=readme_path)
    done = cluster.kube.kubectl("run", "--image-pull-policy=Never", *words[2:], namespace="default", timeout=180)
    assert "migrat" in (done.stdout + done.stderr).lower(), done
    return done.stdout + done.stderr


def migrated_database(cluster: NodeCluster) -> str:
    """A new migrated database on the pods' Postgres; its name."""
    name = f"jq_node_{uuid.uuid4().hex[:10]}"

    async def make() -> None:
        admin = await asyncpg.connect(cluster.local_dsn("postgres"))
        try:
            await admin.execute(f'CREATE DATABASE "{name}"')
        finally:
            await admin.close()
        conn = await asyncpg.connect(cluster.local_dsn(name))
        try:
            await migrate(conn)
        finally:
            await conn.close()

    asyncio.run(make())
    return name
