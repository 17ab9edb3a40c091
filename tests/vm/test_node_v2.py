"""A cgroup v2 node with kubelet's defaults, judging.

Kubernetes 1.35+ kubelet refuses cgroup v1 hosts by default, so the product must run where kubelet
runs as it ships. Here kubelet (the pinned release, its configuration left at its defaults: no
``failCgroupV1`` override, the cgroupfs driver it defaults to), containerd and runc run inside the
cgroup v2 VM and register with the control plane on the host (the guest reaches the host's loopback
as 10.0.2.2). The operator runs on the host; the JudgeQueue's pods run on the VM's node from the
image built from the Dockerfile. The API server, Postgres and Redis listen on a host address (the
host end of a veth pair, as for tests/node) that both the host and the guest reach: the guest's
connections leave qemu's user network as the host's own. Normal and hostile
submissions are judged by the worker pod's sandbox on cgroup v2.
"""

from __future__ import annotations

import asyncio
import shutil
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import yaml

from judgequeue.core import api
from judgequeue.core.store.migrate import migrate
from judgequeue.core.store.queues import create_queue
from tests.kube.cluster import Cluster, control_plane, write_kubeconfig
from tests.kube.conftest import CRD_FILE
from tests.kube.tools import (
    condition,
    jq_path,
    judgequeue,
    operator_with_secrets,
    wait_for,
)
from tests.node.realnode import script_output
from tests.node.services import HostServices, host_services
from tests.vm import machine
from tests.vm.conftest import FIGURES

NODE = "v2-node"
NAMESPACE = "judge"

#: The guest's job: containerd with the pause and judgequeue images, then kubelet with a
#: configuration that sets nothing kubelet does not require, until the host says it is done.
GUEST_SCRIPT = r"""
set -eu
mkdir -p /var/lib/containerd /etc/containerd /etc/cni/net.d
mount -t tmpfs -o size=4g tmpfs /var/lib/containerd   # the disk is small; images go to memory
cat > /etc/containerd/config.toml <<EOF
version = 2
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "/etc/cni/net.d"
EOF
cat > /etc/cni/net.d/10-pods.conflist <<EOF
{"cniVersion": "1.0.0", "name": "pods", "plugins": [
  {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": true,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.88.0.0/16"}]], "routes": [{"dst": "0.0.0.0/0"}]}},
  {"type": "portmap", "capabilities": {"portMappings": true}}]}
EOF
containerd >/jqvm/out/containerd.log 2>&1 &
i=0; until ctr version >/dev/null 2>&1; do i=$((i+1)); [ $i -lt 300 ] || exit 3; sleep 0.2; done
ctr -n k8s.io images import "/images/pause/$PAUSE_ARCHIVE"
ctr -n k8s.io images import "/images/app/$APP_ARCHIVE"
touch /jqvm/out/imported
/opt/kube/kubelet --config=/jqvm/kubelet.yaml --kubeconfig=/jqvm/kubeconfig --node-ip=10.0.2.15 \
  --hostname-override=v2-node >/jqvm/out/kubelet.log 2>&1 &
until [ -e /jqvm/done ]; do sleep 1; done
cat /proc/self/mountinfo | grep cgroup > /jqvm/out/cgroup-mounts || true
"""


@dataclass
class V2Node:
    kube: Cluster
    host: HostServices
    job: Path
    image: str
    vm: threading.Thread
    outcome: dict[str, Any]

    def check(self) -> None:
        if not self.vm.is_alive():
            out = self.outcome.get("outcome")
            raise AssertionError(f"the VM stopped: {out.returncode if out else None}\n"
                                 f"{(out.output if out else '')[-3000:]}\n{_tail(self.job / 'out' / 'kubelet.log')}")


def _tail(path: Path, size: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-size:]
    except FileNotFoundError:
        return ""


#: The VM, and the kubelet, node packages and image it runs.
pytestmark = pytest.mark.builds("vm", "control-plane", "node", "image")


@pytest.fixture(scope="module")
def v2_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[V2Node]:
    image = script_output("build-image", "--print")
    pause = script_output("build-node", "--print")
    workdir = tmp_path_factory.mktemp("v2node")
    with host_services(workdir) as host, control_plane(workdir / "control-plane", address=host.addresses.host) as kube:
        job = workdir / "job"
        job.mkdir()
        shutil.copy(kube.ca, job / "ca.crt")
        write_kubeconfig(job / "kubeconfig", server=kube.server, ca=Path("/jqvm/ca.crt"), token=kube.token)
        (job / "kubelet.yaml").write_text(yaml.safe_dump(
            {"apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration"}))
        shares = [
            machine.Share(str(kube.bin_dir), "/opt/kube"),
            machine.Share(str(Path(image["ARCHIVE"]).parent), "/images/app"),
            machine.Share(str(Path(pause["PAUSE_ARCHIVE"]).parent), "/images/pause"),
        ]
        env = {"PAUSE_IMAGE": pause["PAUSE_IMAGE"], "PAUSE_ARCHIVE": Path(pause["PAUSE_ARCHIVE"]).name,
               "APP_ARCHIVE": Path(image["ARCHIVE"]).name}
        outcome: dict[str, Any] = {}
        started = time.monotonic()
        vm = threading.Thread(target=lambda: outcome.update(outcome=machine.run(
            GUEST_SCRIPT, job_dir=job, shares=shares, env=env, deadline=1800, memory_mb=6144, cpus=2)))
        vm.start()
        node = V2Node(kube, host, job, image["IMAGE"], vm, outcome)
        try:
            wait_for("the VM's node Ready", lambda: _ready(kube), timeout=900, check=node.check)
            FIGURES["v2 node: boot to Ready (s)"] = round(time.monotonic() - started)
            yield node
        finally:
            (job / "done").touch()
            vm.join(timeout=180)


def _ready(kube: Cluster) -> bool:
    conditions = (kube.get(f"/api/v1/nodes/{NODE}") or {}).get("status", {}).get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def py(source: str, output: str = "ok\n", **limits: Any) -> dict[str, Any]:
    return {"language": "python", "source": source, "tests": [{"input": "", "output": output}],
            "limits": {"time": 5, "memory_mb": 128, **limits}}


CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "accepted": ("ACCEPTED", py("print('ok')")),
    "wrong": ("WRONG_ANSWER", py("print('no')")),
    "memory": ("MEMORY_LIMIT", py("x = bytearray(600 << 20)\nprint(len(x))", memory_mb=64)),
    "fork-bomb": ("RUNTIME_ERROR|TIME_LIMIT|MEMORY_LIMIT", py(
        "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n", time=2)),
    "network": ("ACCEPTED", py(
        "import socket, sys\ntry:\n    socket.create_connection(('10.0.2.2', 22), timeout=2)\n    print('reached')\n"
        "except OSError:\n    print('ok')\n")),
    "escape": ("ACCEPTED", py(
        "import os\nfound = [p for p in ('/var/run/secrets', '/sys/fs/cgroup/cgroup.procs') if os.path.exists(p)]\n"
        "print('ok' if not found else found)\n")),
}


def test_a_cgroup_v2_node_with_kubelets_defaults_judges(v2_node: V2Node) -> None:
    kube = v2_node.kube
    kube.kubectl("apply", "-f", str(CRD_FILE))
    kube.wait_established("judgequeues.judgequeue.dev")
    kube.create_namespace(NAMESPACE)
    queue = "v2"
    database = f"jq_v2node_{uuid.uuid4().hex[:8]}"
    asyncio.run(_create_database(v2_node.host.local_dsn("postgres"), database, queue))
    dsn = v2_node.host.local_dsn(database)
    operator = operator_with_secrets(kube, NAMESPACE, v2_node.job / "operator.log", dsn=v2_node.host.dsn(database),
                                     redis_url=v2_node.host.redis_url)
    try:
        kube.apply(judgequeue("judge", queue, image=v2_node.image,
                              dispatcher={"replicas": 1}, reaper={"replicas": 1},
                              worker={"minReplicas": 1, "maxReplicas": 1, "concurrency": 2, "judge": "program"}),
                   namespace=NAMESPACE)
        started = time.monotonic()

        def ready() -> bool:
            v2_node.check()
            operator.check()
            return condition(kube.request("GET", jq_path(NAMESPACE, "judge")), "Ready").get("status") == "True"

        wait_for("the JudgeQueue Ready on the cgroup v2 node", ready, timeout=900)
        FIGURES["v2 node: JudgeQueue Ready (s)"] = round(time.monotonic() - started)
        ids = asyncio.run(_submit(dsn, queue, [p for _, p in CASES.values()]))
        results = wait_for("verdicts from the cgroup v2 node", lambda: _done(dsn, ids), timeout=900)
        for (name, (want, _)), i in zip(CASES.items(), ids, strict=True):
            got = results[i]
            assert got.status in want.split("|"), (name, got.status, got.details)
            assert (got.details or {})["details"]["isolation"] == "full", (name, got.details)
    finally:
        operator.stop()
        (v2_node.job / "done").touch()


async def _create_database(admin_dsn: str, name: str, queue: str) -> None:
    """A migrated database with the queue, on the host's test server."""
    admin = await asyncpg.connect(admin_dsn)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    conn = await asyncpg.connect(admin_dsn.rsplit("/", 1)[0] + f"/{name}")
    try:
        await migrate(conn)
        await create_queue(conn, queue)
    finally:
        await conn.close()


async def _submit(dsn: str, queue: str, payloads: list[dict[str, Any]]) -> list[int]:
    conn = await asyncpg.connect(dsn)
    try:
        return [await api.submit(conn, queue, p) for p in payloads]
    finally:
        await conn.close()


def _done(dsn: str, ids: list[int]) -> dict[int, api.Result] | None:
    async def read() -> dict[int, api.Result]:
        conn = await asyncpg.connect(dsn)
        try:
            return {i: await api.result(conn, i) for i in ids}
        finally:
            await conn.close()

    found = asyncio.run(read())
    return found if all(r.finished for r in found.values()) else None

