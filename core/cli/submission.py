"""``judgequeue submission``: one submission's verdict history, and cancelling it."""

from __future__ import annotations

import argparse
from collections.abc import Mapping

from .common import EXIT_OK, Commands, connection_flags, pg_and_queue, print_json, run_pg


def cmd_submission(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    from ..store import submissions

    dsn, queue = pg_and_queue(args, env)
    submission: int = args.id
    if args.submission_command == "cancel":
        done = run_pg(dsn, lambda conn: submissions.cancel(conn, queue, submission, args.reason), transaction=True)
        if args.json:
            print_json({"id": submission, "generation": done.generation, "cancelled_now": done.cancelled_now})
        elif done.cancelled_now:
            print(f"{submission} cancelled as generation {done.generation}")
        else:
            print(f"{submission} was cancelled already (generation {done.generation}); nothing changed")
        return EXIT_OK

    entries = run_pg(dsn, lambda conn: submissions.history(conn, queue, submission))
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
    connection_flags(h)
    c = action("cancel", "cancel a submission: a queued job never starts, a running one is stopped (idempotent)")
    c.add_argument("id", type=int, metavar="ID", help="submission id")
    c.add_argument("--reason", required=True, help="why (1 to 1000 characters): kept in the history and the event")
    connection_flags(c)
