"""docs/gitops.md's Argo CD health check (Lua), run with lupa against typical JudgeQueue objects."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import lupa
import pytest

ROOT = Path(__file__).resolve().parents[2]
GITOPS = ROOT / "docs" / "gitops.md"


def health_script() -> str:
    blocks = re.findall(r"```lua\n(.*?)```", GITOPS.read_text(), re.S)
    assert len(blocks) == 1, "docs/gitops.md should hold exactly one Lua block"
    return str(blocks[0])


def health(obj: dict[str, Any]) -> tuple[str, str]:
    """Run the health check the way Argo CD does: ``obj`` global, the script returns ``hs``."""
    lua = lupa.LuaRuntime(unpack_returned_tuples=True)
    lua.globals().obj = lua.table_from(obj, recursive=True)
    hs = lua.execute(health_script())
    return str(hs["status"]), str(hs["message"])


def cond(type_: str, status: str, reason: str = "R", message: str = "m", generation: int = 3) -> dict[str, Any]:
    return {"type": type_, "status": status, "reason": reason, "message": message, "observedGeneration": generation}


def jq(*conditions: dict[str, Any], observed: int | None = 3, paused: bool = False) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "judgequeue.dev/v1alpha1", "kind": "JudgeQueue",
        "metadata": {"name": "judge", "generation": 3},
        "spec": {"queue": "judge", "paused": paused, "cutover": {"mode": "live"}},
    }
    if observed is not None:
        obj["status"] = {"observedGeneration": observed, "conditions": list(conditions)}
    return obj


def _without_observed(obj: dict[str, Any]) -> dict[str, Any]:
    del obj["status"]["observedGeneration"]
    return obj


HEALTHY = (
    cond("Ready", "True", "AllReplicasAvailable", "dispatcher 1/1, worker 2/2, reaper 1/1"),
    cond("Progressing", "False", "Reconciled"),
    cond("Degraded", "False", "Reconciled"),
    cond("CutoverApplied", "True", "Applied"),
)


@pytest.mark.parametrize(
    ("obj", "expected", "fragment"),
    [
        (jq(*HEALTHY), "Healthy", "worker 2/2"),
        (jq(observed=None), "Progressing", "generation 3"),
        (jq(*HEALTHY, observed=2), "Progressing", "generation 3"),
        (jq(cond("Degraded", "True", "InvalidSpec", "worker.minReplicas must not exceed worker.maxReplicas")),
         "Degraded", "InvalidSpec: worker.minReplicas"),
        (jq(cond("Ready", "True"), cond("CutoverApplied", "False", "WatermarkMovedBack", "moved back")),
         "Degraded", "moved back"),
        (jq(cond("Ready", "True"), cond("CutoverApplied", "False", "DatabaseUnavailable", "no db")),
         "Progressing", "no db"),
        (jq(cond("Ready", "True"), cond("CutoverApplied", "False", "WaitingForSubmits", "waited 10s for 1")),
         "Progressing", "waited 10s"),
        # A flip the gate holds back waits for figures: progressing, never degraded.
        (jq(cond("Ready", "True"), cond("CutoverApplied", "False", "GateNotMet", "held back by cutover.gate")),
         "Progressing", "held back by cutover.gate"),
        (jq(cond("Ready", "False", "ReplicasUnavailable", "available replicas: worker 0/2"),
            cond("CutoverApplied", "True")), "Progressing", "worker 0/2"),
        (jq(cond("Ready", "True"), cond("CutoverApplied", "True", generation=2)), "Progressing", "cutover"),
        (jq(cond("Ready", "True")), "Progressing", "cutover"),
        (jq(*HEALTHY, paused=True), "Suspended", "Paused"),
        # A failure reported for this generation wins over a status the operator could not finish.
        (_without_observed(jq(cond("Degraded", "True", "ChildRefused", "Service judge-metrics: too long"))),
         "Degraded", "ChildRefused: Service judge-metrics"),
        (jq(cond("Ready", "True"), cond("CutoverApplied", "False", "Drifted", "queue 'judge' holds mode=live")),
         "Degraded", "holds mode=live"),
        (jq(cond("Ready", "False"), cond("CutoverApplied", "False", "QueueOwned", "belongs to JudgeQueue a/judge")),
         "Degraded", "belongs to JudgeQueue a/judge"),
    ],
)
def test_argo_cd_health_check(obj: dict[str, Any], expected: str, fragment: str) -> None:
    status, message = health(obj)
    assert status == expected, message
    assert fragment in message
