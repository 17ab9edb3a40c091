"""What every command shares: exit codes, the error line, the ``JUDGEQUEUE_*`` flags, connections,
and the :class:`Commands` each command group declares itself on."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, NoReturn, TypeVar

from ..base.errors import ConfigError, Failure
from ..config import (
    FILE_VARIABLES,
    PREFIX,
    parse_variable,
    read_credential_files,
    redact_url,
)

EXIT_OK = 0


EXIT_FAILURE = 1


EXIT_USAGE = 2


#: Where a container's fatal line goes for Kubernetes (the pod's ``terminationMessagePath``): the
#: kubelet puts the file's content in the container's ``terminated.message``, which the operator
#: quotes in the JudgeQueue's status. Written only when it exists (the kubelet creates it), so a run
#: outside a container never creates a file in /dev.
TERMINATION_LOG = "/dev/termination-log"


def write_termination_message(line: str, path: str = TERMINATION_LOG) -> None:
    """Leave ``line`` (already scrubbed of secrets) in the termination log, if there is one to write."""
    if not (os.path.isfile(path) and os.access(path, os.W_OK)):
        return
    try:
        with open(path, "w", encoding="utf-8") as log:
            log.write(line + "\n")
    except OSError:
        pass  # best effort: the line is on stderr too, which FallbackToLogsOnError reads


def fatal(line: str) -> None:
    """Print a command's one error line and leave it for Kubernetes as the termination message."""
    print(line, file=sys.stderr)
    write_termination_message(line, TERMINATION_LOG)  # looked up now, so a test can point it elsewhere


DSN = PREFIX + "POSTGRES_DSN"


REDIS = PREFIX + "REDIS_URL"


QUEUE = PREFIX + "QUEUE"


CONNECT_TIMEOUT = 10.0


T = TypeVar("T")


EPILOG = """\
exit codes: 0 ok, 1 failure or unhealthy, 2 bad usage or configuration.
Every JUDGEQUEUE_* variable has a matching flag (JUDGEQUEUE_BATCH_SIZE -> --batch-size); flags win.
TLS: put sslmode=require (or verify-full) in the Postgres DSN query; use a rediss:// Redis URL.
Passwords belong in the URLs (or their Secrets) and are never printed."""


def flag_for(variable: str) -> str:
    """``JUDGEQUEUE_BATCH_SIZE`` -> ``--batch-size``."""
    return "--" + variable.removeprefix(PREFIX).lower().replace("_", "-")


def _variable_help(variable: str) -> str:
    return f"overrides ${variable}"


def add_variable_flags(parser: argparse.ArgumentParser, variables: Sequence[str], title: str) -> None:
    group = parser.add_argument_group(title)
    for variable in variables:
        group.add_argument(flag_for(variable), dest=variable, metavar="VALUE", help=_variable_help(variable))


def overrides_from(args: argparse.Namespace) -> dict[str, str]:
    """The ``JUDGEQUEUE_*`` values given as flags."""
    return {k: v for k, v in vars(args).items() if k.startswith(PREFIX) and v is not None}


def resolve(args: argparse.Namespace, env: Mapping[str, str], variable: str) -> Any:
    """Validate one variable from its flag, the environment or, for a connection, the file its
    ``*_FILE`` variable names (a mounted Secret, as the roles read it); ConfigError names it."""
    flags = overrides_from(args)
    if variable in flags:
        return parse_variable(variable, flags[variable], shown_as=flag_for(variable))
    if variable.removeprefix(PREFIX) in FILE_VARIABLES:
        others = [PREFIX + suffix for suffix in FILE_VARIABLES if PREFIX + suffix != variable]
        from_file = read_credential_files(env, ignore=others)
        if variable in from_file:
            return parse_variable(variable, from_file[variable])
    return parse_variable(variable, env.get(variable))


def explain(exc: ConfigError) -> str:
    """The error line, with the flag that sets a missing variable."""
    message = str(exc)
    if message.startswith(PREFIX) and message.endswith(" is required"):
        message += f" (set it or pass {flag_for(message.split()[0])})"
    return message


def print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, default=str, sort_keys=False))


def print_listing(
    rows: Sequence[T], as_json: bool, to_json: Callable[[T], Any], line: Callable[[T], str], none: str,
    between: str = "\n",
) -> None:
    """A ``list`` subcommand's output: a JSON array, or one line (or block) per row, ``between`` them
    (``none`` when there is none)."""
    if as_json:
        print_json([to_json(r) for r in rows])
    else:
        print(between.join(line(r) for r in rows) if rows else none)


def run_async(coro: Awaitable[T]) -> T:
    async def wrapper() -> T:
        return await coro

    return asyncio.run(wrapper())


def scrub(text: str, secrets: Sequence[str]) -> str:
    """``text`` with the password field of each URL in ``secrets`` hidden: the whole URL where it
    appears, else its userinfo (``user:PASSWORD@``) and ``password=`` forms. Only those: a short
    password must not turn every word that contains it into stars."""
    from urllib.parse import unquote, urlsplit

    for url in secrets:
        if not url:
            continue
        if url in text:
            text = text.replace(url, redact_url(url))
        try:
            parts = urlsplit(url)
            password = parts.password
        except ValueError:
            continue
        if not password:
            continue
        for form in {password, unquote(password)}:
            text = text.replace(f":{form}@", ":***@")
            text = re.sub(rf"(password=){re.escape(form)}(?=[&\s'\"]|$)", r"\1***", text)
    return text


def secret_urls(values: Mapping[str, str]) -> list[str]:
    """The connection URLs a message might quote, for :func:`scrub`: given as variables or flags,
    or read from their ``*_FILE`` (a pod's mounted Secret), best effort."""
    names = [PREFIX + suffix for suffix in ("POSTGRES_DSN", "POSTGRES_LISTEN_DSN", "REDIS_URL")]
    found = [values[name] for name in names if values.get(name)]
    for name in names:
        try:
            found += list(read_credential_files(values, ignore=[n for n in names if n != name]).values())
        except ConfigError:
            continue  # reported by the command itself, which reads the files again
    return found


async def connect_pg(dsn: str) -> Any:
    import asyncpg

    from ..transport.connect import connect_postgres

    try:
        # One-shot commands gain nothing from caching prepared statements, and without the cache
        # they work through any pooler, PgBouncer in transaction mode included.
        return await connect_postgres(dsn, pooler="transaction", timeout=CONNECT_TIMEOUT)
    except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        raise Failure(f"cannot connect to Postgres at {redact_url(dsn)}: {exc or type(exc).__name__}") from None


async def with_pg(dsn: str, fn: Callable[[Any], Awaitable[T]]) -> T:
    conn = await connect_pg(dsn)
    try:
        return await fn(conn)
    finally:
        await conn.close()


async def with_redis(url: str, fn: Callable[[Any], Awaitable[T]], socket_timeout: float = CONNECT_TIMEOUT) -> T:
    from ..transport.connect import redis_client

    client = redis_client(url, socket_timeout=socket_timeout, socket_connect_timeout=socket_timeout)
    try:
        return await fn(client)
    finally:
        await client.aclose()


def run_pg(dsn: str, fn: Callable[[Any], Awaitable[T]], *, transaction: bool = False) -> T:
    """Run ``fn`` on a fresh Postgres connection, closed after it: a one-shot command's step. With
    ``transaction``, all ``fn`` does commits at once or not at all."""

    async def atomic(conn: Any) -> T:
        async with conn.transaction():
            return await fn(conn)

    return run_async(with_pg(dsn, atomic if transaction else fn))


def run_redis(url: str, fn: Callable[[Any], Awaitable[T]]) -> T:
    """Run ``fn`` on a fresh Redis client, closed after it: a one-shot command's step."""
    return run_async(with_redis(url, fn))


def run_pg_redis(
    dsn: str, url: str, fn: Callable[[Any, Any], Awaitable[T]], *, socket_timeout: float = CONNECT_TIMEOUT
) -> T:
    """Run ``fn`` on a fresh Postgres connection and a fresh Redis client, both closed after it."""
    return run_pg(dsn, lambda conn: with_redis(url, lambda client: fn(conn, client), socket_timeout))


def pg_and_queue(args: argparse.Namespace, env: Mapping[str, str]) -> tuple[str, str]:
    """The Postgres DSN and the queue of a command that works on one queue in Postgres (in that order,
    so a missing DSN is the error named first)."""
    dsn: str = resolve(args, env, DSN)
    queue: str = resolve(args, env, QUEUE)
    return dsn, queue


def redis_if_given(args: argparse.Namespace, env: Mapping[str, str]) -> str | None:
    """The Redis URL of a command that works without Redis, if it was given one (flag, variable or
    file), validated; else None."""
    given = REDIS in overrides_from(args) or bool(env.get(REDIS)) or bool(env.get(REDIS + "_FILE"))
    url: str | None = resolve(args, env, REDIS) if given else None
    return url


def connection_flags(
    parser: argparse.ArgumentParser, variables: Sequence[str] = (DSN, QUEUE), title: str = "connection"
) -> None:
    """The flags of the connection variables a command reads (by default a queue's in Postgres)."""
    add_variable_flags(parser, variables, title)


async def load_redis_functions(client: Any) -> list[str]:
    """Load every Redis function the components call (the roles' users may FCALL them, never load
    one); the functions' names."""
    from ..store import dlq  # noqa: F401 - registers its script with the others
    from ..transport import (
        endpoint_slots,  # noqa: F401 - registers the endpoints' functions
        redis_scripts,
    )

    await redis_scripts.load_scripts(client)
    return [s.function for s in redis_scripts.registered_scripts()]


def queue_arg(args: argparse.Namespace, env: Mapping[str, str]) -> str:
    name = getattr(args, "name", None)
    if name:
        from ..base.names import validate_queue_name

        try:
            return validate_queue_name(name)
        except ValueError as exc:
            raise Failure(str(exc), EXIT_USAGE) from None
    queue: str = resolve(args, env, QUEUE)
    return queue


def flags_json(flags: Any) -> dict[str, Any]:
    return {
        "name": flags.name,
        "mode": flags.mode,
        "watermark": flags.watermark.isoformat() if flags.watermark else None,
        "paused": flags.paused,
        "config_version": flags.config_version,
        "updated_at": flags.updated_at.isoformat(),
    }


def flags_line(flags: Any) -> str:
    watermark = flags.watermark.isoformat() if flags.watermark else "none"
    return (
        f"{flags.name}  mode={flags.mode}  watermark={watermark}  paused={'yes' if flags.paused else 'no'}  "
        f"config_version={flags.config_version}"
    )


#: What a subcommand runs: the parsed arguments and the environment in, the exit code out.
Handler = Callable[[argparse.Namespace, Mapping[str, str]], int]


class Parser(argparse.ArgumentParser):
    """argparse with the project's one-line errors and exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)


#: The connection variables of a command that needs both servers and a queue.
CONNECTION = [DSN, REDIS, QUEUE]


class Commands:
    """The ``judgequeue`` subcommands being declared: each command group's module adds its own."""

    def __init__(self, sub: Any, json_flag: Parser) -> None:
        self.sub = sub
        #: A parent parser that gives a subcommand ``--json``.
        self.json_flag = json_flag

    def add(self, name: str, help_text: str, *, parents: Sequence[Parser] = ()) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = self.sub.add_parser(
            name, help=help_text, description=help_text, epilog=EPILOG,
            formatter_class=argparse.RawDescriptionHelpFormatter, parents=parents,
        )  # fmt: skip
        return p

    def actions(self, parent: argparse.ArgumentParser, dest: str, handler: Handler) -> Callable[[str, str], Parser]:
        """The ACTION subcommands of ``parent`` (``dest`` names the one chosen), all run by ``handler``:
        what it returns adds one, with its help as its description and ``--json``."""
        subparsers = parent.add_subparsers(dest=dest, metavar="ACTION", parser_class=Parser, required=True)

        def action(name: str, help_text: str) -> Parser:
            q: Parser = subparsers.add_parser(name, help=help_text, description=help_text, parents=[self.json_flag])
            q.set_defaults(handler=handler)
            return q

        return action
