"""``judgequeue rejudge``: judge submissions again under a new generation."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

from .common import (
    DSN,
    EXIT_OK,
    Commands,
    add_variable_flags,
    print_json,
    resolve,
    run_async,
    with_pg,
)


def cmd_rejudge(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    from ..store.outbox import rejudge

    dsn: str = resolve(args, env, DSN)

    async def go(conn: Any) -> list[tuple[int, int]]:
        out = []
        for submission_id in args.ids:
            async with conn.transaction():
                out.append((submission_id, await rejudge(conn, submission_id)))
        return out

    results = run_async(with_pg(dsn, go))
    if args.json:
        print_json([{"id": i, "generation": g} for i, g in results])
    else:
        for i, g in results:
            print(f"{i} requeued as generation {g}")
    return EXIT_OK


def add(commands: Commands) -> None:
    p = commands.add("rejudge", "judge submissions again under a new generation", parents=[commands.json_flag])
    p.add_argument("ids", nargs="+", type=int, metavar="ID", help="submission id")
    add_variable_flags(p, [DSN], "connection")
    p.set_defaults(handler=cmd_rejudge)
