"""checkov, a Kubernetes policy scanner, on what judgequeue deploys: every finding fixed or explained.

The operator's children are rendered for the default spec (program judge, sandboxed workers) and for
trusted workers; the Helm chart with ``helm template`` (the pinned helm of scripts/build-kube).
checkov (the ``scan`` extra, in its own venv: see pyproject.toml) scans them all in one run. Every
failed check must be in :data:`ALLOWED` with its reason, and every entry of :data:`ALLOWED` must still
be found (a fixed finding leaves the list). A canary Deployment with known defects proves the scan
and the comparison see what they should. Before/after counts: docs/judges.md, "checkov".
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from judgequeue.controllers import render
from judgequeue.core.spec import JudgeQueueSpec, parse_spec

ROOT = Path(__file__).resolve().parents[2]
#: The chart is rendered with the helm scripts/build-kube builds: on a new machine these tests run
#: after that build (tests/conftest.py).
pytestmark = pytest.mark.builds

CHECKOV = Path(os.environ.get("JUDGEQUEUE_CHECKOV", ROOT / ".venv-checkov" / "bin" / "checkov"))
OWNER = render.Owner("judge", "judge-ns", "uid-1")

USER_IMAGE = "spec.image and spec.imagePullPolicy are the user's (IfNotPresent by default; a digest is accepted)"
SANDBOX = "the program judge's sandbox: root in the container to give each box its own uid and cgroups"
TRUSTED_ROLE = ("runs no untrusted code; its egress (Postgres, Redis, maybe a direct LISTEN DSN elsewhere) "
                "is the cluster's policy to set")
CHART_IMAGE = "image.repository/tag/pullPolicy are the installer's values (a digest is accepted)"

#: (scanned file, check id) -> why it stays. Files: ``<scenario>/<object name>``.
ALLOWED: dict[tuple[str, str], str] = {
    **{(f"isolated/judge-{role}", check): USER_IMAGE
       for role in ("dispatcher", "worker", "reaper") for check in ("CKV_K8S_15", "CKV_K8S_43")},
    ("isolated/judge-worker", "CKV_K8S_23"): SANDBOX + " (runAsUser 0, runAsNonRoot false)",
    ("isolated/judge-worker", "CKV_K8S_40"): SANDBOX + " (uid 0 is not a high UID)",
    ("isolated/judge-worker", "CKV_K8S_25"): "the sandbox's capabilities: SETUID/SETGID (a uid per box), "
                                             "CHOWN/DAC_OVERRIDE/FOWNER (its 0700 dir), KILL (its leftovers)",
    ("isolated/judge-dispatcher", "CKV2_K8S_6"): TRUSTED_ROLE,
    ("isolated/judge-reaper", "CKV2_K8S_6"): TRUSTED_ROLE,
    **{(f"trusted/judge-{role}", check): USER_IMAGE
       for role in ("dispatcher", "worker", "reaper") for check in ("CKV_K8S_15", "CKV_K8S_43")},
    ("trusted/judge-dispatcher", "CKV2_K8S_6"): TRUSTED_ROLE,
    ("trusted/judge-reaper", "CKV2_K8S_6"): TRUSTED_ROLE,
    ("chart/judgequeue", "CKV_K8S_15"): CHART_IMAGE,
    ("chart/judgequeue", "CKV_K8S_43"): CHART_IMAGE,
    ("chart/judgequeue", "CKV_K8S_11"): "no CPU limit on the operator on purpose: throttling delays reconciles "
                                        "(CPU and memory requested, memory limited)",
    ("chart/judgequeue", "CKV_K8S_38"): "the operator talks to the API server as its ServiceAccount: it needs "
                                        "the token",
    ("chart/judgequeue", "CKV_K8S_9"): "no Service sends traffic to the operator (one leader, Kopf peering); its "
                                       "liveness probe is set",
    ("chart/judgequeue", "CKV2_K8S_6"): "the operator must reach the API server, Postgres and Redis, whose "
                                        "addresses the chart cannot know; set a NetworkPolicy of your own",
    ("chart/judgequeue-migrations", "CKV_K8S_15"): CHART_IMAGE + " (the migration Job runs the operator's image)",
    ("chart/judgequeue-migrations", "CKV_K8S_43"): CHART_IMAGE + " (the migration Job runs the operator's image)",
    ("chart/judgequeue-migrations", "CKV_K8S_11"): "no CPU limit on the migration Job on purpose: a throttled "
                                                   "migration holds its transaction's locks longer (CPU and "
                                                   "memory requested, memory limited)",
    ("chart/judgequeue-migrations", "CKV2_K8S_6"): "the migration Job must reach Postgres, whose address the chart "
                                                   "cannot know; set a NetworkPolicy of your own",
}

#: What the canary must be caught for: CPU/memory requests/limits missing, a secret in env, privileged.
CANARY_CHECKS = {"CKV_K8S_10", "CKV_K8S_11", "CKV_K8S_12", "CKV_K8S_13", "CKV_K8S_35", "CKV_K8S_16"}


def parsed(**worker: Any) -> JudgeQueueSpec:
    spec = parse_spec({"image": "ghcr.io/example/judgequeue:1.0", "postgres": {"secretKeyRef": {"name": "db"}},
                       "redis": {"secretKeyRef": {"name": "rd"}}, "worker": worker}, name="judge")
    assert isinstance(spec, JudgeQueueSpec), spec
    return spec


def canary() -> dict[str, Any]:
    """A dispatcher Deployment as it must never be rendered: no resources, the DSN in env, privileged."""
    body = render.render_deployment(parsed(), OWNER, "dispatcher", replicas=1).body
    container = body["spec"]["template"]["spec"]["containers"][0]
    container.pop("resources")
    container["env"].append({"name": "JUDGEQUEUE_POSTGRES_DSN",
                             "valueFrom": {"secretKeyRef": {"name": "db", "key": "dsn"}}})
    container["securityContext"]["privileged"] = True
    return body


def helm_binary() -> Path:
    out = subprocess.run([str(ROOT / "scripts" / "build-kube"), "--print-dir"], check=True, capture_output=True,
                         text=True).stdout
    dirs = dict(line.split("=", 1) for line in out.split())
    return Path(dirs["HELM_BIN"]) / "helm"


def write_manifests(base: Path) -> None:
    for scenario, spec in (("isolated", parsed()), ("trusted", parsed(sandbox="trusted"))):
        (base / scenario).mkdir()
        for child in render.render_children(spec, OWNER, worker_replicas=1):
            (base / scenario / f"{child.name}.yaml").write_text(yaml.safe_dump(child.body))
    (base / "canary").mkdir()
    (base / "canary" / "judge-dispatcher.yaml").write_text(yaml.safe_dump(canary()))
    helm = helm_binary()
    assert helm.exists(), f"{helm} is missing: run scripts/build-kube (scripts/test does)"
    chart = subprocess.run([str(helm), "template", "judgequeue", str(ROOT / "charts" / "judgequeue"), "-n",
                            "judgequeue-system", "--kube-version", "1.36.3"], check=True, capture_output=True,
                           text=True, env={**os.environ, "HELM_CACHE_HOME": str(base / ".helm"),
                                           "HELM_CONFIG_HOME": str(base / ".helm"),
                                           "HELM_DATA_HOME": str(base / ".helm")}).stdout
    (base / "chart").mkdir()
    for doc in yaml.safe_load_all(chart):
        if doc:
            (base / "chart" / f"{doc['kind'].lower()}-{doc['metadata']['name']}.yaml").write_text(yaml.safe_dump(doc))


def scan(base: Path) -> set[tuple[str, str]]:
    """checkov's failed checks as (``<scenario>/<object name>``, check id)."""
    done = subprocess.run([str(CHECKOV), "--directory", str(base), "--framework", "kubernetes", "--output", "json",
                           "--quiet", "--compact", "--skip-download"], capture_output=True, text=True, timeout=600)
    assert done.returncode in (0, 1), done.stderr[-3000:]  # 1: some check failed
    reports = json.loads(done.stdout)
    found: set[tuple[str, str]] = set()
    for report in reports if isinstance(reports, list) else [reports]:
        assert report["check_type"] == "kubernetes"
        for check in report["results"]["failed_checks"]:
            path = Path(check["file_path"].lstrip("/"))
            name = path.stem.split("-", 1)[1] if path.parent.name == "chart" else path.stem
            found.add((f"{path.parent.name}/{name}", check["check_id"]))
    return found


@pytest.fixture(scope="module")
def findings(tmp_path_factory: pytest.TempPathFactory) -> set[tuple[str, str]]:
    if not CHECKOV.exists():
        pytest.fail(f"checkov is not installed at {CHECKOV}: scripts/prepare-tests makes it (scripts/test runs that)")
    base = tmp_path_factory.mktemp("checkov")
    write_manifests(base)
    return scan(base)


def test_every_finding_is_fixed_or_explained(findings: set[tuple[str, str]]) -> None:
    found = {f for f in findings if not f[0].startswith("canary/")}
    unexplained = sorted(found - set(ALLOWED))
    assert not unexplained, f"checkov findings neither fixed nor in ALLOWED (with a reason): {unexplained}"
    stale = sorted(set(ALLOWED) - found)
    assert not stale, f"ALLOWED lists findings checkov no longer reports (remove them): {stale}"


def test_the_canary_is_caught(findings: set[tuple[str, str]]) -> None:
    caught = {check for where, check in findings if where == "canary/judge-dispatcher"}
    assert caught >= CANARY_CHECKS, sorted(CANARY_CHECKS - caught)
    assert not {("isolated/judge-dispatcher", c) for c in CANARY_CHECKS} & set(ALLOWED)


def test_fixed_by_this_design(findings: set[tuple[str, str]]) -> None:
    """What checkov would report on Deployments rendered without these choices, and does not: requests
    and limits for every role, connections as files, an egress NetworkPolicy for program workers."""
    for role in ("dispatcher", "worker", "reaper"):
        for check in ("CKV_K8S_10", "CKV_K8S_11", "CKV_K8S_12", "CKV_K8S_13", "CKV_K8S_35"):
            assert (f"isolated/judge-{role}", check) not in findings
    assert ("isolated/judge-worker", "CKV2_K8S_6") not in findings
    assert ("trusted/judge-worker", "CKV2_K8S_6") not in findings
