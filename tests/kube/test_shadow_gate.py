"""Shadow judging earns the cutover, end to end on the real control plane.

The operator (as the chart's ServiceAccount) runs a JudgeQueue in shadow mode with shadow workers
of their own (``spec.worker.shadow``: a Deployment the node agent runs as real ``judgequeue worker``
processes with ``JUDGEQUEUE_SHADOW=judge``), a dispatcher and a reaper. A simulated legacy judge
reports its verdicts through the SQL function, as an application in any language would, some
deliberately different. Then:

- the agreement figures are exact everywhere an operator reads them: the reaper's Prometheus metrics,
  ``judgequeue status`` (text and ``--json``), the JudgeQueue's ``status.shadow`` and ``judgequeue
  shadow diff`` (the two mismatches, both verdicts, per-test details);
- ``kubectl apply`` of the flip to live is refused by ``spec.cutover.gate`` (``CutoverApplied=False``,
  reason ``GateNotMet``, the figures in the message, a Warning Event) and the row stays in shadow
  over several passes; more agreeing verdicts come in and the operator writes the flip on its own;
- the rollback to shadow by ``kubectl apply`` is not gated; a flip past a gate it cannot meet goes
  through with ``cutover.force``; the shadow workers scale to none while the row is live.
"""

from __future__ import annotations

import json
import os
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

from tests.kube import tools
from tests.kube.cluster import Cluster
from tests.kube.node import NodeAgent
from tests.support.databases import REDIS_URL

GATE = {"minAgreement": "95%", "minSamples": 20}


def _manifest(queue: str, **cutover: Any) -> dict[str, Any]:
    return tools.judgequeue(
        "judge", queue, cutover=cutover,
        dispatcher={"replicas": 1, "schedule": "200ms"},
        reaper={"replicas": 1, "interval": "1s"},
        worker={"judge": "sleep", "minReplicas": 0, "maxReplicas": 1, "concurrency": 8, "gracePeriod": "2s",
                "shadow": {"enabled": True, "replicas": 1}},
    )  # fmt: skip


class LegacyJudge:
    """The judge being replaced: it has its own verdict for each submission and reports it with
    ``judgequeue.report_legacy_verdict`` (SQL), per-test details included."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn

    def report(self, submission: int, verdict: str) -> None:
        details = {"tests": [{"test": 1, "verdict": "ACCEPTED"}, {"test": 2, "verdict": verdict}]}
        tools.run_sql(self.dsn, "SELECT judgequeue.report_legacy_verdict($1, $2, $3::jsonb)", submission, verdict,
                      json.dumps(details))


def _submit(dsn: str, queue: str, payload: dict[str, Any]) -> int:
    (row,) = tools.run_sql(dsn, "SELECT judgequeue.submit($1, $2::jsonb) AS id", queue, json.dumps(payload))
    return int(row["id"])


def _shadow_final(dsn: str, ids: list[int]) -> bool:
    (row,) = tools.run_sql(dsn, "SELECT count(*) AS n FROM judgequeue.shadow_verdicts"
                                " WHERE submission_id = ANY($1) AND status <> 'JUDGING'", ids)
    return int(row["n"]) == len(ids)


def _row_mode(dsn: str, queue: str) -> str:
    (row,) = tools.run_sql(dsn, "SELECT mode FROM judgequeue.queues WHERE name = $1", queue)
    return str(row["mode"])


def _cli(dsn: str, queue: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "JUDGEQUEUE_POSTGRES_DSN": dsn, "JUDGEQUEUE_REDIS_URL": REDIS_URL, "JUDGEQUEUE_QUEUE": queue}
    return subprocess.run([str(tools.JUDGEQUEUE_BIN), *args], env=env, capture_output=True, text=True, timeout=60)


def _metrics(node: NodeAgent, namespace: str) -> dict[tuple[str, str], float]:
    """``judgequeue_shadow_submissions`` of the reaper pod, by (verdict, outcome), plus the ratio and
    samples under ("", name)."""
    (reaper,) = [r for r in node.running("judge-reaper") if r.namespace == namespace]
    with urllib.request.urlopen(f"http://127.0.0.1:{reaper.ports['metrics']}/metrics", timeout=5) as response:
        text = response.read().decode()
    found: dict[tuple[str, str], float] = {}
    for line in text.splitlines():
        if line.startswith("judgequeue_shadow_submissions{"):
            labels = dict(part.split("=", 1) for part in line[line.index("{") + 1:line.index("}")].split(","))
            found[(labels["verdict"].strip('"'), labels["outcome"].strip('"'))] = float(line.rsplit(" ", 1)[1])
        elif line.startswith(("judgequeue_shadow_agreement_ratio{", "judgequeue_shadow_compared_submissions{")):
            found[("", line.split("{", 1)[0])] = float(line.rsplit(" ", 1)[1])
    return found


def test_shadow_figures_everywhere_and_the_gate_on_the_flip(
    crd_installed: Cluster, node: NodeAgent, namespace: str, pg_dsn: str, queue_name: str, tmp_path: Path
) -> None:
    kube, q = crd_installed, queue_name
    operator = tools.operator_with_secrets(kube, namespace, tmp_path / "operator.log", dsn=pg_dsn)
    legacy = LegacyJudge(pg_dsn)

    def jq() -> dict[str, Any]:
        return dict(kube.request("GET", tools.jq_path(namespace, "judge")))

    try:
        kube.apply(_manifest(q, mode="shadow", gate=GATE), namespace=namespace)
        for component in ("dispatcher", "reaper", "shadow-worker"):
            tools.wait_for(f"a ready {component} pod", lambda c=component: tools.ready_pods(kube, namespace, c),  # type: ignore[misc]
                           timeout=120, check=operator.check)
        assert tools.ready_pods(kube, namespace, "worker") == []  # nothing live to judge in shadow mode

        # 18 agree, 2 deliberately differ, 2 have no legacy verdict, 2 never finish shadow judging.
        matched = [_submit(pg_dsn, q, {"status": s}) for s in ["ACCEPTED", "WRONG_ANSWER"] * 9]
        differ = [_submit(pg_dsn, q, {"status": "ACCEPTED", "echo": "shadow says ACCEPTED"}) for _ in range(2)]
        shadow_only = [_submit(pg_dsn, q, {"status": "RUNTIME_ERROR"}) for _ in range(2)]
        hanging = [_submit(pg_dsn, q, {"hang": True}) for _ in range(2)]
        tools.wait_for("shadow verdicts", lambda: _shadow_final(pg_dsn, matched + differ + shadow_only),
                       timeout=60, check=operator.check)
        for sid, verdict in zip(matched, ["ACCEPTED", "WRONG_ANSWER"] * 9, strict=True):
            legacy.report(sid, verdict)
        for sid in differ:
            legacy.report(sid, "WRONG_ANSWER")
        for sid in hanging:
            legacy.report(sid, "ACCEPTED")
        # Never a submission's verdict: every one of them is still the legacy judge's (PENDING).
        rows = tools.run_sql(pg_dsn, "SELECT DISTINCT status FROM judgequeue.submissions WHERE queue = $1", q)
        assert [r["status"] for r in rows] == ["PENDING"]

        want = {"samples": 20, "matched": 18, "mismatched": 2, "legacyOnly": 2, "shadowOnly": 2,
                "agreement": "90.00%"}

        # judgequeue status, --json and text.
        result = _cli(pg_dsn, q, "status", "--json")
        figures = json.loads(result.stdout)["shadow"]
        assert {k: figures[k] for k in ("matched", "mismatched", "legacy_only", "shadow_only", "samples",
                                        "agreement")} == {"matched": 18, "mismatched": 2, "legacy_only": 2,
                                                          "shadow_only": 2, "samples": 20, "agreement": "90.00%"}
        assert figures["by_verdict"]["ACCEPTED"] == {"matched": 9, "mismatched": 0, "legacy_only": 2,
                                                     "shadow_only": 0}
        assert figures["by_verdict"]["WRONG_ANSWER"] == {"matched": 9, "mismatched": 2, "legacy_only": 0,
                                                         "shadow_only": 0}
        assert figures["by_verdict"]["RUNTIME_ERROR"]["shadow_only"] == 2
        text = _cli(pg_dsn, q, "status").stdout
        assert ("agreement 90.00% over 20 compared (18 matched, 2 mismatched; 2 legacy only, 2 shadow only)"
                in text), text

        # judgequeue shadow diff: exactly the two mismatches, both verdicts, per-test details.
        diff = _cli(pg_dsn, q, "shadow", "diff", "--json")
        assert diff.returncode == 0, diff.stderr
        found = json.loads(diff.stdout)
        assert sorted(m["submission"] for m in found) == sorted(differ)
        assert all(m["legacy"]["status"] == "WRONG_ANSWER" and m["shadow"]["status"] == "ACCEPTED" for m in found)
        assert found[0]["legacy"]["details"]["tests"][1] == {"test": 2, "verdict": "WRONG_ANSWER"}
        assert found[0]["shadow"]["details"]["echo"] == "shadow says ACCEPTED"
        shown = _cli(pg_dsn, q, "shadow", "diff").stdout
        assert f"submission {differ[-1]}  queue {q}  generation 1: legacy WRONG_ANSWER, shadow ACCEPTED" in shown
        assert "legacy  WRONG_ANSWER" in shown and "shadow  ACCEPTED" in shown and "test  verdict" in shown

        # The JudgeQueue's status, read by the operator on each pass.
        def status_shadow() -> dict[str, Any] | None:
            got = (jq().get("status") or {}).get("shadow") or {}
            return got if all(got.get(k) == v for k, v in want.items()) else None

        shadow_status = tools.wait_for("status.shadow with the figures", status_shadow, timeout=30,
                                       check=operator.check)
        assert {"verdict": "WRONG_ANSWER", "matched": 9, "mismatched": 2, "legacyOnly": 0, "shadowOnly": 0} in (
            shadow_status["byVerdict"])
        # Before any flip is asked for, status says whether one would pass now.
        assert shadow_status["gate"].startswith("not met: agreement 90.00% over 20 compared"), shadow_status
        printed = kube.kubectl("get", "jq", "judge", "-n", namespace).stdout
        assert "90.00%" in printed.splitlines()[1], printed

        # The flip, by kubectl apply, refused by the gate: the row stays in shadow mode.
        kube.apply(_manifest(q, mode="live", gate=GATE), namespace=namespace)
        met, _, out = tools.kubectl_wait(kube, namespace, "judge", "CutoverApplied", value="False", timeout=30)
        assert met, out
        cond = tools.condition(jq(), "CutoverApplied")
        assert cond["reason"] == "GateNotMet", cond
        assert "agreement 90.00% over 20 compared (18 matched, 2 mismatched; 2 legacy only, 2 shadow only)" in (
            cond["message"])
        assert "90.00% agree, 95% needed" in cond["message"] and "stays in shadow mode" in cond["message"]
        assert tools.condition(jq(), "Degraded")["status"] == "False"  # waiting for figures is no failure
        tools.wait_ticks(kube, namespace, "judge", 3, check=operator.check)
        assert _row_mode(pg_dsn, q) == "shadow"
        assert (jq()["status"].get("shadow") or {}).get("gate", "").startswith("not met: ")
        assert tools.warning_events(kube, namespace, "judge", "GateNotMet")

        # More agreeing verdicts: 38 of 40 (95.00%) meet the gate; the operator writes the flip itself.
        more = [_submit(pg_dsn, q, {"status": "ACCEPTED"}) for _ in range(20)]
        tools.wait_for("the new shadow verdicts", lambda: _shadow_final(pg_dsn, more), timeout=60,
                       check=operator.check)
        for sid in more:
            legacy.report(sid, "ACCEPTED")
        tools.wait_for("the flip written once the gate is met", lambda: _row_mode(pg_dsn, q) == "live", timeout=30,
                       check=operator.check)
        met, _, out = tools.kubectl_wait(kube, namespace, "judge", "CutoverApplied", timeout=30)
        assert met, out
        applied = tools.condition(jq(), "CutoverApplied")["message"]
        assert "the gate was met: agreement 95.00% over 40 compared" in applied, applied
        flips = [e for e in tools.actions(operator.lines(), "cutover") if "gate met" in e["reason"]]
        assert len(flips) == 1 and "wrote mode=live" in flips[0]["reason"]
        tools.wait_for("the shadow workers scaled to none while live",
                       lambda: not tools.ready_pods(kube, namespace, "shadow-worker"), timeout=60, check=operator.check)

        # The Prometheus figures of the reaper pod (refreshed once a minute): exact.
        final = {("ACCEPTED", "matched"): 29.0, ("ACCEPTED", "legacy_only"): 2.0, ("WRONG_ANSWER", "matched"): 9.0,
                 ("WRONG_ANSWER", "mismatched"): 2.0, ("RUNTIME_ERROR", "shadow_only"): 2.0,
                 ("", "judgequeue_shadow_compared_submissions"): 40.0,
                 ("", "judgequeue_shadow_agreement_ratio"): 0.95}

        def exported() -> dict[tuple[str, str], float] | None:
            got = _metrics(node, namespace)
            return got if all(got.get(k) == v for k, v in final.items()) else None

        got = tools.wait_for("the reaper's metrics", exported, timeout=90, check=operator.check)
        assert sum(v for (verdict, _), v in got.items() if verdict) == 44  # every submission counted once
        assert got[("ACCEPTED", "mismatched")] == 0 and got[("PRESENTATION_ERROR", "matched")] == 0

        # The rollback is never gated, even below the gate; a forced flip goes past a gate it cannot meet.
        strict = {"minAgreement": "100%", "minSamples": 1000}
        kube.apply(_manifest(q, mode="shadow", gate=strict), namespace=namespace)
        tools.wait_for("the rollback written", lambda: _row_mode(pg_dsn, q) == "shadow", timeout=30,
                       check=operator.check)
        kube.apply(_manifest(q, mode="live", gate=strict, force=True), namespace=namespace)
        tools.wait_for("the forced flip written", lambda: _row_mode(pg_dsn, q) == "live", timeout=30,
                       check=operator.check)
        # CutoverApplied was True already (the rollback's): wait for this flip's account, which the
        # passes after it keep until the next write.
        tools.wait_for("the forced flip reported",
                       lambda: "forced past the gate (cutover.force)" in tools.condition(jq(), "CutoverApplied")
                       .get("message", ""), timeout=30, check=operator.check)
        tools.wait_ticks(kube, namespace, "judge", 2, check=operator.check)
        assert "forced past the gate (cutover.force)" in tools.condition(jq(), "CutoverApplied")["message"]
    finally:
        operator.stop()
        kube.kubectl("delete", "-n", namespace, "jq", "judge", "--wait=true", "--timeout=60s", check=False)
