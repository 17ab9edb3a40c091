"""The spec's fields, each declared once (:data:`FIELDS`: type, default, bounds, description, the
role setting it is built from), and the list-valued fields and resources declared beside them."""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Literal

from ..base.agreement import PERCENT_PATTERN
from ..settings_table import ROW_BY_SPEC, ROWS, Role

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
SECRET_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
#: A Kubernetes quantity (k8s.io/apimachinery resource.Quantity): a decimal number and a binary
#: (Ki..Ei) or decimal (n, u, m, k, M..E) suffix or an exponent. ``512MB`` and ``half`` are not.
QUANTITY_RE = re.compile(r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))((?:[KMGTPE]i)|[numkMGTPE]|[eE][+-]?[0-9]+)?$")
QUANTITY_SUFFIXES = {
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


#: The components that may connect with credentials of their own (``spec.credentials.<component>``):
#: each Deployment the operator renders, and the operator's own connections for this JudgeQueue.
CREDENTIAL_COMPONENTS: tuple[str, ...] = ("dispatcher", "worker", "reaper", "operator")
#: Where the per-component credentials are named.
CREDENTIALS: tuple[str, ...] = ("credentials",)
#: The keys a component's Secret holds unless its ``postgresKey``/``redisKey`` say otherwise.
CREDENTIAL_KEYS: dict[str, str] = {"postgres": "postgres-dsn", "redis": "redis-url"}


def _credentials(component: str) -> tuple[Field, ...]:
    """``spec.credentials.<component>``: the Secret holding that component's own Postgres DSN and Redis
    URL (and, optionally, its direct LISTEN DSN)."""
    path = (*CREDENTIALS, component)
    return (
        Field((*path, "secretName"), "string", pattern=SECRET_NAME_RE.pattern, max_length=253,
              required_in_object=True, hint="a Secret name",
              description=f"The Secret (in the JudgeQueue's namespace) holding the {component}'s own Postgres DSN "
                          "and Redis URL: a login user given its group role and an ACL user with its rules "
                          "(`judgequeue roles`)."),
        Field((*path, "postgresKey"), "string", CREDENTIAL_KEYS["postgres"], pattern=SECRET_KEY_PATTERN,
              max_length=253, hint="a Secret key", description="The key of the Postgres DSN in that Secret."),
        Field((*path, "redisKey"), "string", CREDENTIAL_KEYS["redis"], pattern=SECRET_KEY_PATTERN,
              max_length=253, hint="a Secret key", description="The key of the Redis URL in that Secret."),
        Field((*path, "listenKey"), "string", pattern=SECRET_KEY_PATTERN, max_length=253, hint="a Secret key",
              description="The key of its direct (pooler-free) LISTEN DSN in that Secret, used where "
                          "spec.postgres.listen is given. Absent: this component gets no LISTEN DSN (it polls "
                          "behind a transaction pooler) rather than the shared one."),
    )


def _secret(path: tuple[str, ...], key: str) -> tuple[Field, Field]:
    return (
        Field((*path, "secretKeyRef", "name"), "string", required=True, min_length=1, max_length=253),
        Field((*path, "secretKeyRef", "key"), "string", key, pattern=SECRET_KEY_PATTERN, hint="a Secret key"),
    )


#: Every scalar field of ``JudgeQueue.spec``, in the order the CRD lists them. A role setting's field is
#: its row's (:func:`_setting`); a row not placed here is added after its object's last field.
#: ``resources`` (requests/limits of quantities) are the only other leaves; see :data:`RESOURCES`.
#: ``spec.events.progress``: the workers write live progress events (the worker's ``JUDGEQUEUE_PROGRESS``).
PROGRESS: tuple[str, ...] = ("events", "progress")
#: The variable it renders for the workers.
PROGRESS_VARIABLE = "JUDGEQUEUE_PROGRESS"

FIELDS: tuple[Field, ...] = _with_every_setting((
    Field(("image",), "string", required=True, min_length=1,
          description="The judgequeue image; its command selects the role."),
    Field(("imagePullPolicy",), "choice", "IfNotPresent", choices=("Always", "IfNotPresent", "Never")),
    _setting(("queue",)),
    _setting(("logLevel",)),
    Field(("paused",), "boolean", False,
          description="When true, dispatchers claim nothing; submissions still commit."),
    Field(PROGRESS, "boolean", False,
          description="When true, workers write the live progress of each submission they judge (compiled, tests "
                      "done of total, the last test's verdict) as progress events beside the verdicts, at most one "
                      "row per submission per progressInterval; webhooks deliver verdicts only (docs/events.md)."),
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
    *(f for component in CREDENTIAL_COMPONENTS for f in _credentials(component)),
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
        "A direct (pooler-free) DSN for the LISTEN wake-up of dispatchers and direct-intake workers and for "
        "workers' cancellations; without one behind a transaction pooler they poll. Optional, so secretKeyRef.name is "
        "checked by the operator (reported in status), not here.",
    CREDENTIALS:
        "Credentials of each component's own (docs/security.md): a Secret per component holding a Postgres DSN "
        "of a login user given only that component's group role and a Redis URL of an ACL user with only its "
        "rules. A component named here connects with them and never receives spec.postgres or spec.redis; one "
        "not named shares those (the quick start), which status reports as SharedCredentials=True.",
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
#: objects (not scalars, so not in :data:`FIELDS`): read by :func:`parse_classes`, written to the queue row
#: by the operator and ``judgequeue local``.
CLASSES: tuple[str, ...] = ("classes",)

#: ``spec.worker.endpoints``: the endpoints an ``http-call`` worker may call (core/judges/http_call.py),
#: a list of objects (not scalars, so not in :data:`FIELDS`): read by :func:`parse_endpoints`.
ENDPOINTS: tuple[str, ...] = ("worker", "endpoints")
ENDPOINT_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9_]*[a-z0-9])?$"
ENDPOINT_URL_PATTERN = r"^https?://[^/?#]+"
ENDPOINTS_MAX = 32
ENDPOINT_URL_MAX_LENGTH = 2048
#: An endpoint's bounded numbers: (least, most, default).
ENDPOINT_CONCURRENCY = (1, 1024, 4)
ENDPOINT_TRIES = (1, 100, 5)
ENDPOINT_DEADLINE = "60s"
#: An endpoint's rate: calls per second, minute or hour across the queue's workers (``600/m``).
ENDPOINT_RATE_PATTERN = r"^[0-9]+(\.[0-9]+)?/(s|m|h)$"
#: Seconds per unit of a rate, and the most calls a second a rate may allow.
RATE_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}
RATE_MAX = 100_000.0


def rate_per_second(text: str) -> float:
    """Calls a second a rate such as ``10/s``, ``600/m`` or ``1000/h`` allows; ValueError saying what
    is wrong otherwise (pure)."""
    if not re.match(ENDPOINT_RATE_PATTERN, text.strip()):
        raise ValueError(f"must be calls per time unit, like 10/s, 600/m or 1000/h, got {text!r}")
    count, _, unit = text.strip().partition("/")
    rate = float(count) / RATE_UNITS[unit]
    if not 0 < rate <= RATE_MAX:
        raise ValueError(f"must be above 0 and at most {RATE_MAX:g}/s, got {text!r}")
    return rate

#: The variable the http-call judge reads its endpoints from (core/judges/http_call.py ENDPOINTS_VAR).
ENDPOINTS_VARIABLE = "JUDGEQUEUE_CALL_ENDPOINTS"
#: Where a worker pod finds each endpoint's URL taken from a Secret (the operator mounts it there,
#: beside the connections, controllers/render.py).
ENDPOINT_URL_DIR = "/var/run/secrets/judgequeue"

#: ``spec.events.webhooks``: where the reaper delivers the queue's verdict events (docs/events.md), a
#: list of objects read by :func:`parse_webhooks`; beside it ``events`` holds :data:`PROGRESS`.
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


