"""Per-component login users, as docs/security.md tells an administrator to make them.

:func:`make_component_users` creates, for each component, a Postgres ``LOGIN`` role given only that
component's group role (and, for the dispatcher, worker and reaper, the queue's role) and a Redis ACL
user with only that component's rules for the queue; :func:`drop_component_users` removes them.
:func:`with_user` puts a user and password into a DSN or URL of the admin's.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import redis.asyncio as aioredis

from judgequeue.core.store.privileges import ROLES, queue_role
from judgequeue.core.transport import redis_scripts
from judgequeue.core.transport.acl import acl_rules

#: The components split by queue: each serves only the queues whose role it holds.
QUEUE_SCOPED = ("dispatcher", "worker", "reaper")


@dataclass(frozen=True)
class ComponentUser:
    component: str
    user: str
    password: str


def with_user(url: str, user: str, password: str) -> str:
    """``url`` (a Postgres DSN or Redis URL) logging in as ``user`` with ``password``."""
    parts = urlsplit(url)
    host = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit(parts._replace(netloc=f"{user}:{password}@{host}"))


async def make_component_users(
    admin_dsn: str, admin_redis_url: str | None, queue: str, components: Iterable[str], *, prefix: str, password: str
) -> dict[str, ComponentUser]:
    """A Postgres login user (and, except for the application, a Redis ACL user of the same name) per
    component. Redis functions are loaded with the admin's URL first: the components may not."""
    made: dict[str, ComponentUser] = {}
    conn = await asyncpg.connect(admin_dsn)
    try:
        scope = queue_role(queue)
        await conn.execute(f'DO $$ BEGIN CREATE ROLE "{scope}" NOLOGIN; EXCEPTION WHEN duplicate_object THEN END $$')
        for component in components:
            user = f"{prefix}_{component}"
            await conn.execute(f'DROP ROLE IF EXISTS "{user}"')
            await conn.execute(f"CREATE ROLE \"{user}\" LOGIN PASSWORD '{password}'")
            await conn.execute(f'GRANT {ROLES[component].name} TO "{user}"')
            if component in QUEUE_SCOPED:
                await conn.execute(f'GRANT "{scope}" TO "{user}"')
            made[component] = ComponentUser(component, user, password)
    finally:
        await conn.close()
    if admin_redis_url is not None:
        admin = aioredis.Redis.from_url(admin_redis_url)
        try:
            await redis_scripts.load_scripts(admin)
            for component, made_user in made.items():
                if component == "application":
                    continue
                await admin.execute_command(  # type: ignore[no-untyped-call]
                    "ACL", "SETUSER", made_user.user, "reset", "on", f">{password}", *acl_rules(component, [queue]))
        finally:
            await admin.aclose()
    return made


async def drop_component_users(admin_dsn: str, admin_redis_url: str | None, users: Iterable[ComponentUser]) -> None:
    conn = await asyncpg.connect(admin_dsn)
    try:
        for made in users:
            await conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1", made.user)
            await conn.execute(f'DROP ROLE IF EXISTS "{made.user}"')
    finally:
        await conn.close()
    if admin_redis_url is not None:
        admin = aioredis.Redis.from_url(admin_redis_url)
        try:
            for made in users:
                await admin.execute_command("ACL", "DELUSER", made.user)  # type: ignore[no-untyped-call]
        finally:
            await admin.aclose()
