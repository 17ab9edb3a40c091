"""The http-call judge in a real worker, against real Postgres, Redis and HTTP (the example tool server).

What is checked: the answer is the verdict's details, written through the fence; 429/503 are tried
again later with the same idempotency key (the job deferred out of the worker's slots, a new
generation of the same request); a 4xx and every bad input is a terminal verdict with its reason and
the worker goes on; retries are bounded; a rejudge during a call gets a new key and the old try's
result is refused by the fence; a lost lease cancels the call; a hung endpoint and a 429/503 storm
leave the other endpoints the worker's slots.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest

from judgequeue.core.base import metrics
from judgequeue.core.judges.http_call import CallSettings, Endpoint, HttpCallJudge
from judgequeue.core.roles.worker import cancels
from judgequeue.core.store import outbox
from judgequeue.core.transport.endpoint_slots import EndpointSlots, Limits
from tests.support.tool_server import RawServer, ToolServer, http_answer, tool_server
from tests.support.waiting import eventually
from tests.support.worker_harness import Harness


def judge(*endpoints: Endpoint, max_body: int = 1024, max_response: int = 4096) -> HttpCallJudge:
    return HttpCallJudge(CallSettings({e.name: e for e in endpoints}, max_body=max_body, max_response=max_response))


async def verdict(h: Harness, sid: int) -> dict[str, Any]:
    row = await h.row(sid)
    doc: dict[str, Any] = json.loads(row["verdict"])
    return doc


async def finished(h: Harness, sid: int) -> bool:
    return (await h.row(sid))["status"] not in ("PENDING", "JUDGING")


async def test_the_answer_is_the_verdict_and_the_effect_is_applied_once(h: Harness) -> None:
    with tool_server("--delay", "0") as tool:
        w = h.worker(judge(Endpoint("tool", tool.url + "/effect")))
        [sid] = await h.submit({"endpoint": "tool", "body": {"order": 42}})
        await eventually(lambda: finished(h, sid))
        doc = await verdict(h, sid)
        key = f"judgequeue:{h.queue}:{sid}:1"
        assert doc["status"] == "ACCEPTED"
        assert doc["details"] == {
            "endpoint": "tool", "idempotency_key": key, "tries": 1, "http_status": 200,
            "response": {"effect": "applied", "key": key, "echo": {"order": 42}},
        }  # fmt: skip
        assert await tool.aeffects() == {"applied": {key: 1}, "calls": {key: 1}}
        assert w.stats.written == 1


async def test_429_and_503_are_tried_later_with_the_same_key_out_of_the_slots(h: Harness) -> None:
    deferred = metrics.JOBS_DEFERRED.labels(h.queue, "failed")
    with tool_server("--delay", "0", "--fail-first", "2") as tool:
        w = h.worker(judge(Endpoint("tool", tool.url, tries=5)))
        [sid] = await h.submit({"endpoint": "tool", "body": {}})
        await eventually(lambda: finished(h, sid), within=20)
        doc = await verdict(h, sid)
        key = f"judgequeue:{h.queue}:{sid}:1"
        assert doc["status"] == "ACCEPTED" and doc["details"]["tries"] == 3
        assert await tool.aeffects() == {"applied": {key: 1}, "calls": {key: 3}}
        row = await h.pool.fetchrow(
            "SELECT generation, request_generation, call_failures, retry_count FROM judgequeue.submissions"
            " WHERE id = $1", sid,
        )  # fmt: skip
        # Each deferral was a new generation of the same request (the fence moved on, the key did not),
        # and none counted as a lease expiry.
        assert dict(row) == {"generation": 3, "request_generation": 1, "call_failures": 2, "retry_count": 0}
        # The deferred outbox rows waited for the endpoint's Retry-After (1 s) before being dispatched again.
        waits = await h.pool.fetch(
            "SELECT extract(epoch FROM next_attempt_at - created_at) AS wait, last_error FROM judgequeue.outbox"
            " WHERE submission_id = $1 AND generation > 1 ORDER BY generation", sid,
        )  # fmt: skip
        assert [r["wait"] >= 1.0 for r in waits] == [True, True]
        assert all("endpoint answered" in r["last_error"] for r in waits)
        assert w.in_flight == 0 and deferred._value.get() == 2


async def test_a_4xx_is_terminal_with_the_answers_message(h: Harness) -> None:
    with tool_server("--delay", "0") as tool:
        h.worker(judge(Endpoint("tool", tool.url)))
        [sid] = await h.submit({"endpoint": "tool", "body": {"reject": "no such customer"}})
        await eventually(lambda: finished(h, sid))
        doc = await verdict(h, sid)
        assert doc["status"] == "RUNTIME_ERROR"
        assert doc["reason"] == "endpoint refused the request (422): rejected: no such customer"
        assert doc["details"]["http_status"] == 422 and doc["details"]["tries"] == 1


async def test_retries_are_bounded(h: Harness) -> None:
    with tool_server("--storm") as tool:
        h.worker(judge(Endpoint("tool", tool.url, tries=2)))
        [sid] = await h.submit({"endpoint": "tool", "body": {}})
        await eventually(lambda: finished(h, sid), within=20)
        doc = await verdict(h, sid)
        assert doc["status"] == "SYSTEM_ERROR"
        assert doc["reason"].startswith("gave up after 2 tries: endpoint answered")
        assert sum((await tool.aeffects())["calls"].values()) == 2


async def test_a_call_past_its_deadline_is_abandoned_and_tried_again(h: Harness) -> None:
    with tool_server("--hang") as tool:
        h.worker(judge(Endpoint("tool", tool.url, deadline=0.3, tries=2)))
        [sid] = await h.submit({"endpoint": "tool", "body": {}})
        await eventually(lambda: finished(h, sid), within=20)
        doc = await verdict(h, sid)
        assert doc["status"] == "SYSTEM_ERROR"
        assert doc["reason"] == "gave up after 2 tries: no answer within the deadline of 0.3s"
        assert tool.effects()["calls"] == {f"judgequeue:{h.queue}:{sid}:1": 2}


async def test_bad_inputs_are_clear_terminal_verdicts_and_the_worker_goes_on(h: Harness) -> None:
    raw = RawServer({
        "text": http_answer(200, b"<html>not json</html>", "text/html"),
        "huge": http_answer(200, b'{"x": "' + b"y" * 10_000 + b'"}'),
        "chunked": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + b"1000\r\n" + b"y" * 4096 + b"\r\n" * 2,
    })  # fmt: skip
    async with raw.running():
        with tool_server("--delay", "0") as tool:
            endpoints = [Endpoint(n, f"{raw.url}/{n}") for n in ("text", "huge", "chunked")]
            w = h.worker(judge(Endpoint("tool", tool.url), *endpoints, max_body=64, max_response=4000))
            cases: dict[str, dict[str, Any]] = {
                "unknown endpoint 'nowhere' (this queue calls: chunked, huge, text, tool)":
                    {"endpoint": "nowhere", "body": {}},
                "body is 105 bytes, over the limit of 64 bytes": {"endpoint": "tool", "body": "z" * 103},
                "response is not JSON: Expecting value: line 1 column 1 (char 0)": {"endpoint": "text", "body": {}},
                "response too large: answer of 10009 bytes, over the bound of 4000 bytes":
                    {"endpoint": "huge", "body": {}},
                "response too large: answer over the bound of 4000 bytes": {"endpoint": "chunked", "body": {}},
                'payload must be an object {"endpoint": name, "body": JSON}': {"body": {}},
            }  # fmt: skip
            ids = await h.submit(*cases.values())
            for sid in ids:
                await eventually(lambda sid=sid: finished(h, sid))  # type: ignore[misc]
            reasons = {(await verdict(h, sid))["reason"]: (await verdict(h, sid))["status"] for sid in ids}
            assert set(reasons) == set(cases)
            assert reasons["body is 105 bytes, over the limit of 64 bytes"] == "RUNTIME_ERROR"
            assert reasons["response too large: answer over the bound of 4000 bytes"] == "SYSTEM_ERROR"
            # Nothing was lost and the worker is unharmed: the next job is judged as usual.
            [good] = await h.submit({"endpoint": "tool", "body": {"after": "bad inputs"}})
            await eventually(lambda: finished(h, good))
            assert (await verdict(h, good))["status"] == "ACCEPTED"
            assert w.stats.judge_errors == 0 and w.stats.written == len(cases) + 1


async def test_a_rejudge_during_a_call_gets_a_new_key_and_the_old_result_is_refused(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Nothing but the fence stops the old try: the cancellation watch's lease check is far away too.
    monkeypatch.setattr(cancels, "LISTENING_CHECK", 3600.0)
    monkeypatch.setattr(cancels, "POLL", 3600.0)
    with tool_server("--delay", "1.5") as tool:
        endpoint = Endpoint("tool", tool.url, deadline=30)
        # A heartbeat far away: the old try runs to its end, and the fence at write time refuses it.
        old = h.worker(judge(endpoint), lease_ttl="30s", concurrency="1")
        [sid] = await h.submit({"endpoint": "tool", "body": {}})
        first_key = f"judgequeue:{h.queue}:{sid}:1"
        await eventually(lambda: _calls(tool, first_key), what="the first call under way")
        async with h.pool.acquire() as conn:
            await outbox.rejudge(conn, sid)
        h.worker(judge(endpoint))
        await eventually(lambda: old.stats.stale_results == 1, within=20, what="the old try's verdict refused")
        await eventually(lambda: finished(h, sid), within=20)
        doc = await verdict(h, sid)
        assert doc["generation"] == 2 and doc["details"]["idempotency_key"] == f"judgequeue:{h.queue}:{sid}:2"
        assert old.stats.written == 0


async def test_a_lost_lease_cancels_the_call(h: Harness) -> None:
    with tool_server("--hang") as tool:
        w = h.worker(judge(Endpoint("tool", tool.url, deadline=60)), lease_ttl="600ms")
        [sid] = await h.submit({"endpoint": "tool", "body": {}})
        await eventually(lambda: _calls(tool, f"judgequeue:{h.queue}:{sid}:1"), what="the call under way")
        before = metrics.STALE_RESULTS_DROPPED.labels(h.queue, "lease_lost")._value.get()
        async with h.pool.acquire() as conn:
            await outbox.rejudge(conn, sid)
        # The heartbeat finds the lease gone and cancels the call at once, not after its 60 s deadline.
        await eventually(lambda: w.stats.lost_leases >= 1, within=5, what="the call cancelled")
        assert metrics.STALE_RESULTS_DROPPED.labels(h.queue, "lease_lost")._value.get() >= before + 1


async def test_a_hung_endpoint_and_a_storm_leave_other_endpoints_the_slots(h: Harness) -> None:
    """Qualitative isolation (bench/agent_bench.py measures it): with every call to the hung endpoint
    stuck and every call to the stormy one refused, jobs for a healthy endpoint still all finish on
    the same worker, while the hung ones are still in their calls."""
    with tool_server("--hang") as hung, tool_server("--storm") as storm, tool_server("--delay", "0") as good:
        w = h.worker(judge(
            Endpoint("hung", hung.url, concurrency=1, deadline=120),
            Endpoint("storm", storm.url, concurrency=1, tries=100),
            Endpoint("good", good.url, concurrency=2),
        ), concurrency="3")  # fmt: skip
        stuck = await h.submit(*({"endpoint": "hung", "body": {"i": i}} for i in range(3)))
        await h.submit(*({"endpoint": "storm", "body": {"i": i}} for i in range(3)))
        await eventually(lambda: _total_calls(hung) == 1, what="one hung call (its endpoint's bound)")
        served = await h.submit(*({"endpoint": "good", "body": {"i": i}} for i in range(20)))
        for sid in served:
            await eventually(lambda sid=sid: finished(h, sid), within=30)  # type: ignore[misc]
        assert [(await verdict(h, sid))["status"] for sid in served] == ["ACCEPTED"] * len(served)
        # Still stuck: one call in the hung endpoint, the others waiting out of any slot.
        assert [(await h.row(sid))["status"] in ("PENDING", "JUDGING") for sid in stuck] == [True] * 3
        assert _total_calls(hung) == 1
        assert w.in_flight <= 3


def _calls(tool: ToolServer, key: str) -> bool:
    return tool.effects()["calls"].get(key, 0) >= 1


def _total_calls(tool: ToolServer) -> int:
    return sum(tool.effects()["calls"].values())


async def test_a_job_over_the_fleet_bound_waits_holding_its_lease_and_calls_once_a_slot_frees(h: Harness) -> None:
    """The endpoint's one slot is held elsewhere in the fleet: the job waits in its worker slot (not
    deferred) for several lease TTLs, its lease renewed by the heartbeat (no rescue, no new
    generation), and calls as soon as the slot is freed."""
    with tool_server("--delay", "0") as tool:
        http = judge(Endpoint("tool", tool.url, concurrency=1))
        h.worker(http, lease_ttl="1s")
        slots = EndpointSlots(h.redis)
        assert (await slots.acquire(h.queue, "tool", "another-worker", Limits(1), lease=30.0)).granted
        [sid] = await h.submit({"endpoint": "tool", "body": {}})
        assert http.flow is not None
        await eventually(lambda: http.flow is not None and http.flow.waiting("tool") == 1, what="the job waiting")
        until = time.monotonic() + 3.0  # three lease TTLs, within the 5 s after which it would be stalled
        while time.monotonic() < until:
            row = await h.row(sid)
            assert (row["status"], row["generation"], _total_calls(tool)) == ("JUDGING", 1, 0)
            renewed = await h.pool.fetchval(
                "SELECT lease_expires_at > now() FROM judgequeue.submissions WHERE id = $1", sid
            )
            assert renewed, "the waiting job's lease lapsed"
            await asyncio.sleep(0.2)
        assert await slots.release(h.queue, "tool", "another-worker")
        await eventually(lambda: finished(h, sid), within=10, what="the call once the slot freed")
        row = await h.row(sid)
        assert (row["status"], row["generation"], _total_calls(tool)) == ("ACCEPTED", 1, 1)
