"""The role settings, one row each: what every ``JUDGEQUEUE_*`` setting of a role is, written once.

Each row is a field of a settings class below (:class:`Settings` and its sections), declared with
:func:`whole`, :func:`duration`, :func:`choice` or :func:`text`: the variable, its parser, its default
and bounds, the ``JudgeQueue`` spec field that sets it (if any), the roles that read it, and one doc
line. Everything else that describes a setting is derived from these rows, so it cannot disagree:

- :func:`judgequeue.core.config.load_settings` reads each row's variable with the row's parser, which
  refuses what the row's bounds refuse, in one line naming the variable;
- :data:`judgequeue.core.spec.FIELDS` builds the spec field of each row that has a spec path (kind,
  default, bounds, choices, pattern, description), and the CRD's ``spec`` schema is generated from those
  (``controllers/crd.py``), so a JudgeQueue refuses what the roles refuse;
- the README's variable table is :func:`variable_table` (``scripts/gen_variable_table.py`` writes it,
  ``tests/unit/test_settings_table.py`` checks it).

A new role setting is one row here plus the code that reads it (``settings.<section>.<name>``); give it
a ``spec`` path and the JudgeQueue, the CRD and ``judgequeue local`` take it too.

Pure: no I/O. The parsers raise ``ValueError`` saying what is accepted; the caller names the variable.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import MISSING, dataclass, field, fields, replace
from typing import Any, Literal

from .base.names import validate_queue_name
from .setting_values import (
    AUTO_INTAKE,
    DIRECT_INTAKE_MAX_WORKERS,
    INTAKES,
    JUDGE_PATTERN,
    LOG_LEVELS,
    POOLERS,
    QUEUE_PATTERN,
    SHADOW_MODES,
    SPEC_INTAKES,
    format_duration,
    one_of,
    parse_judge_name,
    parse_listen_address,
    parse_postgres_dsn,
    positive_duration,
    redact_url,
    whole_number,
)
from .transport.redis_url import validate_redis_url

PREFIX = "JUDGEQUEUE_"

Role = Literal["dispatcher", "worker", "reaper"]
ROLES: tuple[Role, ...] = ("dispatcher", "worker", "reaper")
Kind = Literal["integer", "duration", "choice", "string"]

# --- rows ---------------------------------------------------------------------------------------


class _Unset:
    """A row's default or spec default that is not given (a dataclass cannot take ``MISSING`` as one)."""

    def __repr__(self) -> str:
        return "<unset>"


UNSET: Any = _Unset()


@dataclass(frozen=True)
class Row:
    """One setting: its variable (``PREFIX + suffix``), what it accepts, where a JudgeQueue sets it,
    who reads it, and what the README says of it.

    ``section`` and ``name`` (``Settings.<section>.<name>``, section None: top level) and ``default``
    (:data:`UNSET`: required) are the settings field the row is declared as; :data:`ROWS` fills them in.
    """

    suffix: str
    kind: Kind
    parse: Callable[[str], Any]
    roles: tuple[Role, ...]
    doc: str
    minimum: int | None = None
    maximum: int | None = None
    #: Durations: the exclusive upper bound (seconds), if any.
    under: float | None = None
    choices: tuple[str, ...] = ()
    #: The scalar ``JudgeQueue`` spec field that sets it (its path under ``spec``), if any.
    spec: tuple[str, ...] | None = None
    #: A connection: the spec object whose ``secretKeyRef`` holds it (never a scalar of the spec).
    secret: tuple[str, ...] | None = None
    #: Where the spec deliberately differs from the role, with the reason beside the row.
    spec_maximum: int | None = None
    spec_choices: tuple[str, ...] = ()
    spec_default: Any = UNSET
    #: Spec strings: the CRD's pattern, length bound, and what a refused value should look like.
    pattern: str | None = None
    max_length: int | None = None
    hint: str = ""
    #: Durations: the spec accepts days (``7d``); only for one no CEL rule compares (CEL has no ``d``).
    long: bool = False
    #: What ``kubectl explain`` says of the spec field.
    explain: str = ""
    section: str | None = None
    name: str = ""
    default: Any = UNSET

    @property
    def variable(self) -> str:
        return PREFIX + self.suffix

    @property
    def required(self) -> bool:
        return self.default is UNSET

    @property
    def spec_bounds(self) -> tuple[int | None, int | None]:
        """The spec field's (minimum, maximum): the row's, or a tighter declared maximum."""
        return self.minimum, self.spec_maximum if self.spec_maximum is not None else self.maximum

    @property
    def spec_field_default(self) -> Any:
        """The spec field's default (None: none): the role's, unless the row declares the spec's own."""
        if self.spec_default is not UNSET:
            return self.spec_default
        return None if self.required else self.default


_ROW = "judgequeue.row"


def _declare(default: Any, row: Row) -> Any:
    if default is MISSING:
        return field(metadata={_ROW: row})
    return field(default=default, metadata={_ROW: row})


def whole(suffix: str, default: int, minimum: int, maximum: int | None = None, *, roles: tuple[Role, ...],
          doc: str, meaning: str | None = None, **spec: Any) -> int:
    """A whole-number setting from ``minimum`` to ``maximum``: the roles and the spec both enforce them."""
    row = Row(suffix, "integer", whole_number(minimum, maximum, meaning=meaning), roles, doc, minimum=minimum,
              maximum=maximum, **spec)
    return _declare(default, row)  # type: ignore[no-any-return]


def duration(suffix: str, default: float, *, roles: tuple[Role, ...], doc: str, under: float | None = None,
             **spec: Any) -> float:
    """A positive duration (seconds), below ``under`` when given."""
    row = Row(suffix, "duration", positive_duration(under), roles, doc, under=under, **spec)
    return _declare(default, row)  # type: ignore[no-any-return]


def choice(suffix: str, default: str, choices: tuple[str, ...], *, roles: tuple[Role, ...], doc: str,
           meaning: str | None = None, upper: bool = False, **spec: Any) -> str:
    """One of ``choices`` (read in any case; ``upper``: the choices are upper case)."""
    row = Row(suffix, "choice", one_of(choices, meaning, upper=upper), roles, doc, choices=choices, **spec)
    return _declare(default, row)  # type: ignore[no-any-return]


def text(suffix: str, default: Any, parse: Callable[[str], Any], *, roles: tuple[Role, ...], doc: str,
         **spec: Any) -> Any:
    """Any other value, checked by ``parse`` (``MISSING`` as the default: required)."""
    return _declare(default, Row(suffix, "string", parse, roles, doc, **spec))


# --- the settings, one row each ------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class DispatcherSettings:
    batch_size: int = whole(
        "BATCH_SIZE", 100, 1, 10000, roles=("dispatcher",), spec=("dispatcher", "batchSize"),
        doc="dispatcher: outbox rows claimed per batch")
    schedule: float = duration(
        # The reaper prunes dispatcher waiters older than a few schedules, so it reads the schedule
        # too; so does a worker (direct intake polls and re-registers on it).
        "SCHEDULE", 1.0, roles=("dispatcher", "reaper", "worker"), spec=("dispatcher", "schedule"),
        doc="dispatcher: idle poll fallback (wake-ups normally arrive at once), and with direct intake the "
            "hand-off (a live row is the workers' for one schedule) and the worker's poll; reaper: prunes waiters "
            "older than 3 of these (at least 5m)")
    max_attempts: int = whole(
        "MAX_ATTEMPTS", 10, 1, 1000, roles=("dispatcher",), spec=("dispatcher", "maxAttempts"),
        doc="dispatcher: send attempts before an outbox row is `DEAD`")
    backoff_base: float = duration(
        "BACKOFF_BASE", 1.0, roles=("dispatcher",), spec=("dispatcher", "backoff", "base"),
        doc="dispatcher: first retry delay (doubles, with jitter)")
    backoff_max: float = duration(
        "BACKOFF_MAX", 300.0, roles=("dispatcher",), spec=("dispatcher", "backoff", "max"),
        doc="dispatcher: retry delay cap")
    claim_ttl: float = duration(
        "CLAIM_TTL", 30.0, roles=("dispatcher",), doc="dispatcher: a claim older than this is taken over")
    seen_ttl: float = duration(
        # The reaper marks the shadow entries it re-sends the same way.
        "SEEN_TTL", 86400.0, roles=("dispatcher", "reaper"),
        doc="dispatcher: longest life of a Redis dedup marker (a worker deletes it with its ack); reaper: the "
            "same for the shadow entries it re-sends")


@dataclass(frozen=True, kw_only=True)
class WorkerSettings:
    concurrency: int = whole(
        "CONCURRENCY", 4, 1, roles=("worker",), spec=("worker", "concurrency"),
        # The operator's default resources reserve memory per slot (controllers/render.py), so the
        # spec's bound keeps a worker's default request schedulable; a role run by hand (a benchmark,
        # a noop judge) may take more. Beyond it on Kubernetes, run more workers.
        spec_maximum=64,
        doc="worker: jobs judged at once",
        explain="Jobs a worker judges at once. Without worker.resources a worker requests 256Mi plus 256Mi "
                "per slot and is limited to 256Mi plus 1Gi per slot (a compile at most per slot); an "
                "http-call worker requests 256Mi and is limited to 512Mi whatever its concurrency.")
    judge: str = text(
        "JUDGE", "program", parse_judge_name, roles=("worker",), spec=("worker", "judge"), pattern=JUDGE_PATTERN,
        hint="a judge plugin name: lowercase letters, digits, - and _",
        doc="worker: judge plugin (`noop`, `sleep`, `program`)",
        explain="Judge plugin (noop, sleep, program, or one installed in the image).")
    lease_ttl: float = duration(
        # Workers heartbeat by this TTL; the reaper rescues leases by the expiry stored in Postgres and
        # never reads it, so it goes to the workers only.
        "LEASE_TTL", 30.0, roles=("worker",), spec=("reaper", "leaseTtl"),
        doc="worker: lease length (heartbeat every third)")
    grace_period: float = duration(
        "GRACE_PERIOD", 25.0, under=3600.0, roles=("worker",), spec=("worker", "gracePeriod"),
        doc="worker: time to finish in-flight jobs on SIGTERM")
    intake: str = choice(
        # The one setting whose spec default is not the role's: auto is resolved on the fleet's bound
        # (core/spec/roles.py fleet_intake) before it reaches a role. The dispatcher holds back for direct.
        "INTAKE", "direct", INTAKES, roles=("worker", "dispatcher"), spec=("worker", "intake"),
        spec_choices=SPEC_INTAKES, spec_default=AUTO_INTAKE,
        meaning="stream (every job through the Redis stream) or direct (workers lease ready rows from Postgres "
                "themselves; the stream carries the overflow)",
        doc="worker and dispatcher: `stream` (every job through the Redis stream) or `direct` (a worker with free "
            "slots leases ready rows from Postgres itself, and an idle one offers its free slots, which the submits "
            "fill in their own transactions; the dispatcher sends only what no worker took within one schedule): at "
            "a few workers less CPU per job and a shorter commit-to-start than `stream`, but its idle workers' offers "
            "and wake-ups cost more than the stream saves in a large fleet ([docs/design.md](docs/design.md) §1, "
            "[docs/performance.md](docs/performance.md)). A role cannot know how many workers share its queue, so "
            "unset it is `direct`. A JudgeQueue's `spec.worker.intake` is `auto` unless set: the operator (and "
            "`judgequeue local`) gives workers and dispatchers `direct` while `worker.maxReplicas` (locally, the "
            f"workers it runs) is at most `DIRECT_INTAKE_MAX_WORKERS` ({DIRECT_INTAKE_MAX_WORKERS}; "
            "`maxReplicas` defaults to 8), else `stream`; `status.workers.intake` and "
            "`intakeReason`, and `kubectl get jq`'s `INTAKE` column, say which and why",
        explain=f"auto = direct while maxReplicas is at most {DIRECT_INTAKE_MAX_WORKERS}, else stream "
                "(status.workers.intake says which and why); stream = every job goes through the Redis stream; "
                "direct = a worker with free slots claims and leases ready rows from Postgres itself and the "
                "dispatcher sends to the stream only what no worker took within one dispatcher schedule "
                "(docs/design.md).")
    #: Direct intake: open slots an idle worker offers for submits to fill (core/direct/offers.py); 0: none.
    offers: int = whole(
        "OFFERS", 32, 0, 1024, roles=("worker",), spec=("worker", "offers"),
        doc="worker, direct intake: how many of its free slots an idle worker offers (`0`: none). A submit that "
            "finds an open offer writes its job already leased to that worker and notifies it with the job "
            "([docs/design.md](docs/design.md) §1); a worker needs a LISTEN connection for offers (behind a "
            "transaction pooler, the listen DSN). Notifying commits serialise, so above about 1,100 fills a second "
            "a worker stops offering for a few seconds and takes instead; a flag flip waits (at most 10 s) for "
            "open transactions that filled offers ([docs/gitops.md](docs/gitops.md))",
        explain="With direct intake: how many of its free slots an idle worker offers; a submit that finds an open "
                "offer writes its job already leased to that worker and notifies it (no statement of the "
                "worker's before the judge). 0 = no offers.")
    #: Direct intake, a queue with several classes: slots kept for the first class (core/roles/worker/direct/).
    reserve_percent: int = whole(
        "RESERVE_PERCENT", 12, 0, 50, roles=("worker",), spec=("worker", "reservePercent"),
        doc="worker, direct intake, in a queue with several classes: the share of its slots (percent of "
            "`CONCURRENCY`, rounded up, never all of them) a worker keeps for the first class (`0`: none). No take "
            "fills them; they are offered only to first-class submits that no ready job of their class is ahead of, "
            "so such a job starts at once while a backlog of any class (a bulk rejudge, another contest's burst) "
            "drains, and the other classes run in the rest. Needs offers (`OFFERS` above 0 and a LISTEN "
            "connection) ([docs/design.md](docs/design.md), \"Priority classes and fair share\")",
        explain="With direct intake, in a queue with several classes: the percent of a worker's slots (of "
                "concurrency, rounded up, never all) kept for the first class; only first-class submits that "
                "nothing of their class is ahead of fill them, so a contest job starts at once while a rejudge "
                "or another contest's burst drains. 0 = none.")
    progress: str = choice(
        # Not a spec scalar: the spec's boolean spec.events.progress renders it (core/spec/roles.py).
        "PROGRESS", "off", ("off", "on"), roles=("worker",),
        meaning="off (verdicts only) or on (also write each judging's live progress as events)",
        doc="worker: `on` writes the live progress of each job it judges (compiled, tests done of total, the last "
            "test's verdict and time) as progress events beside the verdicts, at most one row per job per "
            "`PROGRESS_INTERVAL` ([docs/events.md](docs/events.md)); a JudgeQueue's `spec.events.progress: true`")
    progress_interval: float = duration(
        "PROGRESS_INTERVAL", 1.0, under=60.0, roles=("worker",), spec=("events", "progressInterval"),
        explain="With progress on: the least time between two progress rows of one submission (under 1m).",
        doc="worker, with `PROGRESS=on`: the least time between two progress rows of one job (the worker writes the "
            "latest state of every job that moved in one statement per interval); each row costs about 0.14 ms of "
            "CPU, so a shorter interval shows more and costs more ([docs/events.md](docs/events.md))")
    shadow: str = choice(
        # Not a spec scalar: the operator renders it for the Deployment of spec.worker.shadow.
        "SHADOW", "off", SHADOW_MODES, roles=("worker",),
        meaning="off (judge the work stream) or judge (a shadow worker: judge the shadow stream into shadow "
                "verdicts)",
        doc="worker: `judge` makes it a *shadow worker*, which judges its queue's shadow stream with the same judge "
            "and sandbox and writes shadow verdicts, never a submission's verdict ([docs/gitops.md](docs/gitops.md)); "
            "run shadow workers as processes (replicas) of their own")


@dataclass(frozen=True, kw_only=True)
class ReaperSettings:
    interval: float = duration(
        "REAPER_INTERVAL", 5.0, roles=("reaper",), spec=("reaper", "interval"), doc="reaper: time between sweeps")
    visibility_timeout: float = duration(
        "VISIBILITY_TIMEOUT", 60.0, roles=("reaper",), spec=("reaper", "visibilityTimeout"),
        doc="reaper: idle time before a pending entry is re-delivered")
    max_deliveries: int = whole(
        "MAX_DELIVERIES", 5, 1, 1000, roles=("reaper",), spec=("reaper", "maxDeliveries"),
        doc="reaper: deliveries before an entry is dead-lettered")
    max_retries: int = whole(
        "MAX_RETRIES", 3, 0, 100, roles=("reaper",), spec=("reaper", "maxRetries"),
        doc="reaper: lease expiries before `SYSTEM_ERROR` (0: at the first)")
    retention: float = duration(
        "RETENTION", 7 * 86400.0, roles=("reaper",), spec=("reaper", "retention"), long=True,
        doc="reaper: age at which terminal outbox rows, finished submissions, shadow and legacy verdicts and "
            "shadow stream entries are pruned")
    sweep_batch: int = whole(
        "SWEEP_BATCH", 1000, 1, roles=("reaper",), doc="reaper: entries per XAUTOCLAIM batch")
    redispatch_after: float = duration(
        "REDISPATCH_AFTER", 600.0, roles=("reaper",),
        doc="reaper: re-send a delivery never leased this long after sending (Redis lost its data); also how long "
            "a re-sent shadow entry waits for a shadow worker before it is sent again")


@dataclass(frozen=True, kw_only=True)
class Settings:
    """Everything a role reads, validated (core/config.py ``load_settings``)."""

    postgres_dsn: str = text(
        "POSTGRES_DSN", MISSING, parse_postgres_dsn, roles=ROLES, secret=("postgres",),
        doc="`postgresql://` URL (TLS via `?sslmode=`); several hosts with `?target_session_attrs=read-write` "
            "follow a failover")
    # "transaction": the DSN reaches Postgres through a pooler in transaction mode (PgBouncer
    # pool_mode=transaction): no prepared-statement cache, no LISTEN or session state through it.
    postgres_pooler: str = choice(
        "POSTGRES_POOLER", "none", POOLERS, roles=ROLES, spec=("postgres", "pooler"),
        meaning="none (direct to Postgres), session (a session-pooling pooler) or transaction "
                "(PgBouncer pool_mode=transaction or any transaction pooler)",
        doc="what the DSN goes through: `none` (Postgres itself), `session` (a session-pooling pooler), "
            "`transaction` (PgBouncer `pool_mode=transaction` or any transaction pooler: no prepared-statement "
            "cache, no LISTEN through it)",
        explain="What the DSN reaches: Postgres itself (none), a session pooler, or a transaction pooler such as "
                "PgBouncer pool_mode=transaction (no statement cache, no LISTEN through it). The operator's own "
                "connections honour it too.")
    # A direct (pooler-free) DSN for the LISTEN wake-up of the dispatcher (core/wakeup.py), of a worker
    # with direct intake (core/direct/) and a worker's cancel watch (roles/worker/cancels.py); without one
    # behind a transaction pooler they poll.
    postgres_listen_dsn: str | None = text(
        "POSTGRES_LISTEN_DSN", None, parse_postgres_dsn, roles=("dispatcher", "worker"), secret=("postgres", "listen"),
        doc="dispatcher and worker: a direct `postgresql://` URL (no pooler) for their LISTEN wake-ups and a "
            "worker's cancellations; unset behind a transaction pooler, they poll (every `SCHEDULE`; a worker "
            "checks its leases every 0.5 s)")
    redis_url: str = text(
        "REDIS_URL", MISSING, validate_redis_url, roles=ROLES, secret=("redis",),
        doc="`redis://` or `rediss://` URL (password in the URL), or "
            "`redis+sentinel://host:port,host:port/<master-name>[/<db>]` for a Sentinel-managed master")
    queue: str = text(
        "QUEUE", MISSING, validate_queue_name, roles=ROLES, spec=("queue",), pattern=QUEUE_PATTERN, max_length=63,
        doc="queue name (DNS label)", explain="Queue name (DNS label); defaults to the resource's name.")
    metrics_port: int = whole(
        "METRICS_PORT", 9090, 0, 65535, roles=ROLES, meaning="a port number 0-65535 (0 picks a free port)",
        doc="port of `/metrics`, `/healthz`, `/readyz` (`0` picks a free one)")
    metrics_address: str = text(  # all IPv4 interfaces, as Prometheus in a pod needs
        "METRICS_ADDRESS", "0.0.0.0", parse_listen_address, roles=ROLES,
        doc="IP address that port listens on (`127.0.0.1` keeps it local, `::` for IPv6 too)")
    log_level: str = choice(
        "LOG_LEVEL", "INFO", LOG_LEVELS, upper=True, roles=ROLES, spec=("logLevel",),
        doc="`DEBUG`, `INFO`, `WARNING`, `ERROR`")
    dispatcher: DispatcherSettings = field(default_factory=DispatcherSettings)
    worker: WorkerSettings = field(default_factory=WorkerSettings)
    reaper: ReaperSettings = field(default_factory=ReaperSettings)

    def redacted(self) -> dict[str, Any]:
        """A loggable view: connection passwords replaced."""
        return {
            "postgres_dsn": redact_url(self.postgres_dsn),
            "postgres_pooler": self.postgres_pooler,
            "postgres_listen_dsn": redact_url(self.postgres_listen_dsn) if self.postgres_listen_dsn else None,
            "redis_url": redact_url(self.redis_url),
            "queue": self.queue,
            "metrics_port": self.metrics_port,
            "metrics_address": self.metrics_address,
            "log_level": self.log_level,
            "dispatcher": vars(self.dispatcher),
            "worker": vars(self.worker),
            "reaper": vars(self.reaper),
        }

    @property
    def listen_dsn(self) -> str | None:
        """Where the dispatcher LISTENs for wake-ups, or None to poll on ``schedule`` alone.

        LISTEN needs one server session for as long as it listens, which a transaction pooler
        does not give: notifications would reach whichever client holds that server connection.
        """
        if self.postgres_listen_dsn:
            return self.postgres_listen_dsn
        return None if self.postgres_pooler == "transaction" else self.postgres_dsn


#: The settings classes by section (None: the top level), in the order their rows are read.
SECTIONS: dict[str | None, type[Any]] = {
    None: Settings, "dispatcher": DispatcherSettings, "worker": WorkerSettings, "reaper": ReaperSettings,
}


def _rows() -> Iterator[Row]:
    for section, cls in SECTIONS.items():
        for f in fields(cls):
            row = f.metadata.get(_ROW)
            if isinstance(row, Row):
                yield replace(row, section=section, name=f.name, default=UNSET if f.default is MISSING else f.default)


#: Every role setting, in the order the README lists them and a role reads them.
ROWS: tuple[Row, ...] = tuple(_rows())
ROW_BY_SUFFIX: dict[str, Row] = {r.suffix: r for r in ROWS}
ROW_BY_SPEC: dict[tuple[str, ...], Row] = {r.spec: r for r in ROWS if r.spec is not None}


def _check_rows() -> None:
    """What every row must hold, checked at import so a malformed row never loads: one row per
    variable, known roles, and a default its own parser accepts."""
    if len(ROW_BY_SUFFIX) != len(ROWS):
        raise TypeError("two rows declare one variable")
    for r in ROWS:
        if not r.roles or not set(r.roles) <= set(ROLES) or (r.spec and r.secret):
            raise TypeError(f"{r.variable}: roles must be some of {ROLES}, and a spec path or a secret, not both")
        if not r.required and r.default is not None:
            r.parse(format_duration(r.default) if r.kind == "duration" else str(r.default))


_check_rows()


# --- the README's table --------------------------------------------------------------------------

#: The variables read by other parts than the role settings (a judge, ``problem upload``, the
#: credential files), as (variables, default, meaning): the README lists them under the rows.
OTHER_VARIABLES: tuple[tuple[str, str, str], ...] = (
    ("`JUDGEQUEUE_POSTGRES_DSN_FILE`, `JUDGEQUEUE_POSTGRES_LISTEN_DSN_FILE`, `JUDGEQUEUE_REDIS_URL_FILE`", "unset",
     "read that connection from a file (a mounted Secret) instead of the environment; setting both forms is an error"),
    ("`JUDGEQUEUE_JUDGE_REFUSED`", "`exit`",
     "worker: when the judge refuses to start (no sandbox), `exit` with one line, or stay `unready` (`/readyz` 503 "
     "naming what is missing; what the operator renders)"),
    ("`JUDGEQUEUE_SANDBOX`, `JUDGEQUEUE_SANDBOX_DIR`, `JUDGEQUEUE_PROGRAM_MAX_TESTS`, `JUDGEQUEUE_PROGRAM_BUDGET`, "
     "`JUDGEQUEUE_PROGRAM_BOX`, `JUDGEQUEUE_PROBLEM_CACHE_DIR`, `JUDGEQUEUE_PROBLEM_CACHE_MB`",
     "see [docs/judges.md](docs/judges.md)",
     "the program judge: isolation required or trusted, where boxes live, tests and wall budget per submission, a "
     "box per submission (default) or per test, the problem package cache"),
    ("`JUDGEQUEUE_ARCHIVE_MAX_FILE_MB`, `JUDGEQUEUE_ARCHIVE_MAX_PACKAGE_MB`, `JUDGEQUEUE_ARCHIVE_MAX_RATIO`",
     "`256`, half `JUDGEQUEUE_PROBLEM_CACHE_MB` (512), `1100`",
     "`problem upload`: the largest file of a package, the most a package stores (or a zip expands to; never more "
     "than the judge's cache), how far a zip entry may expand; see [docs/judges.md](docs/judges.md) \"What a "
     "package may hold\""),
    ("`JUDGEQUEUE_CALL_ENDPOINTS`, `JUDGEQUEUE_CALL_MAX_BODY_BYTES`, `JUDGEQUEUE_CALL_MAX_RESPONSE_BYTES`",
     "see [docs/agent-jobs.md](docs/agent-jobs.md)",
     "the http-call judge: its endpoints by name (`{name: {url or urlFile, concurrency, deadline, tries, rate}}`, "
     "JSON; `concurrency` and `rate` count the calls of all the queue's workers), the request and answer size "
     "bounds (256 KiB, 1 MiB)"),
    ("`JUDGEQUEUE_WEBHOOKS`", "unset (no webhooks)",
     "reaper: where it POSTs the queue's verdict events (`{name: {url or urlFile, secret or secretFile, concurrency, "
     "maxAttempts, deadline}}`, JSON; a JudgeQueue's `spec.events.webhooks`); see [docs/events.md](docs/events.md)"),
)


def _shown_default(r: Row) -> str:
    """The default column: the default as a variable would say it, then the range a number or a
    duration must keep to."""
    if r.required:
        return "required"
    if r.default is None:
        return "unset"
    shown = f"`{format_duration(r.default) if r.kind == 'duration' else r.default}`"
    if r.kind == "integer" and r.maximum is not None:
        return f"{shown} ({r.minimum}-{r.maximum})"
    if r.kind == "integer" and r.spec_maximum is not None:
        return f"{shown} ({r.minimum} or more; in a JudgeQueue {r.minimum}-{r.spec_maximum})"
    if r.kind == "duration" and r.under is not None:
        return f"{shown} (under {format_duration(r.under)})"
    return shown


def _where(r: Row) -> str:
    if r.spec is not None:
        return f"`spec.{'.'.join(r.spec)}`"
    if r.secret is not None:
        return f"`spec.{'.'.join(r.secret)}.secretKeyRef`"
    return "—"


def variable_table() -> str:
    """The README's table of ``JUDGEQUEUE_*`` variables (markdown, one line per row), from :data:`ROWS`
    and :data:`OTHER_VARIABLES`."""
    lines = ["| variable | default | meaning | JudgeQueue field |", "|---|---|---|---|"]
    lines += [f"| `{r.variable}` | {_shown_default(r)} | {r.doc} | {_where(r)} |" for r in ROWS]
    lines += [f"| {names} | {default} | {meaning} | — |" for names, default, meaning in OTHER_VARIABLES]
    return "\n".join(lines) + "\n"
