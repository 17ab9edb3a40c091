"""``judgequeue status``: one screen of queue health, or one submission's verdict."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable, Mapping

from ..config import (
    parse_duration,
)
from .common import (
    CONNECTION,
    DSN,
    EXIT_FAILURE,
    EXIT_OK,
    QUEUE,
    REDIS,
    Commands,
    T,
    connection_flags,
    print_json,
    resolve,
    run_pg,
    run_pg_redis,
)
from .submit import verdict_json, verdict_lines


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


def cmd_submission_status(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    """``status --submission ID``: each submission's status and, once judged, its per-test results."""
    from ..store import submissions

    dsn: str = resolve(args, env, DSN)
    rows = run_pg(dsn, lambda conn: submissions.read(conn, args.submission))
    missing = [i for i in args.submission if i not in rows]
    if args.json:
        print_json([verdict_json(rows[i]) for i in args.submission if i in rows])
    else:
        for i in args.submission:
            if i in rows:
                lines = verdict_lines(rows[i]) if submissions.is_terminal(rows[i]["status"]) else [rows[i]["status"]]
                print(f"{i} " + "\n".join(lines))
    if missing:
        print(f"judgequeue: error: no submission {', '.join(map(str, missing))}", file=sys.stderr)
        return EXIT_FAILURE
    return EXIT_OK


def cmd_status(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    if args.submission:
        return cmd_submission_status(args, env)
    from ..status import Thresholds, as_json, evaluate, gather, render

    dsn: str = resolve(args, env, DSN)
    redis_url: str = resolve(args, env, REDIS)
    queue: str = resolve(args, env, QUEUE)
    # Each threshold's flag is named after its field (--max-pel sets max_pel).
    thresholds = Thresholds(**{f.name: getattr(args, f.name) for f in dataclasses.fields(Thresholds)})

    figures = run_pg_redis(dsn, redis_url, lambda conn, client: gather(conn, client, queue), socket_timeout=5)
    verdict = evaluate(figures, thresholds)
    if args.json:
        print_json(as_json(figures, verdict))
    else:
        print(render(figures, verdict))
    return EXIT_OK if verdict.healthy else EXIT_FAILURE


def add(commands: Commands) -> None:
    p = commands.add(
        "status",
        "one screen of queue health: outbox by state, oldest pending age, stream length, lag, PEL, oldest idle, "
        "DLQ, live consumers, cutover flags, and shadow judging's agreement with the legacy judge (matched, "
        "mismatched, legacy only, shadow only, per verdict class). Exits 1 when a threshold is crossed ('off' "
        "disables one).",
        parents=[commands.json_flag],
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
    connection_flags(p, CONNECTION)
    p.set_defaults(handler=cmd_status)
