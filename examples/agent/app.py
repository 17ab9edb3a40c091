"""An application that asks for agent/tool jobs the recoverable way (docs/agent-jobs.md).

It keeps its own table (``shop.orders``) and writes each order together with the job intent in one
transaction: either both commit or neither does, so there is never an order whose job was lost,
nor a job for an order that does not exist. judgequeue then calls the tool (the ``tool`` endpoint of
examples/agent/judgequeue.yaml) with an idempotency key per request, retries it on 429/503, and
stores the tool's answer as the job's verdict. This script waits for every answer, prints it, and
finally asks the tool server how many times it applied each effect (once per key: never twice,
whatever was retried or redelivered).

    .venv/bin/python examples/agent/app.py --orders 5

Connects to ``JUDGEQUEUE_POSTGRES_DSN`` (default: the server scripts/install set up).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import urllib.request

import asyncpg

from judgequeue.core import api

SCHEMA = """
CREATE SCHEMA IF NOT EXISTS shop;
CREATE TABLE IF NOT EXISTS shop.orders (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    item text NOT NULL,
    quantity integer NOT NULL,
    submission_id bigint,  -- the judgequeue job that carries this order to the tool
    created_at timestamptz NOT NULL DEFAULT now()
)
"""


async def place_order(conn: asyncpg.Connection, queue: str, item: str, quantity: int) -> tuple[int, int]:
    """The order row and its job intent, in one transaction: both or neither."""
    async with conn.transaction():
        order_id = await conn.fetchval("INSERT INTO shop.orders (item, quantity) VALUES ($1, $2) RETURNING id",
                                       item, quantity)
        payload = {"endpoint": "tool", "body": {"order": order_id, "item": item, "quantity": quantity}}
        submission_id = await api.submit(conn, queue, payload)
        await conn.execute("UPDATE shop.orders SET submission_id = $1 WHERE id = $2", submission_id, order_id)
    return order_id, submission_id


def tool_effects(url: str) -> dict[str, dict[str, int]]:
    """The tool server's effect counts by idempotency key."""
    with urllib.request.urlopen(url + "/effects", timeout=5) as response:
        doc: dict[str, dict[str, int]] = json.loads(response.read())
    return doc


async def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Place orders whose tool calls judgequeue carries out.")
    parser.add_argument("--orders", type=int, default=5)
    parser.add_argument("--queue", default="agents")
    parser.add_argument("--tool", default="http://127.0.0.1:8765", help="the tool server, for its effect counts")
    parser.add_argument("--timeout", type=float, default=120.0)
    args = parser.parse_args(argv)
    dsn = os.environ.get("JUDGEQUEUE_POSTGRES_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(SCHEMA)
        placed = [await place_order(conn, args.queue, f"item-{i}", i + 1) for i in range(args.orders)]
        print(f"placed {len(placed)} orders, each with its job in the same transaction")
        deadline = time.monotonic() + args.timeout
        results = {}
        while len(results) < len(placed):
            for order_id, submission_id in placed:
                if order_id not in results:
                    result = await api.result(conn, submission_id)
                    if result.finished:
                        results[order_id] = result
            if time.monotonic() > deadline:
                print(f"timed out: {len(results)} of {len(placed)} orders have an answer", file=sys.stderr)
                return 1
            await asyncio.sleep(0.2)
    finally:
        await conn.close()
    ok = True
    for order_id, submission_id in placed:
        result = results[order_id]
        details = result.details.get("details", {}) if result.details else {}
        answer = details.get("response") or details.get("reason")
        print(f"order {order_id} (job {submission_id}): {result.status} after {details.get('tries')} "
              f"tries, key {details.get('idempotency_key')}: {json.dumps(answer)}")
        ok = ok and result.status == "ACCEPTED"
    effects = await asyncio.to_thread(tool_effects, args.tool)
    applied = effects["applied"]
    print(f"tool: {sum(effects['calls'].values())} calls, {sum(applied.values())} effects applied for "
          f"{len(applied)} keys (at most once per key: {all(n == 1 for n in applied.values())})")
    return 0 if ok and all(n == 1 for n in applied.values()) else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
