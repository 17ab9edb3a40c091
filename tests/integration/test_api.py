"""The public API for applications (judgequeue.core.api) against the real database: one import gives
an application what the README promises, and a submission's life reads back through :func:`api.result`."""

from __future__ import annotations

import asyncpg
import pytest

from judgequeue.core import api
from judgequeue.core.store import leases
from judgequeue.core.store.leases import VerdictWrite
from judgequeue.core.store.queues import create_queue
from tests.support.queries import count_submissions


async def test_submit_result_verdict_and_rejudge(pg: asyncpg.Connection, queue_name: str) -> None:
    await create_queue(pg, queue_name)
    async with pg.transaction():
        sid = await api.submit(pg, queue_name, {"language": "python", "source": "print(1)"})
    pending = await api.result(pg, sid)
    assert (pending.status, pending.generation, pending.details, pending.finished) == ("PENDING", 1, None, False)

    [lease] = await leases.acquire(pg, queue_name, [(sid, 1)], ttl=30)
    assert (await api.result(pg, sid)).status == "JUDGING"
    await leases.write_verdicts(pg, [VerdictWrite(lease, "WRONG_ANSWER", {"status": "WRONG_ANSWER", "test": 2})])
    done = await api.result(pg, sid)
    assert done.finished and done.status == "WRONG_ANSWER" and done.details == {"status": "WRONG_ANSWER", "test": 2}
    assert done.finished_at is not None and done.finished_at >= done.created_at

    assert await api.rejudge(pg, sid) == 2
    again = await api.result(pg, sid)
    assert (again.status, again.generation, again.finished) == ("PENDING", 2, False)


async def test_errors_are_the_public_ones_and_write_nothing(pg: asyncpg.Connection, queue_name: str) -> None:
    with pytest.raises(api.UnknownSubmission, match="999999"):
        await api.result(pg, 999999)
    with pytest.raises(api.UnknownQueue):
        await api.submit(pg, queue_name, {"source": "x"})
    await create_queue(pg, queue_name)
    with pytest.raises(api.InvalidQueueName):
        await api.submit(pg, "Not A Label", {"source": "x"})
    with pytest.raises(api.PayloadTooLarge):
        await api.submit(pg, queue_name, {"source": "x" * (1 << 20)})
    refusals = (api.UnknownSubmission, api.UnknownQueue, api.InvalidQueueName, api.PayloadTooLarge, api.InvalidPayload)
    for error in refusals:
        assert issubclass(error, api.JudgeQueueError)
    assert await count_submissions(pg) == 0


def test_plugin_interface_is_public() -> None:
    class Echo:
        async def judge(self, payload: object) -> api.Verdict:
            return api.Verdict("ACCEPTED", {"echo": payload})

    assert isinstance(Echo(), api.Judge)
    assert set(api.VERDICTS) >= {"ACCEPTED", "WRONG_ANSWER", "SYSTEM_ERROR"}
    with pytest.raises(ValueError, match="unknown verdict status"):
        api.Verdict("PENDING")  # type: ignore[arg-type]
