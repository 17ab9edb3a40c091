"""A queue's flags or owner changed by anyone is heard at the commit (core.queues.listen_queues)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import asyncpg

from judgequeue.core.store.queues import claim_queue, create_queue, listen_queues, set_cutover


async def _heard(received: list[str], count: int) -> list[str]:
    for _ in range(100):
        if len(received) >= count:
            break
        await asyncio.sleep(0.02)
    await asyncio.sleep(0.1)  # and nothing more
    return list(received)


async def test_every_change_of_flags_or_owner_is_heard_and_nothing_else(pg_dsn: str, queue_name: str) -> None:
    listener, writer = await asyncpg.connect(pg_dsn), await asyncpg.connect(pg_dsn)
    received: list[str] = []
    try:
        stop = await listen_queues(listener, received.append)
        await create_queue(writer, queue_name)
        assert await _heard(received, 1) == [queue_name]
        await create_queue(writer, queue_name)  # exists: nothing written, nothing heard
        await set_cutover(writer, queue_name, mode="shadow")
        await set_cutover(writer, queue_name, watermark=datetime(2026, 1, 1, tzinfo=UTC))
        await set_cutover(writer, queue_name, paused=True)
        assert await _heard(received, 4) == [queue_name] * 4
        # Plain SQL is heard as well, owner included; offers_until (not a flag) is not.
        await writer.execute("UPDATE judgequeue.queues SET owner = 'someone' WHERE name = $1", queue_name)
        await writer.execute("UPDATE judgequeue.queues SET offers_until = now() WHERE name = $1", queue_name)
        await writer.execute("UPDATE judgequeue.queues SET paused = true WHERE name = $1", queue_name)  # no change
        assert await _heard(received, 5) == [queue_name] * 5
        # Heard at the commit, not before; a rolled back change is never heard.
        async with writer.transaction():
            await writer.execute("UPDATE judgequeue.queues SET paused = false WHERE name = $1", queue_name)
            assert await _heard(received, 6) == [queue_name] * 5
        assert await _heard(received, 6) == [queue_name] * 6
        tx = writer.transaction()
        await tx.start()
        await writer.execute("UPDATE judgequeue.queues SET paused = true WHERE name = $1", queue_name)
        await tx.rollback()
        other = f"{queue_name}-b"
        await claim_queue(writer, other, "JudgeQueue ns/b")
        await writer.execute("DELETE FROM judgequeue.queues WHERE name = $1", other)
        assert await _heard(received, 8) == [queue_name] * 6 + [other, other]
        await stop()
        await set_cutover(writer, queue_name, mode="live")
        assert await _heard(received, 9) == [queue_name] * 6 + [other, other]
    finally:
        await listener.close()
        await writer.close()
