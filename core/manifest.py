"""A ``JudgeQueue`` manifest (see README's Kubernetes section) read outside Kubernetes, and rendered to role settings.

:func:`render_env` is pure: spec in, ``JUDGEQUEUE_*`` variables out, named through
:func:`judgequeue.core.config.variable_for` so the names live in one table. Every rendered value is
validated the way the roles will validate it, and an error names the manifest field it came from.
Connections (Postgres, Redis) are not part of the rendering: in a cluster they come from Secrets,
locally from the environment or flags.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from .config import format_duration, parse_variable, variable_for
from .errors import ConfigError
from .queues import MODES, validate_queue_name

API_VERSION = "judgequeue.dev/v1alpha1"
KIND = "JudgeQueue"


class ManifestError(ConfigError):
    """The manifest is malformed; the message names the field."""


# spec path -> (Settings section, field, is a duration); the CRD (crds/judgequeue.yaml) has the same fields.
SPEC_FIELDS: dict[tuple[str, ...], tuple[str | None, str, bool]] = {
    ("logLevel",): (None, "log_level", False),
    ("dispatcher", "batchSize"): ("dispatcher", "batch_size", False),
    ("dispatcher", "schedule"): ("dispatcher", "schedule", True),
    ("dispatcher", "maxAttempts"): ("dispatcher", "max_attempts", False),
    ("dispatcher", "backoff", "base"): ("dispatcher", "backoff_base", True),
    ("dispatcher", "backoff", "max"): ("dispatcher", "backoff_max", True),
    ("worker", "concurrency"): ("worker", "concurrency", False),
    ("worker", "judge"): ("worker", "judge", False),
    ("worker", "gracePeriod"): ("worker", "grace_period", True),
    # Workers heartbeat against the same TTL the reaper judges expiry by.
    ("reaper", "leaseTtl"): ("worker", "lease_ttl", True),
    ("reaper", "interval"): ("reaper", "interval", True),
    ("reaper", "visibilityTimeout"): ("reaper", "visibility_timeout", True),
    ("reaper", "maxDeliveries"): ("reaper", "max_deliveries", False),
    ("reaper", "maxRetries"): ("reaper", "max_retries", False),
    ("reaper", "retention"): ("reaper", "retention", True),
}

# Fields that exist in the CRD but do not become settings (cluster-only, or used by local for counts).
OTHER_FIELDS: dict[tuple[str, ...], set[str]] = {
    (): {
        "image",
        "imagePullPolicy",
        "queue",
        "paused",
        "postgres",
        "redis",
        "dispatcher",
        "worker",
        "reaper",
        "cutover",
    },
    ("dispatcher",): {"replicas", "resources", "backoff"},
    ("dispatcher", "backoff"): set(),
    ("worker",): {
        "replicas",
        "minReplicas",
        "maxReplicas",
        "targetBacklogPerReplica",
        "autoscaling",
        "scaleDownStabilization",
        "resources",
    },
    ("reaper",): {"replicas", "resources"},
    ("cutover",): {"mode", "watermark"},
}


def unknown_fields(spec: Mapping[str, Any]) -> list[str]:
    """Spec fields the JudgeQueue schema does not have (a typo would otherwise be ignored). Pure."""
    known: dict[tuple[str, ...], set[str]] = {k: set(v) for k, v in OTHER_FIELDS.items()}
    for path in SPEC_FIELDS:
        known.setdefault(path[:-1], set()).add(path[-1])
    found = []
    for section, names in known.items():
        node = _lookup(spec, section) if section else spec
        if isinstance(node, Mapping):
            found += ["spec." + ".".join((*section, str(k))) for k in node if k not in names]
    return sorted(found)


@dataclass(frozen=True)
class Cutover:
    mode: str
    watermark: datetime | None
    paused: bool


@dataclass(frozen=True)
class Replicas:
    dispatcher: int
    worker: int
    reaper: int


@dataclass(frozen=True)
class Manifest:
    name: str
    queue: str
    spec: Mapping[str, Any]
    cutover: Cutover
    replicas: Replicas
    env: dict[str, str]


def _lookup(spec: Mapping[str, Any], path: tuple[str, ...]) -> Any:
    node: Any = spec
    for key in path:
        if not isinstance(node, Mapping) or key not in node:
            return None
        node = node[key]
    return node


def _as_text(value: Any, duration: bool, where: str) -> str:
    if isinstance(value, bool):
        raise ManifestError(f"{where}: expected a {'duration' if duration else 'value'}, got {value!r}")
    if isinstance(value, int | float):
        return format_duration(float(value)) if duration else str(value)
    if isinstance(value, str):
        return value
    raise ManifestError(f"{where}: expected a {'duration' if duration else 'scalar'}, got {type(value).__name__}")


def render_env(spec: Mapping[str, Any]) -> dict[str, str]:
    """The ``JUDGEQUEUE_*`` settings a spec sets (queue and tuning; never connections). Pure."""
    env: dict[str, str] = {}
    queue = spec.get("queue")
    if queue is not None:
        env[variable_for(None, "queue")] = str(queue)
    for path, (section, name, duration) in SPEC_FIELDS.items():
        value = _lookup(spec, path)
        if value is None:
            continue
        where = "spec." + ".".join(path)
        variable = variable_for(section, name)
        text = _as_text(value, duration, where)
        try:
            parse_variable(variable, text)
        except ConfigError as exc:
            raise ManifestError(f"{where} ({exc})") from None
        env[variable] = text
    return env


def _positive_count(spec: Mapping[str, Any], path: tuple[str, ...], default: int) -> int:
    value = _lookup(spec, path)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ManifestError(f"spec.{'.'.join(path)}: expected a non-negative integer, got {value!r}")
    return value


def _cutover(spec: Mapping[str, Any]) -> Cutover:
    cut = spec.get("cutover") or {}
    if not isinstance(cut, Mapping):
        raise ManifestError("spec.cutover: expected a mapping with mode and watermark")
    mode = cut.get("mode", "live")
    if mode not in MODES:
        raise ManifestError(f"spec.cutover.mode: expected one of {', '.join(MODES)}, got {mode!r}")
    raw = cut.get("watermark")
    watermark: datetime | None = None
    if raw is not None:
        if isinstance(raw, datetime):
            watermark = raw
        else:
            try:
                watermark = datetime.fromisoformat(str(raw).replace("Z", "+00:00"))
            except ValueError:
                raise ManifestError(
                    f"spec.cutover.watermark: expected an RFC 3339 time such as 2025-01-31T12:00:00Z, got {raw!r}"
                ) from None
        if watermark.tzinfo is None:
            raise ManifestError(f"spec.cutover.watermark: {raw!r} needs a time zone (e.g. a trailing Z)")
    paused = spec.get("paused", False)
    if not isinstance(paused, bool):
        raise ManifestError(f"spec.paused: expected true or false, got {paused!r}")
    return Cutover(mode=mode, watermark=watermark, paused=paused)


def parse_manifest(doc: Any) -> Manifest:
    """Validate a loaded manifest document into a :class:`Manifest`. Pure."""
    if not isinstance(doc, Mapping):
        raise ManifestError("manifest: expected a JudgeQueue object")
    if doc.get("apiVersion") != API_VERSION:
        raise ManifestError(f"apiVersion: expected {API_VERSION}, got {doc.get('apiVersion')!r}")
    if doc.get("kind") != KIND:
        raise ManifestError(f"kind: expected {KIND}, got {doc.get('kind')!r}")
    metadata = doc.get("metadata") or {}
    spec = doc.get("spec")
    if not isinstance(spec, Mapping):
        raise ManifestError("spec: expected a mapping")
    name = str(metadata.get("name", "")) if isinstance(metadata, Mapping) else ""
    queue = spec.get("queue") or name
    try:
        validate_queue_name(queue)
    except ValueError as exc:
        raise ManifestError(f"spec.queue: {exc}") from None
    spec = {**spec, "queue": queue}
    unknown = unknown_fields(spec)
    if unknown:
        raise ManifestError(f"{unknown[0]}: unknown field (see crds/judgequeue.yaml for the JudgeQueue schema)")
    min_workers = _positive_count(spec, ("worker", "minReplicas"), 1)
    max_workers = _positive_count(spec, ("worker", "maxReplicas"), max(min_workers, 1))
    if min_workers > max_workers:
        raise ManifestError(f"spec.worker.minReplicas ({min_workers}) exceeds spec.worker.maxReplicas ({max_workers})")
    replicas = Replicas(
        dispatcher=_positive_count(spec, ("dispatcher", "replicas"), 1),
        worker=min_workers,
        reaper=_positive_count(spec, ("reaper", "replicas"), 1),
    )
    return Manifest(
        name=name or queue,
        queue=queue,
        spec=spec,
        cutover=_cutover(spec),
        replicas=replicas,
        env=render_env(spec),
    )


def load_manifest(path: str | Path) -> Manifest:
    """Read a YAML manifest file (the first JudgeQueue document in it)."""
    import yaml

    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ManifestError(f"{path}: {exc.strerror or exc}") from None
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        raise ManifestError(f"{path}: not valid YAML ({str(exc).splitlines()[0]})") from None
    for doc in docs:
        if isinstance(doc, Mapping) and doc.get("kind") == KIND:
            return parse_manifest(doc)
    raise ManifestError(f"{path}: no {KIND} document found")
