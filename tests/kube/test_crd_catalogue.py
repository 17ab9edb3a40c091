"""A catalogue of invalid JudgeQueues the real API server must refuse, each with the expected message.

tests/test_crd.py checks the same rules fast (a schema engine and cel-python, no server); this file
is the proof that the real server enforces them, with the field path and message a user sees.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tests.kube.cluster import ApiError, Cluster
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
