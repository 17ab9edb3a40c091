"""An http-call JudgeQueue on the real control plane: the endpoint's URL comes from a Secret.

The chart's operator renders the worker pods; the node agent mounts the Secret's key where the
operator said (beside the connections) and runs the workers; a job submitted in SQL is carried to
the example tool server (on the host's loopback, which the agent's pods share) with its
idempotency key, and the tool's answer is the stored verdict.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.kube.cluster import Cluster
from tests.kube.node import NodeAgent
from tests.kube.test_user_path import RELEASE_NS, helm_install, secrets_manifest
from tests.kube.tools import KUBE_REDIS_URL, clear_queue_keys, condition, jq_path, run_sql, wait_for
from tests.support.databases import ADMIN_DSN
from tests.support.tool_server import ToolServer

ROOT_EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "agent" / "judgequeue.yaml"
QUEUE = "agents"


@pytest.fixture(scope="module")
def agents(kube: Cluster, node: NodeAgent) -> Iterator[tuple[Cluster, str, str, ToolServer]]:
    """The chart installed, a migrated database, the Secrets (the tool's URL among them) and the
    agent example applied with its endpoint's URL taken from that Secret."""
    database = f"jq_kube_{uuid.uuid4().hex[:8]}"
    dsn = ADMIN_DSN.rsplit("/", 1)[0] + f"/{database}"
    run_sql(ADMIN_DSN, f'CREATE DATABASE "{database}"')
    clear_queue_keys(KUBE_REDIS_URL, QUEUE)
    tool = ToolServer("--delay", "0.2", "--fail-first", "1")
    namespace = f"agents-{uuid.uuid4().hex[:6]}"
    try:
        result = helm_install(kube, dsn)  # its pre-install hook migrates the database
        assert "STATUS: deployed" in result.stdout, result.stdout + result.stderr
        kube.kubectl("create", "namespace", namespace)
        kube.apply(secrets_manifest(namespace, dsn, KUBE_REDIS_URL))
        kube.apply(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "agent-tools", "namespace": namespace},
            "type": "Opaque", "stringData": {"tool-url": tool.url + "/effect"},
        }))  # fmt: skip
        doc: dict[str, Any] = yaml.safe_load(ROOT_EXAMPLE.read_text())
        [endpoint] = doc["spec"]["worker"]["endpoints"]
        del endpoint["url"]
        endpoint["secretKeyRef"] = {"name": "agent-tools", "key": "tool-url"}
        doc["spec"]["worker"].update(minReplicas=1, maxReplicas=1)
        kube.request("POST", jq_path(namespace), doc)
        yield kube, namespace, dsn, tool
    finally:
        kube.kubectl("delete", "jq", "agents", "-n", namespace, "--wait=true", "--timeout=60s", check=False)
        kube.helm_cmd("uninstall", "judgequeue", "-n", RELEASE_NS, "--wait", check=False)
        wait_for("the agent pods gone", lambda: not kube.request("GET", f"/api/v1/namespaces/{namespace}/pods")
                 ["items"], timeout=90)
        tool.close()
        clear_queue_keys(KUBE_REDIS_URL, QUEUE)
        run_sql(ADMIN_DSN, f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')


def test_a_job_calls_the_endpoint_whose_url_is_a_secret(agents: tuple[Cluster, str, str, ToolServer]) -> None:
    kube, namespace, dsn, tool = agents

    def ready() -> bool:
        obj = kube.request("GET", jq_path(namespace, "agents"))
        return condition(obj, "Ready").get("status") == "True"

    wait_for("the agents JudgeQueue Ready", ready, timeout=180)
    (row,) = run_sql(dsn, "SELECT judgequeue.submit('agents', $1::jsonb) AS id",
                     json.dumps({"endpoint": "tool", "body": {"order": 1}}))  # fmt: skip
    sid = row["id"]

    def verdict() -> dict[str, Any] | None:
        (found,) = run_sql(dsn, "SELECT status, verdict FROM judgequeue.submissions WHERE id = $1", sid)
        return None if found["status"] in ("PENDING", "JUDGING") else dict(found)

    found = wait_for("the job's verdict", verdict, timeout=90)
    doc = json.loads(found["verdict"])
    key = f"judgequeue:agents:{sid}:1"
    assert found["status"] == "ACCEPTED", doc
    # The first call was answered 429/503 and tried again later with the same key, out of any slot.
    assert doc["details"]["tries"] == 2 and doc["details"]["idempotency_key"] == key
    assert doc["details"]["response"] == {"effect": "applied", "key": key, "echo": {"order": 1}}
    assert tool.effects() == {"applied": {key: 1}, "calls": {key: 2}}
