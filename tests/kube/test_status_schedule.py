"""Status is true while the world changes under it: a property over a random schedule, on the real
control plane with the chart's RBAC and pods run by the node agent.

A JudgeQueue with a small fleet (dispatcher, reaper and one or two workers, all running) goes
through a seeded random schedule of what happens to a real one: spec edits (valid changes: an
image tag, worker concurrency, dispatcher batch size, cutover mode, ``paused``), bad pushes (an
image no node can pull, or a judge the new workers refuse with exit 2, fixed by a later edit),
children recreated by hand with drift (``kubectl replace --force``: a new uid; the operator may
recreate a deleted one before kubectl does, which is a recreation too), the queue row's
flags changed behind the operator's back (the real ``judgequeue cutover set`` or plain SQL) and
scale changes (the spec's counts, or ``kubectl scale`` on the worker Deployment itself). The
operator runs with its default timer (10 s), so only what it hears at once can keep up.

A sampler reads the world and the JudgeQueue every 0.25 s and checks two claims:

- ``Ready=True`` agrees with the children: every role's Deployment exists, has its
  observedGeneration current and replicas = updated = ready = available = desired, and (when the
  condition is about the current generation) runs the spec's image;
- ``CutoverApplied=True`` agrees with the queue row: the row holds the spec's mode and paused flag
  (or, while the condition is about an older generation, the flags it last applied).

A disagreement may be seen while the operator catches up, never for more than :data:`BOUND` seconds
(from its first sample to its last). And the claims are not vacuous: once the schedule ends and
the spec is good, the JudgeQueue is Ready with its cutover applied again, about the spec's
current generation.

``JUDGEQUEUE_TEST_SEED`` replays a schedule (the seed is printed and named in every failure);
``JUDGEQUEUE_SCHEDULE_SECONDS`` sets its length (180 by default).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg

from judgequeue.controllers.state import OperatorConfig
from tests.kube import tools
from tests.kube.cluster import ApiError, Cluster
from tests.kube.node import NodeAgent

BOUND = 2.0  # seconds a claim may disagree with the world
SAMPLE_EVERY = 0.25
DURATION = float(os.environ.get("JUDGEQUEUE_SCHEDULE_SECONDS", "180"))
ROLES = ("dispatcher", "worker", "reaper")
GOOD_IMAGES = ("judgequeue:test", "judgequeue:test-b")  # any image outside .invalid runs on the node agent
NAME = "judge"


def ready_disagreement(jq: Mapping[str, Any], deployments: Mapping[str, Mapping[str, Any]]) -> str | None:
    """Why ``Ready=True`` on ``jq`` is not what its children (by name) show; None when it is, or
    when Ready is not True (a claim of not-ready is never a lie this test looks for). A condition
    about the current generation also claims the children run the spec's image; one about an older
    generation (a spec edit the operator is still applying) claims only that the rollout is done."""
    ready = tools.condition(jq, "Ready")
    if ready.get("status") != "True":
        return None
    current = ready.get("observedGeneration") == jq["metadata"].get("generation")
    image = jq["spec"].get("image")
    for role in ROLES:
        deployment = deployments.get(f"{NAME}-{role}")
        if deployment is None:
            return f"Ready=True, no {role} Deployment"
        meta, spec, status = deployment["metadata"], deployment.get("spec") or {}, deployment.get("status") or {}
        if status.get("observedGeneration") != meta.get("generation"):
            return (f"Ready=True, {role} Deployment at generation {meta.get('generation')}, observed"
                    f" {status.get('observedGeneration')}")
        desired = int(spec.get("replicas", 1))
        counts = {k: int(status.get(k, 0) or 0) for k in ("replicas", "updatedReplicas", "readyReplicas",
                                                         "availableReplicas")}
        if set(counts.values()) != {desired}:
            return f"Ready=True, {role} Deployment wants {desired}: {counts}"
        images = {c.get("image") for c in spec["template"]["spec"]["containers"]}
        if current and images != {image}:
            return f"Ready=True, {role} Deployment runs {sorted(images)}, the spec says {image}"
    return None


def cutover_disagreement(jq: Mapping[str, Any], row: Mapping[str, Any] | None) -> str | None:
    """Why ``CutoverApplied=True`` on ``jq`` is not what the queue row holds; None when it is, or
    when the condition is not True. A condition about the current generation claims the row holds
    the spec's mode and paused flag; one about an older generation (a spec edit the operator is
    still applying) claims the flags it last applied (``status.cutover.applied``)."""
    applied = tools.condition(jq, "CutoverApplied")
    if applied.get("status") != "True":
        return None
    if row is None:
        return "CutoverApplied=True, no queue row"
    if applied.get("observedGeneration") == jq["metadata"].get("generation"):
        mode = (jq["spec"].get("cutover") or {}).get("mode", "live")
        paused = bool(jq["spec"].get("paused", False))
        claimed = "the spec says"
    else:
        fields = dict(part.split("=", 1) for part in str(
            ((jq.get("status") or {}).get("cutover") or {}).get("applied", "")).split() if "=" in part)
        mode, paused, claimed = fields.get("mode"), fields.get("paused") == "true", "it last applied"
    if (row["mode"], row["paused"]) != (mode, paused):
        return (f"CutoverApplied=True, {claimed} mode={mode} paused={paused}, the row holds"
                f" mode={row['mode']} paused={row['paused']} (config version {row['config_version']})")
    return None


@dataclass
class Episode:
    """A run of consecutive samples in which one claim disagreed with the world."""

    claim: str
    first: float  # seconds since the schedule began
    last: float
    why: str  # the first sample's reason
    last_why: str = ""  # the last sample's (the world may have moved on while the claim stayed)

    @property
    def seen_for(self) -> float:
        return self.last - self.first


@dataclass(eq=False)  # a Thread must stay hashable
class Sampler(threading.Thread):
    """Reads the JudgeQueue, its Deployments and its queue row every :data:`SAMPLE_EVERY` seconds and
    records every episode of disagreement (:func:`ready_disagreement`, :func:`cutover_disagreement`)."""

    kube: Cluster
    namespace: str
    dsn: str
    queue: str
    started: float
    episodes: list[Episode] = field(default_factory=list)
    samples: int = 0
    ready_true: int = 0
    applied_true: int = 0
    errors: list[str] = field(default_factory=list)
    halt: threading.Event = field(default_factory=threading.Event)
    _open: dict[str, Episode] = field(default_factory=dict)

    def __post_init__(self) -> None:
        threading.Thread.__init__(self, daemon=True)

    def _note(self, claim: str, why: str | None, at: float) -> None:
        episode = self._open.get(claim)
        if why is None:
            if episode is not None:
                self.episodes.append(self._open.pop(claim))
            return
        if episode is None:
            self._open[claim] = Episode(claim, at, at, why, why)
        else:
            episode.last, episode.last_why = at, why

    def run(self) -> None:
        loop = asyncio.new_event_loop()
        conn: asyncpg.Connection = loop.run_until_complete(asyncpg.connect(self.dsn))
        try:
            while not self.halt.is_set():
                began = time.monotonic()
                try:
                    self._sample(loop, conn, began - self.started)
                except (ApiError, OSError, asyncpg.PostgresError) as exc:
                    self.errors.append(f"{began - self.started:.2f}s: {exc!r}")
                self.halt.wait(max(0.0, SAMPLE_EVERY - (time.monotonic() - began)))
        finally:
            loop.run_until_complete(conn.close())
            loop.close()
        for claim in list(self._open):
            self.episodes.append(self._open.pop(claim))

    def _sample(self, loop: asyncio.AbstractEventLoop, conn: asyncpg.Connection, at: float) -> None:
        jq = self.kube.request("GET", tools.jq_path(self.namespace, NAME))
        items = self.kube.request("GET", f"/apis/apps/v1/namespaces/{self.namespace}/deployments")["items"]
        row = loop.run_until_complete(conn.fetchrow(
            "SELECT mode, paused, config_version FROM judgequeue.queues WHERE name = $1", self.queue))
        deployments = {d["metadata"]["name"]: d for d in items if not d["metadata"].get("deletionTimestamp")}
        self.samples += 1
        self.ready_true += tools.condition(jq, "Ready").get("status") == "True"
        self.applied_true += tools.condition(jq, "CutoverApplied").get("status") == "True"
        self._note("Ready", ready_disagreement(jq, deployments), at)
        self._note("CutoverApplied", cutover_disagreement(jq, None if row is None else dict(row)), at)


class Schedule:
    """The random schedule's actions on one JudgeQueue; each returns a line for the run's log."""

    def __init__(self, kube: Cluster, namespace: str, dsn: str, queue: str, rng: random.Random) -> None:
        self.kube, self.namespace, self.dsn, self.queue, self.rng = kube, namespace, dsn, queue, rng
        self.broken = False  # a bad push is in place; the next spec edit fixes it

    def _patch(self, spec: dict[str, Any]) -> None:
        self.kube.request("PATCH", tools.jq_path(self.namespace, NAME), {"spec": spec},
                          content_type="application/merge-patch+json")

    def _fixing(self, spec: dict[str, Any]) -> dict[str, Any]:
        if self.broken:
            spec = {**spec, "image": self.rng.choice(GOOD_IMAGES),
                    "worker": {**spec.get("worker", {}), "judge": "sleep"}}
            self.broken = False
        return spec

    def spec_edit(self) -> str:
        rng = self.rng
        change: dict[str, Any] = rng.choice([
            {"image": rng.choice(GOOD_IMAGES)},
            {"worker": {"concurrency": rng.randint(1, 3)}},
            {"dispatcher": {"batchSize": rng.choice([50, 100, 200])}},
            {"cutover": {"mode": rng.choice(["live", "shadow"])}},
            {"paused": rng.choice([True, False])},
        ])
        change = self._fixing(change)
        self._patch(change)
        return f"spec edit {json.dumps(change, sort_keys=True)}"

    def bad_push(self) -> str:
        change: dict[str, Any] = self.rng.choice([
            {"image": f"registry.invalid/judgequeue:{self.rng.randrange(1000)}"},
            {"worker": {"judge": "gpu"}},  # not installed: the new workers exit 2
        ])
        self._patch(change)
        self.broken = True
        return f"bad push {json.dumps(change, sort_keys=True)}"

    def recreate_child(self) -> str:
        kind, name, drift = self.rng.choice([
            ("deployment", f"{NAME}-worker", ("nodeSelector", {"disk": "ssd"})),
            ("deployment", f"{NAME}-dispatcher", ("hostNetwork", True)),
            ("deployment", f"{NAME}-reaper", ("nodeSelector", {"disk": "ssd"})),
            ("networkpolicy", f"{NAME}-worker-egress", ("egress", [{}])),
        ])
        result = self.kube.kubectl("get", "-n", self.namespace, kind, name, "-o", "json", check=False)
        if result.returncode != 0:
            return f"recreate {kind} {name}: not there ({result.stderr.strip()})"
        obj = json.loads(result.stdout)
        target = obj["spec"] if kind == "networkpolicy" else obj["spec"]["template"]["spec"]
        target[drift[0]] = drift[1]
        # Deleted, then created again; the operator may recreate it in between (kubectl's create fails).
        replaced = self.kube.kubectl("replace", "--force", "-f", "-", input=json.dumps(obj), check=False)
        outcome = "replaced" if replaced.returncode == 0 else f"not replaced ({replaced.stderr.strip()[-120:]})"
        return f"recreate {kind} {name} with {drift[0]}={json.dumps(drift[1])}: {outcome}"

    def flag_edit(self) -> str:
        mode, paused = self.rng.choice(["live", "shadow"]), self.rng.choice([True, False])
        if self.rng.random() < 0.5:
            env = {**os.environ, "JUDGEQUEUE_POSTGRES_DSN": self.dsn, "JUDGEQUEUE_QUEUE": self.queue}
            result = subprocess.run([str(tools.JUDGEQUEUE_BIN), "cutover", "set", "--mode", mode,
                                     "--pause" if paused else "--resume"], env=env, capture_output=True,
                                    text=True, timeout=60)
            return f"cli cutover set mode={mode} paused={paused}: rc {result.returncode}"
        tools.run_sql(self.dsn, "UPDATE judgequeue.queues SET mode = $2, paused = $3 WHERE name = $1",
                      self.queue, mode, paused)
        return f"sql mode={mode} paused={paused}"

    def scale(self) -> str:
        rng = self.rng
        if rng.random() < 0.4:
            replicas = rng.randint(1, 2)
            self.kube.kubectl("scale", "-n", self.namespace, f"deployment/{NAME}-worker",
                              f"--replicas={replicas}", check=False)
            return f"kubectl scale deployment/{NAME}-worker --replicas={replicas}"
        low = rng.randint(1, 2)
        change: dict[str, Any] = rng.choice([
            {"worker": {"minReplicas": low, "maxReplicas": rng.randint(low, 2)}},
            {"dispatcher": {"replicas": rng.randint(0, 1)}},
            {"reaper": {"replicas": rng.randint(0, 1)}},
        ])
        self._patch(change)
        return f"scale {json.dumps(change, sort_keys=True)}"

    def step(self) -> str:
        actions: list[tuple[Callable[[], str], float]] = [
            (self.spec_edit, 3), (self.bad_push, 1.5), (self.recreate_child, 1.5), (self.flag_edit, 2),
            (self.scale, 2)]
        action = self.rng.choices([a for a, _ in actions], weights=[w for _, w in actions])[0]
        return action()


def test_ready_and_cutover_applied_agree_with_the_world_over_a_random_schedule(
    crd_installed: Cluster, node: NodeAgent, namespace: str, pg_dsn: str, queue_name: str, tmp_path: Path,
) -> None:
    kube = crd_installed
    seed = int(os.environ.get("JUDGEQUEUE_TEST_SEED", time.time_ns() % 1_000_000))
    print(f"schedule seed {seed} (JUDGEQUEUE_TEST_SEED={seed} replays it), {DURATION:g} s")
    rng = random.Random(seed)
    operator = tools.operator_with_secrets(kube, namespace, tmp_path / "operator.log", dsn=pg_dsn,
                                           interval=OperatorConfig().interval)
    sampler: Sampler | None = None
    log: list[str] = []
    try:
        kube.request("POST", tools.jq_path(namespace), tools.judgequeue(
            NAME, queue_name, cutover={"mode": "shadow"}, dispatcher={"replicas": 1}, reaper={"replicas": 1},
            worker={"judge": "sleep", "minReplicas": 1, "maxReplicas": 2, "concurrency": 1}))
        for cond in ("Ready", "CutoverApplied"):
            met, _, out = tools.kubectl_wait(kube, namespace, NAME, cond, timeout=180)
            assert met, (seed, out, operator.text()[-3000:])

        sampler = Sampler(kube, namespace, pg_dsn, queue_name, time.monotonic())
        sampler.start()
        schedule = Schedule(kube, namespace, pg_dsn, queue_name, rng)
        deadline = sampler.started + DURATION
        while time.monotonic() < deadline:
            operator.check()
            line = schedule.step()
            log.append(f"{time.monotonic() - sampler.started:7.2f}s {line}")
            # A pause drawn from the schedule (not a wait for anything): some changes land in quick
            # succession, some after the world has settled.
            time.sleep(min(rng.choice([0.2, 1.0, 3.0, 6.0, 10.0]), max(0.0, deadline - time.monotonic())))
        schedule.broken = True  # whatever the last push was, end on a good spec
        log.append(f"{time.monotonic() - sampler.started:7.2f}s final {schedule.spec_edit()}")

        def settled() -> bool:
            obj = kube.request("GET", tools.jq_path(namespace, NAME))
            return all(tools.condition(obj, cond).get("status") == "True" and tools.condition(obj, cond).get(
                "observedGeneration") == obj["metadata"]["generation"] for cond in ("Ready", "CutoverApplied"))

        try:
            tools.wait_for("Ready and CutoverApplied about the final spec", settled, timeout=180,
                           check=operator.check)
        except TimeoutError as exc:
            raise AssertionError((seed, "\n".join(log[-10:]), operator.text()[-3000:])) from exc
    finally:
        if sampler is not None:
            sampler.halt.set()
            sampler.join(timeout=30)
        operator.stop()
    assert sampler is not None
    long = [e for e in sampler.episodes if e.seen_for > BOUND]
    report = "\n".join([f"seed {seed}: {sampler.samples} samples, Ready=True in {sampler.ready_true},"
                        f" CutoverApplied=True in {sampler.applied_true}",
                        *(f"{e.claim} disagreed {e.first:.2f}-{e.last:.2f}s ({e.seen_for:.2f}s): {e.why}"
                          + (f" ... {e.last_why}" if e.last_why != e.why else "") for e in sampler.episodes),
                        "schedule:", *log])
    print(report)
    tools.record_figure("status_schedule_longest_disagreement_seconds",
                        round(max((e.seen_for for e in sampler.episodes), default=0.0), 2))
    assert not sampler.errors or len(sampler.errors) < sampler.samples // 10, (seed, sampler.errors[:5])
    assert sampler.ready_true > 0 and sampler.applied_true > 0, report
    assert not long, f"claims disagreeing with the world for more than {BOUND:g} s:\n{report}"
