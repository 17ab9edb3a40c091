"""The ``http-call`` judge: one idempotent, bounded remote call per job (docs/agent-jobs.md).

For jobs that are a call to a model or a tool rather than a program to run: the payload names an
endpoint and carries a JSON body, ``{"endpoint": "summarise", "body": {...}}``. The endpoint's URL
comes from the worker's configuration (:data:`ENDPOINTS_VAR`, URLs usually read from files a
Secret mounts), never from the submitter. Each try POSTs the body with

* ``Idempotency-Key: judgequeue:<queue>:<submission>:<request generation>``: the same for every try
  of one request (a redelivery, a rescue after the worker died mid-call, a deferred retry) and new
  for a rejudge, so the endpoint can apply the effect once (:class:`~judgequeue.core.judges.Job`);
* ``X-Deadline-Seconds``: the endpoint's deadline, after which this try is abandoned.

The worker heartbeats the lease while the call runs; a lost lease (a rejudge, a rescue) cancels it,
and the fence refuses whatever the old try would have written. The endpoint's JSON answer becomes
the verdict's details, written through the fence like any verdict.

Every answer is classified once, by :func:`classify` (pure): a timeout, a connection error, a 5xx,
a 408 or a 429 is tried again later (:class:`~judgequeue.core.judges.CallLater`, honouring
``Retry-After``) up to the endpoint's ``tries``; the job holds no worker slot while it waits. What
the request is to blame for ends ``RUNTIME_ERROR`` with its reason: another 4xx (with the answer's
message), and before any call an unknown endpoint name or a body over the bound
(:func:`check_payload`). What the endpoint is to blame for ends ``SYSTEM_ERROR``: an answer that
is not JSON or is over the size bound, a redirect, tries used up. Each endpoint has a concurrency
bound and a rate shared by the whole fleet of the queue's workers (:mod:`.flow`): a job for an
endpoint at its bound waits in its slot for a call to end, within limits that keep a slow tool
from taking the slots other endpoints' jobs need.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any, Literal

from ...base.errors import ConfigError
from ...spec.fields import RATE_MAX, rate_per_second
from ...transport.endpoint_slots import EndpointSlots, Limits
from .. import CallLater, Job, Status, Verdict
from .client import Answer, CallFailed, check_url, post
from .flow import EndpointFlow

ENDPOINTS_VAR = "JUDGEQUEUE_CALL_ENDPOINTS"
MAX_BODY_VAR = "JUDGEQUEUE_CALL_MAX_BODY_BYTES"
MAX_RESPONSE_VAR = "JUDGEQUEUE_CALL_MAX_RESPONSE_BYTES"

#: Defaults of an endpoint's settings.
DEFAULT_CONCURRENCY = 4
DEFAULT_DEADLINE = 60.0
DEFAULT_TRIES = 5
#: Backoff of failed tries: ``BACKOFF_BASE * 2**failures`` seconds, at most ``BACKOFF_CAP``, jittered.
BACKOFF_BASE = 0.5
BACKOFF_CAP = 60.0
#: A ``Retry-After`` is honoured up to this many seconds (a bogus header must not park a job for days).
RETRY_AFTER_CAP = 600.0
#: Seconds a job for an endpoint at its bound that may not wait in its slot (:mod:`.flow`) is
#: deferred for (out of any slot) before it looks again: ``BUSY_DELAY * 2**waits`` (its earlier
#: deferrals), at most ``BUSY_CAP``, jittered. Each costs a deferral (a generation and an outbox
#: row, a dispatch, a lease); backing off keeps jobs queued behind a slow endpoint cheap.
BUSY_DELAY = 0.5
BUSY_CAP = 5.0
#: Characters of an endpoint's error message kept in a verdict.
MESSAGE_CHARS = 500


@dataclass(frozen=True)
class Endpoint:
    """One named endpoint: where it is and how hard it may be called: ``concurrency`` calls at once
    and at most ``rate`` calls a second (0: unlimited), both across every worker of the queue."""

    name: str
    url: str
    concurrency: int = DEFAULT_CONCURRENCY
    deadline: float = DEFAULT_DEADLINE
    tries: int = DEFAULT_TRIES
    rate: float = 0.0

    @property
    def limits(self) -> Limits:
        return Limits(self.concurrency, self.rate)


@dataclass(frozen=True)
class CallSettings:
    """The judge's configuration (from the environment, :func:`load_call_settings`)."""

    endpoints: Mapping[str, Endpoint]
    max_body: int = 256 * 1024
    max_response: int = 1024 * 1024


def _number(where: str, value: Any, kind: type[int] | type[float], low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and not isinstance(value, int)):
        raise ConfigError(f"{where} must be {'an integer' if kind is int else 'a number'}, got {value!r}")
    if not low <= value <= high:
        raise ConfigError(f"{where} must be between {low:g} and {high:g}, got {value!r}")
    return value


def parse_rate(where: str, value: Any) -> float:
    """Calls a second a rate allows: a number (calls a second; 0 for no limit) or ``N/s``, ``N/m``,
    ``N/h`` as in the JudgeQueue; ConfigError naming ``where`` otherwise (pure)."""
    if isinstance(value, str):
        try:
            return rate_per_second(value)
        except ValueError as exc:
            raise ConfigError(f"{where} {exc}") from None
    return float(_number(where, value, float, 0, RATE_MAX))


def load_call_settings(env: Mapping[str, str]) -> CallSettings:
    """Parse :data:`ENDPOINTS_VAR` (a JSON object ``{name: {url | urlFile, concurrency, deadline,
    tries, rate}}``) and the size bounds; a bad value raises ConfigError naming the variable and field.

    ``urlFile`` names a file holding the URL (a Secret's key mounted by the operator), read now so
    a missing Secret stops the worker at start rather than failing every job.
    """
    raw = env.get(ENDPOINTS_VAR, "").strip()
    if not raw:
        raise ConfigError(f"{ENDPOINTS_VAR} must name the endpoints the http-call judge may call (a JSON object)")
    try:
        doc = json.loads(raw)
    except ValueError as exc:
        raise ConfigError(f"{ENDPOINTS_VAR} is not JSON: {exc}") from None
    if not isinstance(doc, dict) or not doc:
        raise ConfigError(f"{ENDPOINTS_VAR} must be a non-empty JSON object of endpoints by name")
    endpoints: dict[str, Endpoint] = {}
    for name, spec in doc.items():
        where = f"{ENDPOINTS_VAR}[{name!r}]"
        if not isinstance(spec, dict):
            raise ConfigError(f"{where} must be an object with url or urlFile")
        unknown = set(spec) - {"url", "urlFile", "concurrency", "deadline", "tries", "rate"}
        if unknown:
            raise ConfigError(f"{where}: unknown field {sorted(unknown)[0]!r}")
        if ("url" in spec) == ("urlFile" in spec):
            raise ConfigError(f"{where} must have exactly one of url and urlFile")
        if "urlFile" in spec:
            try:
                url = Path(str(spec["urlFile"])).read_text().strip()
            except OSError as exc:
                raise ConfigError(f"{where}.urlFile: cannot read {spec['urlFile']!r}: {exc.strerror}") from None
        else:
            url = str(spec["url"])
        try:
            check_url(url)
        except ValueError as exc:
            raise ConfigError(f"{where}: {exc}") from None  # the URL itself may carry a secret: not shown
        endpoints[name] = Endpoint(
            name, url,
            concurrency=int(
                _number(f"{where}.concurrency", spec.get("concurrency", DEFAULT_CONCURRENCY), int, 1, 1024)
            ),
            deadline=float(_number(f"{where}.deadline", spec.get("deadline", DEFAULT_DEADLINE), float, 0.1, 86400)),
            tries=int(_number(f"{where}.tries", spec.get("tries", DEFAULT_TRIES), int, 1, 100)),
            rate=parse_rate(f"{where}.rate", spec.get("rate", 0)),
        )  # fmt: skip
    bounds = {}
    for var, default in ((MAX_BODY_VAR, 256 * 1024), (MAX_RESPONSE_VAR, 1024 * 1024)):
        text = env.get(var, str(default))
        try:
            bounds[var] = int(text)
        except ValueError:
            raise ConfigError(f"{var} must be an integer of bytes, got {text!r}") from None
        if not 1 <= bounds[var] <= 64 * 1024 * 1024:
            raise ConfigError(f"{var} must be between 1 and 67108864 bytes, got {text!r}")
    return CallSettings(endpoints, bounds[MAX_BODY_VAR], bounds[MAX_RESPONSE_VAR])


# --- classification (pure) -------------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    """What one try came to: ``done`` (the verdict), ``retry`` (try again later) or ``fail`` (a
    terminal verdict with its reason)."""

    kind: Literal["done", "retry", "fail"]
    status: Status = "ACCEPTED"
    reason: str = ""
    retry_after: float | None = None
    details: dict[str, Any] = field(default_factory=dict)


def retry_after_seconds(value: str | None, now: datetime | None = None) -> float | None:
    """Seconds a ``Retry-After`` header asks for (delta-seconds or an HTTP date), capped at
    :data:`RETRY_AFTER_CAP`; None when absent or unreadable (pure given ``now``)."""
    if value is None:
        return None
    value = value.strip()
    if value.isdigit():
        return min(float(value), RETRY_AFTER_CAP)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    seconds = (when - (now or datetime.now(UTC))).total_seconds()
    return min(max(seconds, 0.0), RETRY_AFTER_CAP)


def _message(body: bytes) -> str:
    """The human part of an error answer: its JSON ``error``/``message``/``detail``, else its text."""
    try:
        doc = json.loads(body)
    except ValueError:
        doc = None
    if isinstance(doc, dict):
        for key in ("error", "message", "detail"):
            value = doc.get(key)
            if isinstance(value, dict):
                value = value.get("message", value)
            if value:
                return str(value)[:MESSAGE_CHARS]
    return body.decode("utf-8", "replace").strip()[:MESSAGE_CHARS]


def classify(result: Answer | CallFailed | TimeoutError, *, deadline: float) -> Outcome:
    """What a try's result means; the one place answers are interpreted (pure)."""
    if isinstance(result, TimeoutError):
        return Outcome("retry", reason=f"no answer within the deadline of {deadline:g}s")
    if isinstance(result, CallFailed):
        if result.kind == "too_large":
            return Outcome("fail", "SYSTEM_ERROR", f"response too large: {result.detail}")
        return Outcome("retry", reason=f"connection error: {result.detail}")
    status = result.status
    if status == 429 or status == 408 or 500 <= status <= 599:
        after = retry_after_seconds(result.headers.get("retry-after"))
        return Outcome("retry", reason=f"endpoint answered {status}: {_message(result.body)}", retry_after=after)
    if 400 <= status <= 499:
        return Outcome("fail", "RUNTIME_ERROR", f"endpoint refused the request ({status}): {_message(result.body)}",
                       details={"http_status": status})
    if not 200 <= status <= 299:
        return Outcome("fail", "SYSTEM_ERROR", f"endpoint answered {status} (redirects are not followed)",
                       details={"http_status": status})
    try:
        response = json.loads(result.body) if result.body.strip() else None
    except ValueError as exc:
        return Outcome("fail", "SYSTEM_ERROR", f"response is not JSON: {exc}", details={"http_status": status})
    return Outcome("done", "ACCEPTED", details={"http_status": status, "response": response})


def retry_delay(failures: int, retry_after: float | None, *, rand: Callable[[], float] = random.random) -> float:
    """Seconds before the next try after ``failures`` failed ones (>= 1): exponential backoff with
    jitter (half fixed, half random), never sooner than the endpoint's ``Retry-After`` (pure given
    ``rand``)."""
    ceiling = min(BACKOFF_CAP, BACKOFF_BASE * 2 ** max(failures - 1, 0))
    delay = ceiling / 2 + rand() * ceiling / 2
    return float(max(delay, retry_after or 0.0))


def busy_delay(waits: int, *, rand: Callable[[], float] = random.random) -> float:
    """Seconds a job waits after finding its endpoint at its bound ``waits`` times before (pure
    given ``rand``): between half and all of ``BUSY_DELAY * 2**waits``, at most :data:`BUSY_CAP`."""
    ceiling = min(BUSY_CAP, BUSY_DELAY * 2 ** max(waits, 0))
    return float(ceiling / 2 + rand() * ceiling / 2)


def check_payload(payload: Any, settings: CallSettings) -> tuple[Endpoint, bytes] | Verdict:
    """The endpoint and the encoded body a payload asks for, or the terminal verdict saying what is
    wrong with it (pure)."""
    if not isinstance(payload, dict) or not isinstance(payload.get("endpoint"), str):
        return Verdict("RUNTIME_ERROR", {"reason": 'payload must be an object {"endpoint": name, "body": JSON}'})
    unknown = set(payload) - {"endpoint", "body"}
    if unknown:
        return Verdict("RUNTIME_ERROR", {"reason": f"payload: unknown field {sorted(unknown)[0]!r}"})
    name = payload["endpoint"]
    endpoint = settings.endpoints.get(name)
    if endpoint is None:
        known = ", ".join(sorted(settings.endpoints))
        return Verdict("RUNTIME_ERROR", {"reason": f"unknown endpoint {name[:100]!r} (this queue calls: {known})"})
    body = json.dumps(payload.get("body"), separators=(",", ":")).encode()
    if len(body) > settings.max_body:
        return Verdict("RUNTIME_ERROR", {
            "reason": f"body is {len(body)} bytes, over the limit of {settings.max_body} bytes", "endpoint": name,
        })  # fmt: skip
    return endpoint, body


# --- the judge -------------------------------------------------------------------------------------


class HttpCallJudge:
    """Judges a job by calling its endpoint once per try (see the module's docstring)."""

    def __init__(self, settings: CallSettings | None = None) -> None:
        self.settings = settings or load_call_settings(os.environ)
        self.flow: EndpointFlow | None = None

    def attach_redis(self, redis: Any, worker_slots: int) -> None:
        """The worker's Redis, where the endpoints' slots are counted across the fleet."""
        self.flow = EndpointFlow(EndpointSlots(redis), worker_slots=worker_slots)

    async def judge(self, payload: Any) -> Verdict:
        """Without the job's identity there is no idempotency key: refuse rather than call unsafely."""
        return Verdict("SYSTEM_ERROR", {"reason": "the http-call judge needs a worker that passes the job's identity"})

    async def judge_job(self, job: Job, payload: Any) -> Verdict:
        checked = check_payload(payload, self.settings)
        if isinstance(checked, Verdict):
            return checked
        endpoint, body = checked
        if self.flow is None:
            return Verdict("SYSTEM_ERROR", {"reason": "the http-call judge needs a worker that attaches Redis"})
        # Its earlier deferrals for a busy endpoint: the request's generations that were not failed
        # tries (a rescue counts too).
        waits = job.generation - job.request_generation - job.failures
        result = await self.flow.call(
            job.queue, endpoint.name, endpoint.limits, lambda: self._try(endpoint, body, job),
            defer_for=busy_delay(waits),
        )  # fmt: skip
        outcome = classify(result, deadline=endpoint.deadline)
        tries = job.failures + 1
        base = {"endpoint": endpoint.name, "idempotency_key": job.idempotency_key, "tries": tries}
        if outcome.kind == "done":
            return Verdict(outcome.status, {**base, **outcome.details})
        if outcome.kind == "fail":
            return Verdict(outcome.status, {**base, **outcome.details, "reason": outcome.reason})
        if tries >= endpoint.tries:
            return Verdict("SYSTEM_ERROR", {**base, "reason": f"gave up after {tries} tries: {outcome.reason}"})
        raise CallLater(retry_delay(tries, outcome.retry_after), outcome.reason)

    async def _try(self, endpoint: Endpoint, body: bytes, job: Job) -> Answer | CallFailed | TimeoutError:
        headers = {
            "Content-Type": "application/json",
            "Idempotency-Key": job.idempotency_key,
            "X-Deadline-Seconds": f"{endpoint.deadline:g}",
        }
        try:
            async with asyncio.timeout(endpoint.deadline):
                return await post(endpoint.url, body, headers, max_response=self.settings.max_response)
        except CallFailed as exc:
            return exc
        except TimeoutError as exc:
            return exc
