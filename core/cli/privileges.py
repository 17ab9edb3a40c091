"""``judgequeue roles``: what each component's credentials may do, in Postgres and in Redis."""

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

#: The components ``--create-logins`` makes a login user for, in order.
LOGIN_COMPONENTS = ("application", "dispatcher", "worker", "reaper", "operator")


def _with_user(url: str, user: str, password: str) -> str:
    """``url`` logging in as ``user`` with ``password`` (both percent-encoded)."""
    from urllib.parse import quote, urlsplit, urlunsplit

    parts = urlsplit(url)
    host = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit(parts._replace(netloc=f"{quote(user, safe='')}:{quote(password, safe='')}@{host}"))


def cmd_create_logins(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    """A login user per component, each with a new random password, in Postgres (and, given a Redis
    URL, an ACL user of the same name per component but the application); prints each component's
    own DSN and URL, to put in its Secret (docs/security.md)."""
    import secrets

    from ..base.errors import Failure
    from ..store.privileges import LOGIN_NAME, ensure_login
    from ..transport.acl import acl_rules

    dsn: str = resolve(args, env, DSN)
    redis_url = redis_if_given(args, env)
    queues: list[str] = args.queue or []
    if redis_url is not None and not queues:
        raise Failure("--create-logins with a Redis URL needs --queue: an ACL user reaches only its queues' keys")
    components = args.component or list(LOGIN_COMPONENTS)
    passwords = {c: secrets.token_urlsafe(24) for c in components}
    users = {c: f"{args.prefix}_{c}" for c in components}
    if not all(LOGIN_NAME.match(user) for user in users.values()):
        raise Failure(f"--prefix: {args.prefix!r} must be a lowercase identifier (letters, digits, _) of at most"
                      " 50 characters")

    async def make_pg(conn: Any) -> dict[str, bool]:
        return {c: await ensure_login(conn, users[c], passwords[c], c, queues) for c in components}

    made = run_pg(dsn, make_pg)
    if redis_url is not None:
        async def make_redis(client: Any) -> None:
            await load_redis_functions(client)
            for c in components:
                if c != "application":  # an application talks to Postgres only
                    await client.execute_command(
                        "ACL", "SETUSER", users[c], "reset", "on", f">{passwords[c]}", *acl_rules(c, queues))

        run_redis(redis_url, make_redis)
    out: dict[str, dict[str, object]] = {}
    for c in components:
        entry: dict[str, object] = {"user": users[c], "created": made[c], "postgres_dsn": _with_user(dsn, users[c],
                                                                                                     passwords[c])}
        if redis_url is not None and c != "application":
            entry["redis_url"] = _with_user(redis_url, users[c], passwords[c])
        out[c] = entry
    if args.json:
        print_json(out)
        return EXIT_OK
    print("Login users (passwords are shown once: put each component's in its own Secret):")
    for c, entry in out.items():
        print(f"  {c}: {entry['user']} ({'created' if entry['created'] else 'password changed'})")
        print(f"      JUDGEQUEUE_POSTGRES_DSN={entry['postgres_dsn']}")
        if "redis_url" in entry:
            print(f"      JUDGEQUEUE_REDIS_URL={entry['redis_url']}")
    return EXIT_OK


def cmd_roles(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    if args.create_logins:
        return cmd_create_logins(args, env)
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
    p.add_argument("--create-logins", action="store_true",
                   help="make a login user per component (Postgres, and Redis ACL users when a Redis URL is given) "
                        "with a new random password each, and print each component's own DSN and URL; the queues "
                        "given (--queue) are the only ones the dispatcher's, worker's and reaper's users serve")
    p.add_argument("--prefix", default="judgequeue",
                   help="--create-logins: name the users <prefix>_<component> (default judgequeue)")
    p.add_argument("--component", action="append", choices=LOGIN_COMPONENTS,
                   help="--create-logins: only this component (repeat; default: every one)")
    connection_flags(p, [DSN, REDIS], "connection (--create-logins: an administrator's, e.g. the migrator's)")
    p.set_defaults(handler=cmd_roles)
