"""What every handler of one operator process shares: its settings, its per-JudgeQueue memory,
where a JudgeQueue's connections go, and how a JudgeQueue is named."""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from judgequeue.core.spec import JudgeQueueSpec

from .children import Verified
from .kube import KubeApi
from .render import (
    Owner,
)

Status = dict[str, Any]


Log = logging.Logger | logging.LoggerAdapter[Any]


@dataclass(frozen=True)
class OperatorConfig:
    """Operator-wide knobs (not per JudgeQueue)."""

    interval: float = 10.0  # timer: autoscale, status refresh, retries
    db_timeout: float = 5.0  # connecting to Postgres/Redis for cutover and backlog


@dataclass
class OperatorState:
    """Shared by every handler of one operator process."""

    config: OperatorConfig
    kube: KubeApi | None = None
    locks: dict[str, asyncio.Lock] = field(default_factory=dict)
    # (namespace/name, generation) -> how many times a change handler ran; tests assert "once".
    handled: collections.Counter[tuple[str, int]] = field(default_factory=collections.Counter)
    # (uid, reason) -> (message, monotonic time) of the last Warning Event posted, to rate-limit them.
    warned: dict[tuple[str, str], tuple[str, float]] = field(default_factory=dict)
    # JudgeQueue uid -> child name -> what was last verified equal to the rendered child.
    verified: dict[str, dict[str, Verified]] = field(default_factory=dict)
    # JudgeQueue uid -> what its daemon (follow_queue_row) waits on to make a pass at once.
    pokes: dict[str, asyncio.Event] = field(default_factory=dict)

    def poke(self, uid: str) -> None:
        """Ask the daemon of JudgeQueue ``uid`` for a pass now (nothing if none runs)."""
        event = self.pokes.get(uid)
        if event is not None:
            event.set()

    def lock(self, uid: str) -> asyncio.Lock:
        return self.locks.setdefault(uid, asyncio.Lock())

    def forget(self, uid: str) -> None:
        self.locks.pop(uid, None)
        self.verified.pop(uid, None)
        for key in [k for k in self.warned if k[0] == uid]:
            del self.warned[key]

    @property
    def api(self) -> KubeApi:
        if self.kube is None:
            raise RuntimeError("the Kubernetes client is not set up (operator not started)")
        return self.kube


@dataclass(frozen=True)
class Connections:
    """Where the operator's own connections go, read from the JudgeQueue's Secrets; they are opened
    through :mod:`judgequeue.core.transport.connect` exactly as the roles open theirs, so the operator works
    behind the same PgBouncer (``pooler``) and with the same ``redis+sentinel://`` URL."""

    postgres_dsn: str
    redis_url: str
    pooler: str = "none"


def utc_now() -> datetime:
    return datetime.now(UTC)


def owner_of(body: Mapping[str, Any]) -> Owner:
    meta = body["metadata"]
    return Owner(name=meta["name"], namespace=meta["namespace"], uid=meta["uid"])


def queue_owner(owner: Owner) -> str:
    """How a JudgeQueue is recorded as its queue's owner in Postgres."""
    return f"JudgeQueue {owner.namespace}/{owner.name}"


def jq_name(owner: Owner) -> str:
    return f"{owner.namespace}/{owner.name}"


async def read_connections(api: KubeApi, namespace: str, spec: JudgeQueueSpec) -> Connections:
    """The operator's own connections for this JudgeQueue: ``spec.credentials.operator``'s Secret when
    given, else the shared ``spec.postgres``/``spec.redis``."""
    postgres, redis, _ = spec.connections("operator")
    return Connections(
        postgres_dsn=await api.secret_value(namespace, postgres.name, postgres.key),
        redis_url=await api.secret_value(namespace, redis.name, redis.key),
        pooler=spec.postgres_pooler,
    )


def owned_by(obj: Mapping[str, Any], owner: Owner) -> bool:
    refs = obj.get("metadata", {}).get("ownerReferences") or []
    return any(r.get("uid") == owner.uid and r.get("controller") for r in refs)
