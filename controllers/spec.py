"""Parse and validate a ``JudgeQueue`` spec into typed values (pure; no I/O).

The CRD schema and its CEL rules reject most mistakes at admission, but the operator must not trust
that (a CRD applied without its schema, an older CRD version, a hand-edited object), so every rule is
checked again here. :func:`parse_spec` returns either a :class:`JudgeQueueSpec` or a list of errors,
each naming the field (``spec.worker.minReplicas: ...``), so the ``Degraded`` condition can say
exactly what to fix.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from judgequeue.core.config import parse_duration
from judgequeue.core.errors import InvalidQueueName
from judgequeue.core.queues import validate_queue_name

BUILTIN_JUDGES: frozenset[str] = frozenset({"noop", "sleep", "program"})

# Durations compared by CEL rules must be Go durations too (CEL's duration() has no "d" unit).
_DURATION = re.compile(r"^[0-9]+(\.[0-9]+)?(ms|s|m|h)$")
_LONG_DURATION = re.compile(r"^[0-9]+(\.[0-9]+)?(ms|s|m|h|d)$")
_QUANTITY = re.compile(r"^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$")
_SECRET_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
_SECRET_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")

Autoscaling = Literal["internal", "external"]


@dataclass(frozen=True)
class SecretKeyRef:
    """A key of a Secret in the JudgeQueue's namespace."""

    name: str
    key: str


@dataclass(frozen=True)
class Backoff:
    base: float
    max: float


@dataclass(frozen=True)
class DispatcherSpec:
    replicas: int = 1
    batch_size: int = 100
    schedule: float = 1.0
    max_attempts: int = 10
    backoff: Backoff = field(default_factory=lambda: Backoff(1.0, 300.0))
    resources: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class WorkerSpec:
    min_replicas: int = 1
    max_replicas: int = 10
    replicas: int | None = None  # the scale subresource; honoured in external mode
    target_backlog_per_replica: int = 10
    concurrency: int = 4
    judge: str = "program"
    autoscaling: Autoscaling = "internal"
    scale_down_window: float = 300.0
    grace_period: float = 25.0
    resources: Mapping[str, Any] = field(default_factory=dict)
    # isolated: the program judge's sandbox works (and is required); trusted: it runs code unisolated.
    sandbox: Literal["isolated", "trusted"] = "isolated"


SANDBOX_MODES = ("isolated", "trusted")


@dataclass(frozen=True)
class ReaperSpec:
    replicas: int = 1
    interval: float = 5.0
    visibility_timeout: float = 60.0
    max_deliveries: int = 5
    lease_ttl: float = 30.0
    max_retries: int = 3
    retention: float = 7 * 86400.0
    resources: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class CutoverSpec:
    mode: Literal["live", "shadow"] = "live"
    watermark: datetime | None = None


@dataclass(frozen=True)
class JudgeQueueSpec:
    """A validated spec; durations in seconds, names checked."""

    image: str
    queue: str
    postgres: SecretKeyRef
    redis: SecretKeyRef
    image_pull_policy: str = "IfNotPresent"
    log_level: str = "INFO"
    paused: bool = False
    dispatcher: DispatcherSpec = field(default_factory=DispatcherSpec)
    worker: WorkerSpec = field(default_factory=WorkerSpec)
    reaper: ReaperSpec = field(default_factory=ReaperSpec)
    cutover: CutoverSpec = field(default_factory=CutoverSpec)


class _Reader:
    """Reads typed fields out of nested dicts, collecting errors instead of raising."""

    def __init__(self) -> None:
        self.errors: list[str] = []

    def section(self, data: Mapping[str, Any], key: str, path: str) -> Mapping[str, Any]:
        value = data.get(key)
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            self.errors.append(f"{path}.{key}: must be an object")
            return {}
        return value

    def integer(self, data: Mapping[str, Any], key: str, path: str, default: int, lo: int, hi: int) -> int:
        value = data.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int):
            self.errors.append(f"{path}.{key}: must be an integer, got {value!r}")
            return default
        if not lo <= value <= hi:
            self.errors.append(f"{path}.{key}: must be between {lo} and {hi}, got {value}")
            return default
        return value

    def duration(
        self, data: Mapping[str, Any], key: str, path: str, default: str, *, long: bool = False
    ) -> float:
        value = data.get(key, default)
        pattern = _LONG_DURATION if long else _DURATION
        units = "ms, s, m, h, d" if long else "ms, s, m, h"
        if not isinstance(value, str) or not pattern.match(value):
            self.errors.append(f"{path}.{key}: {value!r} is not a duration (a number with unit {units}, e.g. 30s)")
            return parse_duration(default)
        seconds = parse_duration(value)
        if seconds <= 0:
            self.errors.append(f"{path}.{key}: must be positive, got {value!r}")
            return parse_duration(default)
        return seconds

    def choice(self, data: Mapping[str, Any], key: str, path: str, default: str, allowed: Collection[str]) -> str:
        value = data.get(key, default)
        if value not in allowed:
            self.errors.append(f"{path}.{key}: must be one of {', '.join(sorted(allowed))}, got {value!r}")
            return default
        return str(value)

    def boolean(self, data: Mapping[str, Any], key: str, path: str, default: bool) -> bool:
        value = data.get(key, default)
        if not isinstance(value, bool):
            self.errors.append(f"{path}.{key}: must be true or false, got {value!r}")
            return default
        return value

    def secret_ref(self, data: Mapping[str, Any], key: str, path: str, default_key: str) -> SecretKeyRef:
        section = self.section(data, key, path)
        ref = self.section(section, "secretKeyRef", f"{path}.{key}")
        where = f"{path}.{key}.secretKeyRef"
        name, skey = ref.get("name"), ref.get("key", default_key)
        if not isinstance(name, str) or not name:
            self.errors.append(f"{where}.name: the name of a Secret holding the connection is required")
            name = ""
        elif len(name) > 253 or not _SECRET_NAME.match(name):
            self.errors.append(f"{where}.name: {name!r} is not a valid Secret name")
        if not isinstance(skey, str) or not _SECRET_KEY.match(skey):
            self.errors.append(f"{where}.key: {skey!r} is not a valid Secret key")
            skey = default_key
        return SecretKeyRef(name=name, key=skey)

    def resources(self, data: Mapping[str, Any], path: str) -> Mapping[str, Any]:
        value = self.section(data, "resources", path)
        for part in ("requests", "limits"):
            amounts = value.get(part) or {}
            if not isinstance(amounts, Mapping):
                self.errors.append(f"{path}.resources.{part}: must be an object")
                continue
            for name, amount in amounts.items():
                if isinstance(amount, bool) or not (
                    isinstance(amount, int | float) or (isinstance(amount, str) and _QUANTITY.match(amount))
                ):
                    self.errors.append(f"{path}.resources.{part}.{name}: {amount!r} is not a quantity")
        return dict(value)


def parse_spec(
    spec: Mapping[str, Any] | None, *, name: str, known_judges: Collection[str] = BUILTIN_JUDGES
) -> JudgeQueueSpec | list[str]:
    """Validate ``spec`` (the CR's ``.spec``, defaults maybe not applied) of the JudgeQueue ``name``.

    Returns the typed spec, or every error found (each starting with the field path).
    """
    r = _Reader()
    s: Mapping[str, Any] = spec if isinstance(spec, Mapping) else {}
    if not isinstance(spec, Mapping):
        r.errors.append("spec: must be an object")

    image = s.get("image")
    if not isinstance(image, str) or not image.strip():
        r.errors.append("spec.image: a container image is required")
        image = ""
    queue = s.get("queue", name)
    try:
        queue = validate_queue_name(queue)
    except InvalidQueueName as exc:
        r.errors.append(f"spec.queue: {exc}")
    pull = r.choice(s, "imagePullPolicy", "spec", "IfNotPresent", ("Always", "IfNotPresent", "Never"))
    log_level = r.choice(s, "logLevel", "spec", "INFO", ("DEBUG", "INFO", "WARNING", "ERROR"))
    paused = r.boolean(s, "paused", "spec", False)
    postgres = r.secret_ref(s, "postgres", "spec", "dsn")
    redis = r.secret_ref(s, "redis", "spec", "url")

    d = r.section(s, "dispatcher", "spec")
    p = "spec.dispatcher"
    b = r.section(d, "backoff", p)
    backoff = Backoff(
        base=r.duration(b, "base", f"{p}.backoff", "1s"),
        max=r.duration(b, "max", f"{p}.backoff", "5m"),
    )
    if backoff.base > backoff.max:
        r.errors.append(f"{p}.backoff.base: must not exceed {p}.backoff.max ({b.get('base')} > {b.get('max')})")
    dispatcher = DispatcherSpec(
        replicas=r.integer(d, "replicas", p, 1, 0, 100),
        batch_size=r.integer(d, "batchSize", p, 100, 1, 10000),
        schedule=r.duration(d, "schedule", p, "1s"),
        max_attempts=r.integer(d, "maxAttempts", p, 10, 1, 1000),
        backoff=backoff,
        resources=r.resources(d, p),
    )

    w = r.section(s, "worker", "spec")
    p = "spec.worker"
    min_replicas = r.integer(w, "minReplicas", p, 1, 0, 1000)
    max_replicas = r.integer(w, "maxReplicas", p, 10, 1, 1000)
    if min_replicas > max_replicas:
        r.errors.append(f"{p}.minReplicas: must not exceed {p}.maxReplicas ({min_replicas} > {max_replicas})")
    replicas = r.integer(w, "replicas", p, 0, 0, 1000) if w.get("replicas") is not None else None
    judge = w.get("judge", "program")
    if judge not in known_judges:
        r.errors.append(f"{p}.judge: unknown judge {judge!r} (known: {', '.join(sorted(known_judges))})")
        judge = "program"
    worker = WorkerSpec(
        min_replicas=min_replicas,
        max_replicas=max_replicas,
        replicas=replicas,
        target_backlog_per_replica=r.integer(w, "targetBacklogPerReplica", p, 10, 1, 1_000_000),
        concurrency=r.integer(w, "concurrency", p, 4, 1, 256),
        judge=str(judge),
        autoscaling="external" if r.choice(w, "autoscaling", p, "internal", ("internal", "external")) == "external"
        else "internal",
        scale_down_window=r.duration(w, "scaleDownStabilization", p, "5m"),
        grace_period=r.duration(w, "gracePeriod", p, "25s"),
        resources=r.resources(w, p),
        sandbox="trusted" if r.choice(w, "sandbox", p, "isolated", SANDBOX_MODES) == "trusted" else "isolated",
    )

    rp = r.section(s, "reaper", "spec")
    p = "spec.reaper"
    reaper = ReaperSpec(
        replicas=r.integer(rp, "replicas", p, 1, 0, 20),
        interval=r.duration(rp, "interval", p, "5s"),
        visibility_timeout=r.duration(rp, "visibilityTimeout", p, "60s"),
        max_deliveries=r.integer(rp, "maxDeliveries", p, 5, 1, 1000),
        lease_ttl=r.duration(rp, "leaseTtl", p, "30s"),
        max_retries=r.integer(rp, "maxRetries", p, 3, 0, 100),
        retention=r.duration(rp, "retention", p, "7d", long=True),
        resources=r.resources(rp, p),
    )
    if reaper.interval > reaper.visibility_timeout:
        r.errors.append(f"{p}.interval: must not exceed {p}.visibilityTimeout (sweeps would miss idle entries)")
    if reaper.lease_ttl > reaper.visibility_timeout:
        r.errors.append(f"{p}.leaseTtl: must not exceed {p}.visibilityTimeout")
    if worker.grace_period >= 3600:
        r.errors.append("spec.worker.gracePeriod: must be under 1h")

    c = r.section(s, "cutover", "spec")
    mode = r.choice(c, "mode", "spec.cutover", "live", ("live", "shadow"))
    watermark: datetime | None = None
    raw_watermark = c.get("watermark")
    if raw_watermark is not None:
        watermark = parse_timestamp(raw_watermark)
        if watermark is None:
            r.errors.append(
                f"spec.cutover.watermark: {raw_watermark!r} is not an RFC 3339 timestamp with a zone "
                "(e.g. 2025-01-31T12:00:00Z)"
            )
    cutover = CutoverSpec(mode="shadow" if mode == "shadow" else "live", watermark=watermark)

    if r.errors:
        return r.errors
    return JudgeQueueSpec(
        image=str(image),
        queue=str(queue),
        postgres=postgres,
        redis=redis,
        image_pull_policy=pull,
        log_level=log_level,
        paused=paused,
        dispatcher=dispatcher,
        worker=worker,
        reaper=reaper,
        cutover=cutover,
    )


def parse_timestamp(value: object) -> datetime | None:
    """An RFC 3339 timestamp with a zone as an aware datetime, else None."""
    if not isinstance(value, str):
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else None
