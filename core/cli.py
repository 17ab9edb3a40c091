"""The ``judgequeue`` command: one entry point for every role and tool.

Exit codes: 0 success; 1 failure (unreachable server, refused change, unhealthy status, role crash);
2 bad usage or configuration (one line naming the variable or flag and what it accepts).

Settings come from ``JUDGEQUEUE_*`` variables; every variable has a matching flag (``--batch-size``
overrides ``JUDGEQUEUE_BATCH_SIZE``). A command validates only the variables it needs: ``migrate``
needs the Postgres DSN alone, ``status`` needs Postgres, Redis and the queue. Heavy imports happen
inside the subcommands so ``--help`` is fast and roles load only what they run.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import importlib
import json
import os
import re
import sys
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from datetime import datetime
from typing import Any, NoReturn, TypeVar

from .config import (
    FILE_VARIABLES,
    PREFIX,
    archive_variable_names,
    judge_refused_mode,
    load_archive_settings,
    load_settings,
    parse_duration,
    parse_variable,
    read_credential_files,
    redact_url,
    variable_names,
)
from .errors import ConfigError, Failure, JudgeQueueError
from .version import VERSION

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


def _fatal(line: str) -> None:
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


def _add_variable_flags(parser: argparse.ArgumentParser, variables: Sequence[str], title: str) -> None:
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


def _print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, default=str, sort_keys=False))


def _print_listing(
    rows: Sequence[T], as_json: bool, to_json: Callable[[T], Any], line: Callable[[T], str], none: str
) -> None:
    """A ``list`` subcommand's output: a JSON array, or one line per row (``none`` when there is none)."""
    if as_json:
        _print_json([to_json(r) for r in rows])
    else:
        print("\n".join(line(r) for r in rows) if rows else none)


def _run(coro: Awaitable[T]) -> T:
    async def wrapper() -> T:
        return await coro

    return asyncio.run(wrapper())


def _scrub(text: str, secrets: Sequence[str]) -> str:
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


def _secret_urls(values: Mapping[str, str]) -> list[str]:
    """The connection URLs a message might quote, for :func:`_scrub`: given as variables or flags,
    or read from their ``*_FILE`` (a pod's mounted Secret), best effort."""
    names = [PREFIX + suffix for suffix in ("POSTGRES_DSN", "POSTGRES_LISTEN_DSN", "REDIS_URL")]
    found = [values[name] for name in names if values.get(name)]
    for name in names:
        try:
            found += list(read_credential_files(values, ignore=[n for n in names if n != name]).values())
        except ConfigError:
            continue  # reported by the command itself, which reads the files again
    return found


async def _connect_pg(dsn: str) -> Any:
    import asyncpg

    from .connect import connect_postgres

    try:
        # One-shot commands gain nothing from caching prepared statements, and without the cache
        # they work through any pooler, PgBouncer in transaction mode included.
        return await connect_postgres(dsn, pooler="transaction", timeout=CONNECT_TIMEOUT)
    except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        raise Failure(f"cannot connect to Postgres at {redact_url(dsn)}: {exc or type(exc).__name__}") from None


async def _with_pg(dsn: str, fn: Callable[[Any], Awaitable[T]]) -> T:
    conn = await _connect_pg(dsn)
    try:
        return await fn(conn)
    finally:
        await conn.close()


def _queue_arg(args: argparse.Namespace, env: Mapping[str, str]) -> str:
    name = getattr(args, "name", None)
    if name:
        from .queues import validate_queue_name

        try:
            return validate_queue_name(name)
        except ValueError as exc:
            raise Failure(str(exc), EXIT_USAGE) from None
    queue: str = resolve(args, env, QUEUE)
    return queue


def _flags_json(flags: Any) -> dict[str, Any]:
    return {
        "name": flags.name,
        "mode": flags.mode,
        "watermark": flags.watermark.isoformat() if flags.watermark else None,
        "paused": flags.paused,
        "config_version": flags.config_version,
        "updated_at": flags.updated_at.isoformat(),
    }


def _flags_line(flags: Any) -> str:
    watermark = flags.watermark.isoformat() if flags.watermark else "none"
    return (
        f"{flags.name}  mode={flags.mode}  watermark={watermark}  paused={'yes' if flags.paused else 'no'}  "
        f"config_version={flags.config_version}"
    )


# --- commands -------------------------------------------------------------------------------------


def cmd_migrate(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    from .migrate import applied_versions, migrate

    dsn: str = resolve(args, env, DSN)

    async def go(conn: Any) -> tuple[list[int], list[int]]:
        return await migrate(conn), await applied_versions(conn)

    applied, versions = _run(_with_pg(dsn, go))
    if args.json:
        _print_json({"applied": applied, "versions": versions})
    elif applied:
        print(f"applied migrations {', '.join(f'{v:04d}' for v in applied)}; schema at {versions[-1]:04d}")
    else:
        print(f"schema up to date at {versions[-1]:04d}" if versions else "no migrations")
    return EXIT_OK


ROLE_MODULES = {
    "dispatcher": "judgequeue.core.dispatcher",
    "worker": "judgequeue.core.worker",
    "reaper": "judgequeue.core.reaper",
}


def load_role(role: str) -> Callable[[Any, asyncio.Event], Coroutine[Any, Any, None]]:
    """The ``run`` function of a role module, or Failure when this build does not have it yet."""
    module_name = ROLE_MODULES[role]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name == module_name:
            raise Failure(f"judgequeue {role} is not available in this build yet ({module_name} is missing)") from None
        raise
    run = getattr(module, "run", None)
    if run is None:
        raise Failure(f"judgequeue {role} is not available in this build yet ({module_name} has no run())")
    return run  # type: ignore[no-any-return]


def cmd_role(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    from .runtime import catch_early_signals, run_role

    catch_early_signals()  # a SIGTERM while the role still imports must still stop it cleanly
    settings = load_settings(env, overrides_from(args), override_name=flag_for)
    main = load_role(args.command)
    if args.command == "worker":
        from .judges import load_judge
        from .judges.sandbox.isolation import SandboxUnavailable

        refused = judge_refused_mode(env)
        try:
            load_judge(settings.worker.judge)  # an unknown judge is bad configuration: one line, exit 2
        except ImportError as exc:
            raise Failure(f"judge plugin {settings.worker.judge!r} is installed but cannot be loaded: {exc}") from None
        except SandboxUnavailable as exc:
            if refused == "exit":
                raise
            # In a pod (the operator sets "unready"): stay up, unready, naming what is missing.
            _fatal(f"judgequeue: error: {exc}")
            from .runtime import run_refused

            return run_refused(args.command, settings, str(exc))

    return run_role(args.command, settings, main, need_group=args.command in ("worker", "reaper"))


def cmd_operator(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    # Imported here only: judgequeue.core never imports Kubernetes at module import time.
    try:
        module = importlib.import_module("judgequeue.controllers.operator")
    except ModuleNotFoundError as exc:
        if exc.name == "judgequeue.controllers.operator":
            raise Failure("judgequeue operator is not available in this build yet") from None
        raise
    run_operator = getattr(module, "run_operator", None)
    if run_operator is None:
        raise Failure("judgequeue operator is not available in this build yet (no run_operator)")
    options = module.OperatorOptions(
        namespaces=None if args.all_namespaces else args.namespace,
        liveness_port=args.liveness_port,
        liveness_address=args.liveness_address,
        peering=args.peering,
        kubeconfig=args.kubeconfig,
    )
    if args.interval is not None:
        options = dataclasses.replace(options, config=dataclasses.replace(options.config, interval=args.interval))
    try:
        result = run_operator(options, log_level=env.get("JUDGEQUEUE_LOG_LEVEL", "INFO"))
    except Exception as exc:
        if type(exc).__module__.startswith("kubernetes.config"):
            raise Failure(f"cannot load the Kubernetes configuration: {exc}") from None
        raise
    return int(result or 0)


def cmd_local(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    from .local import LocalOptions, run_local

    options = LocalOptions(
        manifest=args.file,
        postgres_dsn=_local_connection(args, env, DSN, "JUDGEQUEUE_TEST_POSTGRES_DSN", LOCAL_DSN),
        redis_url=_local_connection(args, env, REDIS, "JUDGEQUEUE_TEST_REDIS_URL", LOCAL_REDIS),
        demo=args.demo,
        demo_dir=args.demo_dir,
        timeout=args.timeout,
        workers=args.workers,
        log_dir=args.log_dir,
        metrics_port=args.metrics_port,
        json_output=args.json,
    )
    return run_local(options, env)


LOCAL_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"
LOCAL_REDIS = "redis://127.0.0.1:6379/0"


def _local_connection(
    args: argparse.Namespace, env: Mapping[str, str], variable: str, test_var: str, default: str
) -> str:
    raw = overrides_from(args).get(variable) or env.get(variable) or env.get(test_var) or default
    value: str = parse_variable(variable, raw)
    return value


def cmd_queue(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    from .queues import create_queue, get_queue, list_queues

    dsn: str = resolve(args, env, DSN)
    if args.queue_command == "list":
        _print_listing(_run(_with_pg(dsn, list_queues)), args.json, _flags_json, _flags_line, "no queues")
        return EXIT_OK
    name = _queue_arg(args, env)
    if args.queue_command == "create":
        flags = _run(_with_pg(dsn, lambda conn: create_queue(conn, name, mode=args.mode)))
    else:
        from .outbox import stats

        async def show(conn: Any) -> Any:
            return await get_queue(conn, name), await stats(conn, name)

        flags, outbox = _run(_with_pg(dsn, show))
        if args.json:
            _print_json({**_flags_json(flags), "outbox": outbox.by_state})
        else:
            print(_flags_line(flags))
            print("outbox " + "  ".join(f"{k}={v}" for k, v in outbox.by_state.items()))
        return EXIT_OK
    print(json.dumps(_flags_json(flags)) if args.json else _flags_line(flags))
    return EXIT_OK


def cmd_problem(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    from pathlib import Path

    from .problems import list_problems, upload

    dsn: str = resolve(args, env, DSN)
    if args.problem_command == "list":
        def line(r: dict[str, Any]) -> str:
            return (f"{r['id']}  version={r['version']}  tests={r['tests']}  bytes={r['total_bytes']}  "
                    f"sha256={r['sha256'][:16]}")  # fmt: skip

        _print_listing(_run(_with_pg(dsn, list_problems)), args.json, dict, line, "no problems")
        return EXIT_OK
    bounds = load_archive_settings(env, overrides_from(args), override_name=flag_for)
    done = _run(_with_pg(dsn, lambda conn: upload(
        conn, Path(args.dir), version=args.version, problem_id=args.id, time_limit=args.time_limit, fmt=args.format,
        bounds=bounds, judge_env=env,
    )))  # fmt: skip
    if args.json:
        _print_json({**vars(done), "notes": list(done.notes)})
    else:
        print(f"{done.id} version {done.version} ({done.format} package): {done.tests} tests, {done.total_bytes} "
              f"bytes ({done.new_files} new files), sha256 {done.sha256[:16]}")
        for note in done.notes:
            print(f"note: {note}")
        print(f'submit with: {{"problem": "{done.id}", "version": {done.version}, "language": ..., "source": ...}}')
    return EXIT_OK


def _read_payload(args: argparse.Namespace) -> Any:
    if args.payload is not None:
        text, source = args.payload, "--payload"
    else:
        source = args.file
        try:
            text = sys.stdin.read() if args.file == "-" else open(args.file).read()  # noqa: SIM115
        except OSError as exc:
            raise Failure(f"cannot read {args.file}: {exc.strerror or exc}", EXIT_USAGE) from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise Failure(f"{source} is not valid JSON: {exc}", EXIT_USAGE) from None


async def wait_for_verdicts(conn: Any, ids: Sequence[int], within: float, poll: float = 0.2) -> dict[int, Any]:
    """Poll until every submission in ``ids`` is terminal or ``within`` seconds pass; return the rows seen."""
    from . import submissions

    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while True:
        found = await submissions.read(conn, ids)
        if all(i in found and submissions.is_terminal(found[i]["status"]) for i in ids) or loop.time() >= deadline:
            return found
        await asyncio.sleep(poll)


def _verdict_json(row: Any) -> dict[str, Any]:
    return {"id": row["id"], "status": row["status"], "generation": row["generation"], "verdict": row["verdict"]}


def _verdict_lines(row: Any) -> list[str]:
    """A stored verdict for people: summary, per-test table, groups (see judges.report)."""
    from .judges.report import render_verdict

    doc = _verdict_json(row)["verdict"] or {}
    details = doc.get("details") if isinstance(doc, dict) else None
    return render_verdict(row["status"], details if isinstance(details, dict) else {})


def cmd_submission_status(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    """``status --submission ID``: each submission's status and, once judged, its per-test results."""
    from . import submissions

    dsn: str = resolve(args, env, DSN)
    rows = _run(_with_pg(dsn, lambda conn: submissions.read(conn, args.submission)))
    missing = [i for i in args.submission if i not in rows]
    if args.json:
        _print_json([_verdict_json(rows[i]) for i in args.submission if i in rows])
    else:
        for i in args.submission:
            if i in rows:
                lines = _verdict_lines(rows[i]) if submissions.is_terminal(rows[i]["status"]) else [rows[i]["status"]]
                print(f"{i} " + "\n".join(lines))
    if missing:
        print(f"judgequeue: error: no submission {', '.join(map(str, missing))}", file=sys.stderr)
        return EXIT_FAILURE
    return EXIT_OK


def cmd_submit(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    from .outbox import submit
    from .submissions import is_terminal

    dsn: str = resolve(args, env, DSN)
    queue: str = resolve(args, env, QUEUE)
    payload = _read_payload(args)

    async def go(conn: Any) -> tuple[int, dict[int, Any]]:
        async with conn.transaction():
            submission_id = await submit(conn, queue, payload)
        rows = await wait_for_verdicts(conn, [submission_id], args.timeout) if args.wait else {}
        return submission_id, rows

    submission_id, rows = _run(_with_pg(dsn, go))
    if not args.wait:
        print(json.dumps({"id": submission_id, "queue": queue}) if args.json else submission_id)
        return EXIT_OK
    row = rows.get(submission_id)
    done = row is not None and is_terminal(row["status"])
    if args.json:
        _print_json({**_verdict_json(row), "queue": queue, "finished": done} if row else {"id": submission_id})
    else:
        print(f"{submission_id} {row['status'] if row else 'UNKNOWN'}")
        if done:
            print("\n".join(_verdict_lines(row)[1:]))
    if not done:
        print(f"judgequeue: error: no verdict for submission {submission_id} within {args.timeout:g}s", file=sys.stderr)
        return EXIT_FAILURE
    return EXIT_OK


def cmd_rejudge(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    from .outbox import rejudge

    dsn: str = resolve(args, env, DSN)

    async def go(conn: Any) -> list[tuple[int, int]]:
        out = []
        for submission_id in args.ids:
            async with conn.transaction():
                out.append((submission_id, await rejudge(conn, submission_id)))
        return out

    results = _run(_with_pg(dsn, go))
    if args.json:
        _print_json([{"id": i, "generation": g} for i, g in results])
    else:
        for i, g in results:
            print(f"{i} requeued as generation {g}")
    return EXIT_OK


def _threshold(kind: Callable[[str], T]) -> Callable[[str], T | None]:
    def parse(text: str) -> T | None:
        if text.lower() in ("off", "none", "-"):
            return None
        try:
            value = kind(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        if isinstance(value, int | float) and value < 0:
            raise argparse.ArgumentTypeError(f"{text!r} must not be negative (use 'off' to disable)")
        return value

    return parse


def cmd_status(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    if args.submission:
        return cmd_submission_status(args, env)
    from .connect import redis_client
    from .status import Thresholds, as_json, evaluate, gather, render

    dsn: str = resolve(args, env, DSN)
    redis_url: str = resolve(args, env, REDIS)
    queue: str = resolve(args, env, QUEUE)
    # Each threshold's flag is named after its field (--max-pel sets max_pel).
    thresholds = Thresholds(**{f.name: getattr(args, f.name) for f in dataclasses.fields(Thresholds)})

    async def go(conn: Any) -> Any:
        client = redis_client(redis_url, socket_timeout=5, socket_connect_timeout=5)
        try:
            return await gather(conn, client, queue)
        finally:
            await client.aclose()

    figures = _run(_with_pg(dsn, go))
    verdict = evaluate(figures, thresholds)
    if args.json:
        _print_json(as_json(figures, verdict))
    else:
        print(render(figures, verdict))
    return EXIT_OK if verdict.healthy else EXIT_FAILURE


def parse_time(text: str) -> datetime:
    """An RFC 3339 / ISO 8601 time with a zone, e.g. ``2025-01-31T12:00:00Z``."""
    try:
        value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a time such as 2025-01-31T12:00:00Z or 'now'") from None
    if value.tzinfo is None:
        raise argparse.ArgumentTypeError(f"{text!r} needs a time zone (e.g. a trailing Z)")
    return value


def cmd_cutover(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    from .queues import database_now, get_queue, set_cutover

    dsn: str = resolve(args, env, DSN)
    queue: str = resolve(args, env, QUEUE)
    if args.cutover_command == "show":
        flags = _run(_with_pg(dsn, lambda conn: get_queue(conn, queue)))
    else:
        if args.mode is None and args.watermark is None and args.paused is None:
            raise Failure("cutover set: give at least one of --mode, --watermark, --pause, --resume", EXIT_USAGE)

        async def go(conn: Any) -> Any:
            changes: dict[str, Any] = {}
            if args.mode is not None:
                changes["mode"] = args.mode
            if args.paused is not None:
                changes["paused"] = args.paused
            if args.watermark is not None:
                # "now" is the database clock, like every other time decision.
                changes["watermark"] = (
                    await database_now(conn) if args.watermark == "now" else parse_time(args.watermark)
                )
            return await set_cutover(conn, queue, **changes)

        flags = _run(_with_pg(dsn, go))
    print(json.dumps(_flags_json(flags)) if args.json else _flags_line(flags))
    return EXIT_OK


async def _with_redis(url: str, fn: Callable[[Any], Awaitable[T]]) -> T:
    from .connect import redis_client

    client = redis_client(url, socket_timeout=CONNECT_TIMEOUT, socket_connect_timeout=CONNECT_TIMEOUT)
    try:
        return await fn(client)
    finally:
        await client.aclose()


def _letter_json(letter: Any) -> dict[str, Any]:
    return {
        "id": letter.entry_id,
        "submission": letter.submission,
        "generation": letter.generation,
        "reason": letter.reason,
        "deliveries": letter.deliveries,
        "consumer": letter.consumer,
        "postgres": letter.postgres,
        "source_id": letter.source_id,
        "entry": letter.entry,
    }


def _chosen_entries(args: argparse.Namespace) -> list[str] | None:
    """Entry ids to act on, None for --all; refuses neither or both."""
    if args.all == bool(args.entries):
        raise Failure(f"dlq {args.dlq_command}: give entry ids or --all (not both)", EXIT_USAGE)
    return None if args.all else list(args.entries)


def cmd_dlq(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    from . import dlq

    redis_url: str = resolve(args, env, REDIS)
    queue: str = resolve(args, env, QUEUE)
    action = args.dlq_command
    if action == "list":
        letters = _run(_with_redis(redis_url, lambda r: dlq.list_entries(r, queue, args.count, after=args.after)))
        if args.json:
            _print_json([_letter_json(x) for x in letters])
        else:
            for x in letters:
                print(
                    f"{x.entry_id}  submission={x.submission} generation={x.generation}  "
                    f"deliveries={x.deliveries}  {x.reason}"
                )
            if not letters:
                print("no dead letters")
        return EXIT_OK
    if action == "show":
        letter = _run(_with_redis(redis_url, lambda r: dlq.show(r, queue, args.entries[0])))
        if letter is None:
            raise Failure(f"no dead letter {args.entries[0]} in queue {queue}")
        data = _letter_json(letter)
        print(json.dumps(data, indent=2) if args.json else "\n".join(f"{k:<11} {v}" for k, v in data.items()))
        return EXIT_OK
    chosen = _chosen_entries(args)
    if action == "purge":
        removed = _run(_with_redis(redis_url, lambda r: dlq.purge(r, queue, chosen)))
        print(json.dumps({"purged": removed}) if args.json else f"purged {removed} dead letters")
        return EXIT_OK
    dsn: str = resolve(args, env, DSN)

    async def go(conn: Any) -> Any:
        return await _with_redis(redis_url, lambda r: dlq.replay(conn, r, queue, chosen))

    result = _run(_with_pg(dsn, go))
    if args.json:
        _print_json({"outcomes": result.outcomes, "generations": result.generations})
    else:
        for entry_id, outcome in result.outcomes.items():
            extra = f" as generation {result.generations[entry_id]}" if entry_id in result.generations else ""
            print(f"{entry_id}  {outcome}{extra}")
        if not result.outcomes:
            print("no dead letters")
    failed = [o for o in result.outcomes.values() if o not in ("replayed", "superseded")]
    return EXIT_FAILURE if failed else EXIT_OK


def _mismatch_json(m: Any) -> dict[str, Any]:
    return {
        "submission": m.submission, "queue": m.queue, "generation": m.generation,
        "legacy": {"status": m.legacy, "details": m.legacy_details, "reported_at": m.reported_at.isoformat()},
        "shadow": {"status": m.shadow, "details": m.shadow_details, "judged_at": m.judged_at.isoformat()},
    }  # fmt: skip


def _mismatch_lines(m: Any) -> list[str]:
    """Both verdicts of a mismatch for people: each side's summary and per-test table (judges.report)."""
    from .judges.report import render_verdict

    lines = [f"submission {m.submission}  queue {m.queue}  generation {m.generation}:"
             f" legacy {m.legacy}, shadow {m.shadow}"]
    for side, status, details, at in (("legacy", m.legacy, m.legacy_details, m.reported_at),
                                      ("shadow", m.shadow, m.shadow_details, m.judged_at)):
        summary, *rest = render_verdict(status, details if isinstance(details, dict) else {}, indent="      ")
        lines.append(f"  {side}  {summary}  ({'reported' if side == 'legacy' else 'judged'} {at.isoformat()})")
        lines += rest
    return lines


def cmd_shadow(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    """``shadow diff``: the submissions the legacy and the shadow judge disagree on, newest first."""
    from . import shadow

    dsn: str = resolve(args, env, DSN)
    queue: str | None = resolve(args, env, QUEUE) if overrides_from(args).get(QUEUE) or env.get(QUEUE) else None
    if args.limit < 1:
        raise Failure("shadow diff: --limit must be 1 or more", EXIT_USAGE)
    found = _run(_with_pg(dsn, lambda conn: shadow.mismatches(conn, queue, limit=args.limit)))
    if args.json:
        _print_json([_mismatch_json(m) for m in found])
    elif found:
        print("\n\n".join("\n".join(_mismatch_lines(m)) for m in found))
    else:
        print(f"no mismatches{f' in queue {queue}' if queue else ''}")
    return EXIT_OK


# --- parser ---------------------------------------------------------------------------------------


#: What a subcommand runs: the parsed arguments and the environment in, the exit code out.
Handler = Callable[[argparse.Namespace, Mapping[str, str]], int]


class _Parser(argparse.ArgumentParser):
    """argparse with the project's one-line errors and exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)


def build_parser() -> argparse.ArgumentParser:
    """The whole command line (also used to render the README's CLI reference)."""
    formatter = argparse.RawDescriptionHelpFormatter
    parser = _Parser(
        prog="judgequeue",
        description="Recoverable online-judge job delivery: roles and tools.",
        epilog=EPILOG,
        formatter_class=formatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {VERSION}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser, required=True)

    json_flag = _Parser(add_help=False)
    json_flag.add_argument("--json", action="store_true", help="print machine-readable JSON")
    all_vars = variable_names()
    conn_vars = [DSN, REDIS, QUEUE]
    tuning_vars = [v for v in all_vars if v not in conn_vars]

    def add(name: str, help_text: str, *, parents: Sequence[_Parser] = ()) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = sub.add_parser(
            name, help=help_text, description=help_text, epilog=EPILOG, formatter_class=formatter, parents=parents
        )
        return p

    def actions(parent: argparse.ArgumentParser, dest: str, handler: Handler) -> Callable[[str, str], _Parser]:
        """The ACTION subcommands of ``parent`` (``dest`` names the one chosen), all run by ``handler``:
        what it returns adds one, with its help as its description and ``--json``."""
        subparsers = parent.add_subparsers(dest=dest, metavar="ACTION", parser_class=_Parser, required=True)

        def action(name: str, help_text: str) -> _Parser:
            q: _Parser = subparsers.add_parser(name, help=help_text, description=help_text, parents=[json_flag])
            q.set_defaults(handler=handler)
            return q

        return action

    p = add("migrate", "apply the database migrations (needs only the Postgres DSN)", parents=[json_flag])
    _add_variable_flags(p, [DSN], "connection")
    p.set_defaults(handler=cmd_migrate)

    for role, text in (
        ("dispatcher", "run a dispatcher: move committed outbox rows into the Redis stream"),
        ("worker", "run a worker: judge jobs from the stream and write fenced verdicts"),
        ("reaper", "run a reaper: rescue idle entries, expired leases and poison jobs; export queue gauges"),
    ):
        p = add(role, text + " (serves /metrics, /healthz, /readyz on --metrics-port; stops on SIGTERM)")
        _add_variable_flags(p, conn_vars, "connection")
        _add_variable_flags(p, tuning_vars, "settings")
        p.set_defaults(handler=cmd_role)

    p = add("operator", "run the Kubernetes operator (Kopf) for JudgeQueue resources")
    p.add_argument("--namespace", action="append", help="watch this namespace (repeatable)")
    p.add_argument("--all-namespaces", action="store_true", help="watch every namespace (default without --namespace)")
    p.add_argument("--liveness-port", type=int, help="serve the operator's /healthz on this port")
    p.add_argument("--liveness-address", default="0.0.0.0",
                   help="the address /healthz binds to (default 0.0.0.0: every interface of the pod, where the"
                        " kubelet probes; 127.0.0.1 keeps it local)")
    p.add_argument("--peering", help="Kopf peering name, for several operator replicas (default: standalone)")
    p.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster, else $KUBECONFIG or ~/.kube/config)")
    p.add_argument("--interval", type=parse_duration, default=10.0,
                   help="time between timer ticks: autoscaling, status refresh, retries (default 10s)")
    p.set_defaults(handler=cmd_operator)

    p = add(
        "local",
        "run a JudgeQueue manifest here: migrate, create the queue, apply cutover, start the roles as child "
        "processes and show progress. Postgres/Redis come from $JUDGEQUEUE_POSTGRES_DSN/$JUDGEQUEUE_REDIS_URL "
        f"(or the flags), defaulting to {LOCAL_DSN} and {LOCAL_REDIS}. Ctrl-C stops everything gracefully.",
        parents=[json_flag],
    )
    p.add_argument("-f", "--file", required=True, help="JudgeQueue manifest (YAML), e.g. examples/judgequeue.yaml")
    p.add_argument("--demo", action="store_true", help="submit the demo programs, print their verdicts, exit")
    p.add_argument("--demo-dir", help="demo set directory (default: demo/ next to the manifest)")
    p.add_argument("--timeout", type=parse_duration, default=120.0, help="--demo: give up after this long (default 2m)")
    p.add_argument("--workers", type=int, help="worker processes (default: spec.worker.minReplicas)")
    p.add_argument("--log-dir", help="where the roles' JSON logs go (default: a new temporary directory)")
    p.add_argument("--metrics-port", type=int, default=0, help="first metrics port of the roles (default: any)")
    _add_variable_flags(p, [DSN, REDIS], "connection")
    p.set_defaults(handler=cmd_local)

    p = add("queue", "create, list and show queues (Postgres only)")
    queue_action = actions(p, "queue_command", cmd_queue)
    for action, text in (("create", "create a queue (idempotent)"), ("show", "show a queue's flags and outbox")):
        q = queue_action(action, text)
        q.add_argument("name", nargs="?", help="queue name (default: $JUDGEQUEUE_QUEUE)")
        _add_variable_flags(q, [DSN, QUEUE], "connection")
        if action == "create":
            q.add_argument("--mode", choices=("live", "shadow"), default="live", help="initial mode (default live)")
    _add_variable_flags(queue_action("list", "list every queue"), [DSN], "connection")

    p = add("problem", "upload and list problem packages (tests, checker, interactor, limits, subtasks)")
    problem_action = actions(p, "problem_command", cmd_problem)
    text = ("store the package in DIR (a directory, or a zip archive of one) as a new version: judgequeue "
            "(problem.yaml with an id, tests/NAME.in + NAME.ans), ICPC/Kattis (problem.yaml, data/, "
            "output_validators/) or Polygon (problem.xml); its checker and interactor are built first")
    q = problem_action("upload", text)
    q.add_argument("dir", help="the package: a directory, or a zip archive of one (as Polygon exports it)")
    q.add_argument("--version", type=int,
                   help="version number (default: the package's own (problem.yaml's, Polygon's revision), else the "
                        "next free one)")  # fmt: skip
    q.add_argument("--id", help="problem id (default: problem.yaml's id, Polygon's short-name, "
                                "a Kattis package's directory name)")  # fmt: skip
    q.add_argument("--time-limit", type=float, metavar="SECONDS",
                   help="a Kattis package's time limit when it gives none (limits.time_limit, .timelimit)")
    q.add_argument("--format", choices=("judgequeue", "kattis", "polygon"),
                   help="the package format (default: detected)")  # fmt: skip
    _add_variable_flags(q, [DSN], "connection")
    _add_variable_flags(q, archive_variable_names(), "what a package may hold (docs/judges.md)")
    _add_variable_flags(problem_action("list", "list stored packages"), [DSN], "connection")

    p = add("submit", "submit one JSON payload to a queue; prints the submission id", parents=[json_flag])
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--payload", help="the payload as JSON text")
    src.add_argument("--file", help="read the JSON payload from a file ('-' for standard input)")
    p.add_argument("--wait", action="store_true", help="wait for the verdict and print it (exit 1 on timeout)")
    p.add_argument("--timeout", type=parse_duration, default=60.0, help="--wait: give up after this long (default 60s)")
    _add_variable_flags(p, [DSN, QUEUE], "connection")
    p.set_defaults(handler=cmd_submit)

    p = add(
        "status",
        "one screen of queue health: outbox by state, oldest pending age, stream length, lag, PEL, oldest idle, "
        "DLQ, live consumers, cutover flags, and shadow judging's agreement with the legacy judge (matched, "
        "mismatched, legacy only, shadow only, per verdict class). Exits 1 when a threshold is crossed ('off' "
        "disables one).",
        parents=[json_flag],
    )
    th = p.add_argument_group("thresholds")
    dur, count = _threshold(parse_duration), _threshold(int)
    th.add_argument("--max-pending-age", type=dur, default=300.0, help="oldest unsent outbox row (default 5m)")
    th.add_argument("--max-backlog", type=count, default=None, help="pending outbox + lag + PEL (default off)")
    th.add_argument("--max-lag", type=count, default=None, help="undelivered stream entries (default off)")
    th.add_argument("--max-pel", type=count, default=None, help="delivered, unacked entries (default off)")
    th.add_argument("--max-oldest-idle", type=dur, default=600.0, help="oldest pending entry idle (default 10m)")
    th.add_argument("--max-dlq", type=count, default=0, help="dead-letter entries (default 0)")
    th.add_argument("--max-dead", type=count, default=None, help="DEAD outbox rows (default off)")
    th.add_argument("--min-live-consumers", type=count, default=None, help="consumers active in the last 60s")
    p.add_argument(
        "--submission", type=int, action="append", metavar="ID",
        help="instead: show this submission's verdict with its per-test results (repeatable; needs Postgres only)",
    )  # fmt: skip
    _add_variable_flags(p, conn_vars, "connection")
    p.set_defaults(handler=cmd_status)

    p = add("dlq", "inspect and handle dead-lettered jobs")
    dlq_action = actions(p, "dlq_command", cmd_dlq)
    for action, text in (
        ("list", "list dead-lettered entries"),
        ("show", "show one dead-lettered entry with its reason"),
        ("replay", "re-dispatch dead-lettered jobs under a new generation (idempotent; needs Postgres)"),
        ("purge", "delete dead-lettered entries"),
    ):
        d = dlq_action(action, text)
        if action in ("show", "replay", "purge"):
            d.add_argument("entries", nargs="*" if action != "show" else 1, metavar="ENTRY", help="DLQ entry id")
        if action in ("replay", "purge"):
            d.add_argument("--all", action="store_true", help="every entry")
        if action == "list":
            d.add_argument("--count", type=int, default=100, help="at most this many entries (default 100)")
            d.add_argument("--after", default="-", help="start after this entry id (paging)")
        _add_variable_flags(d, conn_vars if action == "replay" else [REDIS, QUEUE], "connection")

    p = add("rejudge", "judge submissions again under a new generation", parents=[json_flag])
    p.add_argument("ids", nargs="+", type=int, metavar="ID", help="submission id")
    _add_variable_flags(p, [DSN], "connection")
    p.set_defaults(handler=cmd_rejudge)

    p = add("shadow", "shadow judging: compare the legacy judge's verdicts with the shadow workers' (Postgres only)")
    shadow_action = actions(p, "shadow_command", cmd_shadow)
    text = ("list the submissions the legacy and the shadow judge disagree on (their statuses differ), newest "
            "first, with both verdicts and their per-test details; every queue unless --queue or $JUDGEQUEUE_QUEUE")
    d = shadow_action("diff", text)
    d.add_argument("--limit", type=int, default=20, help="at most this many mismatches (default 20)")
    _add_variable_flags(d, [DSN, QUEUE], "connection")

    p = add("cutover", "show or change a queue's cutover flags (mode, watermark, paused)")
    cutover_action = actions(p, "cutover_command", cmd_cutover)
    _add_variable_flags(cutover_action("show", "show the flags"), [DSN, QUEUE], "connection")
    text = "change flags in one statement; the watermark may only move forward (rollback is --mode shadow)"
    c = cutover_action("set", text)
    c.add_argument("--mode", choices=("live", "shadow"))
    c.add_argument("--watermark", help="RFC 3339 time with zone, or 'now' (database clock)")
    pause = c.add_mutually_exclusive_group()
    pause.add_argument("--pause", dest="paused", action="store_const", const=True, help="dispatchers claim nothing")
    pause.add_argument("--resume", dest="paused", action="store_const", const=False, help="dispatch again")
    _add_variable_flags(c, [DSN, QUEUE], "connection")
    return parser


def main(argv: list[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    """Parse ``argv``, run the command, return its exit code (every error is one line on stderr)."""
    environ = os.environ if env is None else env
    args = build_parser().parse_args(argv)
    if getattr(args, "cutover_command", None) == "set" and args.watermark not in (None, "now"):
        try:
            parse_time(args.watermark)
        except argparse.ArgumentTypeError as exc:
            print(f"judgequeue: error: --watermark: {exc}", file=sys.stderr)
            return EXIT_USAGE
    secrets = _secret_urls({**environ, **overrides_from(args)})
    try:
        code: int = args.handler(args, environ)
        return code
    except ConfigError as exc:
        _fatal(f"judgequeue: error: {_scrub(explain(exc), secrets)}")
        return EXIT_USAGE
    except Failure as exc:
        _fatal(f"judgequeue: error: {_scrub(str(exc), secrets)}")
        return exc.code
    except JudgeQueueError as exc:
        _fatal(f"judgequeue: error: {_scrub(str(exc), secrets)}")
        return EXIT_USAGE if isinstance(exc, ValueError) and not _is_refusal(exc) else EXIT_FAILURE
    except KeyboardInterrupt:
        print("judgequeue: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        if not type(exc).__module__.startswith(("asyncpg", "redis")):
            raise
        message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if getattr(exc, "sqlstate", None) in ("42P01", "3F000", "42883"):  # no table / schema / function
            message += " (is the schema migrated? run: judgequeue migrate)"
        _fatal(f"judgequeue: error: {_scrub(message, secrets)}")
        return EXIT_FAILURE


def _is_refusal(exc: Exception) -> bool:
    from .errors import WatermarkMovedBack

    return isinstance(exc, WatermarkMovedBack)


if __name__ == "__main__":
    sys.exit(main())
