"""Least privilege in Postgres: one group role per component, reaching data only through functions.

Every named statement of ``sql/queries.sql`` runs as a function of its own,
``judgequeue.q_<name>_<digest>`` (the digest is the statement's text's, so two versions of
judgequeue side by side during a rolling upgrade each call their own): a ``SECURITY DEFINER``
PL/pgSQL function owned by :data:`OWNER`, with a fixed ``search_path``, whose body is the statement
itself. :func:`judgequeue.core.store.sql.query` gives the call, so a role process runs the same
statements with any credentials. The components' group roles (``NOLOGIN``) hold no right on any
table: each may ``EXECUTE`` the functions of the statements it runs (:data:`ROLES`) and nothing
else, so its credentials can do what its job needs and no more. A worker stores a verdict only
through ``lease_verdict``, fenced on the attempt id its own lease drew (a random uuid it never reads
for anyone else's submission); it cannot read a submission it did not lease, change a flag, or
write a table. Login users are given a group role (``GRANT judgequeue_worker TO pod_worker``);
a superuser keeps working for a quick start (the roles warn in their logs).

``judgequeue migrate`` runs :func:`install` after the migrations, in the same transaction: it makes
the roles (cluster-wide; skipped, with a warning, when the migrating user may not create roles),
gives :data:`OWNER` the schema and everything in it, writes the functions, and grants; every step
is idempotent. The application's two SQL entry points, ``judgequeue.submit()`` and
``judgequeue.report_legacy_verdict()``, are called as they are (applications in any language call
them inside their own transactions): this step makes them ``SECURITY DEFINER`` with the same fixed
``search_path`` (after the migrations, which may create them again).
"""

from __future__ import annotations

import asyncio
import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

import asyncpg

from ..base.names import validate_queue_name

#: Owns the schema and every object in it (the migrator's group role); the functions run as it.
OWNER: Final = "judgequeue_owner"

#: The application's SQL functions, called directly (not through a wrapper).
DIRECT: Final = frozenset({"submit", "submit_in_class", "report_legacy_verdict"})

#: Called by applications in their own transactions: ``SECURITY DEFINER`` in the schema itself.
APPLICATION_FUNCTIONS: Final = (
    "judgequeue.submit(text, jsonb, text, text)",
    "judgequeue.report_legacy_verdict(bigint, text, jsonb)",
    "judgequeue.cancel(text, bigint, text)",
)


@dataclass(frozen=True)
class Role:
    name: str
    job: str
    statements: frozenset[str]
    functions: tuple[str, ...] = ()


_COMMON = frozenset({"ping", "db_now", "session_rights"})

#: Each component's group role and the statements it may run.
ROLES: Final[Mapping[str, Role]] = MappingProxyType(
    {
        r.name.removeprefix("judgequeue_"): r
        for r in (
            Role(
                "judgequeue_application",
                "submit, read results and verdict histories, cancel submissions, preview, apply and cancel"
                " rejudgings, report legacy verdicts",
                _COMMON | {"submit", "submit_in_class", "report_legacy_verdict", "submissions_read",
                           "submission_exists", "events_head", "events_held", "events_read",
                           "submission_cancel", "submission_history", "submission_in_queue",
                           "rejudging_preview", "rejudging_apply", "rejudging_cancel",
                           "rejudging_list", "rejudging_items"},
                APPLICATION_FUNCTIONS,
            ),
            Role(
                "judgequeue_dispatcher",
                "claim outbox rows, mark them sent, wait for work",
                _COMMON
                | {
                    "outbox_mark_claim",
                    "waiter_register",
                    "waiter_unregister",
                    "queue_get",
                    "record_dead_letters",
                },
            ),
            Role(
                "judgequeue_worker",
                "lease jobs, renew and release leases, store verdicts fenced on its own attempts, read problems",
                _COMMON
                | {
                    "lease_acquire",
                    "lease_direct",
                    "offers_sync",
                    "lease_renew",
                    "lease_verdict",
                    "progress_record",
                    "lease_make_durable",
                    "lease_release",
                    "lease_defer",
                    "lease_stale_reasons",
                    "lease_gone",
                    "shadow_acquire",
                    "shadow_renew",
                    "shadow_verdict",
                    "shadow_release",
                    "shadow_stale_reasons",
                    "shadow_give_up",
                    "record_dead_letters",
                    "waiter_register",
                    "waiter_unregister",
                    "queue_get",
                    "queue_classes",
                    "problem_get",
                    "problem_chunks",
                },
            ),
            Role(
                "judgequeue_reaper",
                "rescue expired leases and idle deliveries, dead-letter, prune, export gauges",
                _COMMON
                | {
                    "lease_rescue_expired",
                    "record_dead_letters",
                    "outbox_prune",
                    "submissions_prune",
                    "outbox_waiting_stats",
                    "outbox_other_stats",
                    "outbox_find_stranded",
                    "outbox_resend_stranded",
                    "tables_never_analyzed",
                    "analyze_outbox",
                    "analyze_submissions",
                    "waiter_prune",
                    "offers_prune",
                    "notify_queue_usage",
                    "shadow_rescue_expired",
                    "shadow_give_up",
                    "shadow_verdicts_prune",
                    "legacy_verdicts_prune",
                    "queue_get",
                    "outbox_waiting_by_class",
                    "shadow_agreement",
                    "events_prune",
                    "history_prune",
                    "rejudgings_prune",
                    "events_read",
                    "events_held",
                    "webhook_endpoint_ensure",
                    "webhook_ingest",
                    "webhook_claim",
                    "webhook_stats",
                    "webhook_release",
                    "webhook_delivered",
                    "webhook_failed",
                    "webhook_prune_dead",
                },
            ),
            Role(
                "judgequeue_operator",
                "create and own queues, set cutover flags, read backlog and agreement figures",
                _COMMON
                | {
                    "queue_create",
                    "queue_get",
                    "queue_list",
                    "queue_claim",
                    "queue_release",
                    "queue_owned_by",
                    "queue_take_back",
                    "queue_flip_wait",
                    "queue_flip_lock",
                    "queue_flip_blockers",
                    "queue_set_cutover",
                    "outbox_waiting_stats",
                    "outbox_other_stats",
                    "submissions_count_by_status",
                    "submissions_finished_since",
                    "shadow_agreement",
                    "shadow_mismatches",
                    "queue_classes",
                    "queue_set_classes",
                    "webhook_health",
                },
            ),
        )
    }
)

#: What ``judgequeue roles`` says of the owner (it may run every statement and change the schema).
OWNER_JOB: Final = ("owns the schema: migrations, and every statement (administration: rejudge, DLQ replay, problems,"
                    " webhook dead letters)")

_PARAM = re.compile(r"\$(\d+)")

#: The statements a component runs for one queue, by the position of their queue parameter. A login
#: user given any queue's role (:func:`queue_role`) runs them for those queues only; one given none,
#: for every queue (a single fleet, the quick start).
QUEUE_PARAMS: Final[Mapping[str, int]] = MappingProxyType(
    {
        "lease_acquire": 4,
        "lease_direct": 1,
        "offers_sync": 1,
        "shadow_acquire": 4,
        "waiter_register": 1,
        "waiter_unregister": 1,
        "queue_get": 1,
        "queue_classes": 1,
        "shadow_agreement": 1,
        "outbox_mark_claim": 8,
        "lease_rescue_expired": 1,
        "outbox_prune": 3,
        "submissions_prune": 3,
        "outbox_waiting_stats": 1,
        "outbox_other_stats": 1,
        "outbox_find_stranded": 1,
        "outbox_resend_stranded": 1,
        "shadow_rescue_expired": 1,
        "shadow_verdicts_prune": 3,
        "legacy_verdicts_prune": 3,
        "submission_cancel": 1,
        "submission_history": 1,
        "submission_in_queue": 1,
        "history_prune": 3,
        "rejudging_preview": 1,
        "rejudging_apply": 1,
        "rejudging_cancel": 1,
        "rejudging_list": 1,
        "rejudging_items": 1,
        "rejudgings_prune": 3,
    }
)

QUEUE_ROLE_PREFIX: Final = "judgequeue_queue_"


def queue_role(queue: str) -> str:
    """The group role that gives a login user ``queue`` (and, once it has one, only the queues it has).

    ``judgequeue_queue_<queue>``; a name over 46 characters is cut and ends with a digest, so the
    role's name stays within Postgres's 63 (the SQL in the functions computes the same name).
    """
    validate_queue_name(queue)
    if len(queue) <= 46:
        return QUEUE_ROLE_PREFIX + queue
    return f"{QUEUE_ROLE_PREFIX}{queue[:29]}_{hashlib.md5(queue.encode()).hexdigest()[:16]}"


def _queue_check(param: int) -> str:
    q = f"${param}"
    role = (
        f"CASE WHEN length({q}) <= 46 THEN '{QUEUE_ROLE_PREFIX}' || {q}"
        f" ELSE '{QUEUE_ROLE_PREFIX}' || left({q}, 29) || '_' || left(md5({q}), 16) END"
    )
    mine = (
        "SELECT 1 FROM pg_catalog.pg_auth_members m JOIN pg_catalog.pg_roles g ON g.oid = m.roleid"
        " WHERE m.member = (SELECT r.oid FROM pg_catalog.pg_roles r WHERE r.rolname = session_user)"
    )
    return (
        f"IF EXISTS ({mine} AND g.rolname LIKE '{QUEUE_ROLE_PREFIX.replace('_', chr(92) + '_')}%')\n"
        f"   AND NOT EXISTS ({mine} AND g.rolname = ({role})) THEN\n"
        "    RAISE EXCEPTION USING ERRCODE = '42501',\n"
        "        MESSAGE = format('%s may not serve queue %s (it holds other queues'' roles only)',\n"
        f"                         session_user, {q});\n"
        "END IF;\n"
    )


def function_name(name: str, statement: str) -> str:
    """``q_<name>_<first 8 hex digits of the statement's sha256>`` (unqualified)."""
    return f"q_{name}_{hashlib.sha256(statement.encode()).hexdigest()[:8]}"


def call_text(name: str, statement: str) -> str:
    """How a process runs ``statement``: its function, called with the same positional parameters."""
    if name in DIRECT:
        return statement
    count = max((int(n) for n in _PARAM.findall(statement)), default=0)
    args = ", ".join(f"${i}" for i in range(1, count + 1))
    return f"SELECT * FROM judgequeue.{function_name(name, statement)}({args})"


def _quote(identifier: str) -> str:
    return '"' + identifier.replace('"', '""') + '"'


async def _type_name(conn: asyncpg.Connection, oid: int) -> str:
    return str(await conn.fetchval("SELECT format_type($1, NULL)", oid))


async def function_ddl(conn: asyncpg.Connection, name: str, statement: str) -> str:
    """The ``CREATE OR REPLACE FUNCTION`` of one statement, typed as Postgres describes the statement."""
    prepared = await conn.prepare(statement)
    params = [await _type_name(conn, p.oid) for p in prepared.get_parameters()]
    columns = [(a.name, await _type_name(conn, a.type.oid)) for a in prepared.get_attributes()]
    if columns and all(t != "void" for _, t in columns):
        returns = "TABLE(" + ", ".join(f"{_quote(n)} {t}" for n, t in columns) + ")"
        body = f"RETURN QUERY {statement};"
    elif columns:  # a SELECT of void functions (an advisory lock): run it, return nothing
        returns = "bigint"
        body = f"PERFORM * FROM ({statement}) AS s;\nRETURN 1;"
    else:  # no result: the rows it changed, as the command tag said
        returns = "bigint"
        body = f"{statement};\nGET DIAGNOSTICS v_rows = ROW_COUNT;\nRETURN v_rows;"
    if name in QUEUE_PARAMS:
        body = _queue_check(QUEUE_PARAMS[name]) + body
    return (
        f"CREATE OR REPLACE FUNCTION judgequeue.{function_name(name, statement)}({', '.join(params)})\n"
        f"RETURNS {returns} LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp\n"
        f"AS $judgequeue$\n#variable_conflict use_column\nDECLARE v_rows bigint;\nBEGIN\n{body}\nEND\n$judgequeue$"
    )


#: Tries of the roles' step: another database's migrate on the same server may change the same
#: catalog row (a role is cluster-wide) at the same moment ("tuple concurrently updated").
ROLE_ATTEMPTS: Final = 8

_NO_ROLES = (
    "the migrating user may not create roles and the components' roles are missing: they were not made"
    " or granted (a superuser or a CREATEROLE user runs `judgequeue migrate` once to make them)"
)


async def ensure_roles(conn: asyncpg.Connection) -> list[str]:
    """Make the missing group roles (cluster-wide, ``NOLOGIN``), each try a short transaction of its
    own; the warnings (none when every role is in place)."""
    for attempt in range(1, ROLE_ATTEMPTS + 1):
        try:
            async with conn.transaction():
                return await _roles_once(conn)
        except (asyncpg.InternalServerError, asyncpg.UniqueViolationError, asyncpg.DuplicateObjectError):
            if attempt == ROLE_ATTEMPTS:
                raise
            await asyncio.sleep(0.05 * attempt)
    raise AssertionError("unreachable")  # pragma: no cover


async def _roles_once(conn: asyncpg.Connection) -> list[str]:
    me = await conn.fetchrow(
        "SELECT rolsuper, rolsuper OR rolcreaterole AS may_create FROM pg_roles WHERE rolname = current_user"
    )
    wanted = [OWNER, *(role.name for role in ROLES.values())]
    rows = await conn.fetch("SELECT rolname, rolreplication FROM pg_roles WHERE rolname = ANY($1::text[])", wanted)
    existing = {r["rolname"]: r["rolreplication"] for r in rows}
    missing = [name for name in wanted if name not in existing]
    if missing and not me["may_create"]:
        return [_NO_ROLES]
    for name in missing:
        await conn.execute(f"CREATE ROLE {_quote(name)} NOLOGIN")
    # REPLICATION: a worker's durability barrier emits a logical message (lease_make_durable),
    # which Postgres allows only to superusers and replication roles.
    if me["rolsuper"] and not existing.get(OWNER, False):
        await conn.execute(f"ALTER ROLE {_quote(OWNER)} REPLICATION")
    if not await conn.fetchval("SELECT pg_has_role(current_user, $1, 'MEMBER')", OWNER):
        await conn.execute(f"GRANT {_quote(OWNER)} TO current_user")
    return []


@dataclass(frozen=True)
class Installed:
    functions: int
    roles: bool
    warnings: tuple[str, ...]


async def install(conn: asyncpg.Connection, statements: Mapping[str, str]) -> Installed:
    """Ownership, functions and grants, idempotently (inside the caller's transaction; the roles are
    made before, by :func:`ensure_roles`)."""
    warnings: list[str] = []
    present = await conn.fetchval(
        "SELECT count(*) FROM pg_roles WHERE rolname = ANY($1::text[])", [OWNER, *(r.name for r in ROLES.values())]
    )
    roles_ok = present == len(ROLES) + 1 and bool(
        await conn.fetchval("SELECT pg_has_role(current_user, $1, 'MEMBER')", OWNER)
    )
    if not roles_ok:
        warnings.append(_NO_ROLES)
    for name, statement in statements.items():
        if name in DIRECT:
            continue
        await conn.execute(await function_ddl(conn, name, statement))
    for function in APPLICATION_FUNCTIONS:
        await conn.execute(f"ALTER FUNCTION {function} SECURITY DEFINER SET search_path = pg_catalog, pg_temp")
    if roles_ok:
        await _give_ownership(conn)
        await _grant(conn, statements)
    return Installed(functions=len(statements) - len(DIRECT), roles=roles_ok, warnings=tuple(warnings))


async def _give_ownership(conn: asyncpg.Connection) -> None:
    """:data:`OWNER` owns the schema and its functions, and its tables where that is free to do now.

    A table changes owner only under a lock taken without waiting: with an earlier version's roles
    running (a rolling upgrade), a table they are using keeps its owner and :data:`OWNER` is granted
    every right on it instead, so the run never deadlocks with their transactions; the next run
    while they are idle moves it. (Until then ANALYZE of that table through the reaper's function
    only warns: Postgres lets only a table's owner analyse it.)
    """
    owner = _quote(OWNER)
    await conn.execute(f"ALTER SCHEMA judgequeue OWNER TO {owner}")
    await conn.execute(f"GRANT ALL ON ALL TABLES IN SCHEMA judgequeue TO {owner}")
    await conn.execute(f"GRANT ALL ON ALL SEQUENCES IN SCHEMA judgequeue TO {owner}")
    rows = await conn.fetch(
        """SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
            WHERE n.nspname = 'judgequeue' AND c.relkind IN ('r', 'p')  -- sequences follow their tables
              AND c.relowner <> (SELECT oid FROM pg_roles WHERE rolname = $1)
            ORDER BY c.relname""",
        OWNER,
    )
    for row in rows:
        table = f"judgequeue.{_quote(row['relname'])}"
        try:
            async with conn.transaction():  # a savepoint: a busy table is left as it is
                await conn.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE NOWAIT")
                await conn.execute(f"ALTER TABLE {table} OWNER TO {owner}")
        except asyncpg.LockNotAvailableError:
            continue
    functions = await conn.fetch(
        """SELECT p.oid::regprocedure::text AS signature FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
            WHERE n.nspname = 'judgequeue' AND p.proowner <> (SELECT oid FROM pg_roles WHERE rolname = $1)""",
        OWNER,
    )
    for row in functions:
        await conn.execute(f"ALTER FUNCTION {row['signature']} OWNER TO {owner}")


async def _grant(conn: asyncpg.Connection, statements: Mapping[str, str]) -> None:
    everyone = ", ".join(_quote(r.name) for r in ROLES.values())
    await conn.execute("REVOKE ALL ON SCHEMA judgequeue FROM PUBLIC")
    await conn.execute("REVOKE ALL ON ALL TABLES IN SCHEMA judgequeue FROM PUBLIC")
    await conn.execute(f"REVOKE ALL ON ALL TABLES IN SCHEMA judgequeue FROM {everyone}")
    await conn.execute(f"REVOKE ALL ON ALL SEQUENCES IN SCHEMA judgequeue FROM PUBLIC, {everyone}")
    await conn.execute(f"REVOKE ALL ON ALL FUNCTIONS IN SCHEMA judgequeue FROM PUBLIC, {everyone}")
    await conn.execute(f"GRANT USAGE ON SCHEMA judgequeue TO {everyone}")
    for role in ROLES.values():
        for name in sorted(role.statements - DIRECT):
            signature = await conn.fetchval(
                """SELECT p.oid::regprocedure::text FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
                    WHERE n.nspname = 'judgequeue' AND p.proname = $1""",
                function_name(name, statements[name]),
            )
            await conn.execute(f"GRANT EXECUTE ON FUNCTION {signature} TO {_quote(role.name)}")
        for function in role.functions:
            await conn.execute(f"GRANT EXECUTE ON FUNCTION {function} TO {_quote(role.name)}")


def describe(statements: Mapping[str, str], comments: Mapping[str, str]) -> list[dict[str, object]]:
    """What each group role may do, for ``judgequeue roles``: its job and its statements."""
    out: list[dict[str, object]] = [
        {"role": OWNER, "job": OWNER_JOB, "statements": sorted(statements)},
    ]
    for role in ROLES.values():
        out.append(
            {
                "role": role.name,
                "job": role.job,
                "statements": [{"name": n, "does": comments[n]} for n in sorted(role.statements)],
                "functions": list(role.functions),
            }
        )
    return out


def unknown_statements(statements: Sequence[str]) -> list[str]:
    """Statements :data:`ROLES` names that ``queries.sql`` does not have (a test keeps this empty)."""
    known = set(statements)
    return sorted({n for r in ROLES.values() for n in r.statements} - known)


#: The components whose statements are split by queue: a login user of theirs given queues' roles
#: serves those queues only (the operator and the application are not split).
QUEUE_SCOPED: Final = ("dispatcher", "worker", "reaper")
#: A login user's name as ``judgequeue roles --create-logins`` makes them (``<prefix>_<component>``).
LOGIN_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


async def ensure_login(conn: asyncpg.Connection, user: str, password: str, component: str,
                       queues: Sequence[str] = ()) -> bool:
    """Make (or, if it exists, set a new password for) the login user ``user`` of ``component``: given
    that component's group role and, for a queue-scoped component, the roles of ``queues`` (each made
    ``NOLOGIN`` when missing). The DDL is written by the server's ``format()`` (``%I``, ``%L``), never
    by joining strings. True if the user was made, False if it existed. One transaction."""
    if not LOGIN_NAME.match(user):
        raise ValueError(f"login user {user!r} must be a lowercase identifier (letters, digits, _)")
    if component not in ROLES:
        raise ValueError(f"component must be one of {', '.join(ROLES)}, got {component!r}")
    group = ROLES[component].name
    async with conn.transaction():
        made = not await conn.fetchval("SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $1)", user)
        verb = "CREATE" if made else "ALTER"
        await conn.execute(await conn.fetchval(
            f"SELECT format('{verb} ROLE %I LOGIN NOSUPERUSER INHERIT PASSWORD %L', $1::text, $2::text)",
            user, password))
        await conn.execute(await conn.fetchval("SELECT format('GRANT %I TO %I', $1::text, $2::text)", group, user))
        for queue in queues if component in QUEUE_SCOPED else ():
            scope = queue_role(queue)
            if not await conn.fetchval("SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $1)", scope):
                await conn.execute(await conn.fetchval("SELECT format('CREATE ROLE %I NOLOGIN', $1::text)", scope))
            await conn.execute(await conn.fetchval("SELECT format('GRANT %I TO %I', $1::text, $2::text)",
                                                   scope, user))
    return made
