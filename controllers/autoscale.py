"""The worker autoscaler's decision (pure; no I/O).

Desired workers are ``ceil(backlog / targetBacklogPerReplica)`` within ``[minReplicas, maxReplicas]``.
Scaling up happens at once; scaling down only once the workers have not been needed at the current
count for a whole stabilization window (measured from the last scale-up or the last moment the
backlog still justified the current count), so a bursty queue does not make pods flap.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any


@dataclass(frozen=True)
class ScaleState:
    """What the autoscaler remembers between ticks (kept in the CR's status, so it survives restarts)."""

    last_scale_up: float | None = None  # epoch seconds
    last_busy: float | None = None  # last time the backlog justified the current count


@dataclass(frozen=True)
class ScaleDecision:
    replicas: int  # what the worker Deployment should have
    wanted: int  # what the backlog alone asks for (within bounds)
    reason: str  # "" when nothing changes
    state: ScaleState

    @property
    def changed(self) -> bool:
        return bool(self.reason)


def wanted_replicas(backlog: int, target_per_replica: int, lo: int, hi: int) -> int:
    raw = math.ceil(max(backlog, 0) / max(target_per_replica, 1))
    return max(lo, min(hi, raw))


def decide(
    *,
    backlog: int,
    current: int,
    min_replicas: int,
    max_replicas: int,
    target_per_replica: int,
    window: float,
    now: float,
    state: ScaleState,
) -> ScaleDecision:
    """The replica count for this tick and the state to remember."""
    wanted = wanted_replicas(backlog, target_per_replica, min_replicas, max_replicas)
    if current < min_replicas or current > max_replicas:
        bounded = max(min_replicas, min(max_replicas, current))
        new_state = replace(state, last_scale_up=now) if bounded > current else state
        return ScaleDecision(bounded, wanted, f"outside bounds [{min_replicas}, {max_replicas}]", new_state)
    if wanted > current:
        return ScaleDecision(
            wanted,
            wanted,
            f"backlog {backlog} needs {wanted} workers at {target_per_replica} per worker",
            ScaleState(last_scale_up=now, last_busy=now),
        )
    if wanted == current:
        return ScaleDecision(current, wanted, "", replace(state, last_busy=now))
    since_candidates = [t for t in (state.last_scale_up, state.last_busy) if t is not None]
    if not since_candidates:  # nothing remembered yet: start the window now
        return ScaleDecision(current, wanted, "", replace(state, last_busy=now))
    since = max(since_candidates)
    if now - since >= window:
        return ScaleDecision(
            wanted,
            wanted,
            f"backlog {backlog} needs only {wanted} workers for {window:g}s",
            replace(state, last_busy=now),
        )
    return ScaleDecision(current, wanted, "", state)


@dataclass(frozen=True)
class Handoff:
    """The switch from internal to external autoscaling, remembered in ``status.autoscaling``:
    when it was seen (epoch seconds) and ``spec.worker.replicas`` at that moment."""

    since: float | None = None
    replicas: int | None = None
    keep_live: bool = False

    @classmethod
    def of(cls, status: Mapping[str, Any] | None) -> Handoff:
        status = status or {}
        since, replicas = status.get("externalSince"), status.get("handoffReplicas")
        return cls(float(since) if since is not None else None, int(replicas) if replicas is not None else None)

    def status(self) -> dict[str, Any]:
        """The fields of ``status.autoscaling`` (None removes them in a merge patch)."""
        return {"externalSince": self.since, "handoffReplicas": self.replicas}


def handoff(
    *, mode: str, previous_mode: str | None, spec_replicas: int | None, memory: Handoff, window: float, now: float,
) -> Handoff:
    """Whether the workers keep their live count instead of ``spec.worker.replicas`` (pure).

    Switching ``worker.autoscaling`` from internal to external hands the count to an HPA or KEDA
    through the scale subresource, whose ``spec.worker.replicas`` still holds its default (1) or an
    old value: following it at once would drop every busy worker. So the live count stays until the
    external scaler writes a new value, or ``spec.worker.replicas`` asks for more (scaling up is
    never held back), or one scale-down stabilization window has passed (then it is followed, as a
    scale-down after the window would be)."""
    if mode != "external":
        return Handoff()
    if previous_mode == "internal" and memory.since is None:
        memory = Handoff(now, spec_replicas)
    if memory.since is None:
        return Handoff()
    if spec_replicas != memory.replicas or now - memory.since >= window:
        return Handoff()
    return Handoff(memory.since, memory.replicas, keep_live=True)
