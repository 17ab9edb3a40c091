"""Typed configuration for every role, read from ``JUDGEQUEUE_*`` environment variables.

One :class:`Settings` object holds everything; :func:`load_settings` validates the environment and
raises :class:`ConfigError` with one line naming the variable and what it accepts. What each variable
is (parser, default, bounds, the JudgeQueue field that sets it, the roles that read it) is its row in
``core/settings_table.py``, which the spec model (``core/spec/``) reads too: the operator renders
the same variables from a ``JudgeQueue`` spec, and both refuse the same values.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, fields
from typing import Any

from .base.errors import ConfigError
from .setting_values import AUTO_INTAKE as AUTO_INTAKE
from .setting_values import DIRECT_INTAKE_MAX_WORKERS as DIRECT_INTAKE_MAX_WORKERS
from .setting_values import INTAKES as INTAKES
from .setting_values import POOLERS as POOLERS
from .setting_values import SHADOW_MODES as SHADOW_MODES
from .setting_values import SPEC_INTAKES as SPEC_INTAKES
from .setting_values import format_duration as format_duration
from .setting_values import parse_duration as parse_duration
from .setting_values import redact_url as redact_url
from .setting_values import whole_number
from .settings_table import PREFIX as PREFIX
from .settings_table import ROW_BY_SUFFIX, ROWS
from .settings_table import DispatcherSettings as DispatcherSettings
from .settings_table import ReaperSettings as ReaperSettings
from .settings_table import Settings as Settings
from .settings_table import WorkerSettings as WorkerSettings


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


#: The connections: each holds a password, so a bad value is shown redacted; a JudgeQueue takes each from a Secret.
_URL_VARIABLES = tuple(r.suffix for r in ROWS if r.secret is not None)
REQUIRED = tuple(r.suffix for r in ROWS if r.required)
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
    return [r.variable for r in ROWS]


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
    for row in ROWS:
        variable, section, name = row.variable, row.section, row.name
        raw = merged.get(variable)
        if raw is None or raw == "":
            if row.required:
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
    for row in ROWS:
        if row.section == section and row.name == name:
            return row.variable
    raise KeyError(f"no variable sets {section or 'settings'}.{name}")


def parse_variable(variable: str, raw: str | None, *, shown_as: str | None = None) -> Any:
    """Validate one variable's value as :func:`load_settings` would; raises ConfigError naming it
    (or ``shown_as``, the flag the value came from)."""
    suffix = variable.removeprefix(PREFIX)
    if suffix not in ROW_BY_SUFFIX:
        raise KeyError(variable)
    if raw is None or raw == "":
        raise ConfigError(f"{variable} is required")
    return _parse(variable, raw, shown_as or variable)


def _parse(variable: str, raw: str, shown_as: str) -> Any:
    """One variable's value through its parser; a ConfigError names it as ``shown_as`` (variable or flag)."""
    suffix = variable.removeprefix(PREFIX)
    try:
        return ROW_BY_SUFFIX[suffix].parse(raw)
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
    expands to: half the judge's cache by default, so a worker's cache holds a new version of a
    package beside the old one it is still judging; ``max_ratio``: how much larger than its
    compressed bytes a zip entry may grow (checked while it is read, past its first MiB: deflate
    cannot pass about 1032, so the default stops only the methods that can, bzip2 and LZMA, long
    before the size bounds would)."""

    max_file_mb: int = 256
    max_package_mb: int = PROBLEM_CACHE_MB_DEFAULT // 2
    max_ratio: int = 1100

    @property
    def max_file_bytes(self) -> int:
        return self.max_file_mb * 1024 * 1024

    @property
    def max_package_bytes(self) -> int:
        return self.max_package_mb * 1024 * 1024


_positive_int = whole_number(1)

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

    The package bound defaults to half the judge's cache bound (``JUDGEQUEUE_PROBLEM_CACHE_MB``,
    its default when unset: a cache holds a new version beside the old one still judged), and may
    not exceed the cache; a file may not be larger than the package bound."""
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
    values.setdefault("max_package_mb", max(1, cache_mb // 2))
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
