"""A catalogue of invalid JudgeQueues the real API server must refuse, each with the expected message.

tests/test_crd.py checks the same rules fast (a schema engine and cel-python, no server); this file
is the proof that the real server enforces them, with the field path and message a user sees.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tests.kube.cluster import ApiError, Cluster
from tests.kube.conftest import CRD_FILE
from tests.kube.tools import jq_path, judgequeue


def _spec(**sections: Any) -> dict[str, Any]:
    obj = judgequeue("bad", "bad")
    obj["spec"].update(sections)
    return obj


def _without(*path: str) -> dict[str, Any]:
    obj = judgequeue("bad", "bad")
    node: Any = obj
    for key in path[:-1]:
        node = node[key]
    del node[path[-1]]
    return obj


# (case, object, [substrings of the API server's message])
CATALOGUE: list[tuple[str, dict[str, Any], list[str]]] = [
    ("no image", _without("spec", "image"), ["spec.image: Required value"]),
    ("empty image", _spec(image=""), ["spec.image", "at least 1 chars long"]),
    ("no postgres", _without("spec", "postgres"), ["spec.postgres: Required value"]),
    ("secret without name", _spec(redis={"secretKeyRef": {"key": "url"}}),
     ["spec.redis.secretKeyRef.name: Required value"]),
    ("queue not a DNS label", _spec(queue="Not_A_Label"), ["spec.queue", "should match"]),
    ("negative batch", _spec(dispatcher={"batchSize": -1}),
     ["spec.dispatcher.batchSize", "greater than or equal to 1"]),
    ("too many workers", _spec(worker={"maxReplicas": 5000}),
     ["spec.worker.maxReplicas", "less than or equal to 1000"]),
    ("duration word", _spec(dispatcher={"schedule": "soon"}), ["spec.dispatcher.schedule", "should match"]),
    ("unknown intake", _spec(worker={"intake": "fast"}), ["spec.worker.intake", "Unsupported value", '"stream"']),
    ("too many offers", _spec(worker={"offers": 5000}), ["spec.worker.offers", "less than or equal to 1024"]),
    ("day unit where CEL compares", _spec(reaper={"visibilityTimeout": "1d"}),
     ["spec.reaper.visibilityTimeout", "should match"]),
    ("min above max", _spec(worker={"minReplicas": 5, "maxReplicas": 2}),
     ["spec.worker.minReplicas", "worker.minReplicas must not exceed worker.maxReplicas"]),
    ("backoff base above max", _spec(dispatcher={"backoff": {"base": "10m", "max": "1m"}}),
     ["spec.dispatcher.backoff.base", "dispatcher.backoff.base must not exceed dispatcher.backoff.max"]),
    ("sweep slower than visibility", _spec(reaper={"interval": "2m", "visibilityTimeout": "1m", "leaseTtl": "30s"}),
     ["spec.reaper.interval", "reaper.interval must not exceed reaper.visibilityTimeout"]),
    ("lease longer than visibility", _spec(reaper={"leaseTtl": "5m"}),
     ["spec.reaper.leaseTtl", "reaper.leaseTtl must not exceed reaper.visibilityTimeout"]),
    ("grace period of hours", _spec(worker={"gracePeriod": "2h"}),
     ["spec.worker.gracePeriod", "worker.gracePeriod must be under 1h"]),
    ("unknown cutover mode", _spec(cutover={"mode": "half"}),
     ["spec.cutover.mode", 'Unsupported value: "half"', '"live", "shadow"']),
    ("unknown autoscaling", _spec(worker={"autoscaling": "keda"}), ["spec.worker.autoscaling", "Unsupported value"]),
    ("watermark not a time", _spec(cutover={"mode": "shadow", "watermark": "yesterday"}),
     ["spec.cutover.watermark", "date-time"]),
    ("judge name with a space", _spec(worker={"judge": "rm -rf"}), ["spec.worker.judge", "should match"]),
    ("log level", _spec(logLevel="TRACE"), ["spec.logLevel", "Unsupported value"]),
    ("resource amount not a quantity type", _spec(worker={"resources": {"limits": {"memory": True}}}),
     ["spec.worker.resources.limits.memory"]),
    ("gate agreement not a percentage", _spec(cutover={"gate": {"minAgreement": "0.995", "minSamples": 10}}),
     ["spec.cutover.gate.minAgreement", "should match"]),
    ("gate agreement over 100%", _spec(cutover={"gate": {"minAgreement": "100.5%", "minSamples": 10}}),
     ["spec.cutover.gate.minAgreement", "should match"]),
    ("gate without a sample size", _spec(cutover={"gate": {"minAgreement": "99.5%"}}),
     ["spec.cutover.gate.minSamples: Required value"]),
    ("gate of no samples", _spec(cutover={"gate": {"minAgreement": "99.5%", "minSamples": 0}}),
     ["spec.cutover.gate.minSamples", "greater than or equal to 1"]),
    ("force not a boolean", _spec(cutover={"force": "yes"}), ["spec.cutover.force", "boolean"]),
    ("too many shadow workers", _spec(worker={"shadow": {"enabled": True, "replicas": 500}}),
     ["spec.worker.shadow.replicas", "less than or equal to 100"]),
    ("endpoint with a url and a secret", _spec(worker={"judge": "http-call", "endpoints": [
        {"name": "a", "url": "http://x", "secretKeyRef": {"name": "s", "key": "k"}}]}),
     ["spec.worker.endpoints[0]", "give exactly one of url and secretKeyRef"]),
    ("endpoint named twice", _spec(worker={"judge": "http-call", "endpoints": [
        {"name": "a", "url": "http://x"}, {"name": "a", "url": "http://y"}]}),
     ["spec.worker.endpoints[1]", "Duplicate value"]),
    ("endpoint url not http", _spec(worker={"judge": "http-call", "endpoints": [{"name": "a", "url": "file:///x"}]}),
     ["spec.worker.endpoints[0].url", "should match"]),
]

# What the API server used to accept and the operator could only report later (or never): refused at
# the door now, on the current release and on the oldest the chart claims.
DOOR: list[tuple[str, dict[str, Any], list[str]]] = [
    ("quantity with a unit Kubernetes does not know", _spec(worker={"resources": {"requests": {"memory": "512MB"}}}),
     ["spec.worker.resources.requests[memory]", "must be a quantity"]),
    ("quantity in words", _spec(reaper={"resources": {"limits": {"cpu": "half"}}}),
     ["spec.reaper.resources.limits[cpu]", "must be a quantity"]),
    ("memory limit below its request", _spec(worker={"resources": {"requests": {"memory": "2Gi"},
                                                                   "limits": {"memory": "1Gi"}}}),
     ["spec.worker.resources.limits", "limits.memory (1Gi) must not be below requests.memory (2Gi)"]),
    ("cpu limit below its request",
     _spec(dispatcher={"resources": {"requests": {"cpu": 2}, "limits": {"cpu": "500m"}}}),
     ["spec.dispatcher.resources.limits", "limits.cpu (500m) must not be below requests.cpu (2)"]),
    ("a name whose children do not fit 63 characters", judgequeue("a" * 59, "bad"),
     ["metadata.name", "may not be more than 49"]),
    ("schedule of zero", _spec(dispatcher={"schedule": "0s"}), ["spec.dispatcher.schedule", "must be positive"]),
    ("retention of zero days", _spec(reaper={"retention": "0.0d"}), ["spec.reaper.retention", "must be positive"]),
    ("progress deadline of zero", _spec(progressDeadline="0m"), ["spec.progressDeadline", "must be positive"]),
    ("CIDR with host bits", _spec(worker={"networkPolicy": {"postgres": {"cidr": "10.0.0.1/8"}}}),
     ["spec.worker.networkPolicy.postgres.cidr", "no host bits set"]),
    ("CIDR prefix past 32", _spec(worker={"networkPolicy": {"redis": {"cidr": "10.0.0.0/33"}}}),
     ["spec.worker.networkPolicy.redis.cidr", "no host bits set"]),
    ("concurrency whose default memory cannot be scheduled", _spec(worker={"concurrency": 256}),
     ["spec.worker.concurrency", "less than or equal to 64"]),
    ("unknown drift policy", _spec(cutover={"mode": "live", "driftPolicy": "ignore"}),
     ["spec.cutover.driftPolicy", "Unsupported value"]),
]


@pytest.mark.parametrize(("case", "obj", "expected"), DOOR, ids=[c[0] for c in DOOR])
def test_refused_at_the_door(crd_installed: Cluster, namespace: str, case: str, obj: dict[str, Any],
                             expected: list[str]) -> None:
    with pytest.raises(ApiError) as refused:
        crd_installed.request("POST", jq_path(namespace), copy.deepcopy(obj))
    assert refused.value.status == 422, refused.value
    for part in expected:
        assert part in refused.value.message, (case, refused.value.message)


@pytest.mark.builds("control-plane", "oldest")
@pytest.mark.parametrize(("case", "obj", "expected"), DOOR, ids=[c[0] for c in DOOR])
def test_refused_at_the_door_of_the_oldest_release(kube_oldest: Cluster, case: str, obj: dict[str, Any],
                                                   expected: list[str]) -> None:
    kube_oldest.kubectl("apply", "-f", str(CRD_FILE))
    kube_oldest.wait_established("judgequeues.judgequeue.dev")
    with pytest.raises(ApiError) as refused:
        kube_oldest.request("POST", jq_path("default"), copy.deepcopy(obj))
    assert refused.value.status == 422, refused.value
    assert expected[0].split("[")[0] in refused.value.message, (case, refused.value.message)


def test_edge_values_pass_the_door(crd_installed: Cluster, namespace: str) -> None:
    """The rules refuse only what they should: the largest concurrency, a 49-character name, a limit
    equal to its request in another unit, sub-second and fractional durations, a /32 and a /0."""
    obj = judgequeue("a" * 49, "edge", worker={"concurrency": 64, "resources": {
        "requests": {"memory": "1Gi", "cpu": 1}, "limits": {"memory": "1024Mi", "cpu": "1000m"}},
        "networkPolicy": {"postgres": {"cidr": "10.1.2.3/32"}, "redis": {"cidr": "0.0.0.0/0"}}},
        dispatcher={"schedule": "0.5s"}, reaper={"retention": "0.5d"}, progressDeadline="90s")
    created = crd_installed.request("POST", jq_path(namespace), obj)
    assert created["spec"]["worker"]["concurrency"] == 64
    assert created["spec"]["worker"]["shadow"] == {"enabled": False, "replicas": 1}  # defaulted
    gated = judgequeue("gated", "gated", cutover={"mode": "shadow", "force": False,
                                                  "gate": {"minAgreement": "100%", "minSamples": 1}},
                       worker={"shadow": {"enabled": True, "replicas": 0, "resources": {"requests": {"cpu": "100m"}}}})
    assert crd_installed.request("POST", jq_path(namespace), gated)["spec"]["cutover"]["gate"] == {
        "minAgreement": "100%", "minSamples": 1}
    for agreement in ("0%", "99.999%", "100.000%", "7%"):
        edge = judgequeue(f"gate-{agreement.rstrip('%').replace('.', '-')}", "edge",
                          cutover={"gate": {"minAgreement": agreement, "minSamples": 1_000_000_000}})
        crd_installed.request("POST", jq_path(namespace), edge)


def test_endpoints_pass_the_door_with_their_defaults(crd_installed: Cluster, namespace: str) -> None:
    obj = judgequeue("agents", "agents", worker={"judge": "http-call", "endpoints": [
        {"name": "tool", "secretKeyRef": {"name": "tools", "key": "url"}},
        {"name": "lookup", "url": "http://lookup.tools.svc:8080/v1", "deadline": "5m", "concurrency": 1024}]})
    created = crd_installed.request("POST", jq_path(namespace), obj)
    assert created["spec"]["worker"]["endpoints"] == [
        {"name": "tool", "secretKeyRef": {"name": "tools", "key": "url"}, "concurrency": 4, "deadline": "60s",
         "tries": 5},
        {"name": "lookup", "url": "http://lookup.tools.svc:8080/v1", "deadline": "5m", "concurrency": 1024,
         "tries": 5},
    ]


@pytest.mark.parametrize(("case", "obj", "expected"), CATALOGUE, ids=[c[0] for c in CATALOGUE])
def test_invalid_spec_refused_with_message(crd_installed: Cluster, namespace: str, case: str,
                                           obj: dict[str, Any], expected: list[str]) -> None:
    with pytest.raises(ApiError) as refused:
        crd_installed.request("POST", jq_path(namespace), copy.deepcopy(obj))
    assert refused.value.status == 422, refused.value
    for part in expected:
        assert part in refused.value.message, (case, refused.value.message)


def test_unknown_field_refused_under_strict_validation(crd_installed: Cluster, namespace: str) -> None:
    obj = _spec(worker={"replica": 3})
    with pytest.raises(ApiError) as refused:
        crd_installed.request("POST", jq_path(namespace) + "?fieldValidation=Strict", obj)
    assert 'unknown field "spec.worker.replica"' in refused.value.message


def test_watermark_moving_back_refused_on_update(crd_installed: Cluster, namespace: str) -> None:
    crd_installed.request("POST", jq_path(namespace), _spec(cutover={"mode": "live",
                                                                     "watermark": "2026-02-01T00:00:00Z"}))
    for cutover in ({"mode": "live", "watermark": "2026-01-01T00:00:00Z"}, {"mode": "live", "watermark": None}):
        with pytest.raises(ApiError) as refused:
            crd_installed.request("PATCH", jq_path(namespace, "bad"), {"spec": {"cutover": cutover}},
                                  content_type="application/merge-patch+json")
        assert "spec.cutover.watermark" in refused.value.message
        assert "cutover.watermark may only move forward (roll back with mode shadow)" in refused.value.message
    # Forward is fine, and so is shadow with the same watermark (the documented rollback).
    crd_installed.request("PATCH", jq_path(namespace, "bad"),
                          {"spec": {"cutover": {"mode": "shadow", "watermark": "2026-02-01T00:00:00Z"}}},
                          content_type="application/merge-patch+json")
