"""``judgequeue local``: a JudgeQueue manifest run here, as processes."""

from __future__ import annotations

import argparse
from collections.abc import Mapping

from ..config import (
    parse_duration,
    parse_variable,
)
from .common import DSN, REDIS, Commands, connection_flags, overrides_from


def cmd_local(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    from ..local import LocalOptions, run_local

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


def add(commands: Commands) -> None:
    p = commands.add(
        "local",
        "run a JudgeQueue manifest here: migrate, create the queue, apply cutover, start the roles as child "
        "processes and show progress. Postgres/Redis come from $JUDGEQUEUE_POSTGRES_DSN/$JUDGEQUEUE_REDIS_URL "
        f"(or the flags), defaulting to {LOCAL_DSN} and {LOCAL_REDIS}; a role given "
        "$JUDGEQUEUE_<DISPATCHER|WORKER|REAPER>_POSTGRES_DSN/_REDIS_URL connects with those instead (its own "
        "login, as spec.credentials on Kubernetes). Ctrl-C stops everything gracefully.",
        parents=[commands.json_flag],
    )
    p.add_argument("-f", "--file", required=True, help="JudgeQueue manifest (YAML), e.g. examples/judgequeue.yaml")
    p.add_argument("--demo", action="store_true", help="submit the demo programs, print their verdicts, exit")
    p.add_argument("--demo-dir", help="demo set directory (default: demo/ next to the manifest)")
    p.add_argument("--timeout", type=parse_duration, default=120.0, help="--demo: give up after this long (default 2m)")
    p.add_argument("--workers", type=int, help="worker processes (default: spec.worker.minReplicas)")
    p.add_argument("--log-dir", help="where the roles' JSON logs go (default: a new temporary directory)")
    p.add_argument("--metrics-port", type=int, default=0, help="first metrics port of the roles (default: any)")
    connection_flags(p, [DSN, REDIS])
    p.set_defaults(handler=cmd_local)
