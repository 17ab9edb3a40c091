"""README.md's Kubernetes section on a real node: the image built from the Dockerfile, pods run by
kubelet and containerd, the program judge's sandbox inside the worker pods.

The steps are the README's, in order (``helm install`` of the chart, the namespace, ``migrate``,
the Secrets and the JudgeQueue, ``kubectl wait``), changing only what a user must: the image they
built and their database's and Redis's addresses. Then normal and hostile submissions are judged
by those pods, and the node is checked afterwards as the attack catalogue checks a host.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from judgequeue.core import api
from tests.kube.tools import actions, condition, jq_path, ready_pods, wait_for
from tests.node import readme
from tests.node.conftest import NodeCluster, readme_migrate, recreated_database
from tests.support.applications import py, results, submit_all

NAMESPACE = "judge"  # the README's
RELEASE_NS = "judgequeue-system"
TERMINAL = set(api.VERDICTS)


@dataclass
class Installed:
    cluster: NodeCluster
    database: str

    @property
    def dsn(self) -> str:
        return self.cluster.local_dsn(self.database)

    def jq(self) -> dict[str, Any]:
        return dict(self.cluster.kube.request("GET", jq_path(NAMESPACE, "judge")))

    def pods(self, component: str) -> list[dict[str, Any]]:
        return list(self.cluster.kube.request(
            "GET", f"/api/v1/namespaces/{NAMESPACE}/pods?labelSelector=app.kubernetes.io/component%3D{component}"
        )["items"])  # fmt: skip


@pytest.fixture(scope="module")
def installed(node_cluster: NodeCluster, helm_installed: None) -> Iterator[Installed]:
    """helm install (the session's), migrate, the namespace, the Secrets and the JudgeQueue: the
    README's steps."""
    kube = node_cluster.kube
    database = "judge"
    recreated_database(node_cluster, database)
    readme_migrate(node_cluster, node_cluster.image, database)
    kube.apply(readme.user_manifests(node_cluster.image, node_cluster.pod_dsn(database), node_cluster.pod_redis_url))
    waited = kube.kubectl("wait", "-n", NAMESPACE, "jq/judge", "--for=condition=Ready", "--timeout=5m",
                          check=False, timeout=330)
    installed = Installed(node_cluster, database)
    if waited.returncode != 0:
        logs = kube.kubectl("logs", "-n", NAMESPACE, "deploy/judge-worker", "--tail=5", check=False)
        pytest.fail(f"JudgeQueue not Ready: {installed.jq().get('status')}\nworker log: {logs.stdout[-3000:]}")
    yield installed
    kube.kubectl("delete", "jq", "judge", "-n", NAMESPACE, "--wait=true", "--timeout=120s", check=False,
                 timeout=150)


def wait_verdicts(installed: Installed, ids: list[int], timeout: float = 300) -> dict[int, api.Result]:
    def all_done() -> dict[int, api.Result] | None:
        found = asyncio.run(results(installed.dsn, ids))
        return found if all(r.status in TERMINAL for r in found.values()) else None

    done: dict[int, api.Result] = wait_for(f"{len(ids)} verdicts", all_done, timeout=timeout)
    return done


NORMAL = {
    "ACCEPTED": py("print('ok')"),
    "WRONG_ANSWER": py("print('no')"),
    "RUNTIME_ERROR": py("raise SystemExit(3)"),
    "TIME_LIMIT": py("while True: pass", time=0.5),
    "MEMORY_LIMIT": py("x = bytearray(600 << 20)\nprint(len(x))", memory_mb=64),
    "COMPILE_ERROR": {"language": "c", "source": "int main( { return 0; }", "tests": [{"input": "", "output": ""}]},
}


def hostile(cluster: NodeCluster) -> dict[str, tuple[str, dict[str, Any]]]:
    """Attacks on the node and the pod, each with the verdict it must get."""
    pg = (cluster.addresses.host, cluster.postgres.port)
    return {
        # the database the worker pod reaches must be out of reach from the box
        "network": ("ACCEPTED", py(
            f"import socket\ntry:\n    socket.create_connection({pg!r}, timeout=2)\n    print('reached')\n"
            "except OSError:\n    print('ok')\n")),
        # the pod's mounted credentials and the worker's environment are not in the box
        "credentials": ("ACCEPTED", py(
            "import os\nfound = [p for p in ('/var/run/secrets', '/run/secrets', '/var/run/secrets/judgequeue')"
            " if os.path.exists(p)] + [k for k in os.environ if k.startswith('JUDGEQUEUE')]\n"
            "try:\n    found.append(open('/proc/1/environ').read())\nexcept OSError:\n    pass\n"
            "print('ok' if not found else found)\n")),
        # a file written to the box's / or /tmp stays in the box
        "escape-files": ("ACCEPTED", py(
            "import os\nfor p in ('/judgequeue-escape', '/tmp/judgequeue-escape', '/sys/fs/cgroup/x'):\n"
            "    try:\n        open(p, 'w').write('x')\n    except OSError:\n        pass\nprint('ok')\n")),
        "fork-bomb": ("RUNTIME_ERROR|TIME_LIMIT|MEMORY_LIMIT", py(
            "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n", time=1)),
        "kill-everything": ("ACCEPTED", py(
            "import os, signal\nfor pid in (-1, 1):\n    try:\n        os.kill(pid, signal.SIGKILL)\n"
            "    except OSError:\n        pass\nprint('ok')\n")),
        "daemon": ("ACCEPTED", py(
            "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(3600)\nprint('ok')\n")),
        "sleep-forever": ("IDLENESS_LIMIT", py("import time\ntime.sleep(3600)", time=0.5)),
    }


def worker_restarts(installed: Installed) -> dict[str, int]:
    return {p["metadata"]["name"]: sum(c.get("restartCount", 0) for c in p["status"].get("containerStatuses", []))
            for p in installed.pods("worker")}


def test_readme_path_judges_normal_and_hostile_submissions(installed: Installed) -> None:
    cluster = installed.cluster
    jq = installed.jq()
    assert condition(jq, "Ready")["status"] == "True", jq["status"]
    workers = ready_pods(cluster.kube, NAMESPACE, "worker")
    assert len(workers) == 2, "the README's minReplicas"
    restarts_before = worker_restarts(installed)
    attacks = hostile(cluster)
    payloads = list(NORMAL.values()) + [p for _, p in attacks.values()]
    started = time.monotonic()
    ids = asyncio.run(submit_all(installed.dsn, "judge", payloads))
    verdicts = wait_verdicts(installed, ids)
    print(f"\n[node tier] {len(ids)} submissions judged by real pods in {time.monotonic() - started:.1f} s")
    got = [verdicts[i].status for i in ids]
    expected = list(NORMAL) + [want for want, _ in attacks.values()]
    for name, want, have, i in zip([*NORMAL, *attacks], expected, got, ids, strict=True):
        assert have in want.split("|"), (name, have, verdicts[i].details)
    for i in ids:
        assert (verdicts[i].details or {})["details"]["isolation"] == "full", verdicts[i].details
    # The node afterwards, as the attack catalogue checks a host: the workers never restarted, no
    # process of any box is left in their pods (daemons, fork bombs), nothing written outside a box.
    assert worker_restarts(installed) == restarts_before

    def boxes_gone() -> bool:
        left = [p for pod in installed.pods("worker") for p in cluster.node.pod_processes(pod["metadata"]["uid"])
                if p[1] != 0 and p[2] != "/pause"]
        return not left

    wait_for("no box process left in the worker pods", boxes_gone, timeout=30)
    # `kubectl logs` of the operator (a pod of this node) shows what it did for this JudgeQueue.
    logs = cluster.kube.kubectl("logs", "-n", RELEASE_NS, "deploy/judgequeue", timeout=60).stdout
    lines = [json.loads(line) for line in logs.splitlines() if line.startswith("{")]
    done = {(e["action"], e["object"].split(" ")[0]) for e in actions(lines) if e.get("judgequeue") == "judge/judge"}
    assert {("create", "Deployment"), ("create", "Service"), ("claim", "queue")} <= done, sorted(done)
    for path in (Path("/judgequeue-escape"), Path("/tmp/judgequeue-escape")):
        assert not path.exists()


def test_rollout_pod_deletion_and_node_restart_with_jobs_in_flight(installed: Installed) -> None:
    """Jobs keep running through a rolling update of the workers, a graceful and a forced pod
    deletion, and kubelet and containerd killed and restarted: every submission gets exactly one
    verdict, the right one (DESIGN.md section 9, invariants 1 and 2)."""
    cluster = installed.cluster
    kube = cluster.kube
    payload = py("import time\ntime.sleep(1.5)\nprint('ok')", time=5)
    ids = asyncio.run(submit_all(installed.dsn, "judge", [payload] * 48))

    def judging(at_least: int) -> bool:
        found = asyncio.run(results(installed.dsn, ids))
        return sum(r.status == "JUDGING" for r in found.values()) >= at_least

    wait_for("jobs in flight", lambda: judging(4), timeout=60)
    # A rolling update: the operator renders new worker pods; the old ones finish or release.
    # The backlog scales the fleet to maxReplicas (4), more workers than this one small node fits
    # beside a rollout's surge: new pods wait Unschedulable and the old ones may not go while that
    # leaves fewer than 3 available. The fleet's return to minReplicas once the backlog is gone is
    # what lets such a rollout finish, so the scale-down window is made short enough to see it here.
    jq = installed.jq()
    concurrency = jq["spec"]["worker"]["concurrency"]
    patch = {"spec": {"worker": {"concurrency": concurrency - 1, "scaleDownStabilization": "15s"}}}
    kube.kubectl("patch", "jq", "judge", "-n", NAMESPACE, "--type=merge", "-p", json.dumps(patch))
    wait_for("jobs in flight after the rollout started", lambda: judging(2), timeout=60)
    pods = [p for p in installed.pods("worker") if not p["metadata"].get("deletionTimestamp")]
    kube.kubectl("delete", "pod", pods[0]["metadata"]["name"], "-n", NAMESPACE, "--wait=false")
    wait_for("jobs in flight after a graceful deletion", lambda: judging(1), timeout=60)
    # kubelet and containerd die with jobs in flight; the containers (their shims) keep running.
    cluster.node.stop_kubelet_and_runtime()
    cluster.node.restart_kubelet_and_runtime()
    wait_for("jobs in flight after the node restart", lambda: judging(1), timeout=90)
    pods = [p for p in installed.pods("worker") if not p["metadata"].get("deletionTimestamp")]
    kube.kubectl("delete", "pod", pods[-1]["metadata"]["name"], "-n", NAMESPACE, "--grace-period=0", "--force",
                 check=False)
    verdicts = wait_verdicts(installed, ids, timeout=420)
    statuses = {i: r.status for i, r in verdicts.items()}
    wrong = {i: json.dumps(verdicts[i].details) for i, s in statuses.items() if s != "ACCEPTED"}
    assert not wrong, "\n".join(f"{i}: {d}" for i, d in wrong.items())
    # exactly one verdict each: a late write of an older attempt was refused by the fence
    rows = asyncio.run(_verdict_counts(installed.dsn, ids))
    assert rows == {i: 1 for i in ids}
    # Ready again: the backlog is gone, the fleet back at minReplicas, the rollout finished.
    def ready() -> bool:
        return condition(installed.jq(), "Ready").get("status") == "True"

    try:
        wait_for("the JudgeQueue Ready again", ready, timeout=180)
    except TimeoutError as exc:
        deployments = kube.kubectl("get", "deploy", "-n", NAMESPACE, "-o", "wide", check=False).stdout
        listed = kube.kubectl("get", "pods", "-n", NAMESPACE, "-o", "wide", check=False).stdout
        pytest.fail(f"{exc}\nconditions: {json.dumps(installed.jq().get('status', {}).get('conditions'), indent=1)}"
                    f"\n{deployments}\n{listed}")


async def _verdict_counts(dsn: str, ids: list[int]) -> dict[int, int]:
    """Terminal submissions per id, and that no outbox row of theirs is still pending or claimed."""
    conn = await asyncpg.connect(dsn)
    try:
        terminal = await conn.fetch(
            "SELECT id, count(*) AS n FROM judgequeue.submissions WHERE id = ANY($1::bigint[])"
            " AND finished_at IS NOT NULL GROUP BY id", ids)
        open_rows = await conn.fetchval(
            "SELECT count(*) FROM judgequeue.outbox WHERE submission_id = ANY($1::bigint[])"
            " AND state IN ('PENDING', 'CLAIMED')", ids)
        assert open_rows == 0
        return {r["id"]: r["n"] for r in terminal}
    finally:
        await conn.close()
