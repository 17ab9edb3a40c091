"""``judgequeue migrate``: bring the database to the current schema."""

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


def cmd_migrate(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    from ..store.migrate import applied_versions, migrate

    dsn: str = resolve(args, env, DSN)

    async def go(conn: Any) -> tuple[list[int], list[int]]:
        return await migrate(conn), await applied_versions(conn)

    applied, versions = run_async(with_pg(dsn, go))
    if args.json:
        print_json({"applied": applied, "versions": versions})
    elif applied:
        print(f"applied migrations {', '.join(f'{v:04d}' for v in applied)}; schema at {versions[-1]:04d}")
    else:
        print(f"schema up to date at {versions[-1]:04d}" if versions else "no migrations")
    return EXIT_OK


def add(commands: Commands) -> None:
    text = "apply the database migrations (needs only the Postgres DSN)"
    p = commands.add("migrate", text, parents=[commands.json_flag])
    add_variable_flags(p, [DSN], "connection")
    p.set_defaults(handler=cmd_migrate)
