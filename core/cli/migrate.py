"""``judgequeue migrate``: bring the database to the current schema (and load the Redis functions)."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

from .common import (
    DSN,
    EXIT_OK,
    REDIS,
    Commands,
    connection_flags,
    load_redis_functions,
    print_json,
    redis_if_given,
    resolve,
    run_pg,
    run_redis,
)


def cmd_migrate(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    from ..store.migrate import applied_versions, migrate

    dsn: str = resolve(args, env, DSN)

    async def go(conn: Any) -> tuple[list[int], list[int]]:
        return await migrate(conn), await applied_versions(conn)

    applied, versions = run_pg(dsn, go)
    functions: list[str] = []
    redis_url = redis_if_given(args, env)
    if redis_url is not None:
        # The roles' Redis users may FCALL these functions but never load one (nor EVAL a script).
        functions = run_redis(redis_url, load_redis_functions)
    if args.json:
        document: dict[str, Any] = {"applied": applied, "versions": versions}
        if functions:  # given a Redis URL
            document["redis_functions"] = functions
        print_json(document)
        return EXIT_OK
    if applied:
        print(f"applied migrations {', '.join(f'{v:04d}' for v in applied)}; schema at {versions[-1]:04d}")
    else:
        print(f"schema up to date at {versions[-1]:04d}" if versions else "no migrations")
    if functions:
        print(f"loaded {len(functions)} Redis functions")
    return EXIT_OK


def add(commands: Commands) -> None:
    text = (
        "apply the database migrations, make the components' roles and grants; with a Redis URL, load"
        " the Redis functions"
    )
    p = commands.add("migrate", text, parents=[commands.json_flag])
    connection_flags(p, [DSN, REDIS])
    p.set_defaults(handler=cmd_migrate)
