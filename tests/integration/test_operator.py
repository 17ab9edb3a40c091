"""The operator end to end: Kopf against kmock (StrictEmulator), real Postgres and Redis."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import redis.asyncio as aioredis

from judgequeue.controllers.state import OperatorConfig
from judgequeue.core.config import load_settings
from judgequeue.core.judges import load_judge
from judgequeue.core.store.outbox import submit
from judgequeue.core.store.queues import get_queue
from tests.support.databases import REDIS_URL
from tests.support.kmock_emulator import (
    DEPLOYMENTS,
    EVENTS,
    JQ,
    SECRETS,
    SERVICES,
    OperatorThread,
    StrictEmulator,
    no_writes,
    secret,
)
from tests.support.operator import NS, Env, operator_env, spec
from tests.support.plugins import install_judge_plugin
from tests.support.waiting import eventually

pytestmark = pytest.mark.kmock(cls=StrictEmulator)

CHILDREN = [(DEPLOYMENTS, "judge-dispatcher"), (DEPLOYMENTS, "judge-worker"), (DEPLOYMENTS, "judge-reaper"),
            (SERVICES, "judge-metrics")]


@pytest.fixture
async def env(kmock: StrictEmulator, pg_dsn: str, tmp_path: Path) -> AsyncIterator[Env]:
    async with operator_env(kmock, tmp_path, pg_dsn) as running:
        yield running


def _env_of(deployment: dict[str, Any]) -> dict[str, Any]:
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


async def test_create_renders_children_status_and_cutover(env: Env, queue_name: str, pg: asyncpg.Connection) -> None:
    cr = env.kmock.put_object(JQ, NS, {"metadata": {"name": "judge"}, "spec": spec(queue_name)})
    uid = cr["metadata"]["uid"]
    await env.observed(1)
    await eventually(lambda: env.condition("CutoverApplied").get("status") == "True", what="cutover applied")
    for resource, name in CHILDREN:
        child = env.kmock.current(resource, NS, name)
        assert child is not None, name
        assert child["metadata"]["ownerReferences"][0]["uid"] == uid
        assert child["metadata"]["ownerReferences"][0]["controller"] is True
    dispatcher = env.kmock.current(DEPLOYMENTS, NS, "judge-dispatcher")
    assert dispatcher is not None
    variables = _env_of(dispatcher)
    assert variables["JUDGEQUEUE_QUEUE"] == queue_name
    assert variables["JUDGEQUEUE_POSTGRES_DSN_FILE"] == "/var/run/secrets/judgequeue/postgres-dsn"
    assert variables["JUDGEQUEUE_BATCH_SIZE"] == "100"
    assert env.replicas() == 1
    flags = await get_queue(pg, queue_name)
    assert (flags.mode, flags.paused) == ("live", False)
    status = env.cr()["status"]
    assert status["cutover"]["mode"] == "live" and status["workers"]["selector"]
    assert env.condition("Degraded")["status"] == "False"
    assert env.condition("Ready")["status"] == "False"  # nothing runs pods in kmock
    # Readiness follows the children: make every Deployment available.
    for _, name in CHILDREN[:3]:
        dep = env.kmock.current(DEPLOYMENTS, NS, name)
        assert dep is not None
        n = dep["spec"].get("replicas", 1)
        dep["status"] = {"observedGeneration": dep["metadata"]["generation"], "replicas": n, "readyReplicas": n,
                         "availableReplicas": n, "updatedReplicas": n}
        env.kmock.objects[DEPLOYMENTS, NS, name].create(dep)
    await eventually(lambda: env.condition("Ready").get("status") == "True", what="Ready=True")
    assert env.operator.state.handled[(f"{NS}/judge", 1)] == 1


async def test_spec_change_patches_only_that_deployment(env: Env, queue_name: str) -> None:
    env.kmock.put_object(JQ, NS, {"metadata": {"name": "judge"}, "spec": spec(queue_name)})
    await env.observed(1)
    await eventually(lambda: env.condition("CutoverApplied").get("status") == "True", what="cutover applied")
    before = {name: env.kmock.versions(r, NS, name) for r, name in CHILDREN}
    generation = await env.patch_cr({"spec": {"dispatcher": {"batchSize": 250}}})
    assert generation == 2
    await env.observed(2)
    after = {name: env.kmock.versions(r, NS, name) for r, name in CHILDREN}
    assert after["judge-dispatcher"] == before["judge-dispatcher"] + 1
    assert {k: v for k, v in after.items() if k != "judge-dispatcher"} == {
        k: v for k, v in before.items() if k != "judge-dispatcher"}
    dispatcher = env.kmock.current(DEPLOYMENTS, NS, "judge-dispatcher")
    assert dispatcher is not None and _env_of(dispatcher)["JUDGEQUEUE_BATCH_SIZE"] == "250"
    generation = await env.patch_cr({"spec": {"worker": {"concurrency": 9}}})
    await env.observed(generation)
    worker = env.kmock.current(DEPLOYMENTS, NS, "judge-worker")
    assert worker is not None and _env_of(worker)["JUDGEQUEUE_CONCURRENCY"] == "9"
    # Status writes do not bump the generation, and each generation was handled exactly once.
    assert env.cr()["metadata"]["generation"] == generation
    assert dict(env.operator.state.handled) == {(f"{NS}/judge", g): 1 for g in range(1, generation + 1)}


INVALID: list[tuple[dict[str, Any], str]] = [
    ({"dispatcher": {"batchSize": -1}}, "spec.dispatcher.batchSize"),
    ({"worker": {"minReplicas": 5, "maxReplicas": 2}}, "spec.worker.minReplicas"),
    ({"reaper": {"interval": "sometimes"}}, "spec.reaper.interval"),
    ({"worker": {"judge": "Oracle!"}}, "spec.worker.judge"),
    ({"postgres": {"secretKeyRef": {"name": "no-such-secret", "key": "dsn"}}}, "no-such-secret not found"),
    ({"redis": {"secretKeyRef": {"name": "jq-redis", "key": "nope"}}}, "has no key 'nope'"),
    ({"image": ""}, "spec.image"),
    ({"queue": "Not A Label"}, "spec.queue"),
    ({"dispatcher": {"backoff": {"base": "9m", "max": "1m"}}}, "spec.dispatcher.backoff.base"),
    ({"cutover": {"mode": "sideways"}}, "spec.cutover.mode"),
    ({"worker": {"autoscaling": "sometimes"}}, "spec.worker.autoscaling"),
]


def _transform(old: Any, new: Any) -> Any:
    """The merge patch turning ``old`` into ``new`` (keys only in ``old`` become None)."""
    if not isinstance(old, dict) or not isinstance(new, dict):
        return new
    patch = {k: _transform(old.get(k), v) for k, v in new.items() if old.get(k) != v}
    patch.update({k: None for k in old if k not in new})
    return patch


async def test_invalid_specs_degrade_without_touching_children(env: Env, queue_name: str) -> None:
    good = spec(queue_name)
    env.kmock.put_object(JQ, NS, {"metadata": {"name": "judge"}, "spec": copy.deepcopy(good)})
    await env.observed(1)
    generation = 1
    for change, expected in INVALID:
        with no_writes(env.kmock, NS, CHILDREN):
            bad = spec(queue_name, **change)
            generation = await env.patch_cr({"spec": _transform(good, bad)})
            await env.observed(generation)
            degraded = env.condition("Degraded")
            assert degraded["status"] == "True" and expected in degraded["message"], (change, degraded)
            assert degraded["observedGeneration"] == generation
        generation = await env.patch_cr({"spec": _transform(bad, good)})
        await env.observed(generation)
        await eventually(lambda: env.condition("Degraded").get("status") == "False", what=f"recovered from {change}")
    assert env.operator.error is None
    assert all(count == 1 for count in env.operator.state.handled.values())


async def _add_stream_backlog(redis: aioredis.Redis, queue: str, entries: int) -> None:
    key = f"jq:{{{queue}}}:stream"
    await redis.xgroup_create(key, "workers", id="0-0", mkstream=True)
    for i in range(entries):
        await redis.xadd(key, {"submission": str(i), "generation": "1"})


async def _submit_many(pg: asyncpg.Connection, queue: str, n: int) -> None:
    """``n`` submissions in one transaction: the backlog grows by ``n`` at once."""
    async with pg.transaction():
        for i in range(n):
            await submit(pg, queue, {"n": i})


async def test_autoscaling_up_to_max_then_down_after_window(
    env: Env, queue_name: str, pg: asyncpg.Connection, redis_client: aioredis.Redis
) -> None:
    env.kmock.put_object(JQ, NS, {"metadata": {"name": "judge"}, "spec": spec(queue_name)})
    await eventually(lambda: env.condition("CutoverApplied").get("status") == "True", what="queue created")
    assert env.replicas() == 1
    # Each backlog step lands in one commit, so the operator sees 4, then 12, then 32, never a
    # figure in between: exactly one ScaledUp per step, however the reads interleave the writes.
    await _add_stream_backlog(redis_client, queue_name, 4)  # backlog 4: still 1 worker at 5 per worker
    await eventually(lambda: (env.cr()["status"].get("backlog") or {}).get("total") == 4, what="backlog 4")
    await _submit_many(pg, queue_name, 8)  # backlog 12 -> 3 workers
    await eventually(lambda: env.replicas() == 3, what="3 workers")
    await eventually(lambda: (env.cr()["status"].get("backlog") or {}).get("total") == 12, what="backlog 12")
    await _submit_many(pg, queue_name, 20)  # backlog 32 -> 7, capped at 4
    await eventually(lambda: env.replicas() == 4, what="max workers")
    await pg.execute("DELETE FROM judgequeue.outbox WHERE queue = $1", queue_name)
    await redis_client.delete(f"jq:{{{queue_name}}}:stream")
    cleared = time.monotonic()
    await eventually(lambda: (env.cr()["status"].get("backlog") or {}).get("total") == 0, what="backlog read 0")
    assert env.replicas() == 4  # still inside the 1s window
    await eventually(lambda: env.replicas() == 1, what="scaled down")
    assert time.monotonic() - cleared >= 0.9

    def reasons() -> list[str]:
        return [o["reason"] for (r, _, _), o in env.kmock.objects.items() if r == EVENTS and not o.deleted
                and o.get("reason") in ("ScaledUp", "ScaledDown")]

    # Kopf posts events from a background queue: they may land just after the replicas change.
    await eventually(lambda: reasons().count("ScaledDown") >= 1, what="the ScaledDown event")
    assert reasons().count("ScaledUp") == 2 and reasons().count("ScaledDown") == 1


async def test_external_autoscaling_leaves_replicas_alone(
    env: Env, queue_name: str, pg: asyncpg.Connection
) -> None:
    # spec.worker.replicas as a real API server defaults it (kmock applies no CRD defaults).
    env.kmock.put_object(JQ, NS, {"metadata": {"name": "judge"},
                                  "spec": spec(queue_name, worker={"autoscaling": "external", "replicas": 1})})
    await eventually(lambda: env.condition("CutoverApplied").get("status") == "True", what="queue created")
    dep = env.kmock.current(DEPLOYMENTS, NS, "judge-worker")
    assert dep is not None and dep["spec"]["replicas"] == 1
    for i in range(30):
        await submit(pg, queue_name, {"n": i})
    await eventually(lambda: (env.cr()["status"].get("backlog") or {}).get("total") == 30, what="backlog read")
    # A few more ticks: a backlog that would make the internal autoscaler scale up changes nothing.
    seen = env.cr()["status"]["backlog"]["readAt"]
    await eventually(lambda: env.cr()["status"]["backlog"]["readAt"] != seen, within=5, what="another tick")
    assert env.replicas() == 1
    # The scale subresource path (spec.worker.replicas) is what external scalers of the CR set.
    generation = await env.patch_cr({"spec": {"worker": {"replicas": 3}}})
    await env.observed(generation)
    assert env.replicas() == 3


async def test_cutover_flip_updates_queue_row_and_status(env: Env, queue_name: str, pg: asyncpg.Connection) -> None:
    env.kmock.put_object(JQ, NS, {"metadata": {"name": "judge"}, "spec": spec(queue_name)})
    await eventually(lambda: env.condition("CutoverApplied").get("status") == "True", what="applied")
    generation = await env.patch_cr({"spec": {"paused": True,
                                              "cutover": {"mode": "shadow", "watermark": "2030-01-01T00:00:00Z"}}})
    await env.observed(generation)
    status = env.cr()["status"]
    assert status["cutover"]["mode"] == "shadow" and status["cutover"]["paused"] is True
    assert status["cutover"]["watermark"] == "2030-01-01T00:00:00Z"
    flags = await get_queue(pg, queue_name)
    assert (flags.mode, flags.paused, flags.watermark.isoformat() if flags.watermark else None) == (
        "shadow", True, "2030-01-01T00:00:00+00:00")
    generation = await env.patch_cr({"spec": {"paused": False, "cutover": {"mode": "live"}}})
    await env.observed(generation)
    flags = await get_queue(pg, queue_name)
    assert (flags.mode, flags.paused) == ("live", False)
    assert flags.watermark is not None  # never moved back or cleared
    # A watermark behind the database's is refused, with the reason, and nothing changes.
    generation = await env.patch_cr({"spec": {"cutover": {"watermark": "2020-01-01T00:00:00Z"}}})
    await env.observed(generation)
    cond = env.condition("CutoverApplied")
    assert cond["status"] == "False" and cond["reason"] == "WatermarkMovedBack"
    assert (await get_queue(pg, queue_name)).watermark == flags.watermark


async def test_cutover_retried_until_database_is_back(env: Env, queue_name: str, pg: asyncpg.Connection) -> None:
    env.kmock.put_object(SECRETS, NS, secret("jq-db-down", dsn="postgresql://postgres@127.0.0.1:1/nowhere"))
    env.kmock.put_object(JQ, NS, {"metadata": {"name": "judge"}, "spec": spec(
        queue_name, paused=True, postgres={"secretKeyRef": {"name": "jq-db-down", "key": "dsn"}})})
    await eventually(lambda: env.condition("CutoverApplied").get("reason") == "DatabaseUnavailable",
                     what="CutoverApplied=False")
    assert env.condition("CutoverApplied")["status"] == "False"
    degraded = env.condition("Degraded")  # status never lies: the step that failed is named
    assert (degraded["status"], degraded["reason"]) == ("True", "DatabaseUnavailable"), degraded
    assert "Connect call failed" in degraded["message"]
    # Whether another JudgeQueue owns the queue cannot be checked yet: nothing is created meanwhile.
    assert all(env.kmock.current(resource, NS, name) is None for resource, name in CHILDREN)
    assert await pg.fetchval("SELECT count(*) FROM judgequeue.queues WHERE name = $1", queue_name) == 0
    # The database comes back (the Secret is fixed): the timer applies the flags, no spec change needed.
    fixed = secret("jq-db-down", dsn=env.pg_dsn)
    obj = env.kmock.current(SECRETS, NS, "jq-db-down")
    assert obj is not None
    obj["data"] = fixed["data"]
    env.kmock.objects[SECRETS, NS, "jq-db-down"].create(obj)
    await eventually(lambda: env.condition("CutoverApplied").get("status") == "True", what="applied after recovery")
    flags = await get_queue(pg, queue_name)
    assert flags.paused is True and flags.owner == f"JudgeQueue {NS}/judge"
    await eventually(lambda: env.condition("Degraded").get("status") == "False", what="Degraded cleared")
    assert all(env.kmock.current(resource, NS, name) is not None for resource, name in CHILDREN)
    assert env.operator.state.handled[(f"{NS}/judge", 1)] == 1


async def test_a_name_too_long_for_its_children_is_an_invalid_spec(env: Env, queue_name: str) -> None:
    """An object stored before the CRD's metadata.name rule (kmock validates nothing, as a CRD
    without its schema would): the operator refuses it in status and creates nothing."""
    name = "j" * 59
    env.kmock.put_object(JQ, NS, {"metadata": {"name": name}, "spec": spec(queue_name)})
    await env.observed(1, name=name)
    degraded = env.condition("Degraded", name=name)
    assert (degraded["status"], degraded["reason"]) == ("True", "InvalidSpec"), degraded
    assert "at most 49" in degraded["message"] and f"{name}-worker-egress" in degraded["message"]
    assert env.kmock.current(DEPLOYMENTS, NS, f"{name}-worker") is None


async def test_operator_resumes_after_restart(env: Env, queue_name: str, tmp_path: Path) -> None:
    env.kmock.put_object(JQ, NS, {"metadata": {"name": "judge"}, "spec": spec(queue_name)})
    await env.observed(1)
    await env.operator.stop()
    generation = await env.patch_cr({"spec": {"reaper": {"maxRetries": 7}}})
    restarted = OperatorThread(tmp_path / "kubeconfig", [NS], OperatorConfig(interval=0.25, db_timeout=2.0))
    restarted.start()
    try:
        await restarted.wait_ready()
        await env.observed(generation)
        reaper = env.kmock.current(DEPLOYMENTS, NS, "judge-reaper")
        assert reaper is not None and _env_of(reaper)["JUDGEQUEUE_MAX_RETRIES"] == "7"
    finally:
        await restarted.stop()
    await asyncio.sleep(0)


async def test_a_judge_plugin_installed_in_the_image_is_accepted(env: Env, queue_name: str, tmp_path: Path) -> None:
    """The operator must not refuse a judge because it is not built in; whether a plugin is
    installed is known where it runs (the worker loads it at start). Here "gpu" is installed in this
    test's environment, as a plugin would be in the image, and the rendered worker loads it."""
    with contextlib.contextmanager(install_judge_plugin)(tmp_path / "site", "gpu"):
        env.kmock.put_object(JQ, NS, {"metadata": {"name": "judge"}, "spec": spec(queue_name, worker={"judge": "gpu"})})
        await env.observed(1)
        assert env.condition("Degraded").get("status") == "False", env.condition("Degraded")
        worker = env.kmock.current(DEPLOYMENTS, NS, "judge-worker")
        assert worker is not None
        plain = {k: v for k, v in _env_of(worker).items() if isinstance(v, str) and not k.endswith("_FILE")}
        settings = load_settings({**plain, "JUDGEQUEUE_POSTGRES_DSN": env.pg_dsn, "JUDGEQUEUE_REDIS_URL": REDIS_URL})
        assert settings.worker.judge == "gpu"
        verdict = await load_judge(settings.worker.judge).judge({})
        assert verdict.status == "ACCEPTED"


async def test_spec_classes_reach_the_queue_row_and_a_bad_list_degrades(
    env: Env, queue_name: str, pg: asyncpg.Connection
) -> None:
    from judgequeue.core.base.classes import JobClass
    from judgequeue.core.store.queues import get_classes

    classes = [{"name": "contest"}, {"name": "practice", "share": 10}, {"name": "rejudge"}]
    env.kmock.put_object(JQ, NS, {"metadata": {"name": "judge"}, "spec": {**spec(queue_name), "classes": classes}})
    await eventually(lambda: env.condition("CutoverApplied").get("status") == "True", what="applied")
    assert await get_classes(pg, queue_name) == (JobClass("contest"), JobClass("practice", 10), JobClass("rejudge", 5))
    generation = await env.patch_cr({"spec": {"classes": [{"name": "a"}, {"name": "b", "share": 70},
                                                          {"name": "c", "share": 40}]}})
    await env.observed(generation)
    degraded = env.condition("Degraded")
    assert degraded["status"] == "True" and "spec.classes: the shares sum to 110%" in degraded["message"]
    assert len(await get_classes(pg, queue_name) or ()) == 3  # an invalid spec writes nothing
