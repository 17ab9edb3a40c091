"""A parsed spec turned into a role's ``JUDGEQUEUE_*`` variables and the Secrets it mounts: each
role gets exactly the settings it reads."""

from __future__ import annotations

import json
from typing import Any

from ..config import (
    IntakeChoice,
    format_duration,
    intake_for_fleet,
    variable_for,
)
from ..settings_table import Role
from .fields import (
    ENDPOINTS_VARIABLE,
    FIELDS,
    LISTEN_SECRET,
    PROGRESS,
    PROGRESS_VARIABLE,
    SANDBOX_VARIABLE,
    SECRET_SETTINGS,
    WEBHOOKS_VARIABLE,
    Field,
)
from .model import EndpointSpec, JudgeQueueSpec, SecretKeyRef, WebhookSpec, endpoint_url_file, webhook_file

# --- role settings ------------------------------------------------------------------------------


def _text(f: Field, value: Any) -> str:
    return format_duration(float(value)) if f.kind == "duration" else str(value)


#: ``spec.worker.intake``, the one field :func:`role_settings` resolves rather than copies.
INTAKE_PATH: tuple[str, ...] = ("worker", "intake")


def fleet_intake(spec: JudgeQueueSpec, workers: int | None = None) -> IntakeChoice:
    """The intake the spec's workers and dispatchers run, and why (:func:`~judgequeue.core.config.intake_for_fleet`).

    ``auto`` is decided on ``spec.worker.maxReplicas``, the fleet's static upper bound, in either
    autoscaling mode: the internal autoscaler never goes above it, and with external autoscaling the
    operator cannot see the scaler's bound, so ``maxReplicas`` (which bounds nothing else then) states
    it. ``workers`` instead: a fixed count (``judgequeue local`` runs exactly that many).
    """
    if workers is None:
        return intake_for_fleet(spec.values[INTAKE_PATH], spec.worker.max_replicas)
    return intake_for_fleet(spec.values[INTAKE_PATH], workers, bound="workers")


def role_fields(role: Role) -> tuple[Field, ...]:
    """The fields whose settings ``role`` reads."""
    return tuple(f for f in FIELDS if role in f.roles)


def role_settings(spec: JudgeQueueSpec, role: Role, *, given_only: bool = False) -> dict[str, str]:
    """The ``JUDGEQUEUE_*`` variables (each its row's, core/settings_table.py) a spec sets for one role, and only
    those the role reads, so a change to another role's setting does not restart it. Connections and
    the metrics port are not part of the spec: a cluster takes them from Secrets, ``local`` from flags.

    ``given_only`` leaves out fields the manifest did not write (``local`` lets the caller's
    environment set those; the defaults are the same either way, being config's, but for the intake).
    The intake is resolved on ``maxReplicas`` (:func:`fleet_intake`), so a role never reads ``auto``
    (``local`` decides it on the workers it runs instead)."""
    values = {
        variable_for(*f.setting): (fleet_intake(spec).intake if f.path == INTAKE_PATH
                                   else _text(f, spec.values[f.path]))
        for f in role_fields(role)
        if f.setting and (not given_only or f.path in spec.given or f.path == ("queue",))
    }
    if role == "worker" and spec.worker.sandbox == "trusted":
        # Read by the program judge itself (judges/sandbox/isolation.py), not core/config.py.
        values[SANDBOX_VARIABLE] = "trusted"
    if role == "worker" and spec.values.get(PROGRESS):
        values[PROGRESS_VARIABLE] = "on"
    if role == "worker" and spec.worker.endpoints:
        values[ENDPOINTS_VARIABLE] = endpoints_setting(spec.worker.endpoints)
    if role == "reaper" and spec.webhooks:
        values[WEBHOOKS_VARIABLE] = webhooks_setting(spec.webhooks)
    return values


def webhooks_setting(webhooks: tuple[WebhookSpec, ...]) -> str:
    """The reaper's :data:`WEBHOOKS_VARIABLE` for these webhooks: a URL given inline or the file its
    Secret's key is mounted at, and always the file of the signing key (:func:`webhook_file`). Pure."""
    doc = {
        w.name: {
            **({"url": w.url} if w.url is not None else {"urlFile": webhook_file(w.name, "url")}),
            "secretFile": webhook_file(w.name, "secret"),
            "concurrency": w.concurrency, "maxAttempts": w.max_attempts, "deadline": w.deadline,
        }
        for w in webhooks
    }
    return json.dumps(doc, separators=(",", ":"), sort_keys=True)


def webhook_secrets(spec: JudgeQueueSpec) -> dict[str, SecretKeyRef]:
    """The Secret keys of the webhooks' URLs and signing keys, by the file name a reaper pod finds each at."""
    out: dict[str, SecretKeyRef] = {}
    for w in spec.webhooks:
        if w.url_secret is not None:
            out[webhook_file(w.name, "url").rsplit("/", 1)[1]] = w.url_secret
        out[webhook_file(w.name, "secret").rsplit("/", 1)[1]] = w.secret
    return out


def endpoints_setting(endpoints: tuple[EndpointSpec, ...]) -> str:
    """The http-call judge's :data:`ENDPOINTS_VARIABLE` for these endpoints: a URL given inline, or the
    file the operator mounts its Secret's key at (:func:`endpoint_url_file`). Pure."""
    doc = {
        e.name: {
            **({"url": e.url} if e.url is not None else {"urlFile": endpoint_url_file(e.name)}),
            "concurrency": e.concurrency, "deadline": e.deadline, "tries": e.tries,
            **({"rate": e.rate} if e.rate else {}),
        }
        for e in endpoints
    }
    return json.dumps(doc, separators=(",", ":"), sort_keys=True)


def endpoint_secrets(spec: JudgeQueueSpec) -> dict[str, SecretKeyRef]:
    """The Secret keys holding endpoint URLs, by the file name a worker pod finds each at."""
    return {endpoint_url_file(e.name).rsplit("/", 1)[1]: e.secret for e in spec.worker.endpoints if e.secret}


def role_secrets(spec: JudgeQueueSpec, role: Role) -> dict[str, SecretKeyRef]:
    """The connection variables ``role`` reads, each with the Secret key that holds its value
    (:data:`SECRET_SETTINGS`): the role's own Secret when ``spec.credentials`` names one, else the
    shared ones; an optional connection the spec does not reference is left out."""
    postgres, redis, listen = spec.connections(role)  # its own Secret's keys, if spec.credentials names one
    refs: dict[tuple[str, ...], SecretKeyRef | None] = {("postgres",): postgres, ("redis",): redis,
                                                        LISTEN_SECRET: listen}
    out: dict[str, SecretKeyRef] = {}
    for path, setting, roles in SECRET_SETTINGS:
        ref = refs[path]
        if role in roles and ref is not None:
            out[variable_for(*setting)] = ref
    return out
