"""``judgequeue submission``: one submission's verdict history, and cancelling it."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

from .common import (
    DSN,
    EXIT_OK,
    QUEUE,
    Commands,
    add_variable_flags,
    print_json,
    resolve,
    run_async,
    with_pg,
)


def cmd_submission(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    from ..store import submissions

    dsn: str = resolve(args, env, DSN)
    queue: str = resolve(args, env, QUEUE)
    submission: int = args.id
    if args.submission_command == "cancel":

        async def cancel(conn: Any) -> submissions.Cancellation:
            async with conn.transaction():
                return await submissions.cancel(conn, queue, submission, args.reason)

        done = run_async(with_pg(dsn, cancel))
        if args.json:
            print_json({"id": submission, "generation": done.generation, "cancelled_now": done.cancelled_now})
        elif done.cancelled_now:
            print(f"{submission} cancelled as generation {done.generation}")
        else:
            print(f"{submission} was cancelled already (generation {done.generation}); nothing changed")
        return EXIT_OK

    entries = run_async(with_pg(dsn, lambda conn: submissions.history(conn, queue, submission)))
    if args.json:
        print_json([
            {"generation": e.generation, "status": e.status, "cause": e.cause, "reason": e.reason,
             "score": e.score, "stored_at": e.stored_at.isoformat(), "verdict": e.verdict}
            for e in entries
        ])  # fmt: skip
        return EXIT_OK
    if not entries:
        print(f"{submission} has no verdict yet")
    for e in entries:
        extra = "".join(
            f"  {name}={value}" for name, value in (("score", e.score), ("reason", e.reason)) if value is not None
        )
        when = e.stored_at.isoformat(timespec="seconds")
        print(f"{when}  generation {e.generation}  {e.status:<18} {e.cause}{extra}")
    return EXIT_OK


def add(commands: Commands) -> None:
    p = commands.add("submission", "one submission: its verdict history, or cancel it")
    action = commands.actions(p, "submission_command", cmd_submission)
    h = action("history", "every verdict a submission was given, oldest first, with its generation and cause")
    h.add_argument("id", type=int, metavar="ID", help="submission id")
    add_variable_flags(h, [DSN, QUEUE], "connection")
    c = action("cancel", "cancel a submission: a queued job never starts, a running one is stopped (idempotent)")
    c.add_argument("id", type=int, metavar="ID", help="submission id")
    c.add_argument("--reason", required=True, help="why (1 to 1000 characters): kept in the history and the event")
    add_variable_flags(c, [DSN, QUEUE], "connection")
