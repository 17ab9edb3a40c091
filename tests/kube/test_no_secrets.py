"""No secret reaches the operator's Events, logs or status, on the real control plane with the chart's RBAC.

The operator runs at DEBUG (its log then carries every diff) with a Postgres DSN that holds a
password. Someone adds environment variables holding credentials to the worker Deployment (a
connection string, a token); the operator reverts them and names each field in a ``DriftReverted``
Warning. Then the Redis Secret gets a URL with a password and a bad port (``InvalidConnection``),
and the Postgres Secret a DSN with another password that cannot connect (``DatabaseUnavailable``).
Every secret value used is looked for in every Event of the namespace, in the operator's whole log
and in the JudgeQueue as ``kubectl get -o json`` prints it: none may be there.
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from tests.kube import tools
from tests.kube.cluster import Cluster
from tests.support.databases import REDIS_URL


def _with_password(dsn: str, password: str) -> str:
    parts = urlsplit(dsn)
    user, _, host = parts.netloc.rpartition("@")
    return urlunsplit(parts._replace(netloc=f"{user or 'postgres'}:{password}@{host}"))


def _put_secret(kube: Cluster, namespace: str, name: str, key: str, value: str) -> None:
    kube.request("PUT", f"/api/v1/namespaces/{namespace}/secrets/{name}", {
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": name},
        "data": {key: base64.b64encode(value.encode()).decode()}})


def _wait_for_condition(kube: Cluster, namespace: str, what: str, operator: tools.OperatorProcess,
                        met: Callable[[dict[str, dict[str, Any]]], bool]) -> None:
    """Wait until ``met`` holds of the JudgeQueue's conditions (by type); on timeout, show them."""
    seen: dict[str, dict[str, Any]] = {}

    def probe() -> bool:
        status = kube.request("GET", tools.jq_path(namespace, "judge")).get("status") or {}
        seen.clear()
        seen.update({c["type"]: c for c in status.get("conditions") or []})
        return met(seen)

    try:
        tools.wait_for(what, probe, timeout=30, check=operator.check)
    except TimeoutError as exc:
        raise AssertionError(f"{exc}; the conditions: {list(seen.values())}") from exc


def test_no_secret_value_reaches_events_logs_or_status(
    crd_installed: Cluster, namespace: str, pg_dsn: str, queue_name: str, tmp_path: Path
) -> None:
    kube = crd_installed
    tag = uuid.uuid4().hex[:10]
    secrets = {
        "postgres password": f"pg-{tag}-pw",  # Postgres on 127.0.0.1 trusts: any password connects
        "added DSN password": f"added-{tag}-pw",
        "added token": f"tok-{tag}-abcdef",
        "added password": f"plain-{tag}",
        "redis password": f"rds-{tag}-pw",
        "unreachable DSN password": f"gone-{tag}-pw",
    }
    dsn = _with_password(pg_dsn, secrets["postgres password"])
    operator = tools.operator_with_secrets(kube, namespace, tmp_path / "operator.log", dsn=dsn,
                                           extra_env={"JUDGEQUEUE_LOG_LEVEL": "DEBUG"})
    worker = f"/apis/apps/v1/namespaces/{namespace}/deployments/judge-worker"
    try:
        kube.request("POST", tools.jq_path(namespace), tools.judgequeue(
            "judge", queue_name, dispatcher={"replicas": 0}, reaper={"replicas": 0},
            # No pods: what the status says is then about the connections alone, whether or not a
            # node agent of the package (started by an earlier test) would run them.
            worker={"judge": "sleep", "autoscaling": "external", "replicas": 0}))
        met, _, out = tools.kubectl_wait(kube, namespace, "judge", "CutoverApplied", timeout=60)
        assert met, (out, operator.text()[-3000:])
        tools.wait_for("the worker Deployment", lambda: kube.get(worker), timeout=30, check=operator.check)

        obj = kube.request("GET", worker)
        obj["spec"]["template"]["spec"]["containers"][0].setdefault("env", []).extend([
            {"name": "DATABASE_URL",
             "value": f"postgresql://judgequeue:{secrets['added DSN password']}@db.judge.svc:5432/judge"},
            {"name": "API_TOKEN", "value": secrets["added token"]},
            {"name": "DB_PASSWORD", "value": secrets["added password"]},
        ])
        kube.request("PUT", worker, obj)
        reverted = tools.wait_for("DriftReverted naming the added variables", lambda: [
            e for e in tools.warning_events(kube, namespace, "judge", "DriftReverted")
            if "env[DATABASE_URL]" in e["message"]], timeout=30, check=operator.check)
        assert "postgresql://judgequeue:***@db.judge.svc" in reverted[0]["message"], reverted[0]["message"]

        _put_secret(kube, namespace, "judgequeue-redis", "url",
                    f"redis://:{secrets['redis password']}@127.0.0.1:notaport/0")
        met, _, out = tools.kubectl_wait(kube, namespace, "judge", "Degraded", timeout=30)
        assert met, out
        _wait_for_condition(kube, namespace, "the Redis URL refused", operator,
                            lambda c: c.get("Degraded", {}).get("reason") == "InvalidConnection")
        _put_secret(kube, namespace, "judgequeue-redis", "url", REDIS_URL)
        _put_secret(kube, namespace, "judgequeue-postgres", "dsn",
                    f"postgresql://postgres:{secrets['unreachable DSN password']}@127.0.0.1:1/none")
        # The queue's own condition says why; Degraded names it among whatever else fails meanwhile
        # (which of several problems comes first is not promised).
        _wait_for_condition(kube, namespace, "the database out of reach", operator, lambda c: (
            c.get("CutoverApplied", {}).get("reason") == "DatabaseUnavailable"
            and c.get("Degraded", {}).get("status") == "True"
            and f"cannot read or write queue {queue_name!r}" in c["Degraded"].get("message", "")))
        tools.wait_for("its Warning", lambda: tools.warning_events(kube, namespace, "judge", "DatabaseUnavailable"),
                       timeout=10, check=operator.check)
        _put_secret(kube, namespace, "judgequeue-postgres", "dsn", dsn)
        met, _, out = tools.kubectl_wait(kube, namespace, "judge", "Degraded", value="False", timeout=30)
        assert met, out

        events = json.dumps(kube.request("GET", f"/api/v1/namespaces/{namespace}/events")["items"])
        status = kube.kubectl("get", "-n", namespace, "jq", "judge", "-o", "json").stdout
        log = operator.text()
        assert "DriftReverted" in events and "DatabaseUnavailable" in events and '"diff"' in log
        found: dict[str, Any] = {name: [where for where, text in (("events", events), ("status", status),
                                                                   ("operator log", log)) if value in text]
                                 for name, value in secrets.items()}
        assert found == {name: [] for name in secrets}, found
    finally:
        operator.stop()
