"""Fixtures of the real-node tier: a control plane, one real node, the image, and the servers pods use.

Every test in tests/node/ is marked ``node`` (leave the tier out with ``-m "not node"``). It needs
root (network and mount namespaces, cgroups) and builds what it runs on demand, cached by version
or content: the control plane and kubelet (``scripts/build-kube``), the pause image and the node's
Debian packages (``scripts/build-node``), the judgequeue image from the Dockerfile
(``scripts/build-image``). Missing tools fail the tests with the build's own message: this tier is
the proof that the local-process node agent of tests/kube cannot give.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.kube.cluster import Cluster, control_plane
from tests.node.realnode import Addresses, RealNode, script_output
from tests.support.pg_servers import PostgresServer, postgres_server
from tests.support.redis_servers import RedisServer, free_port

#: The password of the pods' Postgres and Redis (they reach them over the node's network, as pods
#: reach any database: with credentials from a Secret).
PASSWORD = "node-tier-secret"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.node)


@dataclass
class NodeCluster:
    """The control plane, the node, the image its pods run, and the servers they reach."""

    kube: Cluster
    node: RealNode
    addresses: Addresses
    image: str
    postgres: PostgresServer
    redis: RedisServer

    def pod_dsn(self, database: str) -> str:
        """A DSN as a pod uses it (the host end of the node's veth)."""
        return f"postgresql://postgres:{PASSWORD}@{self.addresses.host}:{self.postgres.port}/{database}"

    def local_dsn(self, database: str) -> str:
        """The same database as the test process reaches it."""
        return f"postgresql://postgres@127.0.0.1:{self.postgres.port}/{database}"

    @property
    def pod_redis_url(self) -> str:
        return f"redis://:{PASSWORD}@{self.addresses.host}:{self.redis.port}/0"

    @property
    def local_redis_url(self) -> str:
        return f"redis://:{PASSWORD}@127.0.0.1:{self.redis.port}/0"


def _allow_pods(postgres: PostgresServer, addresses: Addresses) -> None:
    """Pods (masqueraded as the node) log in with a password; the test process still trusts loopback."""
    hba = postgres.data / "pg_hba.conf"
    subnet = addresses.host.rsplit(".", 2)[0] + ".0.0/16"
    with hba.open("a") as f:  # pods arrive masqueraded as the node's address
        f.write(f"host all all {subnet} scram-sha-256\n")
    postgres._run("psql", "-h", "127.0.0.1", "-p", str(postgres.port), "-U", "postgres", "-qc",
                  f"ALTER USER postgres PASSWORD '{PASSWORD}'")
    postgres._run("pg_ctl", "-D", str(postgres.data), "reload")


@contextlib.contextmanager
def node_cluster_up(workdir: Path) -> Iterator[NodeCluster]:
    """Build what is missing, then start the servers, the control plane and the node; stop them after."""
    started = time.monotonic()
    image = script_output("build-image", "--print")
    pause = script_output("build-node", "--print")
    built = time.monotonic() - started
    addresses = Addresses.pick()
    suffix = os.urandom(3).hex()
    RealNode.make_network(addresses, suffix)
    try:
        with postgres_server(settings={"listen_addresses": f"127.0.0.1,{addresses.host}"}) as postgres:
            _allow_pods(postgres, addresses)
            redis = RedisServer(free_port(), workdir / "redis",
                                ["--bind", f"127.0.0.1 {addresses.host}"], password=PASSWORD)
            try:
                with control_plane(workdir / "control-plane", address=addresses.host) as kube:
                    node = RealNode(kube, workdir / "node", addresses, suffix=suffix)
                    try:
                        node.start(pause=(pause["PAUSE_IMAGE"], Path(pause["PAUSE_ARCHIVE"])),
                                   images=[Path(image["ARCHIVE"])])
                        print(f"\n[node tier] artefacts ready in {built:.0f} s, node Ready "
                              f"{time.monotonic() - started - built:.0f} s later")
                        yield NodeCluster(kube, node, addresses, image["IMAGE"], postgres, redis)
                    finally:
                        node.stop()
            finally:
                redis.stop()
    finally:
        RealNode.remove_network(suffix)


@pytest.fixture(scope="session")
def node_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeCluster]:
    """One real node for the session (its pods are the tests' to make and delete)."""
    if os.geteuid() != 0:
        pytest.fail("the real-node tier needs root (namespaces, cgroups, containerd)")
    with node_cluster_up(tmp_path_factory.mktemp("realnode")) as cluster:
        yield cluster
