"""``judgequeue roles``: what each component's credentials may do, in Postgres and in Redis."""

from __future__ import annotations

import argparse
from collections.abc import Mapping

from .common import EXIT_OK, Commands, print_json


def cmd_roles(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    from ..store import sql
    from ..store.privileges import OWNER, ROLES, describe, queue_role
    from ..transport.acl import COMMANDS, acl_command

    queues = args.queue or ["QUEUE"]
    described = describe(sql.QUERIES, sql.COMMENTS)
    redis = {c: acl_command(c, f"judgequeue-{c}", queues) for c in COMMANDS}
    if args.json:
        queue_roles = {queue: queue_role(queue) for queue in args.queue or []}
        print_json({"postgres": described, "queue_roles": queue_roles, "redis": redis})
        return EXIT_OK
    print("Postgres (group roles, made by `judgequeue migrate`; GRANT one to each login user):")
    print(f"  {OWNER}: owns the schema; migrations and every statement (administration)")
    for component, role in ROLES.items():
        print(f"  {role.name} ({component}): {role.job}")
        for name in sorted(role.statements):
            print(f"      {name}: {sql.COMMENTS[name]}")
    if args.queue:
        print("  queue roles (GRANT to the dispatcher's, worker's and reaper's users to split queues by credentials):")
        for queue in args.queue:
            print(f'      {queue}: CREATE ROLE "{queue_role(queue)}" NOLOGIN')
    print()
    print("Redis (ACL users: keys of the named queues only; FCALL, never EVAL; no FLUSH*, CONFIG, KEYS):")
    for component, line in redis.items():
        print(f"  {component}: {line}")
    print("  application: none (an application talks to Postgres only)")
    return EXIT_OK


def add(commands: Commands) -> None:
    text = "print what each component's credentials may do (Postgres group roles, Redis ACL rules)"
    p = commands.add("roles", text, parents=[commands.json_flag])
    p.add_argument("--queue", action="append", help="a queue the Redis users serve (repeat; default: QUEUE)")
    p.set_defaults(handler=cmd_roles)
