"""The user path on a real node with per-component credentials (docs/security.md, "On Kubernetes").

The chart installed as README.md says (the session's ``helm install``), the database migrated by its
owner, then what an administrator does for least privilege: a Postgres login user and a Redis ACL
user per component, a Secret per component, and a JudgeQueue whose ``spec.credentials`` names them.
The shared ``spec.postgres``/``spec.redis`` Secrets hold a login that does not exist, so whatever
works here works on the components' own credentials: the operator creates and flips the queue, the
dispatcher, program-judge workers (sandboxed, in real pods) and reaper judge, the application submits
and reads verdicts with its own user, and a cutover from shadow to live at a watermark goes through.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from judgequeue.core import api
from judgequeue.core.spec import CREDENTIAL_COMPONENTS
from tests.kube.tools import condition, jq_path, run_sql, wait_for
from tests.node.conftest import NodeCluster, migrated_database
from tests.support.applications import py, results, submit_all
from tests.support.credentials import ComponentUser, drop_component_users, make_component_users, with_user

NAMESPACE = "split"
QUEUE = "split"
PASSWORD = "per-component-secret"
TERMINAL = set(api.VERDICTS)


NORMAL = {
    "ACCEPTED": py("print('ok')"),
    "WRONG_ANSWER": py("print('no')"),
    "TIME_LIMIT": py("while True: pass", time=0.5),
    # the pod's mounted credentials are not in the box either
    "credentials": py("import os\nfound = [p for p in ('/var/run/secrets', '/var/run/secrets/judgequeue')"
                      " if os.path.exists(p)] + [k for k in os.environ if k.startswith('JUDGEQUEUE')]\n"
                      "print('ok' if not found else found)\n"),
}
EXPECTED = {"ACCEPTED": "ACCEPTED", "WRONG_ANSWER": "WRONG_ANSWER", "TIME_LIMIT": "TIME_LIMIT",
            "credentials": "ACCEPTED"}


@dataclass
class Split:
    cluster: NodeCluster
    database: str
    users: dict[str, ComponentUser]

    @property
    def admin_dsn(self) -> str:
        return self.cluster.local_dsn(self.database)

    @property
    def application_dsn(self) -> str:
        return with_user(self.cluster.local_dsn(self.database), self.users["application"].user, PASSWORD)

    def jq(self) -> dict[str, Any]:
        return dict(self.cluster.kube.request("GET", jq_path(NAMESPACE, "judge")))

    def patch(self, spec: dict[str, Any]) -> None:
        self.cluster.kube.kubectl("patch", "jq", "judge", "-n", NAMESPACE, "--type=merge", "-p",
                                  json.dumps({"spec": spec}))


def manifests(cluster: NodeCluster, database: str, users: dict[str, ComponentUser]) -> list[dict[str, Any]]:
    secrets = [
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": f"judgequeue-{c}", "namespace": NAMESPACE},
         "stringData": {"postgres-dsn": with_user(cluster.pod_dsn(database), users[c].user, PASSWORD),
                        "redis-url": with_user(cluster.pod_redis_url, users[c].user, PASSWORD)}}
        for c in CREDENTIAL_COMPONENTS
    ]
    # The shared Secrets hold a login nobody has: no component may fall back on them.
    nobody = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "judgequeue-shared", "namespace": NAMESPACE},
              "stringData": {"dsn": with_user(cluster.pod_dsn(database), "nobody", "wrong"),
                             "url": with_user(cluster.pod_redis_url, "nobody", "wrong")}}
    judgequeue = {
        "apiVersion": "judgequeue.dev/v1alpha1", "kind": "JudgeQueue",
        "metadata": {"name": "judge", "namespace": NAMESPACE},
        "spec": {
            "image": cluster.image, "imagePullPolicy": "Never", "queue": QUEUE,
            "postgres": {"secretKeyRef": {"name": "judgequeue-shared", "key": "dsn"}},
            "redis": {"secretKeyRef": {"name": "judgequeue-shared", "key": "url"}},
            "credentials": {c: {"secretName": f"judgequeue-{c}"} for c in CREDENTIAL_COMPONENTS},
            "worker": {"judge": "program", "minReplicas": 1, "maxReplicas": 1, "concurrency": 2},
            "cutover": {"mode": "shadow"},  # a legacy judge is authoritative until the flip below
        },
    }
    return [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}, *secrets, nobody, judgequeue]


@pytest.fixture(scope="module")
def split(node_cluster: NodeCluster, helm_installed: None) -> Iterator[Split]:
    database = migrated_database(node_cluster)  # by its owner, as the chart's migration Job does
    users = asyncio.run(make_component_users(
        node_cluster.local_dsn(database), node_cluster.pod_redis_url, QUEUE, ("application", *CREDENTIAL_COMPONENTS),
        prefix=f"jq_{uuid.uuid4().hex[:6]}", password=PASSWORD))
    kube = node_cluster.kube
    kube.apply(manifests(node_cluster, database, users))
    installed = Split(node_cluster, database, users)
    waited = kube.kubectl("wait", "-n", NAMESPACE, "jq/judge", "--for=condition=Ready", "--timeout=5m",
                          check=False, timeout=330)
    if waited.returncode != 0:
        logs = kube.kubectl("logs", "-n", NAMESPACE, "deploy/judge-worker", "--tail=5", check=False)
        pytest.fail(f"JudgeQueue not Ready: {installed.jq().get('status')}\nworker log: {logs.stdout[-3000:]}")
    yield installed
    kube.kubectl("delete", "jq", "judge", "-n", NAMESPACE, "--wait=true", "--timeout=120s", check=False, timeout=150)
    asyncio.run(drop_component_users(node_cluster.local_dsn(database), node_cluster.pod_redis_url, users.values()))


def _outbox_states(split: Split, ids: list[int]) -> dict[int, str]:
    rows = run_sql(split.admin_dsn, "SELECT submission_id, state FROM judgequeue.outbox WHERE submission_id = ANY($1)",
                   ids)
    return {r["submission_id"]: r["state"] for r in rows}


def test_judging_and_cutover_with_each_components_own_credentials(split: Split) -> None:
    kube = split.cluster.kube
    jq = split.jq()
    shared = condition(jq, "SharedCredentials")
    assert (shared.get("status"), shared.get("reason")) == ("False", "PerComponentCredentials"), shared
    # Each Deployment mounts its own component's Secret and nothing else.
    for role in ("dispatcher", "worker", "reaper"):
        deployment = kube.request("GET", f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/judge-{role}")
        pod = deployment["spec"]["template"]["spec"]
        names = {s["secret"]["name"] for v in pod["volumes"] for s in (v.get("projected") or {}).get("sources", [])}
        assert names == {f"judgequeue-{role}"}, (role, names)

    # Shadow mode: the application's submission goes to the shadow stream, never judged live.
    before = asyncio.run(submit_all(split.application_dsn, QUEUE, [py("print('ok')")]))
    wait_for("the shadow-mode submission sent to the shadow stream",
             lambda: _outbox_states(split, before) == {before[0]: "SHADOW_SENT"}, timeout=120)

    # The cutover: live from the database's present on (the watermark), applied by the operator's own login.
    now = run_sql(split.admin_dsn,
                  "SELECT to_char(clock_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"') AS t")
    watermark = now[0]["t"]  # every submission below is created after it (the database's clock)
    split.patch({"cutover": {"mode": "live", "watermark": watermark}})

    def flipped() -> bool:
        found = split.jq()
        return bool((found.get("status") or {}).get("cutover", {}).get("mode") == "live"
                    and condition(found, "CutoverApplied").get("status") == "True"
                    and condition(found, "CutoverApplied").get("observedGeneration") == found["metadata"]["generation"])

    wait_for("the flip to live applied", flipped, timeout=120)
    flags = run_sql(split.admin_dsn, "SELECT mode, watermark FROM judgequeue.queues WHERE name = $1", QUEUE)
    assert flags[0]["mode"] == "live" and flags[0]["watermark"] is not None

    started = time.monotonic()
    ids = asyncio.run(submit_all(split.application_dsn, QUEUE, list(NORMAL.values())))

    def all_done() -> dict[int, api.Result] | None:
        found = asyncio.run(results(split.application_dsn, ids))
        return found if all(r.status in TERMINAL for r in found.values()) else None

    verdicts: dict[int, api.Result] = wait_for(f"{len(ids)} verdicts", all_done, timeout=300)
    print(f"\n[node tier] {len(ids)} submissions judged on per-component credentials in "
          f"{time.monotonic() - started:.1f} s")
    for name, i in zip(NORMAL, ids, strict=True):
        assert verdicts[i].status == EXPECTED[name], (name, verdicts[i].status, verdicts[i].details)
        assert (verdicts[i].details or {})["details"]["isolation"] == "full", verdicts[i].details
    # The pre-watermark submission was never judged live.
    assert asyncio.run(results(split.application_dsn, before))[before[0]].status == "PENDING"
    assert _outbox_states(split, before) == {before[0]: "SHADOW_SENT"}

    # Who the pods logged in as: each component's own user, never a superuser or the shared login.
    pods = run_sql(split.admin_dsn, "SELECT DISTINCT usename FROM pg_stat_activity WHERE datname = $1"
                                    " AND client_addr IS DISTINCT FROM '127.0.0.1'::inet", split.database)
    logins = {r["usename"] for r in pods}
    own = {split.users[c].user for c in CREDENTIAL_COMPONENTS}
    assert logins <= own, logins - own
    assert {split.users[c].user for c in ("dispatcher", "worker", "reaper")} <= logins, logins
    jq = split.jq()
    assert condition(jq, "Degraded").get("status") == "False", jq.get("status")
