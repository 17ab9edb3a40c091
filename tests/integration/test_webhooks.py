"""Webhook delivery against real Postgres and a receiver of the test's own (docs/events.md): a
refused delivery is dead-lettered and replayed; Retry-After is honoured; an unreachable endpoint
runs out of attempts into the dead-letter list; a misconfigured endpoint is named and its events
wait, never dropped; and the configuration is refused field by field."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest

from judgequeue.core.base import metrics
from judgequeue.core.roles.reaper.webhooks import Deliverer, Endpoint, endpoint_key, load_webhooks, signature
from judgequeue.core.store import events, leases, outbox
from judgequeue.core.store.queues import create_queue
from tests.support.waiting import eventually
from tests.support.webhook_receiver import Receiver

SECRET = b"whsec-integration"
ROOT = Path(__file__).resolve().parents[2]


@contextlib.asynccontextmanager
async def delivering(pool: asyncpg.Pool, dsn: str, queue: str, *endpoints: Endpoint) -> AsyncIterator[Deliverer]:
    deliverer = Deliverer(pool, queue, list(endpoints), "test-deliverer", listen_dsn=dsn)
    stop = asyncio.Event()
    task = asyncio.ensure_future(deliverer.run(stop))
    try:
        yield deliverer
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)


async def _verdicts(pool: asyncpg.Pool, queue: str, count: int) -> list[int]:
    async with pool.acquire() as conn:
        await create_queue(conn, queue)
        ids = [await outbox.submit(conn, queue, {}) for _ in range(count)]
        for sid in ids:
            [lease] = await leases.acquire(conn, queue, [(sid, 1)], ttl=30)
            await leases.write_verdicts(conn, [leases.VerdictWrite(lease, "ACCEPTED", {"status": "ACCEPTED"})])
    return ids


async def test_a_refused_delivery_is_dead_lettered_then_replayed(
    pg_pool: asyncpg.Pool, pg_dsn: str, queue_name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from judgequeue.core.cli import main

    cli = ["--endpoint", "board", "--postgres-dsn", pg_dsn, "--queue", queue_name, "--json"]
    receiver = Receiver(SECRET, script=[(400, None)])
    await receiver.start()
    [sid] = await _verdicts(pg_pool, queue_name, 1)
    name = endpoint_key(queue_name, "board")
    endpoint = Endpoint("board", receiver.url, SECRET, deadline=2)
    try:
        async with delivering(pg_pool, pg_dsn, queue_name, endpoint):

            async def dead() -> list[dict[str, object]]:
                async with pg_pool.acquire() as conn:
                    return await events.dead(conn, name)

            [letter] = await eventually(dead, within=20, what="the refused delivery dead-lettered")
            assert letter["submission_id"] == sid and "answered 400" in str(letter["last_error"])
            assert receiver.deliveries == {}  # refused: no effect
            capsys.readouterr()
            assert await asyncio.to_thread(main, ["events", "dead", *cli]) == 0
            [listed] = json.loads(capsys.readouterr().out)
            assert (listed["event_id"], listed["body"]["submission"]) == (letter["event_id"], sid)
            assert await asyncio.to_thread(main, ["events", "replay", *cli]) == 2  # ids or --all
            assert await asyncio.to_thread(main, ["events", "replay", "--all", *cli]) == 0
            assert json.loads(capsys.readouterr().out) == {"replayed": [letter["event_id"]]}
            await eventually(lambda: receiver.deliveries, within=20, what="the replayed delivery")
        assert dict(receiver.deliveries) == {f"{queue_name}:{sid}:1": 1}
        async with pg_pool.acquire() as conn:
            assert await events.stats(conn, name) == (0, 0, 0.0)
    finally:
        await receiver.stop()


async def test_retry_after_is_honoured(pg_pool: asyncpg.Pool, pg_dsn: str, queue_name: str) -> None:
    receiver = Receiver(SECRET, script=[(503, 3)])
    await receiver.start()
    await _verdicts(pg_pool, queue_name, 1)
    name = endpoint_key(queue_name, "board")
    try:
        async with delivering(pg_pool, pg_dsn, queue_name, Endpoint("board", receiver.url, SECRET)):

            async def waiting_for() -> float | None:
                async with pg_pool.acquire() as conn:
                    return await conn.fetchval(  # type: ignore[no-any-return]
                        "SELECT extract(epoch FROM next_attempt_at - now())::float8 FROM judgequeue.webhook_deliveries"
                        " WHERE endpoint = $1 AND attempts = 1 AND claimed_by IS NULL", name)  # fmt: skip

            delay = await eventually(waiting_for, within=20, what="the 503 recorded")
            assert delay is not None and 2.0 < delay <= 3.0  # Retry-After: 3, not the first backoff step (0.25-0.5 s)
            await eventually(lambda: receiver.deliveries, within=20, what="the delivery after Retry-After")
    finally:
        await receiver.stop()


async def test_an_unreachable_endpoint_runs_out_of_attempts_into_the_dead_letters(
    pg_pool: asyncpg.Pool, pg_dsn: str, queue_name: str
) -> None:
    closed = Receiver(SECRET)
    await closed.start()
    await closed.stop()  # a port nobody listens on
    ids = await _verdicts(pg_pool, queue_name, 2)
    name = endpoint_key(queue_name, "gone")
    async with delivering(pg_pool, pg_dsn, queue_name, Endpoint("gone", closed.url, SECRET, max_attempts=2)):

        async def dead() -> list[dict[str, object]]:
            async with pg_pool.acquire() as conn:
                found = await events.dead(conn, name)
            return found if len(found) == 2 else []

        letters = await eventually(dead, within=30, what="both deliveries dead")
    assert sorted(int(str(d["submission_id"])) for d in letters) == ids
    assert all(d["attempts"] == 2 and "cannot connect" in str(d["last_error"]) for d in letters)


async def test_a_misconfigured_endpoint_is_named_and_its_events_wait(
    pg_pool: asyncpg.Pool, pg_dsn: str, queue_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    [broken], problem = load_webhooks({"JUDGEQUEUE_WEBHOOKS": json.dumps({"board": {"url": "http://127.0.0.1:9/x"}})})
    assert problem is None and broken.problem is not None and "secret" in broken.problem
    ids = await _verdicts(pg_pool, queue_name, 3)
    name = endpoint_key(queue_name, "board")
    async with delivering(pg_pool, pg_dsn, queue_name, broken):

        async def waiting() -> bool:
            async with pg_pool.acquire() as conn:
                return (await events.stats(conn, name))[0] == 3

        await eventually(waiting, within=20, what="the events kept as deliveries")
        assert metrics.WEBHOOK_CONFIG_ERROR.labels(queue_name, "board")._value.get() == 1
    assert any("bad configuration" in r.getMessage() and getattr(r, "endpoint", "") == "board" for r in caplog.records)
    receiver = Receiver(SECRET)
    await receiver.start()
    try:  # fixed: everything that waited is delivered
        async with delivering(pg_pool, pg_dsn, queue_name, Endpoint("board", receiver.url, SECRET)):
            await eventually(lambda: len(receiver.deliveries) == 3, within=20, what="the waiting deliveries")
        assert metrics.WEBHOOK_CONFIG_ERROR.labels(queue_name, "board")._value.get() == 0
        assert sorted(int(k.split(":")[1]) for k in receiver.deliveries) == ids
    finally:
        await receiver.stop()


def test_the_configuration_is_refused_field_by_field(tmp_path: Path) -> None:
    def problem_of(doc: object) -> str | None:
        found, whole = load_webhooks({"JUDGEQUEUE_WEBHOOKS": json.dumps(doc)})
        return whole if whole is not None else found[0].problem

    assert load_webhooks({}) == ([], None)
    assert "is not JSON" in str(load_webhooks({"JUDGEQUEUE_WEBHOOKS": "{"})[1])
    assert "JSON object of endpoints" in str(problem_of(["x"]))
    assert problem_of({"b": {"secret": "s"}}) == "JUDGEQUEUE_WEBHOOKS['b'] must have exactly one of url and urlFile"
    assert "exactly one of secret and secretFile" in str(problem_of({"b": {"url": "http://h/"}}))
    bad_url = problem_of({"b": {"url": "ftp://user:pw@h/", "secret": "s"}})
    assert bad_url is not None and "['b'].url: URL scheme must be http or https" in bad_url and "pw" not in bad_url
    missing = problem_of({"b": {"urlFile": str(tmp_path / "none"), "secret": "s"}})
    assert missing is not None and "['b'].urlFile: cannot read" in missing
    assert "['b'].concurrency must be between 1 and 256" in str(
        problem_of({"b": {"url": "http://h/", "secret": "s", "concurrency": 0}})
    )
    assert "unknown field 'retries'" in str(problem_of({"b": {"url": "http://h/", "secret": "s", "retries": 1}}))
    (tmp_path / "url").write_text("https://hooks.example/x\n")
    (tmp_path / "secret").write_text("s3\n")
    spec = {"urlFile": str(tmp_path / "url"), "secretFile": str(tmp_path / "secret"), "deadline": 2.5}
    [ok], whole = load_webhooks({"JUDGEQUEUE_WEBHOOKS": json.dumps({"b": spec})})
    assert whole is None and ok == Endpoint("b", "https://hooks.example/x", b"s3", deadline=2.5)
    # The signature: HMAC-SHA256 of "<t>.<body>", as a receiver recomputes it.
    assert signature(b"key", 1700000000, b"{}") == (
        "t=1700000000,v1=" + hmac.new(b"key", b"1700000000.{}", "sha256").hexdigest()
    )


def _scoreboard(tmp_path: Path) -> subprocess.Popen[str]:
    """The example scoreboard as a process of its own, on a free port it prints first."""
    return subprocess.Popen(
        [sys.executable, str(ROOT / "examples" / "scoreboard" / "receiver.py"), "--port", "0",
         "--db", str(tmp_path / "board.sqlite")],
        env={**os.environ, "SCOREBOARD_SECRET": SECRET.decode()}, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip


async def test_a_rejudge_changing_100_verdicts_is_100_events_on_the_example_scoreboard(
    pg_pool: asyncpg.Pool, pg_dsn: str, queue_name: str, tmp_path: Path
) -> None:
    """100 verdicts, then a rejudge that changes each: 100 more events, and the example scoreboard
    (examples/scoreboard/receiver.py, a process of its own) shows every one at its new verdict."""
    receiver = _scoreboard(tmp_path)
    try:
        assert receiver.stdout is not None
        url = (await asyncio.to_thread(receiver.stdout.readline)).split()[-1]
        ids = await _verdicts(pg_pool, queue_name, 100)
        async with pg_pool.acquire() as conn:
            before = await events.head(conn)
            for sid in ids:
                async with conn.transaction():
                    assert await outbox.rejudge(conn, sid) == 2
                [lease] = await leases.acquire(conn, queue_name, [(sid, 2)], ttl=30)
                verdict = {"status": "WRONG_ANSWER", "details": {"score": 40}}
                await leases.write_verdicts(conn, [leases.VerdictWrite(lease, "WRONG_ANSWER", verdict)])
            assert len(await events.read(conn, before, queue=queue_name, limit=1000)) == 100

        def board() -> list[dict[str, object]]:
            with urllib.request.urlopen(url + "board.json", timeout=5) as answer:
                rows: list[dict[str, object]] = json.loads(answer.read())
            return rows

        async def shown() -> list[dict[str, object]] | None:
            rows = await asyncio.to_thread(board)
            return rows if len(rows) == 100 and all(r["generation"] == 2 for r in rows) else None

        endpoint = Endpoint("board", url + "hook", SECRET, concurrency=8)
        async with delivering(pg_pool, pg_dsn, queue_name, endpoint) as deliverer:
            rows = await eventually(shown, within=60, every=0.2, what="the scoreboard at every new verdict")
            await eventually(lambda: deliverer.delivered == 200, within=30, what="all 200 events delivered")
        assert rows is not None
        assert sorted(int(str(r["submission"])) for r in rows) == ids
        assert {(r["status"], r["score"]) for r in rows} == {("WRONG_ANSWER", 40)}
    finally:
        receiver.terminate()
        receiver.wait(10)
