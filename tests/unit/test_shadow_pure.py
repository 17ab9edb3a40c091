"""Shadow judging's pure parts: what "agree" means and the figures, the gate and the operator's
decision with it, the spec's gate and shadow workers, and their rendering."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from decimal import Decimal
from fractions import Fraction
from typing import Any

import pytest

from judgequeue.controllers import conditions, cutover, render
from judgequeue.core.base import agreement
from judgequeue.core.base.agreement import Agreement, Counts, Gate, check_gate, classify, format_percent, summarize
from judgequeue.core.base.errors import ConfigError
from judgequeue.core.base.states import VERDICTS
from judgequeue.core.config import load_settings
from judgequeue.core.spec import JudgeQueueSpec, parse_spec
from judgequeue.core.store.queues import QueueFlags

SPEC: dict[str, Any] = {"image": "img:1", "postgres": {"secretKeyRef": {"name": "db"}},
                        "redis": {"secretKeyRef": {"name": "rd"}}}
OWNER = render.Owner(name="judge", namespace="ns", uid="uid-1")
MARK = datetime(2026, 1, 1, tzinfo=UTC)


# --- agreement -----------------------------------------------------------------------------------


def test_agree_is_status_equality_and_nothing_else() -> None:
    for legacy in VERDICTS:
        for shadow in VERDICTS:
            assert agreement.agree(legacy, shadow) is (legacy == shadow)


@pytest.mark.parametrize(("legacy", "shadow", "outcome"), [
    ("ACCEPTED", "ACCEPTED", "matched"),
    ("ACCEPTED", "WRONG_ANSWER", "mismatched"),
    ("ACCEPTED", "SYSTEM_ERROR", "mismatched"),  # a shadow judge that fails disagrees
    ("TIME_LIMIT", None, "legacy_only"),  # not judged yet, or still being judged
    (None, "ACCEPTED", "shadow_only"),  # not reported yet
    (None, None, None),
])
def test_classify(legacy: str | None, shadow: str | None, outcome: str | None) -> None:
    assert classify(legacy, shadow) == outcome


def test_summarize_counts_per_queue_and_per_verdict_class() -> None:
    figures = summarize("q", [
        ("ACCEPTED", "ACCEPTED", 90), ("ACCEPTED", "WRONG_ANSWER", 3), ("WRONG_ANSWER", "ACCEPTED", 2),
        ("WRONG_ANSWER", "WRONG_ANSWER", 5), ("TIME_LIMIT", None, 4), (None, "RUNTIME_ERROR", 1), (None, None, 7),
    ])
    assert figures.total == Counts(matched=95, mismatched=5, legacy_only=4, shadow_only=1)
    assert figures.by_verdict == {"ACCEPTED": Counts(90, 3), "WRONG_ANSWER": Counts(5, 2),
                                  "TIME_LIMIT": Counts(legacy_only=4), "RUNTIME_ERROR": Counts(shadow_only=1)}
    assert figures.samples == 100 and figures.rate == Fraction(95, 100) and figures.percent == "95.00%"
    assert figures.describe() == ("agreement 95.00% over 100 compared (95 matched, 5 mismatched; 4 legacy only,"
                                  " 1 shadow only)")
    by_verdict: Any = figures.as_dict()["by_verdict"]
    assert by_verdict["ACCEPTED"] == {"matched": 90, "mismatched": 3, "legacy_only": 0, "shadow_only": 0}
    empty = summarize("q", [])
    assert empty.rate is None and empty.percent is None and empty.describe().startswith("nothing compared yet")


def test_percentages_round_down_so_a_shown_figure_never_overstates() -> None:
    assert format_percent(Fraction(199, 200)) == "99.50%"
    assert format_percent(Fraction(1989, 1999)) == "99.49%"  # 99.4997...
    assert format_percent(Fraction(1)) == "100.00%" and format_percent(Fraction(0)) == "0.00%"
    assert format_percent(Fraction(1, 3), 0) == "33%"
    assert agreement.parse_percent("99.5%") == Decimal("99.5") and agreement.parse_percent("100%") == 100
    for bad in ("99.5", "100.5%", "101%", "-1%", "99.5555%", "abc", ""):
        with pytest.raises(ValueError, match="not a percentage"):
            agreement.parse_percent(bad)


def _figures(matched: int, mismatched: int, legacy_only: int = 0) -> Agreement:
    return Agreement("q", Counts(matched, mismatched, legacy_only))


@pytest.mark.parametrize(("figures", "met", "words"), [
    (_figures(995, 5), True, "agreement 99.50% over 1000 compared"),  # exactly at both limits
    (_figures(994, 5), False, "999 compared, 1000 needed"),
    (_figures(1989, 10), False, "99.49% agree, 99.5% needed"),  # 99.4997...%: short, exactly
    (_figures(0, 0, legacy_only=5000), False, "0 compared, 1000 needed"),
])
def test_the_gate_is_decided_exactly(figures: Agreement, met: bool, words: str) -> None:
    check = check_gate(Gate(Decimal("99.5"), 1000), figures)
    assert check.met is met and words in check.message, check.message
    assert "at least 99.5% over at least 1000 compared" in check.message


# --- the operator's decision ---------------------------------------------------------------------


def _row(mode: str = "shadow", paused: bool = False, watermark: datetime | None = None) -> QueueFlags:
    return QueueFlags("q", mode, watermark, paused, 3, MARK, "JudgeQueue ns/judge")  # type: ignore[arg-type]


GATE = Gate(Decimal("99.5"), 1000)


def _want(mode: str = "live", *, gate: Gate | None = GATE, force: bool = False, paused: bool = False,
          watermark: datetime | None = None) -> cutover.Wanted:
    return cutover.Wanted("q", mode, paused, watermark, "restore", gate, force)


MET, SHORT = _figures(1000, 0), _figures(10, 0)


@pytest.mark.parametrize(("want", "row", "last", "figures", "decision"), [
    (_want(), _row(), None, SHORT, "gated"),  # a flip to live below the gate is held back
    (_want(), _row(), None, None, "gated"),  # figures that could not be read never meet it
    (_want(), _row(), None, MET, "write"),  # the first pass whose figures meet it writes the flip
    (_want(force=True), _row(), None, SHORT, "write"),  # forced
    (_want(gate=None), _row(), None, SHORT, "write"),  # no gate: as before
    (_want("shadow"), _row("live"), None, SHORT, "write"),  # a rollback is never gated
    (_want(), _row("live"), None, SHORT, "applied"),  # already live (by hand): nothing to hold back
    (_want(), _row(), _want().canonical(), SHORT, "gated"),  # drift back to shadow: restoring it is a flip
    (_want("shadow", paused=True), _row("shadow"), None, SHORT, "write"),  # other flags are not gated
])
def test_the_decision_with_a_gate(want: cutover.Wanted, row: QueueFlags, last: str | None,
                                  figures: Agreement | None, decision: str) -> None:
    assert cutover.decide(want, row, last_applied=last, figures=figures) == decision


def test_a_gated_flip_writes_the_other_flags_and_says_why() -> None:
    want, row = _want(paused=True, watermark=MARK), _row()
    held = cutover.held_back(want, row)
    assert held.canonical() == "mode=shadow paused=true watermark=2026-01-01T00:00:00Z"
    sync = cutover.QueueSync(conditions.Condition("CutoverApplied", "Unknown", "", ""))
    sync.gate = cutover.gate_check(want, row, SHORT)
    out = cutover._outcome(sync, want, row, "gated", {"generation": 4, "applied": "before"}, 5)
    assert (out.condition.status, out.condition.reason) == ("False", "GateNotMet")
    assert "flip to live held back by cutover.gate: agreement 100.00% over 10 compared" in out.condition.message
    assert "10 compared, 1000 needed" in out.condition.message and "stays in shadow mode" in out.condition.message
    assert out.problem is None  # waiting for figures is no failure: not Degraded
    assert out.status["mode"] == "shadow" and out.status["applied"] == "before" and out.status["generation"] == 4


def test_status_shadow_lists_every_figure() -> None:
    figures = summarize("q", [("ACCEPTED", "ACCEPTED", 3), ("ACCEPTED", "WRONG_ANSWER", 1), (None, "ACCEPTED", 2)])
    out = cutover.shadow_status(figures, check_gate(GATE, figures), MARK)
    assert out == {
        "samples": 4, "matched": 3, "mismatched": 1, "legacyOnly": 0, "shadowOnly": 2, "agreement": "75.00%",
        "byVerdict": [{"verdict": "ACCEPTED", "matched": 3, "mismatched": 1, "legacyOnly": 0, "shadowOnly": 2}],
        "gate": "not met: " + check_gate(GATE, figures).message, "readAt": "2026-01-01T00:00:00Z",
    }


# --- spec and rendering --------------------------------------------------------------------------


def _parse(**extra: Any) -> JudgeQueueSpec | list[str]:
    spec = copy.deepcopy(SPEC)
    spec.update(extra)
    return parse_spec(spec, name="judge")


def test_the_spec_reads_the_gate_force_and_shadow_workers() -> None:
    parsed = _parse(cutover={"mode": "shadow", "gate": {"minAgreement": "99.5%", "minSamples": 1000}, "force": True},
                    worker={"shadow": {"enabled": True, "replicas": 2}})
    assert isinstance(parsed, JudgeQueueSpec)
    assert parsed.cutover.gate == Gate(Decimal("99.5"), 1000) and parsed.cutover.force is True
    assert (parsed.worker.shadow.enabled, parsed.worker.shadow.replicas) == (True, 2)
    plain = _parse()
    assert isinstance(plain, JudgeQueueSpec)
    assert plain.cutover.gate is None and plain.cutover.force is False and plain.worker.shadow.enabled is False


@pytest.mark.parametrize(("cutover_spec", "error"), [
    ({"gate": {"minAgreement": "99.5%"}}, "spec.cutover.gate.minSamples: is required (spec.cutover.gate is given)"),
    ({"gate": {"minSamples": 10}}, "spec.cutover.gate.minAgreement: is required"),
    ({"gate": {"minAgreement": "99.5", "minSamples": 10}}, "spec.cutover.gate.minAgreement: '99.5' is not a"
                                                           " percentage from 0% to 100% such as 99.5%"),
    ({"gate": {"minAgreement": "100.1%", "minSamples": 10}}, "spec.cutover.gate.minAgreement"),
    ({"gate": {"minAgreement": "90%", "minSamples": 0}}, "spec.cutover.gate.minSamples: must be between 1 and"),
    ({"force": "yes"}, "spec.cutover.force: must be true or false"),
])
def test_a_bad_gate_is_refused_naming_the_field(cutover_spec: dict[str, Any], error: str) -> None:
    errors = _parse(cutover=cutover_spec)
    assert isinstance(errors, list) and any(error in e for e in errors), errors


def test_shadow_workers_are_rendered_while_the_row_is_in_shadow_mode() -> None:
    parsed = _parse(worker={"shadow": {"enabled": True, "replicas": 3}})
    assert isinstance(parsed, JudgeQueueSpec)
    children = {c.name: c for c in render.render_children(parsed, OWNER, worker_replicas=1, shadow_mode=True)}
    shadow = children["judge-shadow-worker"].body
    worker = children["judge-worker"].body
    assert shadow["spec"]["replicas"] == 3
    labels = shadow["spec"]["template"]["metadata"]["labels"]
    assert labels["app.kubernetes.io/component"] == "shadow-worker"
    assert shadow["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"] == "shadow-worker"
    (container,) = shadow["spec"]["template"]["spec"]["containers"]
    (worker_container,) = worker["spec"]["template"]["spec"]["containers"]
    # The same judge, sandbox and resources as the workers, with JUDGEQUEUE_SHADOW=judge.
    assert container["env"] == worker_container["env"] + [{"name": "JUDGEQUEUE_SHADOW", "value": "judge"}]
    assert container["securityContext"] == worker_container["securityContext"] and container["args"] == ["worker"]
    # The workers' limits and memory; a CPU request of 100m, so they yield to live work on a shared node.
    assert container["resources"]["limits"] == worker_container["resources"]["limits"]
    assert container["resources"]["requests"] == {**worker_container["resources"]["requests"], "cpu": "100m"}
    # The egress policy covers them (they run the same untrusted code); its selector is not the workers'.
    policy = children["judge-worker-egress"].body["spec"]["podSelector"]
    assert policy["matchExpressions"] == [{"key": "app.kubernetes.io/component", "operator": "In",
                                           "values": ["worker", "shadow-worker"]}]
    live = {c.name: c for c in render.render_children(parsed, OWNER, worker_replicas=1, shadow_mode=False)}
    assert live["judge-shadow-worker"].body["spec"]["replicas"] == 0  # none once the row is live
    off = _parse()
    assert isinstance(off, JudgeQueueSpec)
    names = [c.name for c in render.render_children(off, OWNER, worker_replicas=1, shadow_mode=True)]
    assert "judge-shadow-worker" not in names
    assert ("Deployment", "judge-shadow-worker") in render.optional_children(OWNER)  # deleted once disabled
    longest = "x" * 49
    assert len(render.child_name(longest, render.SHADOW_WORKER)) == 63


def test_shadow_workers_may_have_resources_of_their_own() -> None:
    """Smaller CPU requests give shadow judging a smaller share of a busy node (Kubernetes turns
    requests into CPU shares); without any, the workers' (and so their defaults) apply."""
    small = {"requests": {"cpu": "100m", "memory": "512Mi"}, "limits": {"cpu": "1", "memory": "2Gi"}}
    parsed = _parse(worker={"shadow": {"enabled": True, "resources": small}})
    assert isinstance(parsed, JudgeQueueSpec)
    children = {c.name: c for c in render.render_children(parsed, OWNER, worker_replicas=1, shadow_mode=True)}
    (shadow,) = children["judge-shadow-worker"].body["spec"]["template"]["spec"]["containers"]
    (worker,) = children["judge-worker"].body["spec"]["template"]["spec"]["containers"]
    assert shadow["resources"] == small and worker["resources"] != small
    inverted = {"requests": {"cpu": "2"}, "limits": {"cpu": "1"}}
    errors = _parse(worker={"shadow": {"enabled": True, "resources": inverted}})
    assert isinstance(errors, list) and any("spec.worker.shadow.resources.limits.cpu" in e for e in errors), errors


def test_shadow_workers_request_little_cpu_unless_told() -> None:
    assert render.shadow_resources({"requests": {"cpu": "2", "memory": "1Gi"}, "limits": {"cpu": "4"}}) == {
        "requests": {"cpu": "100m", "memory": "1Gi"}, "limits": {"cpu": "4"}}
    assert render.shadow_resources({"limits": {"cpu": "50m"}}) == {"requests": {"cpu": "50m"},
                                                                   "limits": {"cpu": "50m"}}  # never above the limit
    assert render.shadow_resources({"requests": {"memory": "1Gi"}})["requests"] == {"memory": "1Gi", "cpu": "100m"}


def test_the_shadow_setting_is_validated() -> None:
    base = {"JUDGEQUEUE_POSTGRES_DSN": "postgresql://h/d", "JUDGEQUEUE_REDIS_URL": "redis://h", "JUDGEQUEUE_QUEUE": "q"}
    assert load_settings(base).worker.shadow == "off"
    assert load_settings({**base, "JUDGEQUEUE_SHADOW": "Judge"}).worker.shadow == "judge"
    with pytest.raises(ConfigError, match="JUDGEQUEUE_SHADOW='yes' is invalid: must be off"):
        load_settings({**base, "JUDGEQUEUE_SHADOW": "yes"})
