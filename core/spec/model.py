"""The typed spec: what the operator and ``judgequeue local`` read from a parsed JudgeQueue."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from ..base.agreement import Gate
from ..base.classes import (
    DEFAULT_CLASSES,
    JobClass,
)
from ..config import (
    parse_duration,
)
from .fields import (
    CREDENTIAL_COMPONENTS,
    ENDPOINT_CONCURRENCY,
    ENDPOINT_DEADLINE,
    ENDPOINT_TRIES,
    ENDPOINT_URL_DIR,
    WEBHOOK_CONCURRENCY,
    WEBHOOK_DEADLINE,
    WEBHOOK_MAX_ATTEMPTS,
)

# --- the typed spec -----------------------------------------------------------------------------


@dataclass(frozen=True)
class SecretKeyRef:
    """A key of a Secret in the JudgeQueue's namespace."""

    name: str
    key: str


@dataclass(frozen=True)
class RoleCredentials:
    """``spec.credentials.<component>``: the Secret of one component's own connections, and its keys."""

    secret_name: str
    postgres_key: str
    redis_key: str
    listen_key: str | None = None

    @property
    def postgres(self) -> SecretKeyRef:
        return SecretKeyRef(self.secret_name, self.postgres_key)

    @property
    def redis(self) -> SecretKeyRef:
        return SecretKeyRef(self.secret_name, self.redis_key)

    @property
    def listen(self) -> SecretKeyRef | None:
        return SecretKeyRef(self.secret_name, self.listen_key) if self.listen_key is not None else None


@dataclass(frozen=True)
class Backoff:
    base: float
    max: float


@dataclass(frozen=True)
class DispatcherSpec:
    replicas: int
    batch_size: int
    schedule: float
    max_attempts: int
    backoff: Backoff
    resources: Mapping[str, Any] = field(default_factory=dict)


Autoscaling = Literal["internal", "external"]


@dataclass(frozen=True)
class EgressPeer:
    """Where workers may connect for one service: a TCP port, to ``cidr`` only or (None) anywhere."""

    port: int
    cidr: str | None  # None: anywhere


@dataclass(frozen=True)
class NetworkPolicySpec:
    """``spec.worker.networkPolicy``: the program-judge workers' egress allow-list."""

    enabled: bool
    postgres: EgressPeer
    redis: EgressPeer
    sentinel_port: int  # 0: none


@dataclass(frozen=True)
class ShadowWorkers:
    """``spec.worker.shadow``: shadow workers of their own, while the queue row is in shadow mode."""

    enabled: bool
    replicas: int
    #: Their own requests and limits (empty: the workers', with a CPU request of 100m, controllers/render.py):
    #: a small CPU request gives shadow judging a small share of a busy node (Kubernetes turns requests
    #: into CPU shares), so live workers on the same node are not slowed.
    resources: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class EndpointSpec:
    """One of ``spec.worker.endpoints``: a name jobs call by, where it is (a URL, or a Secret key
    holding it), and how hard the queue's workers together may call it (concurrent calls, calls a
    second, 0 for no limit), a deadline per call and tries."""

    name: str
    url: str | None = None
    secret: SecretKeyRef | None = None
    concurrency: int = ENDPOINT_CONCURRENCY[2]
    deadline: float = parse_duration(ENDPOINT_DEADLINE)
    tries: int = ENDPOINT_TRIES[2]
    rate: float = 0.0


@dataclass(frozen=True)
class WebhookSpec:
    """One of ``spec.events.webhooks``: a name, where it is (a URL, or a Secret key holding it), the
    Secret key of its signing key, and how hard the reaper may call it."""

    name: str
    secret: SecretKeyRef
    url: str | None = None
    url_secret: SecretKeyRef | None = None
    concurrency: int = WEBHOOK_CONCURRENCY[2]
    max_attempts: int = WEBHOOK_MAX_ATTEMPTS[2]
    deadline: float = parse_duration(WEBHOOK_DEADLINE)


def webhook_file(name: str, what: str) -> str:
    """Where a reaper pod finds webhook ``name``'s URL (``what`` = url) or signing key (secret)."""
    return f"{ENDPOINT_URL_DIR}/webhook-{name}-{what}"


def endpoint_url_file(name: str) -> str:
    """Where a worker pod finds the URL of endpoint ``name`` taken from a Secret."""
    return f"{ENDPOINT_URL_DIR}/endpoint-{name}-url"


@dataclass(frozen=True)
class WorkerSpec:
    min_replicas: int
    max_replicas: int
    replicas: int | None  # the scale subresource; honoured in external mode
    target_backlog_per_replica: int
    concurrency: int
    judge: str
    autoscaling: Autoscaling
    scale_down_window: float
    grace_period: float
    resources: Mapping[str, Any]
    sandbox: Literal["isolated", "trusted"]
    priority_class: str | None
    network_policy: NetworkPolicySpec
    shadow: ShadowWorkers
    endpoints: tuple[EndpointSpec, ...] = ()


@dataclass(frozen=True)
class ReaperSpec:
    """What the operator reads of ``spec.reaper``; its settings reach the reaper (and ``leaseTtl`` the
    workers) through :func:`role_settings`."""

    replicas: int
    resources: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class CutoverSpec:
    mode: Literal["live", "shadow"]
    watermark: datetime | None
    drift_policy: Literal["restore", "report"]
    gate: Gate | None  # None: a flip to live is not gated
    force: bool  # a flip to live goes through whatever the gate says


@dataclass(frozen=True)
class JudgeQueueSpec:
    """A validated spec; durations in seconds. ``values`` holds every field by path (defaults filled),
    ``given`` the paths the manifest wrote."""

    image: str
    queue: str
    postgres: SecretKeyRef
    redis: SecretKeyRef
    image_pull_policy: str
    log_level: str
    paused: bool
    dispatcher: DispatcherSpec
    worker: WorkerSpec
    reaper: ReaperSpec
    cutover: CutoverSpec
    postgres_pooler: str  # none, session or transaction (core/settings_table.py POOLERS)
    postgres_listen: SecretKeyRef | None  # the direct LISTEN DSN (dispatcher, worker), if any
    progress_deadline: float  # seconds a Deployment may roll out without progress
    classes: tuple[JobClass, ...] = DEFAULT_CLASSES  # priority classes, highest first
    values: Mapping[tuple[str, ...], Any] = field(default_factory=dict, repr=False, compare=False)
    given: frozenset[tuple[str, ...]] = field(default=frozenset(), repr=False, compare=False)
    webhooks: tuple[WebhookSpec, ...] = ()
    #: ``spec.credentials``: the components with connections of their own (the others share
    #: ``postgres``/``redis``).
    credentials: Mapping[str, RoleCredentials] = field(default_factory=dict)

    def connections(self, component: str) -> tuple[SecretKeyRef, SecretKeyRef, SecretKeyRef | None]:
        """(Postgres DSN, Redis URL, direct LISTEN DSN or None) of ``component`` (a role or ``operator``):
        its own Secret's keys when ``spec.credentials`` names one, else the shared ones. A component
        with its own credentials never gets the shared LISTEN DSN (only its own ``listenKey``), and
        none at all without ``spec.postgres.listen``."""
        own = self.credentials.get(component)
        if own is None:
            return self.postgres, self.redis, self.postgres_listen
        return own.postgres, own.redis, own.listen if self.postgres_listen is not None else None

    def shared_components(self) -> tuple[str, ...]:
        """The components (:data:`.fields.CREDENTIAL_COMPONENTS`) without credentials of their own."""
        return tuple(c for c in CREDENTIAL_COMPONENTS if c not in self.credentials)


