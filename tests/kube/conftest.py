"""Fixtures of the real-API-server tier: one control plane for the tier (package-scoped: it stops
when the tier's last test has run, not at the end of the whole suite), a namespace per test.

Every test in tests/kube/ is marked ``kube`` (select with ``-m kube``, leave out with ``-m "not kube"``).
The binaries come from ``scripts/build-kube`` (run by ``scripts/prepare-tests``); when they are missing the
tests fail and say so rather than skip: this tier is the proof the kmock tier cannot give.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from tests.kube.cluster import ROOT, Cluster, control_plane
from tests.kube.node import NodeAgent
from tests.kube.tools import JUDGEQUEUE_BIN, record_figure

CRD_FILE = ROOT / "crds" / "judgequeue.yaml"
CHART = ROOT / "charts" / "judgequeue"
EXAMPLE = ROOT / "examples" / "judgequeue.yaml"

# Start times of this session's control planes (seconds), for docs/performance.md's figures.
START_TIMES: dict[str, float] = {}


@pytest.fixture(scope="package")
def kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """The pinned current control plane: etcd, kube-apiserver (RBAC, OwnerReferencesPermissionEnforcement),
    kube-controller-manager and kube-scheduler on loopback."""
    started = time.monotonic()
    with control_plane(tmp_path_factory.mktemp("kube")) as cluster:
        START_TIMES["current"] = time.monotonic() - started
        record_figure("control_plane_warm_start_seconds", round(START_TIMES["current"], 2))
        yield cluster


@pytest.fixture(scope="package")
def kube_oldest(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """kube-apiserver of the oldest release the chart's kubeVersion claims (with etcd only)."""
    started = time.monotonic()
    with control_plane(tmp_path_factory.mktemp("kube-oldest"), oldest=True) as cluster:
        START_TIMES["oldest"] = time.monotonic() - started
        yield cluster


@pytest.fixture(scope="package")
def crd_installed(kube: Cluster) -> Cluster:
    """The JudgeQueue CRD applied (as a user would, with kubectl) and established."""
    kube.kubectl("apply", "-f", str(CRD_FILE))
    kube.wait_established("judgequeues.judgequeue.dev")
    return kube


@pytest.fixture
def namespace(kube: Cluster) -> Iterator[str]:
    """A fresh namespace per test, deleted afterwards (without waiting for it to go)."""
    with kube.fresh_namespace() as name:
        yield name


@pytest.fixture(scope="package")
def node(kube: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeAgent]:
    """The test node agent: runs the pods the scheduler binds to it as local processes."""
    agent = NodeAgent(kube, tmp_path_factory.mktemp("node"), entrypoint=str(JUDGEQUEUE_BIN))
    agent.start()
    yield agent
    agent.stop()
