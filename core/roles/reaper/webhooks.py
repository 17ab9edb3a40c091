"""Webhook delivery: each verdict event of the queue POSTed to every configured endpoint, at least
once, in generation order per submission (docs/events.md).

The reaper runs it beside its maintainers (a task of its own, so a slow endpoint never delays a
lease rescue). Everything it must not forget is in Postgres (:mod:`judgequeue.core.store.events`):
each endpoint's read position, its deliveries with their attempts and next try, the dead-letter
list. A deliverer claims deliveries for a while (the endpoint's deadline and a margin), so one
killed mid-POST leaves claims that expire and are sent again by whoever runs next: the receiver
may see a delivery twice, never zero times, and dedupes on ``Idempotency-Key``
(``queue:submission:generation``). Several reapers share an endpoint's concurrency bound.

Configured by ``JUDGEQUEUE_WEBHOOKS``: a JSON object of endpoints by name, each
``{"url" | "urlFile", "secret" | "secretFile", "concurrency", "maxAttempts", "deadline"}``. An
endpoint whose configuration is wrong (no secret, a bad URL, an unreadable file) is not called:
its events still become deliveries that wait, the reaper logs one error naming the endpoint and
the field, and ``judgequeue_webhook_config_error{endpoint}`` is 1, so nothing is dropped silently.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import logging
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg

from ...base import metrics
from ...base.errors import DB_ERRORS, describe
from ...judges.http_call.client import Answer, CallFailed, check_url, post
from ...judges.http_call.judge import retry_after_seconds
from ...runtime.lifecycle import backoff
from ...store import events
from ...transport.connect import STATEMENT_TIMEOUT, connect_postgres

log = logging.getLogger("judgequeue.webhooks")

WEBHOOKS_VAR = "JUDGEQUEUE_WEBHOOKS"
#: Header carrying ``t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">`` under the endpoint's secret.
SIGNATURE_HEADER = "Judgequeue-Signature"
DEFAULT_CONCURRENCY = 4
DEFAULT_MAX_ATTEMPTS = 20
DEFAULT_DEADLINE = 10.0
#: Seconds a claim outlives the endpoint's deadline (a deliverer killed mid-POST is re-sent after both).
CLAIM_MARGIN = 2.0
#: Backoff between tries: from BACKOFF_BASE doubling to BACKOFF_CAP, with jitter; never sooner than Retry-After.
BACKOFF_BASE = 0.5
BACKOFF_CAP = 60.0
#: Seconds between looks for due retries while nothing is announced.
POLL = 0.5
#: Seconds between reads of an endpoint's figures (the gauges).
STATS_EVERY = 2.0
#: Bytes of an endpoint's answer read (only its status and headers matter).
MAX_ANSWER = 64 * 1024
#: Answers that mean "try again later"; any other non-2xx is the receiver refusing the event (dead-lettered).
RETRY_STATUSES = frozenset({408, 425, 429})


@dataclass(frozen=True)
class Endpoint:
    """One configured webhook endpoint (``problem`` set: misconfigured, not called)."""

    name: str
    url: str = ""
    secret: bytes = b""
    concurrency: int = DEFAULT_CONCURRENCY
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    deadline: float = DEFAULT_DEADLINE
    problem: str | None = None


def _read(where: str, spec: Mapping[str, Any], inline: str, from_file: str) -> str:
    if (inline in spec) == (from_file in spec):
        raise ValueError(f"{where} must have exactly one of {inline} and {from_file}")
    if inline in spec:
        value = spec[inline]
        if not isinstance(value, str) or not value:
            raise ValueError(f"{where}.{inline} must be a non-empty string")
        return value
    try:
        text = Path(str(spec[from_file])).read_text().strip()
    except OSError as exc:
        raise ValueError(f"{where}.{from_file}: cannot read {spec[from_file]!r}: {exc.strerror}") from None
    if not text:
        raise ValueError(f"{where}.{from_file}: {spec[from_file]!r} is empty")
    return text


def _number(where: str, value: Any, low: float, high: float, integer: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or (integer and not isinstance(value, int)):
        raise ValueError(f"{where} must be {'an integer' if integer else 'a number'}, got {value!r}")
    if not low <= value <= high:
        raise ValueError(f"{where} must be between {low:g} and {high:g}, got {value!r}")
    return value


def _endpoint(name: str, spec: Any) -> Endpoint:
    where = f"{WEBHOOKS_VAR}[{name!r}]"
    if not isinstance(spec, dict):
        raise ValueError(f"{where} must be an object with url (or urlFile) and secret (or secretFile)")
    unknown = set(spec) - {"url", "urlFile", "secret", "secretFile", "concurrency", "maxAttempts", "deadline"}
    if unknown:
        raise ValueError(f"{where}: unknown field {sorted(unknown)[0]!r}")
    url = _read(where, spec, "url", "urlFile")
    try:
        check_url(url)
    except ValueError as exc:
        raise ValueError(f"{where}.url: {exc}") from None  # the URL itself may carry a secret: not shown
    secret = _read(where, spec, "secret", "secretFile")
    return Endpoint(
        name, url, secret.encode(),
        concurrency=int(_number(f"{where}.concurrency", spec.get("concurrency", DEFAULT_CONCURRENCY), 1, 256, True)),
        max_attempts=int(_number(f"{where}.maxAttempts", spec.get("maxAttempts", DEFAULT_MAX_ATTEMPTS), 1, 1000, True)),
        deadline=float(_number(f"{where}.deadline", spec.get("deadline", DEFAULT_DEADLINE), 0.1, 300, False)),
    )  # fmt: skip


def load_webhooks(env: Mapping[str, str]) -> tuple[list[Endpoint], str | None]:
    """The endpoints ``JUDGEQUEUE_WEBHOOKS`` configures (one with ``problem`` set for each that is
    wrong, naming the field), and a problem of the variable as a whole (not JSON, not an object of
    endpoints by name); unset: none at all (pure but for reading ``urlFile``/``secretFile``)."""
    raw = env.get(WEBHOOKS_VAR, "").strip()
    if not raw:
        return [], None
    try:
        doc = json.loads(raw)
    except ValueError as exc:
        return [], f"{WEBHOOKS_VAR} is not JSON: {exc}"
    if not isinstance(doc, dict):
        return [], f"{WEBHOOKS_VAR} must be a JSON object of endpoints by name"
    found = []
    for name, spec in doc.items():
        if not isinstance(name, str) or not name or len(name) > 63:
            return [], f"{WEBHOOKS_VAR}: endpoint names are 1-63 characters, got {name!r}"
        try:
            found.append(_endpoint(name, spec))
        except ValueError as exc:
            found.append(Endpoint(name, problem=str(exc)))
    return found, None


def signature(secret: bytes, timestamp: int, body: bytes) -> str:
    """The :data:`SIGNATURE_HEADER` value: ``t=<timestamp>,v1=<hex HMAC-SHA256 of "<timestamp>.<body>">`` (pure)."""
    mac = hmac.new(secret, str(timestamp).encode() + b"." + body, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={mac}"


@dataclass(frozen=True)
class Outcome:
    """What one POST came to: ``delivered``, ``retry`` (after ``delay`` at least) or ``refused`` (dead-lettered)."""

    kind: str
    error: str = ""
    retry_after: float | None = None


def classify(result: Answer | CallFailed | TimeoutError, deadline: float) -> Outcome:
    """What an endpoint's answer means (pure)."""
    if isinstance(result, TimeoutError):
        return Outcome("retry", f"no answer within {deadline:g}s")
    if isinstance(result, CallFailed):
        return Outcome("retry", f"{result.kind}: {result.detail}")
    if 200 <= result.status <= 299:
        return Outcome("delivered")
    after = retry_after_seconds(result.headers.get("retry-after"))
    if result.status in RETRY_STATUSES or 500 <= result.status <= 599:
        return Outcome("retry", f"answered {result.status}", after)
    return Outcome("refused", f"answered {result.status} (refused; replay it once the receiver takes it)")


def retry_delay(attempts: int, retry_after: float | None, *, rand: Callable[[], float] = random.random) -> float:
    """Seconds before the next try after ``attempts`` (>= 1): exponential backoff with jitter, never
    sooner than the endpoint's ``Retry-After`` (pure given ``rand``)."""
    ceiling = min(BACKOFF_CAP, BACKOFF_BASE * 2 ** max(attempts - 1, 0))
    return float(max(ceiling / 2 + rand() * ceiling / 2, retry_after or 0.0))


def endpoint_key(queue: str, name: str) -> str:
    """The endpoint's row name in Postgres: one per queue and configured name."""
    return f"{queue}/{name}"


class Deliverer:
    """Delivers one queue's events to its configured endpoints until stopped."""

    def __init__(
        self, pool: asyncpg.Pool, queue: str, endpoints: list[Endpoint], owner: str, *, listen_dsn: str | None,
        problem: str | None = None,
    ) -> None:  # fmt: skip
        self.pool, self.queue, self.owner, self.listen_dsn = pool, queue, owner, listen_dsn
        self.endpoints = endpoints
        self.problem = problem
        self.wakes = {ep.name: asyncio.Event() for ep in endpoints}
        self.delivered = 0  # for tests and logs

    async def run(self, stop: asyncio.Event) -> None:
        if self.problem is not None:
            log.error("webhooks not delivered: bad configuration", extra={"error": self.problem})
            metrics.WEBHOOK_CONFIG_ERROR.labels(self.queue, "*").set(1)
        for ep in self.endpoints:
            metrics.WEBHOOK_CONFIG_ERROR.labels(self.queue, ep.name).set(0 if ep.problem is None else 1)
            if ep.problem is not None:
                log.error("webhook endpoint not called: bad configuration",
                          extra={"endpoint": ep.name, "error": ep.problem})  # fmt: skip
        tasks = [asyncio.ensure_future(self._listen(stop))]
        tasks += [asyncio.ensure_future(self._endpoint(ep, stop)) for ep in self.endpoints]
        try:
            await stop.wait()
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError, *DB_ERRORS):
                    await task

    async def _listen(self, stop: asyncio.Event) -> None:
        """Wake every endpoint at every verdict event of the queue; the polls cover any gap while reconnecting."""
        if self.listen_dsn is None:
            return
        failures = 0
        lost = asyncio.Event()

        def ended(_conn: object) -> None:
            lost.set()

        while not stop.is_set():
            conn: asyncpg.Connection | None = None
            lost.clear()
            try:
                conn = await connect_postgres(self.listen_dsn, timeout=STATEMENT_TIMEOUT)
                await conn.add_listener(events.CHANNEL, self._announced)
                conn.add_termination_listener(ended)
                failures = 0
                self._wake_all()  # anything announced while not listening
                await lost.wait()
            except DB_ERRORS:
                failures += 1
                await asyncio.sleep(backoff(failures))
            finally:
                if conn is not None:
                    conn.terminate()

    def _announced(self, _conn: object, _pid: int, _channel: str, payload: str) -> None:
        if payload == self.queue:
            self._wake_all()

    def _wake_all(self) -> None:
        for wake in self.wakes.values():
            wake.set()

    async def _endpoint(self, ep: Endpoint, stop: asyncio.Event) -> None:
        """Turn events into deliveries and send them, ``ep.concurrency`` at a time, until stopped."""
        name = endpoint_key(self.queue, ep.name)
        inflight: set[asyncio.Task[None]] = set()
        accepted: list[int] = []  # deliveries the endpoint took, forgotten in one statement by the loop
        done = asyncio.Event()
        failures = 0
        ensured = False
        stats_at = 0.0
        try:
            wake = self.wakes[ep.name]
            while not stop.is_set():
                wake.clear()
                done.clear()
                try:
                    async with self.pool.acquire(timeout=STATEMENT_TIMEOUT) as conn:
                        if not ensured:
                            await events.ensure_endpoint(conn, name, self.queue)
                            ensured = True
                        await self._forget(conn, ep, name, accepted)
                        while await events.ingest(conn, name, limit=500) == 500:
                            pass
                        claimed = []
                        if ep.problem is None:
                            claimed = await events.claim(
                                conn, name, concurrency=ep.concurrency, owner=self.owner,
                                claim_ttl=ep.deadline + CLAIM_MARGIN,
                            )  # fmt: skip
                        if time.monotonic() - stats_at >= STATS_EVERY:
                            pending, dead, age = await events.stats(conn, name)
                            stats_at = time.monotonic()
                            metrics.WEBHOOK_PENDING.labels(self.queue, ep.name).set(pending)
                            metrics.WEBHOOK_DEAD.labels(self.queue, ep.name).set(dead)
                            metrics.WEBHOOK_OLDEST_PENDING_AGE.labels(self.queue, ep.name).set(age)
                    failures = 0
                except DB_ERRORS as exc:
                    failures += 1
                    log.warning("webhook deliveries: database unavailable",
                                extra={"endpoint": ep.name, "error": describe(exc)})  # fmt: skip
                    await asyncio.sleep(backoff(failures))
                    continue
                for delivery in claimed:
                    task = asyncio.ensure_future(self._send(ep, name, delivery, stop, accepted))
                    inflight.add(task)
                    task.add_done_callback(inflight.discard)
                    task.add_done_callback(lambda _t: done.set())
                waits = [asyncio.ensure_future(e.wait()) for e in (wake, done, stop)]
                try:
                    await asyncio.wait(waits, timeout=POLL, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for w in waits:
                        w.cancel()
        finally:
            for task in inflight:
                task.cancel()
            with contextlib.suppress(Exception):
                async with asyncio.timeout(STATEMENT_TIMEOUT):
                    async with self.pool.acquire() as conn:
                        await self._forget(conn, ep, name, accepted)
                        await events.release(conn, name, self.owner)

    async def _forget(self, conn: asyncpg.Connection, ep: Endpoint, name: str, accepted: list[int]) -> None:
        """Forget the deliveries the endpoint took since the last call, in one statement. Until then
        their claims keep them (a deliverer killed first leaves them to be sent again: at least once)."""
        if not accepted:
            return
        batch = list(accepted)
        lags = await events.delivered(conn, name, batch, self.owner)
        del accepted[: len(batch)]
        self.delivered += len(lags)
        for lag in lags:
            metrics.WEBHOOK_LATENCY.labels(self.queue, ep.name).observe(max(lag, 0.0))

    async def _send(
        self, ep: Endpoint, name: str, delivery: events.Delivery, stop: asyncio.Event, accepted: list[int]
    ) -> None:
        body = delivery.body.encode()
        key = f"{self.queue}:{delivery.submission_id}:{delivery.generation}"
        headers = {
            "Content-Type": "application/json",
            "Idempotency-Key": key,
            "Judgequeue-Event": str(delivery.event_id),
            "Judgequeue-Attempt": str(delivery.attempts),
            SIGNATURE_HEADER: signature(ep.secret, int(time.time()), body),
            "User-Agent": "judgequeue-webhooks",
        }
        result: Answer | CallFailed | TimeoutError
        try:
            result = await asyncio.wait_for(post(ep.url, body, headers, max_response=MAX_ANSWER), ep.deadline)
        except (TimeoutError, CallFailed) as exc:
            result = exc
        outcome = classify(result, ep.deadline)
        metrics.WEBHOOK_DELIVERIES.labels(self.queue, ep.name, outcome.kind).inc()
        if outcome.kind == "delivered":
            accepted.append(delivery.event_id)
            return
        failures = 0
        while True:  # the failure must reach Postgres; until it does, the claim keeps the delivery
            try:
                async with self.pool.acquire(timeout=STATEMENT_TIMEOUT) as conn:
                    state = await events.failed(
                        conn, name, delivery.event_id, self.owner, max_attempts=ep.max_attempts,
                        delay=retry_delay(delivery.attempts, outcome.retry_after), error=outcome.error,
                        permanent=outcome.kind == "refused",
                    )  # fmt: skip
                if state == "DEAD":
                    log.error("webhook delivery dead-lettered", extra={
                        "endpoint": ep.name, "event": delivery.event_id, "key": key,
                        "attempts": delivery.attempts, "error": outcome.error,
                    })  # fmt: skip
                return
            except DB_ERRORS as exc:
                failures += 1
                if stop.is_set() or failures > 20:
                    log.warning("webhook outcome not recorded; the claim's expiry sends it again", extra={
                        "endpoint": ep.name, "event": delivery.event_id, "error": describe(exc),
                    })  # fmt: skip
                    return
                await asyncio.sleep(backoff(failures))
