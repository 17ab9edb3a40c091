"""The endpoints' fleet-wide slots (core/transport/endpoint_slots.py) and the waiting on them
(core/judges/http_call/flow.py), on a real Redis.

What is checked: concurrent acquirers from several clients never hold more than the bound, and all
get their turn by waiting; a holder that stops renewing (a process SIGKILLed holding a slot) frees
it when its lease expires, and a renewal after that says so; the rate limit spaces grants; the keys
expire on their own; a worker's ACL user may call the functions on its own queue's keys only.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import time
import uuid
from urllib.parse import urlsplit, urlunsplit

import pytest
import redis.asyncio as aioredis
import redis.exceptions as rexc
from prometheus_client import REGISTRY

from judgequeue.core.judges import CallLater
from judgequeue.core.judges.http_call.flow import EndpointFlow
from judgequeue.core.transport import redis_scripts
from judgequeue.core.transport.acl import acl_rules
from judgequeue.core.transport.endpoint_slots import ACQUIRE, EndpointSlots, Limits, endpoint_keys
from tests.support.databases import REDIS_URL, delete_queue_keys
from tests.support.waiting import eventually


async def test_concurrent_acquirers_never_hold_more_than_the_bound_and_all_get_a_turn(
    redis_client: aioredis.Redis, queue_name: str
) -> None:
    bound, callers, calls_each = 3, 12, 6  # three callers a worker: all of them may wait
    clients = [aioredis.Redis.from_url(REDIS_URL) for _ in range(4)]  # four "workers"
    flows = [EndpointFlow(EndpointSlots(c), lease=5.0, wait_cap=60.0, poll=0.02) for c in clients]
    slots = EndpointSlots(redis_client)
    now = peak = peak_in_redis = done = 0

    async def call() -> None:
        nonlocal now, peak, peak_in_redis
        now += 1
        peak = max(peak, now)
        peak_in_redis = max(peak_in_redis, await slots.holders(queue_name, "tool"))
        await asyncio.sleep(0.01)  # the call's work
        now -= 1

    async def caller(i: int) -> None:
        nonlocal done
        for _ in range(calls_each):
            await flows[i % len(flows)].call(queue_name, "tool", Limits(bound), call, defer_for=1.0)
            done += 1

    try:
        await asyncio.wait_for(asyncio.gather(*(caller(i) for i in range(callers))), 120)
    finally:
        for c in clients:
            await c.aclose()
    assert done == callers * calls_each  # everyone waited for a turn: nobody was deferred
    assert peak == bound and peak_in_redis <= bound  # the bound was reached, never passed
    assert await slots.holders(queue_name, "tool") == 0  # every slot given back
    labels = {"queue": queue_name, "endpoint": "tool"}
    assert REGISTRY.get_sample_value("judgequeue_endpoint_wait_seconds_count", labels) == callers * calls_each
    assert REGISTRY.get_sample_value("judgequeue_endpoint_waiting", labels) == 0


async def test_a_holder_killed_holding_a_slot_frees_it_when_its_lease_expires(
    redis_client: aioredis.Redis, queue_name: str
) -> None:
    """A process takes the only slot (a 1.5 s lease, renewed while its call runs) and is SIGKILLed
    mid-call: nobody else gets the slot while it lives, and someone does once its lease lapses."""
    code = (
        "import asyncio, sys, redis.asyncio as r\n"
        "from judgequeue.core.judges.http_call.flow import EndpointFlow\n"
        "from judgequeue.core.transport.endpoint_slots import EndpointSlots, Limits\n"
        "async def main():\n"
        "    flow = EndpointFlow(EndpointSlots(r.Redis.from_url(sys.argv[1])), lease=1.5)\n"
        "    async def call():\n"
        "        print('held', flush=True)\n"
        "        await asyncio.Event().wait()\n"
        "    await flow.call(sys.argv[2], 'tool', Limits(1), call, defer_for=1.0)\n"
        "asyncio.run(main())\n"
    )
    holder = await asyncio.create_subprocess_exec(
        sys.executable, "-c", code, REDIS_URL, queue_name, stdout=asyncio.subprocess.PIPE
    )
    slots = EndpointSlots(redis_client)
    try:
        assert holder.stdout is not None
        assert (await asyncio.wait_for(holder.stdout.readline(), 30)).strip() == b"held"
        # It renews its lease: for well over a lease's length, nobody else gets the slot.
        until = time.monotonic() + 4.0
        while time.monotonic() < until:
            grant = await slots.acquire(queue_name, "tool", "other", Limits(1), lease=5.0)
            assert not grant.granted and grant.why == "bound"
            await asyncio.sleep(0.2)
        holder.send_signal(signal.SIGKILL)
        await holder.wait()
        killed = time.monotonic()
        await eventually(
            lambda: _granted(slots, queue_name), within=10, every=0.05, what="the dead holder's slot freed"
        )
        assert time.monotonic() - killed <= 1.5 + 1.0  # within its lease (and some slack)
    finally:
        if holder.returncode is None:
            holder.kill()
            await holder.wait()


async def _granted(slots: EndpointSlots, queue: str) -> bool:
    grant = await slots.acquire(queue, "tool", "other", Limits(1), lease=5.0)
    return grant.granted


async def test_a_lapsed_lease_is_not_renewed_and_a_release_frees_the_slot_at_once(
    redis_client: aioredis.Redis, queue_name: str
) -> None:
    slots = EndpointSlots(redis_client)
    assert (await slots.acquire(queue_name, "tool", "a", Limits(1), lease=0.2)).granted
    assert not (await slots.acquire(queue_name, "tool", "b", Limits(1), lease=5.0)).granted
    await eventually(lambda: _granted_to(slots, queue_name, "b"), within=5, every=0.05, what="a's lease lapsed")
    assert not await slots.renew(queue_name, "tool", "a", 5.0)  # b holds it now: a must stop
    assert await slots.renew(queue_name, "tool", "b", 5.0)
    assert await slots.release(queue_name, "tool", "b")
    assert not await slots.release(queue_name, "tool", "b")
    assert (await slots.acquire(queue_name, "tool", "c", Limits(1), lease=5.0)).granted
    holders, _, _ = endpoint_keys(queue_name, "tool")
    assert 0 < await redis_client.pttl(holders) <= 6000  # the key goes away once idle


async def _granted_to(slots: EndpointSlots, queue: str, holder: str) -> bool:
    return (await slots.acquire(queue, "tool", holder, Limits(1), lease=5.0)).granted


async def test_the_rate_limit_spaces_the_calls(redis_client: aioredis.Redis, queue_name: str) -> None:
    rate, calls = 20.0, 25
    slots = EndpointSlots(redis_client)
    limits = Limits(bound=100, rate=rate, burst=1)
    assert (await slots.acquire(queue_name, "tool", "first", limits, lease=5.0)).granted
    refused = await slots.acquire(queue_name, "tool", "second", limits, lease=5.0)
    assert (refused.granted, refused.why) == (False, "rate") and 0 < refused.retry_in <= 1 / rate
    flow = EndpointFlow(slots, lease=5.0, wait_cap=60.0)
    started = time.monotonic()

    async def call() -> None:
        await asyncio.sleep(0)

    await asyncio.gather(*(flow.call(queue_name, "tool", limits, call, defer_for=1.0) for _ in range(calls)))
    # ``calls`` more grants after "first" at one every 1/rate seconds: no faster (a loaded machine
    # may be slower; the server's clock decides, so there is no tolerance below).
    assert time.monotonic() - started >= (calls - 1) / rate
    _, bucket, _ = endpoint_keys(queue_name, "tool")
    assert 0 < await redis_client.pttl(bucket) <= 2100


async def test_a_job_that_may_not_wait_is_deferred_not_failed(redis_client: aioredis.Redis, queue_name: str) -> None:
    """The worker's waiting room (half its slots) full, or the wait over: CallLater, not a failed try."""
    slots = EndpointSlots(redis_client)
    assert (await slots.acquire(queue_name, "tool", "busy", Limits(1), lease=30.0)).granted
    flow = EndpointFlow(slots, worker_slots=2, wait_cap=0.5)

    async def call() -> None:
        raise AssertionError("called over the bound")

    waiter = asyncio.create_task(flow.call(queue_name, "tool", Limits(1), call, defer_for=2.0))
    await eventually(lambda: flow.waiting("tool") == 1, what="one job waiting")
    with pytest.raises(CallLater) as second:  # the room (one of two slots) is taken
        await flow.call(queue_name, "tool", Limits(1), call, defer_for=2.0)
    assert (second.value.failed, second.value.delay) == (False, 2.0)
    assert "concurrency bound" in second.value.reason
    with pytest.raises(CallLater) as first:  # waited its 0.5 s in vain
        await waiter
    assert first.value.failed is False and flow.waiting() == 0


async def test_jobs_do_not_wait_for_an_endpoint_whose_calls_all_hang(
    redis_client: aioredis.Redis, queue_name: str
) -> None:
    """No slot of the endpoint taken or freed for the stall time: waiting would only hold a worker
    slot, so the job is deferred (not failed) instead."""
    slots = EndpointSlots(redis_client)
    assert (await slots.acquire(queue_name, "tool", "hung", Limits(1), lease=30.0)).granted
    refused = await slots.acquire(queue_name, "tool", "other", Limits(1), lease=30.0)
    assert refused.idle is not None and 0 <= refused.idle < 5
    flow = EndpointFlow(slots, wait_cap=30.0, stall=0.3)

    async def call() -> None:
        raise AssertionError("called over the bound")

    started = time.monotonic()
    with pytest.raises(CallLater) as later:
        await flow.call(queue_name, "tool", Limits(1), call, defer_for=2.0)
    assert later.value.failed is False and "none of its calls ended lately" in later.value.reason
    assert 0.3 <= time.monotonic() - started < 10  # it waited while the endpoint had just moved


async def test_a_worker_user_calls_the_functions_on_its_own_queue_only(
    redis_client: aioredis.Redis, queue_name: str
) -> None:
    await redis_scripts.load_scripts(redis_client)  # the migrator's job
    user, password, other = f"jqt_slots_{uuid.uuid4().hex[:8]}", "pw-" + uuid.uuid4().hex, f"o-{uuid.uuid4().hex[:8]}"
    await redis_client.execute_command(  # type: ignore[no-untyped-call]
        "ACL", "SETUSER", user, "on", f">{password}", *acl_rules("worker", [queue_name])
    )
    parts = urlsplit(REDIS_URL)
    url = urlunsplit(parts._replace(netloc=f"{user}:{password}@{parts.netloc.rsplit('@', 1)[-1]}"))
    worker = aioredis.Redis.from_url(url)
    try:
        slots = EndpointSlots(worker)
        limits = Limits(2, rate=100.0, burst=2)
        assert (await slots.acquire(queue_name, "tool", "a", limits, lease=5.0)).granted
        assert await slots.renew(queue_name, "tool", "a", 5.0)
        assert await slots.release(queue_name, "tool", "a")
        with pytest.raises(rexc.NoPermissionError):
            await worker.execute_command(  # type: ignore[no-untyped-call]
                "FCALL", ACQUIRE.function, 3, *endpoint_keys(other, "tool"), "a", 1, 1000, "0.0", 1
            )
    finally:
        await worker.aclose()
        await redis_client.execute_command("ACL", "DELUSER", user)  # type: ignore[no-untyped-call]
        await delete_queue_keys(redis_client, other)
