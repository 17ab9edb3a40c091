"""Parsing a JudgeQueue's spec: every field read, checked and defaulted, every rule checked, each
error naming its field's path; the typed spec built from the values."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime
from decimal import Decimal, InvalidOperation
from typing import Any

from ..base.agreement import Gate, parse_percent
from ..base.errors import InvalidQueueName
from ..base.names import validate_queue_name
from ..config import (
    parse_duration,
)
from .fields import (
    CLASSES,
    COMPARED_RESOURCES,
    CREDENTIAL_COMPONENTS,
    CREDENTIALS,
    DURATION_MAX_LENGTH,
    ENDPOINTS,
    FIELDS,
    LISTEN_SECRET,
    LONG_DURATION_PATTERN,
    QUANTITY_RE,
    QUANTITY_SUFFIXES,
    RESOURCES,
    SECRET_NAME_RE,
    WEBHOOKS,
    Field,
)
from .lists import parse_classes, parse_endpoints, parse_webhooks
from .model import (
    Backoff,
    CutoverSpec,
    DispatcherSpec,
    EgressPeer,
    JudgeQueueSpec,
    NetworkPolicySpec,
    ReaperSpec,
    RoleCredentials,
    SecretKeyRef,
    ShadowWorkers,
    WorkerSpec,
)
from .rules import RULES, object_paths

# --- parsing ------------------------------------------------------------------------------------


def parse_timestamp(value: object) -> datetime | None:
    """An RFC 3339 timestamp with a zone (or an aware datetime, as YAML loads one) as a datetime, else None."""
    if isinstance(value, datetime):
        return value if value.tzinfo is not None else None
    if not isinstance(value, str):
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else None


def _read(f: Field, value: Any) -> tuple[Any, str | None]:
    """One present field's value, or an error (without the path) saying what it accepts."""
    if f.kind == "integer":
        if isinstance(value, bool) or not isinstance(value, int):
            return None, f"must be an integer, got {value!r}"
        assert f.minimum is not None and f.maximum is not None
        if not f.minimum <= value <= f.maximum:
            return None, f"must be between {f.minimum} and {f.maximum}, got {value}"
        return value, None
    if f.kind == "duration":
        assert f.pattern is not None
        units = "ms, s, m, h, d" if f.pattern == LONG_DURATION_PATTERN else "ms, s, m, h"
        if not isinstance(value, str) or not re.match(f.pattern, value) or len(value) > DURATION_MAX_LENGTH:
            return None, f"{value!r} is not a duration (a number with unit {units}, e.g. 30s)"
        seconds = parse_duration(value)
        if seconds <= 0:
            return None, f"must be positive, got {value!r}"
        return seconds, None
    if f.kind == "choice":
        if value not in f.choices:
            return None, f"must be one of {', '.join(f.choices)}, got {value!r}"
        return value, None
    if f.kind == "boolean":
        if not isinstance(value, bool):
            return None, f"must be true or false, got {value!r}"
        return value, None
    if f.kind == "timestamp":
        stamp = parse_timestamp(value)
        if stamp is None:
            return None, f"{value!r} is not an RFC 3339 timestamp with a zone (e.g. 2025-01-31T12:00:00Z)"
        return stamp, None
    if not isinstance(value, str):
        return None, f"must be a string, got {value!r}"
    if f.min_length is not None and len(value.strip()) < f.min_length:
        return None, "is required"
    if f.max_length is not None and len(value) > f.max_length:
        return None, f"must be at most {f.max_length} characters"
    if f.pattern is not None and not re.match(f.pattern, value):
        return None, f"{value!r} is not {f.hint or 'valid'} (pattern {f.pattern})"
    return value, None


def _resources(value: Any, where: str, errors: list[str]) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        errors.append(f"{where}: must be an object")
        return {}
    for part, amounts in value.items():
        if part not in ("requests", "limits"):
            errors.append(f"{where}.{part}: unknown field (resources has requests and limits)")
            continue
        if amounts is None:
            continue
        if not isinstance(amounts, Mapping):
            errors.append(f"{where}.{part}: must be an object")
            continue
        for name, amount in amounts.items():
            if parse_quantity(amount) is None:
                errors.append(f"{where}.{part}.{name}: {amount!r} is not a quantity (e.g. 500m, 2, 512Mi, 1Gi)")
    requests, limits = value.get("requests"), value.get("limits")
    if isinstance(requests, Mapping) and isinstance(limits, Mapping):
        for name in COMPARED_RESOURCES:
            request, limit = parse_quantity(requests.get(name)), parse_quantity(limits.get(name))
            if request is not None and limit is not None and limit < request:
                errors.append(f"{where}.limits.{name}: {quantity_rule_message(name)}"
                              f" ({limits[name]} < {requests[name]})")
    return dict(value)


def quantity_rule_message(name: str) -> str:
    """The message of the CRD's rule that a limit is not below its request (one per resource)."""
    return f"limits.{name} must not be below requests.{name}"


def parse_quantity(value: object) -> Decimal | None:
    """A Kubernetes quantity (an integer, or a string such as ``500m`` or ``1Gi``) as a Decimal; None
    if it is not one (``512MB``, ``half``, a boolean)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return Decimal(value)
    if not isinstance(value, str):
        return None
    match = QUANTITY_RE.match(value)
    if match is None:
        return None
    number, suffix = match.group(1), match.group(2) or ""
    try:
        if suffix[:1] in ("e", "E"):
            return Decimal(number) * Decimal(10) ** int(suffix[1:])
        return Decimal(number) * QUANTITY_SUFFIXES[suffix]
    except (InvalidOperation, KeyError):
        return None


def _walk(spec: Mapping[str, Any], errors: list[str]) -> dict[tuple[str, ...], Any]:
    """Every present scalar by path (objects type-checked, unknown fields reported)."""
    raw: dict[tuple[str, ...], Any] = {}
    objects = object_paths()

    def visit(node: Mapping[str, Any], path: tuple[str, ...]) -> None:
        for key, value in node.items():
            here = (*path, str(key))
            where = "spec." + ".".join(here)
            if key not in objects[path]:
                errors.append(f"{where}: unknown field (see crds/judgequeue.yaml for the JudgeQueue schema)")
            elif (key == "resources" and path in RESOURCES) or here in (ENDPOINTS, WEBHOOKS, CLASSES):
                raw[here] = value  # parsed on their own
            elif here in objects:
                if value is None:
                    continue
                if not isinstance(value, Mapping):
                    errors.append(f"{where}: must be an object")
                    continue
                visit(value, here)
            elif value is not None:
                raw[here] = value

    visit(spec, ())
    return raw


def parse_spec(spec: Any, *, name: str) -> JudgeQueueSpec | list[str]:
    """Validate ``spec`` (a JudgeQueue's ``.spec``, schema defaults applied or not) of the object ``name``.

    Returns the typed spec, or every error found, each starting with the field's path. The operator
    and ``judgequeue local`` both call this, so they accept and refuse the same manifests.
    """
    errors: list[str] = []
    if not isinstance(spec, Mapping):
        errors.append("spec: must be an object")
        spec = {}
    raw = _walk(spec, errors)
    values: dict[tuple[str, ...], Any] = {}
    bad: set[tuple[str, ...]] = set()
    for f in FIELDS:
        if f.path == ("queue",):  # checked below by the queue's own rule, which explains it
            values[f.path] = raw.get(f.path)
            continue
        if f.path not in raw:
            if f.required:
                errors.append(f"{f.name}: is required")
                bad.add(f.path)
            values[f.path] = f.default
            continue
        value, error = _read(f, raw[f.path])
        if error is not None:
            errors.append(f"{f.name}: {error}")
            bad.add(f.path)
            value = f.default
        values[f.path] = value
    queue = values[("queue",)] if values[("queue",)] is not None else name
    try:
        values[("queue",)] = validate_queue_name(queue)
    except InvalidQueueName as exc:
        errors.append(f"spec.queue: {exc}")
    for ref in (("postgres",), ("redis",), LISTEN_SECRET):
        secret = values[(*ref, "secretKeyRef", "name")]
        if isinstance(secret, str) and secret and (len(secret) > 253 or not SECRET_NAME_RE.match(secret)):
            errors.append(f"spec.{'.'.join(ref)}.secretKeyRef.name: {secret!r} is not a valid Secret name")
    for service in ("postgres", "redis"):
        cidr = values[("worker", "networkPolicy", service, "cidr")]
        if isinstance(cidr, str) and ("worker", "networkPolicy", service, "cidr") not in bad:
            try:
                ipaddress.ip_network(cidr, strict=True)
            except ValueError as exc:
                errors.append(f"spec.worker.networkPolicy.{service}.cidr: {cidr!r} is not a CIDR ({exc})")
    if (*LISTEN_SECRET, "secretKeyRef", "key") in raw and (*LISTEN_SECRET, "secretKeyRef", "name") not in raw:
        errors.append("spec.postgres.listen.secretKeyRef.name: is required")
    for f in FIELDS:
        given_beside = any(p[: len(f.path) - 1] == f.path[:-1] for p in raw)
        if f.required_in_object and f.path not in raw and given_beside:
            errors.append(f"{f.name}: is required (spec.{'.'.join(f.path[:-1])} is given)")
    for rule in RULES:
        if rule.check is None or any((*rule.obj, k) in bad for k in rule.uses):
            continue  # a field of the rule is already reported
        inputs = {k: values[(*rule.obj, k)] for k in rule.uses}
        if not rule.check(inputs):
            errors.append(f"spec.{'.'.join((*rule.obj, rule.field))}: {rule.message}")
    resources = {p: _resources(raw.get((*p, "resources")), f"spec.{'.'.join(p)}.resources", errors)
                 for p in RESOURCES}
    endpoints = parse_endpoints(raw.get(ENDPOINTS), errors)
    classes = parse_classes(raw.get(CLASSES), errors)
    if values[("worker", "judge")] == "http-call" and not endpoints and ENDPOINTS not in raw:
        errors.append("spec.worker.endpoints: is required when spec.worker.judge is http-call")
    webhooks = parse_webhooks(raw.get(WEBHOOKS), errors)
    if errors:
        return errors
    built = _build(values, resources, frozenset(raw))
    if endpoints:
        built = replace(built, worker=replace(built.worker, endpoints=endpoints))
    if webhooks:
        built = replace(built, webhooks=webhooks)
    return replace(built, classes=classes)


def _build(
    v: Mapping[tuple[str, ...], Any], resources: Mapping[tuple[str, ...], dict[str, Any]],
    given: frozenset[tuple[str, ...]],
) -> JudgeQueueSpec:
    return JudgeQueueSpec(
        image=v[("image",)],
        queue=v[("queue",)],
        postgres=SecretKeyRef(v[("postgres", "secretKeyRef", "name")], v[("postgres", "secretKeyRef", "key")]),
        redis=SecretKeyRef(v[("redis", "secretKeyRef", "name")], v[("redis", "secretKeyRef", "key")]),
        image_pull_policy=v[("imagePullPolicy",)],
        log_level=v[("logLevel",)],
        paused=v[("paused",)],
        dispatcher=DispatcherSpec(
            replicas=v[("dispatcher", "replicas")],
            batch_size=v[("dispatcher", "batchSize")],
            schedule=v[("dispatcher", "schedule")],
            max_attempts=v[("dispatcher", "maxAttempts")],
            backoff=Backoff(v[("dispatcher", "backoff", "base")], v[("dispatcher", "backoff", "max")]),
            resources=resources[("dispatcher",)],
        ),
        worker=WorkerSpec(
            min_replicas=v[("worker", "minReplicas")],
            max_replicas=v[("worker", "maxReplicas")],
            replicas=v[("worker", "replicas")],
            target_backlog_per_replica=v[("worker", "targetBacklogPerReplica")],
            concurrency=v[("worker", "concurrency")],
            judge=v[("worker", "judge")],
            autoscaling=v[("worker", "autoscaling")],
            scale_down_window=v[("worker", "scaleDownStabilization")],
            grace_period=v[("worker", "gracePeriod")],
            resources=resources[("worker",)],
            sandbox=v[("worker", "sandbox")],
            priority_class=v[("worker", "priorityClassName")],
            network_policy=NetworkPolicySpec(
                enabled=v[("worker", "networkPolicy", "enabled")],
                postgres=EgressPeer(v[("worker", "networkPolicy", "postgres", "port")],
                                    v[("worker", "networkPolicy", "postgres", "cidr")]),
                redis=EgressPeer(v[("worker", "networkPolicy", "redis", "port")],
                                 v[("worker", "networkPolicy", "redis", "cidr")]),
                sentinel_port=v[("worker", "networkPolicy", "redis", "sentinelPort")],
            ),
            shadow=ShadowWorkers(v[("worker", "shadow", "enabled")], v[("worker", "shadow", "replicas")],
                                 resources[("worker", "shadow")]),
        ),
        reaper=ReaperSpec(
            replicas=v[("reaper", "replicas")],
            resources=resources[("reaper",)],
        ),
        cutover=CutoverSpec(mode=v[("cutover", "mode")], watermark=v[("cutover", "watermark")],
                            drift_policy=v[("cutover", "driftPolicy")],
                            gate=(Gate(parse_percent(v[("cutover", "gate", "minAgreement")]),
                                       v[("cutover", "gate", "minSamples")])
                                  if v[("cutover", "gate", "minAgreement")] is not None else None),
                            force=bool(v[("cutover", "force")])),
        progress_deadline=v[("progressDeadline",)],
        postgres_pooler=v[("postgres", "pooler")],
        postgres_listen=(
            SecretKeyRef(v[(*LISTEN_SECRET, "secretKeyRef", "name")], v[(*LISTEN_SECRET, "secretKeyRef", "key")])
            if v[(*LISTEN_SECRET, "secretKeyRef", "name")] is not None else None
        ),
        values=dict(v),
        given=given,
        credentials={
            c: RoleCredentials(v[(*CREDENTIALS, c, "secretName")], v[(*CREDENTIALS, c, "postgresKey")],
                               v[(*CREDENTIALS, c, "redisKey")], v[(*CREDENTIALS, c, "listenKey")])
            for c in CREDENTIAL_COMPONENTS if v[(*CREDENTIALS, c, "secretName")] is not None
        },
    )


