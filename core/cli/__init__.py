"""The ``judgequeue`` command: one entry point for every role and tool.

Exit codes: 0 success; 1 failure (unreachable server, refused change, unhealthy status, role crash);
2 bad usage or configuration (one line naming the variable or flag and what it accepts).

Settings come from ``JUDGEQUEUE_*`` variables; every variable has a matching flag (``--batch-size``
overrides ``JUDGEQUEUE_BATCH_SIZE``). A command validates only the variables it needs: ``migrate``
needs the Postgres DSN alone, ``status`` needs Postgres, Redis and the queue. Heavy imports happen
inside the subcommands so ``--help`` is fast and roles load only what they run.

Each command group is a module of this package that declares its own arguments (its ``add``) and
runs them (its ``cmd_*``); :mod:`.common` holds what they share.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping

from ..base.errors import ConfigError, Failure, JudgeQueueError
from ..base.version import VERSION
from . import (
    cutover,
    dlq,
    events,
    local,
    migrate,
    operator,
    privileges,
    problem,
    queue,
    rejudge,
    rejudging,
    roles,
    shadow,
    status,
    submission,
    submit,
)
from .common import (
    EPILOG,
    EXIT_FAILURE,
    EXIT_USAGE,
    Commands,
    Parser,
    explain,
    fatal,
    overrides_from,
    scrub,
    secret_urls,
)

#: The command groups, in the order ``--help`` lists them.
GROUPS = (migrate, roles, privileges, operator, local, queue, problem, submit, status, submission, dlq, rejudge,
          rejudging, events, shadow, cutover)


def build_parser() -> argparse.ArgumentParser:
    """The whole command line (also used to render the README's CLI reference)."""
    parser = Parser(
        prog="judgequeue",
        description="Recoverable online-judge job delivery: roles and tools.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {VERSION}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser, required=True)
    json_flag = Parser(add_help=False)
    json_flag.add_argument("--json", action="store_true", help="print machine-readable JSON")
    commands = Commands(sub, json_flag)
    for group in GROUPS:
        group.add(commands)
    return parser


def main(argv: list[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    """Parse ``argv``, run the command, return its exit code (every error is one line on stderr)."""
    environ = os.environ if env is None else env
    args = build_parser().parse_args(argv)
    if getattr(args, "cutover_command", None) == "set" and args.watermark not in (None, "now"):
        try:
            cutover.parse_time(args.watermark)
        except argparse.ArgumentTypeError as exc:
            print(f"judgequeue: error: --watermark: {exc}", file=sys.stderr)
            return EXIT_USAGE
    secrets = secret_urls({**environ, **overrides_from(args)})
    try:
        code: int = args.handler(args, environ)
        return code
    except ConfigError as exc:
        fatal(f"judgequeue: error: {scrub(explain(exc), secrets)}")
        return EXIT_USAGE
    except Failure as exc:
        fatal(f"judgequeue: error: {scrub(str(exc), secrets)}")
        return exc.code
    except JudgeQueueError as exc:
        fatal(f"judgequeue: error: {scrub(str(exc), secrets)}")
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
        fatal(f"judgequeue: error: {scrub(message, secrets)}")
        return EXIT_FAILURE


def _is_refusal(exc: Exception) -> bool:
    from ..base.errors import WatermarkMovedBack

    return isinstance(exc, WatermarkMovedBack)
