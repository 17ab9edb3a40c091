"""The one model of a ``JudgeQueue`` spec: fields, defaults, ranges, cross-field rules, role settings (pure).

The operator (``controllers/``) and ``judgequeue local`` (``core/manifest.py``) both parse a manifest
with :func:`parse_spec`, so they accept and refuse the same manifests, and both turn a parsed spec into
a role's ``JUDGEQUEUE_*`` variables with :func:`role_settings`:

- :data:`FIELDS` lists every scalar field once: its type, default, bounds, description and, when it
  configures a role, the :class:`~judgequeue.core.config.Settings` field it sets. A field that sets a
  role's setting is built from that setting's row in ``core/settings_table.py`` (kind, default,
  bounds, choices, pattern, description, the roles that read it), so the spec refuses what a role
  refuses, and a row with a spec path is a field here even when not placed by hand.
- :data:`RULES` are the cross-field rules: the check, and the CRD's CEL rule with the same message
  (a row's upper bound on a duration is one too).
- The CRD's ``spec`` schema is generated from these (``controllers/crd.py``, written by
  ``scripts/gen_chart_files.py``, as the chart's RBAC is): a new field is written here (a role
  setting: in its row) and where it is used, and ``tests/unit/test_spec_model.py`` fails while
  crds/judgequeue.yaml differs from the model.
- A role gets exactly the variables it reads: the row names the roles that read its setting
  (``worker.lease_ttl`` goes to workers only; the reaper prunes dispatcher waiters by the dispatchers'
  schedule, so it reads that too). ``tests/unit/test_spec_model.py`` checks this against what each
  role's modules read.
- The typed spec (:class:`JudgeQueueSpec`) carries what the operator itself reads (replicas,
  resources, the judge, ...); a setting only a role reads reaches it through :func:`role_settings`.

The judge is checked by name only (the CRD's pattern): whether the plugin is installed is known only
in the image, so the worker checks it at start (``load_judge``) rather than the operator against a
list of built-in names.

The API server's schema rejects most mistakes at admission, but the operator must not trust that (a
CRD applied without its schema, an older CRD version, a hand-edited object), so every rule is checked
here too. Every error starts with the field's path (``spec.worker.minReplicas: ...``).
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from decimal import Decimal, InvalidOperation
from typing import Any, Literal

from .base.agreement import PERCENT_PATTERN, Gate, parse_percent
from .base.classes import DEFAULT_CLASSES, JobClass, check_classes
from .base.classes import DEFAULT_SHARE as DEFAULT_SHARE  # the CRD's description says it
from .base.classes import MAX_CLASSES as MAX_CLASSES  # the CRD's bound
from .base.errors import InvalidClass, InvalidQueueName
from .base.names import validate_queue_name
from .config import (
    IntakeChoice,
    format_duration,
    intake_for_fleet,
    parse_duration,
    variable_for,
)
from .settings_table import JUDGE_PATTERN as JUDGE_PATTERN
from .settings_table import QUEUE_PATTERN as QUEUE_PATTERN
from .settings_table import ROLES as ROLES
from .settings_table import ROW_BY_SPEC, ROWS
from .settings_table import Role as Role

#: ``spec.worker.sandbox``: whether the program judge must isolate (the default) or may trust the code.
SANDBOX_MODES = ("isolated", "trusted")
#: ``spec.cutover.driftPolicy``: restore the spec's flags over a changed queue row, or report it.
DRIFT_POLICIES = ("restore", "report")
SANDBOX_VARIABLE = "JUDGEQUEUE_SANDBOX"

Kind = Literal["integer", "duration", "string", "choice", "boolean", "timestamp"]

# Durations compared by CEL rules must be Go durations (CEL's duration() has no "d" unit); retention
# is never compared, so it may use days.
DURATION_PATTERN = r"^[0-9]+(\.[0-9]+)?(ms|s|m|h)$"
LONG_DURATION_PATTERN = r"^[0-9]+(\.[0-9]+)?(ms|s|m|h|d)$"
SECRET_KEY_PATTERN = r"^[-._a-zA-Z0-9]+$"
#: An IPv4 or IPv6 CIDR's shape; :func:`parse_spec` checks the address itself (no host bits set).
CIDR_PATTERN = r"^[0-9a-fA-F:.]+/[0-9]{1,3}$"
#: The CRD's check of an IPv4 CIDR: a network address (no host bits) with a prefix of at most 32; an
#: IPv6 CIDR is checked by the operator (Degraded, reason InvalidSpec), as :func:`parse_spec` checks both.
IPV4_NETWORK_RULE = (
    "self.contains(':') || (self.matches('^[0-9]{1,3}([.][0-9]{1,3}){3}/[0-9]{1,2}$') && int(self.split('/')[1]) <= 32"
    " && self.split('/')[0].split('.').all(o, int(o) <= 255) && (int(self.split('/')[0].split('.')[0]) * 16777216"
    " + int(self.split('/')[0].split('.')[1]) * 65536 + int(self.split('/')[0].split('.')[2]) * 256"
    " + int(self.split('/')[0].split('.')[3])) % ["
    + ", ".join(str(2 ** (32 - n)) for n in range(33))
    + "][int(self.split('/')[1])] == 0)",
    "must be a network address with no host bits set and a prefix of at most 32 (e.g. 10.0.0.0/16)",
)
_SECRET_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
#: A Kubernetes quantity (k8s.io/apimachinery resource.Quantity): a decimal number and a binary
#: (Ki..Ei) or decimal (n, u, m, k, M..E) suffix or an exponent. ``512MB`` and ``half`` are not.
_QUANTITY = re.compile(r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))((?:[KMGTPE]i)|[numkMGTPE]|[eE][+-]?[0-9]+)?$")
_SUFFIXES = {
    "": Decimal(1), "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "k": Decimal("1e3"),
    "M": Decimal("1e6"), "G": Decimal("1e9"), "T": Decimal("1e12"), "P": Decimal("1e15"), "E": Decimal("1e18"),
    **{s: Decimal(1024) ** (i + 1) for i, s in enumerate(("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"))},
}
#: The resources whose limit may not be below their request (the CRD's rules say the same).
COMPARED_RESOURCES = ("cpu", "memory", "ephemeral-storage")
DURATION_MAX_LENGTH = 16
#: A JudgeQueue's name is the prefix of its children's names; the longest, ``<name>-worker-egress``,
#: and the metrics Service ``<name>-metrics`` (a DNS label) must fit 63 characters.
NAME_MAX_LENGTH = 49

def setting_default(section: str | None, name: str) -> Any:
    """The default of ``Settings.<section>.<name>`` (a role's value when unset), from its row."""
    for row in ROWS:
        if row.section == section and row.name == name and not row.required:
            return row.default
    raise KeyError(f"{section or 'settings'}.{name} has no default")


@dataclass(frozen=True)
class Field:
    """One scalar field of the spec: where it is, what it accepts, and what it configures.

    ``default`` is the model's value when the field is absent (seconds for durations; None: no
    default). ``setting`` is the ``Settings`` (section, name) it sets, and ``read_by`` the roles that
    read it: such a field is built from its row (core/settings_table.py, :func:`_setting`), default,
    bounds and all. ``schema_default``, when given, is ``(what the CRD writes,)`` where it deliberately
    differs from the model's default.
    """

    path: tuple[str, ...]
    kind: Kind
    default: Any = None
    minimum: int | None = None
    maximum: int | None = None
    choices: tuple[str, ...] = ()
    pattern: str | None = None
    max_length: int | None = None
    min_length: int | None = None
    required: bool = False
    #: Required whenever its object is given (the CRD lists it in that object's ``required``); the
    #: object itself stays optional (``cutover.gate``).
    required_in_object: bool = False
    setting: tuple[str | None, str] | None = None
    read_by: tuple[Role, ...] = ()
    schema_default: tuple[Any] | None = None
    hint: str = ""  # what a value refused by ``pattern`` should look like
    #: What the CRD says of the field (``kubectl explain``).
    description: str = ""
    #: CEL rules the CRD adds to the field's own checks, as (rule, message); :func:`parse_spec` checks
    #: the same in Python.
    cel: tuple[tuple[str, str], ...] = ()

    @property
    def name(self) -> str:
        return "spec." + ".".join(self.path)

    @property
    def roles(self) -> tuple[Role, ...]:
        """The roles that read this field's setting (none if it sets no role's setting)."""
        return self.read_by


def _duration(path: tuple[str, ...], default: float | None = None, *, description: str = "") -> Field:
    return Field(path, "duration", default, pattern=DURATION_PATTERN, max_length=DURATION_MAX_LENGTH,
                 description=description)


def _integer(path: tuple[str, ...], lo: int, hi: int, default: int | None = None, *,
             schema_default: tuple[Any] | None = None, description: str = "") -> Field:
    return Field(path, "integer", default, minimum=lo, maximum=hi, schema_default=schema_default,
                 description=description)


def _setting(path: tuple[str, ...]) -> Field:
    """The spec field of the role setting whose row (core/settings_table.py) names ``path``: its kind,
    default, bounds, choices and pattern are the row's, so the spec (and the CRD generated from it)
    accepts what the roles accept. Where it deliberately differs (``worker.intake``'s ``auto``,
    ``worker.concurrency``'s bound), the row says so and why."""
    row = ROW_BY_SPEC[path]
    common: dict[str, Any] = {"setting": (row.section, row.name), "read_by": row.roles, "description": row.explain}
    default = row.spec_field_default
    if row.kind == "duration":
        return Field(path, "duration", default, pattern=LONG_DURATION_PATTERN if row.long else DURATION_PATTERN,
                     max_length=DURATION_MAX_LENGTH, **common)
    if row.kind == "integer":
        minimum, maximum = row.spec_bounds
        return Field(path, "integer", default, minimum=minimum, maximum=maximum, **common)
    if row.kind == "choice":
        return Field(path, "choice", default, choices=row.spec_choices or row.choices, **common)
    return Field(path, "string", default, pattern=row.pattern, max_length=row.max_length, hint=row.hint, **common)


def _with_every_setting(placed: tuple[Field, ...]) -> tuple[Field, ...]:
    """``placed`` and a field for each row with a spec path not placed in it, after the last field
    of its object (so a new setting's row is enough; placing it only chooses where the CRD lists it)."""
    out = list(placed)
    have = {f.path for f in out}
    for path in ROW_BY_SPEC:
        if path in have:
            continue
        siblings = [i for i, f in enumerate(out) if f.path[: len(path) - 1] == path[:-1]]
        out.insert(siblings[-1] + 1 if siblings else len(out), _setting(path))
    return tuple(out)


def _secret(path: tuple[str, ...], key: str) -> tuple[Field, Field]:
    return (
        Field((*path, "secretKeyRef", "name"), "string", required=True, min_length=1, max_length=253),
        Field((*path, "secretKeyRef", "key"), "string", key, pattern=SECRET_KEY_PATTERN, hint="a Secret key"),
    )


#: Every scalar field of ``JudgeQueue.spec``, in the order the CRD lists them. A role setting's field is
#: its row's (:func:`_setting`); a row not placed here is added after its object's last field.
#: ``resources`` (requests/limits of quantities) are the only other leaves; see :data:`RESOURCES`.
FIELDS: tuple[Field, ...] = _with_every_setting((
    Field(("image",), "string", required=True, min_length=1,
          description="The judgequeue image; its command selects the role."),
    Field(("imagePullPolicy",), "choice", "IfNotPresent", choices=("Always", "IfNotPresent", "Never")),
    _setting(("queue",)),
    _setting(("logLevel",)),
    Field(("paused",), "boolean", False,
          description="When true, dispatchers claim nothing; submissions still commit."),
    _duration(("progressDeadline",), 600.0,
              description="How long a Deployment may roll out without progress (its progressDeadlineSeconds) before "
                          "the JudgeQueue turns Degraded with the rollout's own message."),
    *_secret(("postgres",), "dsn"),
    # What sits between the roles (and the operator) and Postgres: every role connects through it.
    _setting(("postgres", "pooler")),
    # Optional: a direct (pooler-free) DSN for the dispatcher's LISTEN wake-up (see LISTEN_SECRET).
    Field(("postgres", "listen", "secretKeyRef", "name"), "string", min_length=1, max_length=253),
    Field(("postgres", "listen", "secretKeyRef", "key"), "string", "dsn", pattern=SECRET_KEY_PATTERN,
          hint="a Secret key"),
    *_secret(("redis",), "url"),
    _integer(("dispatcher", "replicas"), 0, 100, 1),
    _setting(("dispatcher", "batchSize")),
    _setting(("dispatcher", "schedule")),
    _setting(("dispatcher", "maxAttempts")),
    _setting(("dispatcher", "backoff", "base")),
    _setting(("dispatcher", "backoff", "max")),
    # The scale subresource's count: absent means "not set" (the CRD writes 1 so reading the scale
    # subresource always answers); honoured only when autoscaling is external.
    _integer(("worker", "replicas"), 0, 1000, None, schema_default=(1,),
             description="The scale subresource's replica count (defaulted so reading the scale subresource always "
                         "answers). Honoured when autoscaling is external (an HPA or KEDA scales the JudgeQueue); "
                         "the internal autoscaler ignores it."),
    _integer(("worker", "minReplicas"), 0, 1000, 1),
    _integer(("worker", "maxReplicas"), 1, 1000, 8),
    _integer(("worker", "targetBacklogPerReplica"), 1, 1_000_000, 10),
    _setting(("worker", "concurrency")),
    _setting(("worker", "judge")),
    Field(("worker", "autoscaling"), "choice", "internal", choices=("internal", "external"),
          description="internal = the operator scales on backlog; external = an HPA or KEDA owns replicas."),
    _duration(("worker", "scaleDownStabilization"), 300.0),
    _setting(("worker", "gracePeriod")),
    _setting(("worker", "intake")),
    _setting(("worker", "offers")),
    Field(("worker", "priorityClassName"), "string", pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$", max_length=253,
          hint="a PriorityClass name",
          description="The PriorityClass of worker pods (live and shadow): judges that must not be preempted by "
                      "batch work, or that may be. Absent: the cluster's default."),
    Field(("worker", "sandbox"), "choice", "isolated", choices=SANDBOX_MODES,
          description="isolated = worker pods get what the program judge's sandbox needs (docs/judges.md) and it "
                      "refuses to run without it; trusted = no isolation, for code you trust only."),
    Field(("worker", "shadow", "enabled"), "boolean", False),
    _integer(("worker", "shadow", "replicas"), 0, 100, 1),
    Field(("worker", "networkPolicy", "enabled"), "boolean", True),
    _integer(("worker", "networkPolicy", "postgres", "port"), 1, 65535, 5432),
    Field(("worker", "networkPolicy", "postgres", "cidr"), "string", pattern=CIDR_PATTERN, max_length=43,
          hint="a CIDR such as 10.0.0.0/16", cel=(IPV4_NETWORK_RULE,)),
    _integer(("worker", "networkPolicy", "redis", "port"), 1, 65535, 6379),
    _integer(("worker", "networkPolicy", "redis", "sentinelPort"), 0, 65535, 26379,
             description="Redis Sentinel's port (0 = no Sentinel)."),
    Field(("worker", "networkPolicy", "redis", "cidr"), "string", pattern=CIDR_PATTERN, max_length=43,
          hint="a CIDR such as 10.0.0.0/16", cel=(IPV4_NETWORK_RULE,)),
    _integer(("reaper", "replicas"), 0, 20, 1),
    _setting(("reaper", "interval")),
    _setting(("reaper", "visibilityTimeout")),
    _setting(("reaper", "maxDeliveries")),
    _setting(("reaper", "leaseTtl")),
    _setting(("reaper", "maxRetries")),
    _setting(("reaper", "retention")),
    Field(("cutover", "mode"), "choice", "live", choices=("live", "shadow")),
    # What the operator does when the queue row's flags differ from the spec without a spec change.
    Field(("cutover", "driftPolicy"), "choice", "restore", choices=DRIFT_POLICIES,
          description="When the queue row's flags change outside this spec (judgequeue cutover set, SQL): restore = "
                      "write the spec's flags back on the operator's next pass; report = leave the row and report "
                      "CutoverApplied=False, reason Drifted, naming the row's values."),
    Field(("cutover", "watermark"), "timestamp", max_length=64,
          description="Rows created at or after this instant (DB clock) are dispatched live."),
    # The gate on a flip to live (core/base/agreement.py); both are needed once the gate is given. Absent: no gate.
    Field(("cutover", "gate", "minAgreement"), "string", pattern=PERCENT_PATTERN, max_length=8,
          required_in_object=True, hint="a percentage from 0% to 100% such as 99.5%",
          description="The least agreement, a percentage such as 99.5%."),
    Field(("cutover", "gate", "minSamples"), "integer", minimum=1, maximum=1_000_000_000, required_in_object=True,
          description="The least number of submissions both judges judged."),
    Field(("cutover", "force"), "boolean",
          description="true lets a flip to live through whatever the gate says (the status still shows the "
                      "figures). A one-off: remove it with the next commit, or later flips are not gated either."),
))

#: What the CRD says of the spec's objects that are more than their fields.
OBJECT_DESCRIPTIONS: dict[tuple[str, ...], str] = {
    ("postgres", "listen"):
        "A direct (pooler-free) DSN for the LISTEN wake-up of dispatchers (and of workers with direct intake); "
        "without one behind a transaction pooler they poll every schedule. Optional, so secretKeyRef.name is "
        "checked by the operator (reported in status), not here.",
    ("worker", "shadow"):
        "Shadow judging (docs/gitops.md): with enabled, a Deployment <name>-shadow-worker of workers that judge "
        "the queue's shadow stream with the same judge, sandbox and resources and write shadow verdicts, compared "
        "with the legacy judge's; never a submission's verdict. It runs replicas while the queue row is in shadow "
        "mode and none once it is live. Without resources they get the workers' with a CPU request of 100m, so on "
        "a node shared with live workers they use idle CPU and yield under contention.",
    ("worker", "networkPolicy"):
        "The egress NetworkPolicy of workers that run the program judge: DNS (53) and the Postgres and Redis "
        "(+ Sentinel) ports only, to anywhere unless a cidr narrows each. enabled: false removes it.",
    ("cutover", "gate"):
        "Hold a flip to live back until shadow judging agrees with the legacy judge: at least minAgreement of at "
        "least minSamples compared submissions (status equal, docs/gitops.md). A flip that does not meet it is not "
        "written (CutoverApplied=False, reason GateNotMet, with the figures); the queue stays in shadow mode. A "
        "rollback to shadow is never gated.",
}
#: Objects the CRD defaults when absent (so the API server fills their fields in); the others exist
#: only when written: connections (required), the optional LISTEN DSN and gate, the peers of the
#: network policy.
DEFAULTED_OBJECTS: tuple[tuple[str, ...], ...] = (
    ("dispatcher",), ("dispatcher", "backoff"), ("worker",), ("worker", "shadow"), ("worker", "networkPolicy"),
    ("reaper",), ("cutover",),
)

#: Where the dispatcher's direct LISTEN DSN is referenced (a Secret, like every connection string).
LISTEN_SECRET: tuple[str, ...] = ("postgres", "listen")
#: The connection variables taken from Secrets, which roles read them, and where the Secret is named.
#: Connections never pass through :func:`role_settings`: they are rendered as ``secretKeyRef``s.
SECRET_SETTINGS: tuple[tuple[tuple[str, ...], tuple[str | None, str], tuple[Role, ...]], ...] = tuple(
    (row.secret, (row.section, row.name), row.roles)
    for row in sorted(ROWS, key=lambda row: not row.required)  # the required connections first
    if row.secret is not None
)

FIELD_BY_PATH: dict[tuple[str, ...], Field] = {f.path: f for f in FIELDS}

#: ``spec.classes``: the queue's priority classes, highest first (core/base/classes.py), a list of
#: objects (not scalars, so not in :data:`FIELDS`): read by :func:`_classes`, written to the queue row
#: by the operator and ``judgequeue local``.
CLASSES: tuple[str, ...] = ("classes",)

#: ``spec.worker.endpoints``: the endpoints an ``http-call`` worker may call (core/judges/http_call.py),
#: a list of objects (not scalars, so not in :data:`FIELDS`): read by :func:`_endpoints`.
ENDPOINTS: tuple[str, ...] = ("worker", "endpoints")
ENDPOINT_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9_]*[a-z0-9])?$"
ENDPOINT_URL_PATTERN = r"^https?://[^/?#]+"
ENDPOINTS_MAX = 32
ENDPOINT_URL_MAX_LENGTH = 2048
#: An endpoint's bounded numbers: (least, most, default).
ENDPOINT_CONCURRENCY = (1, 1024, 4)
ENDPOINT_TRIES = (1, 100, 5)
ENDPOINT_DEADLINE = "60s"
#: The variable the http-call judge reads its endpoints from (core/judges/http_call.py ENDPOINTS_VAR).
ENDPOINTS_VARIABLE = "JUDGEQUEUE_CALL_ENDPOINTS"
#: Where a worker pod finds each endpoint's URL taken from a Secret (the operator mounts it there,
#: beside the connections, controllers/render.py).
ENDPOINT_URL_DIR = "/var/run/secrets/judgequeue"

#: ``spec.events.webhooks``: where the reaper delivers the queue's verdict events (docs/events.md), a
#: list of objects read by :func:`_webhooks`; ``events`` holds nothing else.
WEBHOOKS: tuple[str, ...] = ("events", "webhooks")
WEBHOOKS_MAX = 16
#: A webhook's bounded numbers: (least, most, default); its deadline's default and bound.
WEBHOOK_CONCURRENCY = (1, 256, 4)
WEBHOOK_MAX_ATTEMPTS = (1, 1000, 20)
WEBHOOK_DEADLINE = "10s"
WEBHOOK_DEADLINE_MAX = 300.0
#: The variable the reaper reads its webhook endpoints from (core/roles/reaper/webhooks.py WEBHOOKS_VAR).
WEBHOOKS_VARIABLE = "JUDGEQUEUE_WEBHOOKS"

#: Objects that hold ``resources`` (``requests`` and ``limits`` maps of quantities), each with how many
#: resources a map may name: the shadow workers' take 4, since the oldest release the chart supports caps
#: the CRD's total CEL cost and their copy of the rules must fit in it.
RESOURCE_AMOUNTS: dict[tuple[str, ...], int] = {("dispatcher",): 8, ("worker",): 8, ("worker", "shadow"): 4,
                                                ("reaper",): 8}
RESOURCES: tuple[tuple[str, ...], ...] = tuple(RESOURCE_AMOUNTS)


@dataclass(frozen=True)
class Rule:
    """A cross-field rule of one object: ``check(values of that object)`` must hold, and so must ``cel``,
    the CRD's rule saying the same.

    ``message`` and ``field`` are the CRD rule's ``message`` and ``fieldPath``; the error reads
    ``spec.<object>.<field>: <message>``. A transition rule (``check`` None: it compares the object
    with its previous version, ``oldSelf``) is the API server's alone.
    """

    obj: tuple[str, ...]
    field: str
    uses: tuple[str, ...]
    message: str
    check: Callable[[Mapping[str, Any]], bool] | None
    cel: str


def _under_rules() -> tuple[Rule, ...]:
    """A rule for each role setting whose row bounds a duration from above (``under``): the roles
    refuse the same values (core/settings_table.py)."""

    def below(name: str, under: float) -> Callable[[Mapping[str, Any]], bool]:
        return lambda values: bool(values[name] < under)

    return tuple(
        Rule(path[:-1], path[-1], (path[-1],), f"{'.'.join(path)} must be under {format_duration(row.under)}",
             below(path[-1], row.under), f"duration(self.{path[-1]}) < duration('{format_duration(row.under)}')")
        for path, row in ROW_BY_SPEC.items() if row.under is not None
    )


RULES: tuple[Rule, ...] = (
    Rule(("dispatcher", "backoff"), "base", ("base", "max"),
         "dispatcher.backoff.base must not exceed dispatcher.backoff.max",
         lambda v: v["base"] <= v["max"],
         "duration(self.base) <= duration(self.max)"),
    Rule(("worker",), "minReplicas", ("minReplicas", "maxReplicas"),
         "worker.minReplicas must not exceed worker.maxReplicas",
         lambda v: v["minReplicas"] <= v["maxReplicas"],
         "self.minReplicas <= self.maxReplicas"),
    *_under_rules(),
    Rule(("reaper",), "interval", ("interval", "visibilityTimeout"),
         "reaper.interval must not exceed reaper.visibilityTimeout (sweeps would miss idle entries)",
         lambda v: v["interval"] <= v["visibilityTimeout"],
         "duration(self.interval) <= duration(self.visibilityTimeout)"),
    Rule(("reaper",), "leaseTtl", ("leaseTtl", "visibilityTimeout"),
         "reaper.leaseTtl must not exceed reaper.visibilityTimeout",
         lambda v: v["leaseTtl"] <= v["visibilityTimeout"],
         "duration(self.leaseTtl) <= duration(self.visibilityTimeout)"),
    Rule(("cutover",), "watermark", ("watermark",),
         "cutover.watermark may only move forward (roll back with mode shadow)", None,
         "!has(oldSelf.watermark) || (has(self.watermark) && "
         "timestamp(self.watermark) >= timestamp(oldSelf.watermark))"),
)


def object_paths() -> dict[tuple[str, ...], set[str]]:
    """Every object of the spec (``()`` is the spec) and the names of its properties."""
    objects: dict[tuple[str, ...], set[str]] = {(): set()}
    for f in FIELDS:
        for i in range(len(f.path)):
            objects.setdefault(f.path[:i], set()).add(f.path[i])
    for path in RESOURCES:
        objects[path].add("resources")
    objects[ENDPOINTS[:-1]].add(ENDPOINTS[-1])
    objects[()].add(WEBHOOKS[0])
    objects[WEBHOOKS[:-1]] = {WEBHOOKS[-1]}
    objects[()].add(CLASSES[0])
    return objects


# --- the typed spec -----------------------------------------------------------------------------


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
    holding it), and how hard each worker may call it (concurrent calls, a deadline per call, tries)."""

    name: str
    url: str | None = None
    secret: SecretKeyRef | None = None
    concurrency: int = ENDPOINT_CONCURRENCY[2]
    deadline: float = parse_duration(ENDPOINT_DEADLINE)
    tries: int = ENDPOINT_TRIES[2]


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
    postgres_listen: SecretKeyRef | None  # the direct LISTEN DSN (dispatcher, direct-intake worker), if any
    progress_deadline: float  # seconds a Deployment may roll out without progress
    classes: tuple[JobClass, ...] = DEFAULT_CLASSES  # priority classes, highest first
    values: Mapping[tuple[str, ...], Any] = field(default_factory=dict, repr=False, compare=False)
    given: frozenset[tuple[str, ...]] = field(default=frozenset(), repr=False, compare=False)
    webhooks: tuple[WebhookSpec, ...] = ()


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
    match = _QUANTITY.match(value)
    if match is None:
        return None
    number, suffix = match.group(1), match.group(2) or ""
    try:
        if suffix[:1] in ("e", "E"):
            return Decimal(number) * Decimal(10) ** int(suffix[1:])
        return Decimal(number) * _SUFFIXES[suffix]
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
        if isinstance(secret, str) and secret and (len(secret) > 253 or not _SECRET_NAME.match(secret)):
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
    endpoints = _endpoints(raw.get(ENDPOINTS), errors)
    classes = _classes(raw.get(CLASSES), errors)
    if values[("worker", "judge")] == "http-call" and not endpoints and ENDPOINTS not in raw:
        errors.append("spec.worker.endpoints: is required when spec.worker.judge is http-call")
    webhooks = _webhooks(raw.get(WEBHOOKS), errors)
    if errors:
        return errors
    built = _build(values, resources, frozenset(raw))
    if endpoints:
        built = replace(built, worker=replace(built.worker, endpoints=endpoints))
    if webhooks:
        built = replace(built, webhooks=webhooks)
    return replace(built, classes=classes)


def _classes(value: Any, errors: list[str]) -> tuple[JobClass, ...]:
    """``spec.classes`` checked item by item (the CRD's item schema and the database's rules): a class
    below the first without a share gets :data:`~judgequeue.core.base.classes.DEFAULT_SHARE`."""
    where = "spec.classes"
    if value is None:
        return DEFAULT_CLASSES
    if not isinstance(value, list):
        errors.append(f"{where}: must be a list")
        return DEFAULT_CLASSES
    out: list[JobClass] = []
    for i, item in enumerate(value):
        if not isinstance(item, Mapping):
            errors.append(f"{where}[{i}]: must be an object")
            return DEFAULT_CLASSES
        unknown = sorted(set(item) - {"name", "share"})
        if unknown:
            errors.append(f"{where}[{i}].{unknown[0]}: unknown field (see crds/judgequeue.yaml for the schema)")
            return DEFAULT_CLASSES
        name: Any = item.get("name")  # checked by check_classes, whatever it is
        out.append(JobClass(name, item.get("share", 0 if i == 0 else DEFAULT_SHARE)))
    try:
        return check_classes(out, where)
    except InvalidClass as exc:
        errors.append(str(exc))
        return DEFAULT_CLASSES


def _secret_ref(value: Any) -> SecretKeyRef | None:
    if (not isinstance(value, Mapping) or not isinstance(value.get("name"), str)
            or not _SECRET_NAME.match(value["name"]) or not isinstance(value.get("key"), str)
            or not re.match(SECRET_KEY_PATTERN, value["key"])):
        return None
    return SecretKeyRef(value["name"], value["key"])


def _webhooks(value: Any, errors: list[str]) -> tuple[WebhookSpec, ...]:
    """``spec.events.webhooks`` checked item by item (the CRD's item schema, checked here too)."""
    where = "spec.events.webhooks"
    if value is None:
        return ()
    if not isinstance(value, list):
        errors.append(f"{where}: must be a list")
        return ()
    if len(value) > WEBHOOKS_MAX:
        errors.append(f"{where}: at most {WEBHOOKS_MAX} webhooks, got {len(value)}")
    out: list[WebhookSpec] = []
    seen: set[str] = set()
    for i, item in enumerate(value):
        at = f"{where}[{i}]"
        if not isinstance(item, Mapping):
            errors.append(f"{at}: must be an object")
            continue
        unknown = sorted(set(item) - {"name", "url", "urlSecretKeyRef", "secretKeyRef", "concurrency",
                                      "maxAttempts", "deadline"})
        if unknown:
            errors.append(f"{at}.{unknown[0]}: unknown field (see crds/judgequeue.yaml for the JudgeQueue schema)")
        name = item.get("name")
        if not isinstance(name, str) or len(name) > 63 or not re.match(ENDPOINT_NAME_PATTERN, name):
            errors.append(f"{at}.name: {name!r} is not a webhook name (lowercase letters, digits, - and _)")
            continue
        if name in seen:
            errors.append(f"{at}.name: {name!r} is given twice")
        seen.add(name)
        url, url_ref = item.get("url"), item.get("urlSecretKeyRef")
        ok = True
        if (url is None) == (url_ref is None):
            errors.append(f"{at}: give exactly one of url and urlSecretKeyRef")
            ok = False
        elif url is not None and (not isinstance(url, str) or not re.match(ENDPOINT_URL_PATTERN, url)
                                  or len(url) > ENDPOINT_URL_MAX_LENGTH):
            errors.append(f"{at}.url: must be an http or https URL (a Secret's key for one with credentials)")
            ok = False
        url_secret = _secret_ref(url_ref) if url_ref is not None else None
        if url_ref is not None and url_secret is None:
            errors.append(f"{at}.urlSecretKeyRef: must name a Secret and a key ({{name: ..., key: ...}})")
            ok = False
        secret = _secret_ref(item.get("secretKeyRef"))
        if secret is None:
            errors.append(f"{at}.secretKeyRef: is required: the Secret and key of the signing key "
                          "({name: ..., key: ...})")
            ok = False
        numbers = {}
        for label, (low, high, default) in (("concurrency", WEBHOOK_CONCURRENCY),
                                            ("maxAttempts", WEBHOOK_MAX_ATTEMPTS)):
            number = item.get(label, default)
            if isinstance(number, bool) or not isinstance(number, int) or not low <= number <= high:
                errors.append(f"{at}.{label}: must be an integer between {low} and {high}, got {number!r}")
                ok = False
            numbers[label] = number
        deadline = item.get("deadline", WEBHOOK_DEADLINE)
        if (not isinstance(deadline, str) or not re.match(DURATION_PATTERN, deadline)
                or not 0 < parse_duration(deadline) <= WEBHOOK_DEADLINE_MAX):
            errors.append(f"{at}.deadline: {deadline!r} is not a duration above 0 and at most 5m (e.g. 10s)")
            ok = False
        if ok and secret is not None:
            out.append(WebhookSpec(name, secret, url if isinstance(url, str) else None, url_secret,
                                   numbers["concurrency"], numbers["maxAttempts"], parse_duration(deadline)))
    return tuple(out)


def _endpoints(value: Any, errors: list[str]) -> tuple[EndpointSpec, ...]:
    """``spec.worker.endpoints`` checked item by item (the CRD's item schema, checked here too)."""
    where = "spec.worker.endpoints"
    if value is None:
        return ()
    if not isinstance(value, list):
        errors.append(f"{where}: must be a list")
        return ()
    if len(value) > ENDPOINTS_MAX:
        errors.append(f"{where}: at most {ENDPOINTS_MAX} endpoints, got {len(value)}")
    out: list[EndpointSpec] = []
    seen: set[str] = set()
    for i, item in enumerate(value):
        at = f"{where}[{i}]"
        if not isinstance(item, Mapping):
            errors.append(f"{at}: must be an object")
            continue
        unknown = sorted(set(item) - {"name", "url", "secretKeyRef", "concurrency", "deadline", "tries"})
        if unknown:
            errors.append(f"{at}.{unknown[0]}: unknown field (see crds/judgequeue.yaml for the JudgeQueue schema)")
        name = item.get("name")
        if not isinstance(name, str) or len(name) > 63 or not re.match(ENDPOINT_NAME_PATTERN, name):
            errors.append(f"{at}.name: {name!r} is not an endpoint name (lowercase letters, digits, - and _)")
            continue
        if name in seen:
            errors.append(f"{at}.name: {name!r} is given twice")
        seen.add(name)
        url, ref = item.get("url"), item.get("secretKeyRef")
        if (url is None) == (ref is None):
            errors.append(f"{at}: give exactly one of url and secretKeyRef")
            continue
        secret = None
        if url is not None and (not isinstance(url, str) or not re.match(ENDPOINT_URL_PATTERN, url)
                                or len(url) > ENDPOINT_URL_MAX_LENGTH):
            errors.append(f"{at}.url: must be an http or https URL (a Secret's key for one with credentials)")
        if ref is not None:
            if (not isinstance(ref, Mapping) or not isinstance(ref.get("name"), str)
                    or not _SECRET_NAME.match(ref["name"]) or not isinstance(ref.get("key"), str)
                    or not re.match(SECRET_KEY_PATTERN, ref["key"])):
                errors.append(f"{at}.secretKeyRef: must name a Secret and a key ({{name: ..., key: ...}})")
            else:
                secret = SecretKeyRef(ref["name"], ref["key"])
        concurrency, tries = item.get("concurrency", ENDPOINT_CONCURRENCY[2]), item.get("tries", ENDPOINT_TRIES[2])
        for label, number, (low, high, _) in (("concurrency", concurrency, ENDPOINT_CONCURRENCY),
                                              ("tries", tries, ENDPOINT_TRIES)):
            if isinstance(number, bool) or not isinstance(number, int) or not low <= number <= high:
                errors.append(f"{at}.{label}: must be an integer between {low} and {high}, got {number!r}")
        deadline = item.get("deadline", ENDPOINT_DEADLINE)
        if not isinstance(deadline, str) or not re.match(DURATION_PATTERN, deadline) or parse_duration(deadline) <= 0:
            errors.append(f"{at}.deadline: {deadline!r} is not a positive duration (e.g. 90s, 5m)")
            continue
        out.append(EndpointSpec(name, url if isinstance(url, str) else None, secret, concurrency,
                                parse_duration(deadline), tries))
    return tuple(out)


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
    )


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
        }
        for e in endpoints
    }
    return json.dumps(doc, separators=(",", ":"), sort_keys=True)


def endpoint_secrets(spec: JudgeQueueSpec) -> dict[str, SecretKeyRef]:
    """The Secret keys holding endpoint URLs, by the file name a worker pod finds each at."""
    return {endpoint_url_file(e.name).rsplit("/", 1)[1]: e.secret for e in spec.worker.endpoints if e.secret}


def role_secrets(spec: JudgeQueueSpec, role: Role) -> dict[str, SecretKeyRef]:
    """The connection variables ``role`` reads, each with the Secret key that holds its value
    (:data:`SECRET_SETTINGS`); an optional connection the spec does not reference is left out."""
    refs: dict[tuple[str, ...], SecretKeyRef | None] = {
        ("postgres",): spec.postgres, ("redis",): spec.redis, LISTEN_SECRET: spec.postgres_listen,
    }
    out: dict[str, SecretKeyRef] = {}
    for path, setting, roles in SECRET_SETTINGS:
        ref = refs[path]
        if role in roles and ref is not None:
            out[variable_for(*setting)] = ref
    return out
