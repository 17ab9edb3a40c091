"""Typed configuration for every role, read from ``JUDGEQUEUE_*`` environment variables.

One :class:`Settings` object holds everything; :func:`load_settings` validates the environment and
raises :class:`ConfigError` with one line naming the variable and what it accepts. The operator
renders the same variables from a ``JudgeQueue`` spec, so this module is the contract between them.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

from .base.errors import ConfigError
from .base.names import validate_queue_name
from .transport.redis_url import validate_redis_url

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


def parse_duration(text: str) -> float:
    """Parse ``"250ms"``, ``"30s"``, ``"5m"``, ``"2h"``, ``"7d"`` or plain seconds into seconds."""
    match = _DURATION.match(text)
    if not match:
        raise ValueError(f"{text!r} is not a duration (examples: 250ms, 30s, 5m, 2h, 7d)")
    return float(match.group(1)) * _UNIT_SECONDS[match.group(2)]


def format_duration(seconds: float) -> str:
    """The shortest exact duration string for ``seconds`` (inverse of :func:`parse_duration`)."""
    for unit in ("d", "h", "m", "s"):
        size = _UNIT_SECONDS[unit]
        if seconds >= size and (seconds / size).is_integer():
            return f"{int(seconds / size)}{unit}"
    ms = seconds * 1000
    return f"{int(ms)}ms" if float(ms).is_integer() else f"{seconds}s"


_SECRET_QUERY = re.compile(r"((?:^|&)(?:password|sentinel_password)=)[^&]*")


def redact_url(url: str) -> str:
    """The URL with any password (userinfo, ``password=`` or ``sentinel_password=``) replaced by ``***``."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable url>"
    if parts.query:
        parts = parts._replace(query=_SECRET_QUERY.sub(r"\1***", parts.query))
    if parts.password is not None:
        netloc = parts.netloc.rsplit("@", 1)[1]
        user = parts.username or ""
        parts = parts._replace(netloc=f"{user}:***@{netloc}")
    return urlunsplit(parts)


@dataclass(frozen=True)
class DispatcherSettings:
    batch_size: int = 100
    schedule: float = 1.0  # idle poll fallback, seconds
    max_attempts: int = 10
    backoff_base: float = 1.0
    backoff_max: float = 300.0
    claim_ttl: float = 30.0
    seen_ttl: float = 86400.0  # how long the Redis dedup marker of a (submission, generation) lives


#: ``JUDGEQUEUE_INTAKE`` values: how jobs reach the workers. ``stream``: every job goes outbox ->
#: dispatcher -> Redis stream -> worker. ``direct``: a worker with free slots claims and leases ready
#: outbox rows itself in one statement; the dispatcher sends to the stream only the rows no worker
#: took within one ``schedule`` (and shadow rows), so Redis carries the overflow and re-deliveries.
INTAKES = ("stream", "direct")
#: ``spec.worker.intake`` may also say ``auto`` (its default): the operator (and ``judgequeue local``)
#: picks one of :data:`INTAKES` from the worker fleet's upper bound, :func:`intake_for_fleet`. A role
#: process never sees ``auto``: it cannot know how many workers share its queue.
AUTO_INTAKE = "auto"
SPEC_INTAKES = (AUTO_INTAKE, *INTAKES)
#: The largest worker fleet ``auto`` gives direct intake; a larger one gets ``stream``. Direct intake
#: takes about half the CPU per job of ``stream`` at a few workers, but its idle workers' offers and
#: wake-ups cost more than the stream saves once many workers share a queue: docs/performance.md,
#: "Intakes at fleet size", has the figures this bound is set from.
DIRECT_INTAKE_MAX_WORKERS = 8


@dataclass(frozen=True)
class IntakeChoice:
    """The intake a fleet runs (one of :data:`INTAKES`) and one line saying why, for status and logs."""

    intake: str
    reason: str


def intake_for_fleet(requested: str, max_workers: int, *, bound: str = "maxReplicas") -> IntakeChoice:
    """Resolve ``spec.worker.intake`` for a fleet of at most ``max_workers`` workers (pure).

    ``auto`` is ``direct`` up to :data:`DIRECT_INTAKE_MAX_WORKERS` workers and ``stream`` above; an
    explicit intake is kept. The bound is the fleet's static upper bound (``spec.worker.maxReplicas``),
    never the current count: a different intake changes every worker's and dispatcher's environment, so
    deciding on the count would roll every pod whenever autoscaling crossed the line. ``bound`` names
    the number in the reason (``maxReplicas``; ``workers`` for ``judgequeue local``'s fixed count).
    """
    if requested in INTAKES:
        return IntakeChoice(requested, f"{requested}: set in spec.worker.intake")
    if requested != AUTO_INTAKE:
        raise ValueError(f"intake must be one of {', '.join(SPEC_INTAKES)}, got {requested!r}")
    if max_workers <= DIRECT_INTAKE_MAX_WORKERS:
        return IntakeChoice("direct", f"auto: {bound} {max_workers} <= {DIRECT_INTAKE_MAX_WORKERS}, direct")
    return IntakeChoice("stream", f"auto: {bound} {max_workers} > {DIRECT_INTAKE_MAX_WORKERS}, stream")

#: ``JUDGEQUEUE_SHADOW`` values. ``off``: a worker judges its queue's work stream. ``judge``: a *shadow
#: worker*, which judges the queue's shadow stream only (same judge, same sandbox) and writes shadow
#: verdicts, never a submission's verdict (docs/gitops.md). Run shadow workers as their own processes
#: (on Kubernetes, ``spec.worker.shadow``: their own Deployment) beside the live ones.
SHADOW_MODES = ("off", "judge")


@dataclass(frozen=True)
class WorkerSettings:
    concurrency: int = 4
    judge: str = "program"
    lease_ttl: float = 30.0
    grace_period: float = 25.0
    intake: str = "direct"  # INTAKES; the dispatcher reads it too
    #: Direct intake: open slots an idle worker offers for submits to fill (roles/worker/direct/offers.py); 0: none.
    offers: int = 32
    shadow: str = "off"  # SHADOW_MODES


@dataclass(frozen=True)
class ReaperSettings:
    interval: float = 5.0
    visibility_timeout: float = 60.0
    max_deliveries: int = 5
    max_retries: int = 3
    retention: float = 7 * 86400.0
    sweep_batch: int = 1000
    redispatch_after: float = 600.0  # re-send deliveries never leased this long after sending


#: ``JUDGEQUEUE_POSTGRES_POOLER`` values: what sits between the roles and Postgres.
POOLERS = ("none", "session", "transaction")


@dataclass(frozen=True)
class Settings:
    postgres_dsn: str
    redis_url: str
    queue: str
    # "transaction": the DSN reaches Postgres through a pooler in transaction mode (PgBouncer
    # pool_mode=transaction): no prepared-statement cache, no LISTEN or session state through it.
    postgres_pooler: str = "none"
    # A direct (pooler-free) DSN for the dispatcher's LISTEN wake-up; without one behind a
    # transaction pooler the dispatcher polls every ``schedule``.
    postgres_listen_dsn: str | None = None
    metrics_port: int = 9090
    metrics_address: str = "0.0.0.0"  # all IPv4 interfaces, as Prometheus in a pod needs
    log_level: str = "INFO"
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


T = TypeVar("T")


_WHOLE = re.compile(r"\s*[+-]?[0-9]{1,18}\s*")


def _positive_int(text: str) -> int:
    if _WHOLE.fullmatch(text) is None or int(text) < 1:
        raise ValueError("must be a positive whole number (1, 2, 3, ...)")
    return int(text)


def _count(text: str) -> int:
    if _WHOLE.fullmatch(text) is None or int(text) < 0:
        raise ValueError("must be a whole number, 0 or more")
    return int(text)


def _port(text: str) -> int:
    if _WHOLE.fullmatch(text) is None or not 0 <= int(text) <= 65535:
        raise ValueError("must be a port number 0-65535 (0 picks a free port)")
    return int(text)


def _listen_address(text: str) -> str:
    """An IP address to bind (``0.0.0.0`` all IPv4, ``::`` all interfaces, ``127.0.0.1`` local only)."""
    try:
        return str(ipaddress.ip_address(text.strip()))
    except ValueError:
        raise ValueError("must be an IP address to listen on, such as 0.0.0.0, 127.0.0.1 or ::") from None


def _positive_duration(text: str) -> float:
    value = parse_duration(text)
    if value <= 0:
        raise ValueError("must be a positive duration (examples: 250ms, 30s, 5m)")
    return value


def _log_level(text: str) -> str:
    level = text.upper()
    if level not in {"DEBUG", "INFO", "WARNING", "ERROR"}:
        raise ValueError("must be one of DEBUG, INFO, WARNING, ERROR")
    return level


def _postgres_dsn(text: str) -> str:
    if not text.startswith(("postgres://", "postgresql://")):
        raise ValueError("must be a postgresql:// URL")
    return text


def _redis_url(text: str) -> str:
    return validate_redis_url(text)


def _one_of(values: tuple[str, ...], meaning: str) -> Callable[[str], str]:
    """A parser accepting one of ``values`` (any case, surrounding spaces ignored); ``meaning``
    says what each is, in the error."""

    def parse(text: str) -> str:
        value = text.strip().lower()
        if value not in values:
            raise ValueError(f"must be {meaning}")
        return value

    return parse


_pooler = _one_of(
    POOLERS,
    "none (direct to Postgres), session (a session-pooling pooler) or transaction "
    "(PgBouncer pool_mode=transaction or any transaction pooler)",
)
_intake = _one_of(
    INTAKES,
    "stream (every job through the Redis stream) or direct (workers lease ready rows from Postgres "
    "themselves; the stream carries the overflow)",
)

_shadow = _one_of(
    SHADOW_MODES,
    "off (judge the work stream) or judge (a shadow worker: judge the shadow stream into shadow verdicts)",
)


def _judge_name(text: str) -> str:
    if not re.match(r"^[a-z][a-z0-9_-]*$", text):
        raise ValueError("must be a judge plugin name such as noop, sleep or program")
    return text


# variable suffix -> (section, field, parser, what is accepted)
_VARIABLES: dict[str, tuple[str | None, str, Callable[[str], Any]]] = {
    "POSTGRES_DSN": (None, "postgres_dsn", _postgres_dsn),
    "POSTGRES_POOLER": (None, "postgres_pooler", _pooler),
    "POSTGRES_LISTEN_DSN": (None, "postgres_listen_dsn", _postgres_dsn),
    "REDIS_URL": (None, "redis_url", _redis_url),
    "QUEUE": (None, "queue", validate_queue_name),
    "METRICS_PORT": (None, "metrics_port", _port),
    "METRICS_ADDRESS": (None, "metrics_address", _listen_address),
    "LOG_LEVEL": (None, "log_level", _log_level),
    "BATCH_SIZE": ("dispatcher", "batch_size", _positive_int),
    "SCHEDULE": ("dispatcher", "schedule", _positive_duration),
    "MAX_ATTEMPTS": ("dispatcher", "max_attempts", _positive_int),
    "BACKOFF_BASE": ("dispatcher", "backoff_base", _positive_duration),
    "BACKOFF_MAX": ("dispatcher", "backoff_max", _positive_duration),
    "CLAIM_TTL": ("dispatcher", "claim_ttl", _positive_duration),
    "SEEN_TTL": ("dispatcher", "seen_ttl", _positive_duration),
    "CONCURRENCY": ("worker", "concurrency", _positive_int),
    "JUDGE": ("worker", "judge", _judge_name),
    "LEASE_TTL": ("worker", "lease_ttl", _positive_duration),
    "GRACE_PERIOD": ("worker", "grace_period", _positive_duration),
    "INTAKE": ("worker", "intake", _intake),
    "OFFERS": ("worker", "offers", _count),
    "SHADOW": ("worker", "shadow", _shadow),
    "REAPER_INTERVAL": ("reaper", "interval", _positive_duration),
    "VISIBILITY_TIMEOUT": ("reaper", "visibility_timeout", _positive_duration),
    "MAX_DELIVERIES": ("reaper", "max_deliveries", _positive_int),
    "MAX_RETRIES": ("reaper", "max_retries", _count),  # 0: give up at the first lease expiry
    "RETENTION": ("reaper", "retention", _positive_duration),
    "SWEEP_BATCH": ("reaper", "sweep_batch", _positive_int),
    "REDISPATCH_AFTER": ("reaper", "redispatch_after", _positive_duration),
}

PREFIX = "JUDGEQUEUE_"
_URL_VARIABLES = ("POSTGRES_DSN", "POSTGRES_LISTEN_DSN", "REDIS_URL")
REQUIRED = ("POSTGRES_DSN", "REDIS_URL", "QUEUE")
#: ``JUDGEQUEUE_POSTGRES_DSN_FILE=/path`` gives the connection as a file (a mounted Secret), so the
#: credential is in no process's environment; the plain variable still works (``judgequeue local``).
FILE_SUFFIX = "_FILE"
#: The variables that may come from a file instead: the connections, which carry passwords.
FILE_VARIABLES = _URL_VARIABLES
MAX_CREDENTIAL_FILE = 64 * 1024


def read_credential_files(env: Mapping[str, str], *, ignore: Collection[str] = ()) -> dict[str, str]:
    """The values of every ``JUDGEQUEUE_<connection>_FILE`` set in ``env``, keyed by the plain variable.

    Raises ConfigError naming the ``_FILE`` variable when its file is missing, unreadable, empty or
    too large, or when the plain variable is set too (two sources of one credential is a mistake).
    Surrounding whitespace (a trailing newline from ``kubectl create secret --from-file``) is dropped.
    Variables in ``ignore`` (given by a flag, which wins) are not read from files.
    """
    values: dict[str, str] = {}
    for suffix in FILE_VARIABLES:
        variable = PREFIX + suffix
        file_variable = variable + FILE_SUFFIX
        path = env.get(file_variable)
        if variable in ignore:
            continue
        if path is None or path == "":
            continue
        if env.get(variable):
            raise ConfigError(f"{variable} and {file_variable} are both set: set only one")
        try:
            with open(path, "rb") as handle:
                raw = handle.read(MAX_CREDENTIAL_FILE + 1)
        except OSError as exc:
            raise ConfigError(f"{file_variable}={path!r}: cannot read the file ({exc.strerror or exc})") from None
        if len(raw) > MAX_CREDENTIAL_FILE:
            raise ConfigError(f"{file_variable}={path!r}: the file is over {MAX_CREDENTIAL_FILE} bytes")
        try:
            text = raw.decode().strip()
        except UnicodeDecodeError:
            raise ConfigError(f"{file_variable}={path!r}: the file is not UTF-8 text") from None
        if not text:
            raise ConfigError(f"{file_variable}={path!r}: the file is empty")
        values[variable] = text
    return values


def variable_names() -> list[str]:
    """Every environment variable :func:`load_settings` reads, but the ``*_FILE`` forms
    (:func:`file_variable_names`)."""
    return [PREFIX + suffix for suffix in _VARIABLES]


def file_variable_names() -> list[str]:
    """The ``*_FILE`` variables: a connection's value read from the file they name."""
    return [PREFIX + suffix + FILE_SUFFIX for suffix in FILE_VARIABLES]


def load_settings(
    env: Mapping[str, str],
    overrides: Mapping[str, str] | None = None,
    *,
    override_name: Callable[[str], str] | None = None,
) -> Settings:
    """Validate ``env`` (plus ``overrides`` keyed by variable name, e.g. from flags) into Settings.

    Raises ConfigError naming the first bad or missing variable; a bad value that came from
    ``overrides`` is named by ``override_name(variable)`` (the flag the user typed) when given.
    """
    merged = {k: v for k, v in env.items() if k.startswith(PREFIX)}
    merged.update(overrides or {})
    merged.update(read_credential_files(merged, ignore=set(overrides or ())))
    top: dict[str, Any] = {}
    sections: dict[str, dict[str, Any]] = {"dispatcher": {}, "worker": {}, "reaper": {}}
    for suffix, (section, name, _parser) in _VARIABLES.items():
        variable = PREFIX + suffix
        raw = merged.get(variable)
        if raw is None or raw == "":
            if suffix in REQUIRED:
                raise ConfigError(f"{variable} is required")
            continue
        from_override = overrides is not None and variable in overrides and override_name is not None
        shown_as = override_name(variable) if from_override and override_name else variable
        (sections[section] if section else top)[name] = _parse(variable, raw, shown_as)
    settings = Settings(
        **top,
        dispatcher=DispatcherSettings(**sections["dispatcher"]),
        worker=WorkerSettings(**sections["worker"]),
        reaper=ReaperSettings(**sections["reaper"]),
    )
    _check_consistency(settings)
    return settings


def _check_consistency(settings: Settings) -> None:
    if settings.dispatcher.backoff_base > settings.dispatcher.backoff_max:
        raise ConfigError(
            f"{PREFIX}BACKOFF_BASE ({settings.dispatcher.backoff_base}s) must not exceed "
            f"{PREFIX}BACKOFF_MAX ({settings.dispatcher.backoff_max}s)"
        )
    if settings.worker.grace_period <= 0:  # pragma: no cover - parser forbids it
        raise ConfigError(f"{PREFIX}GRACE_PERIOD must be positive")


#: What a worker does when its judge refuses to start because it cannot isolate (the program judge's
#: fail-closed start): ``exit`` (status 2, one line; the default, for ``judgequeue local`` and
#: shells) or ``unready`` (keep serving ``/healthz``, answer ``/readyz`` with 503 naming what is
#: missing, take no job; what the operator renders, so a pod says why it is not ready).
JUDGE_REFUSED_VARIABLE = PREFIX + "JUDGE_REFUSED"
JUDGE_REFUSED_MODES = ("exit", "unready")


def judge_refused_mode(env: Mapping[str, str]) -> str:
    """``JUDGEQUEUE_JUDGE_REFUSED`` validated (ConfigError naming it); ``exit`` when unset."""
    value = env.get(JUDGE_REFUSED_VARIABLE, "").strip().lower() or "exit"
    if value not in JUDGE_REFUSED_MODES:
        raise ConfigError(f"{JUDGE_REFUSED_VARIABLE} must be one of {', '.join(JUDGE_REFUSED_MODES)}, "
                          f"got {env.get(JUDGE_REFUSED_VARIABLE)!r}")
    return value


def section_fields(section: type[Any]) -> list[str]:
    return [f.name for f in fields(section)]


def variable_for(section: str | None, name: str) -> str:
    """The environment variable that sets ``Settings.<section>.<name>`` (``section`` None: top level)."""
    for suffix, (sec, field_name, _parse) in _VARIABLES.items():
        if sec == section and field_name == name:
            return PREFIX + suffix
    raise KeyError(f"no variable sets {section or 'settings'}.{name}")


def parse_variable(variable: str, raw: str | None, *, shown_as: str | None = None) -> Any:
    """Validate one variable's value as :func:`load_settings` would; raises ConfigError naming it
    (or ``shown_as``, the flag the value came from)."""
    suffix = variable.removeprefix(PREFIX)
    if suffix not in _VARIABLES:
        raise KeyError(variable)
    if raw is None or raw == "":
        raise ConfigError(f"{variable} is required")
    return _parse(variable, raw, shown_as or variable)


def _parse(variable: str, raw: str, shown_as: str) -> Any:
    """One variable's value through its parser; a ConfigError names it as ``shown_as`` (variable or flag)."""
    suffix = variable.removeprefix(PREFIX)
    try:
        return _VARIABLES[suffix][2](raw)
    except (ValueError, TypeError) as exc:
        shown = redact_url(raw) if suffix in _URL_VARIABLES else raw
        raise ConfigError(f"{shown_as}={shown!r} is invalid: {exc}") from None


# --- archives: what ``judgequeue problem upload`` takes ------------------------------------------

#: The program judge's bound on its package cache (core/judges/sandbox/isolation.py reads it for workers);
#: a package larger than that cache could never be judged, so an upload's bound defaults to it.
PROBLEM_CACHE_MB_VARIABLE = PREFIX + "PROBLEM_CACHE_MB"
PROBLEM_CACHE_MB_DEFAULT = 1024


@dataclass(frozen=True)
class ArchiveSettings:
    """Bounds on a problem archive an upload reads (docs/judges.md, "What a package may hold").

    ``max_file_mb``: any one file of the package (read or stored, statements and sources too);
    ``max_package_mb``: the files stored (what a worker's cache must hold), and everything a zip
    expands to; ``max_ratio``: how much larger than its compressed bytes a zip entry may grow
    (checked while it is read, past its first MiB: deflate cannot pass about 1032, so the default
    stops only the methods that can, bzip2 and LZMA, long before the size bounds would)."""

    max_file_mb: int = 256
    max_package_mb: int = PROBLEM_CACHE_MB_DEFAULT
    max_ratio: int = 1100

    @property
    def max_file_bytes(self) -> int:
        return self.max_file_mb * 1024 * 1024

    @property
    def max_package_bytes(self) -> int:
        return self.max_package_mb * 1024 * 1024


#: variable suffix -> (ArchiveSettings field, parser)
_ARCHIVE_VARIABLES: dict[str, tuple[str, Callable[[str], Any]]] = {
    "ARCHIVE_MAX_FILE_MB": ("max_file_mb", _positive_int),
    "ARCHIVE_MAX_PACKAGE_MB": ("max_package_mb", _positive_int),
    "ARCHIVE_MAX_RATIO": ("max_ratio", _positive_int),
}


def archive_variable_names() -> list[str]:
    """The variables :func:`load_archive_settings` reads (``judgequeue problem upload`` has a flag for each)."""
    return [PREFIX + suffix for suffix in _ARCHIVE_VARIABLES]


def load_archive_settings(
    env: Mapping[str, str],
    overrides: Mapping[str, str] | None = None,
    *,
    override_name: Callable[[str], str] | None = None,
) -> ArchiveSettings:
    """The archive bounds from ``env`` (and ``overrides``, keyed by variable, e.g. from flags), or a
    ConfigError naming the first bad variable (or its flag, by ``override_name``).

    The package bound defaults to the judge's cache bound (``JUDGEQUEUE_PROBLEM_CACHE_MB``) when
    that is set, and may not exceed it; a file may not be larger than the package bound."""
    merged = {**{k: v for k, v in env.items() if k.startswith(PREFIX)}, **(overrides or {})}

    def shown(variable: str) -> str:
        from_override = overrides is not None and variable in overrides and override_name is not None
        return override_name(variable) if from_override and override_name else variable

    values: dict[str, Any] = {}
    for suffix, (name, parser) in _ARCHIVE_VARIABLES.items():
        variable = PREFIX + suffix
        raw = merged.get(variable)
        if raw is None or raw == "":
            continue
        try:
            values[name] = parser(raw)
        except ValueError as exc:
            raise ConfigError(f"{shown(variable)}={raw!r} is invalid: {exc}") from None
    cache_raw = merged.get(PROBLEM_CACHE_MB_VARIABLE)
    cache_mb = PROBLEM_CACHE_MB_DEFAULT
    if cache_raw:
        try:
            cache_mb = _positive_int(cache_raw)
        except ValueError as exc:
            raise ConfigError(f"{PROBLEM_CACHE_MB_VARIABLE}={cache_raw!r} is invalid: {exc}") from None
        values.setdefault("max_package_mb", cache_mb)
    if "max_file_mb" not in values:  # the default file bound, but never above a package bound set lower
        values["max_file_mb"] = min(ArchiveSettings.max_file_mb, values.get("max_package_mb", cache_mb))
    settings = ArchiveSettings(**values)
    package_variable, file_variable = PREFIX + "ARCHIVE_MAX_PACKAGE_MB", PREFIX + "ARCHIVE_MAX_FILE_MB"
    if settings.max_package_mb > cache_mb:
        cache = f"{cache_mb} MiB" if cache_raw else f"{cache_mb} MiB, its default"
        raise ConfigError(
            f"{shown(package_variable)} ({settings.max_package_mb} MiB) is more than {PROBLEM_CACHE_MB_VARIABLE} "
            f"({cache}): a worker's cache could never hold such a package (raise both together)"
        )
    if settings.max_file_mb > settings.max_package_mb:
        raise ConfigError(
            f"{shown(file_variable)} ({settings.max_file_mb} MiB) is more than {shown(package_variable)} "
            f"({settings.max_package_mb} MiB)"
        )
    return settings
