"""What a setting's text may be, and the choices of the enumerated settings: the parsers the rows of
``core/settings_table.py`` are declared with (each raises ``ValueError`` saying what it accepts; the
caller names the variable). Pure: no I/O."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable
from urllib.parse import urlsplit, urlunsplit

# --- parsers ------------------------------------------------------------------------------------

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


_WHOLE = re.compile(r"\s*[+-]?[0-9]{1,18}\s*")


def whole_number(minimum: int, maximum: int | None = None, *, meaning: str | None = None) -> Callable[[str], int]:
    """A parser of whole numbers from ``minimum`` to ``maximum`` (None: no upper bound); its error says
    the bounds (or ``meaning``, when given)."""
    if meaning is None:
        if minimum == 1:
            meaning = "a positive whole number " + ("(1, 2, 3, ...)" if maximum is None else f"up to {maximum}")
        elif maximum is None:
            meaning = f"a whole number, {minimum} or more"
        else:
            meaning = f"a whole number from {minimum} to {maximum}"

    def parse(text: str) -> int:
        if _WHOLE.fullmatch(text) is None or int(text) < minimum or (maximum is not None and int(text) > maximum):
            raise ValueError(f"must be {meaning}")
        return int(text)

    return parse


def positive_duration(under: float | None = None) -> Callable[[str], float]:
    """A parser of positive durations, below ``under`` seconds when given."""

    def parse(text: str) -> float:
        value = parse_duration(text)
        if value <= 0:
            raise ValueError("must be a positive duration (examples: 250ms, 30s, 5m)")
        if under is not None and value >= under:
            raise ValueError(f"must be a positive duration under {format_duration(under)}")
        return value

    return parse


def one_of(values: tuple[str, ...], meaning: str | None = None, *, upper: bool = False) -> Callable[[str], str]:
    """A parser accepting one of ``values`` (any case, surrounding spaces ignored); ``meaning`` says
    what each is, in the error (else the values are listed)."""
    said = meaning or "one of " + ", ".join(values)

    def parse(text: str) -> str:
        value = text.strip().upper() if upper else text.strip().lower()
        if value not in values:
            raise ValueError(f"must be {said}")
        return value

    return parse


def parse_listen_address(text: str) -> str:
    """An IP address to bind (``0.0.0.0`` all IPv4, ``::`` all interfaces, ``127.0.0.1`` local only)."""
    try:
        return str(ipaddress.ip_address(text.strip()))
    except ValueError:
        raise ValueError("must be an IP address to listen on, such as 0.0.0.0, 127.0.0.1 or ::") from None


def parse_postgres_dsn(text: str) -> str:
    if not text.startswith(("postgres://", "postgresql://")):
        raise ValueError("must be a postgresql:// URL")
    return text


#: A judge plugin's name (the CRD's pattern of ``spec.worker.judge`` too).
JUDGE_PATTERN = r"^[a-z][a-z0-9_-]*$"
#: A queue's name, a DNS label (the CRD's pattern of ``spec.queue``; core/queues.py checks the same).
QUEUE_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"


def parse_judge_name(text: str) -> str:
    if not re.match(JUDGE_PATTERN, text):
        raise ValueError("must be a judge plugin name such as noop, sleep or program")
    return text


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


# --- choices ------------------------------------------------------------------------------------

#: ``JUDGEQUEUE_POSTGRES_POOLER`` values: what sits between the roles and Postgres.
POOLERS = ("none", "session", "transaction")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
#: ``JUDGEQUEUE_INTAKE`` values: how jobs reach the workers. ``stream``: every job goes outbox ->
#: dispatcher -> Redis stream -> worker. ``direct``: a worker with free slots claims and leases ready
#: outbox rows itself in one statement; the dispatcher sends to the stream only the rows no worker
#: took within one ``schedule`` (and shadow rows), so Redis carries the overflow and re-deliveries.
INTAKES = ("stream", "direct")
#: ``spec.worker.intake`` may also say ``auto`` (its default): the operator (and ``judgequeue local``)
#: picks one of :data:`INTAKES` from the worker fleet's upper bound (core/config.py ``intake_for_fleet``).
#: A role process never sees ``auto``: it cannot know how many workers share its queue.
AUTO_INTAKE = "auto"
SPEC_INTAKES = (AUTO_INTAKE, *INTAKES)
#: The largest worker fleet ``auto`` gives direct intake; a larger one gets ``stream``. Direct intake
#: takes about half the CPU per job of ``stream`` at a few workers, but its idle workers' offers and
#: wake-ups cost more than the stream saves once many workers share a queue: docs/performance.md,
#: "Intakes at fleet size", has the figures this bound is set from.
DIRECT_INTAKE_MAX_WORKERS = 8
#: ``JUDGEQUEUE_SHADOW`` values. ``off``: a worker judges its queue's work stream. ``judge``: a *shadow
#: worker*, which judges the queue's shadow stream only (same judge, same sandbox) and writes shadow
#: verdicts, never a submission's verdict (docs/gitops.md). Run shadow workers as their own processes
#: (on Kubernetes, ``spec.worker.shadow``: their own Deployment) beside the live ones.
SHADOW_MODES = ("off", "judge")
