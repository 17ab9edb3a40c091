"""An application's side of a test from outside: submissions through ``api.submit`` (one
transaction each, as an application's own would be) and their results, on a connection of its own."""

from __future__ import annotations

from typing import Any

import asyncpg

from judgequeue.core import api


def py(source: str, output: str = "ok\n", **limits: Any) -> dict[str, Any]:
    """A program judge payload: Python ``source`` that must print ``output`` on empty input, within
    2 s and 128 MB unless ``limits`` says otherwise."""
    return {"language": "python", "source": source, "tests": [{"input": "", "output": output}],
            "limits": {"time": 2, "memory_mb": 128, **limits}}


async def submit_all(dsn: str, queue: str, payloads: list[dict[str, Any]]) -> list[int]:
    """Submit each payload to ``queue`` in a transaction of its own; their ids, in order."""
    conn = await asyncpg.connect(dsn)
    try:
        ids = []
        for payload in payloads:
            async with conn.transaction():
                ids.append(await api.submit(conn, queue, payload))
        return ids
    finally:
        await conn.close()


async def results(dsn: str, ids: list[int]) -> dict[int, api.Result]:
    """Each submission's result as ``api.result`` reads it."""
    conn = await asyncpg.connect(dsn)
    try:
        return {i: await api.result(conn, i) for i in ids}
    finally:
        await conn.close()
