"""``judgequeue rejudge``: judge submissions again under a new generation, one by one or in bulk; with
``--preview``, open a rejudging (judged on the side; ``judgequeue rejudging``)."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

from ..base.errors import Failure
from ..spec import parse_timestamp
from .common import DSN, EXIT_OK, EXIT_USAGE, QUEUE, Commands, connection_flags, print_json, resolve, run_pg


def _instant(text: str | None, flag: str) -> Any:
    if text is None:
        return None
    value = parse_timestamp(text)
    if value is None:
        raise Failure(f"{flag}: {text!r} is not an RFC 3339 timestamp (e.g. 2026-03-01T12:00:00Z)", EXIT_USAGE)
    return value


def cmd_rejudge(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    from ..store.outbox import rejudge, rejudge_many

    dsn: str = resolve(args, env, DSN)
    bulk = args.problem is not None or args.since is not None or args.until is not None
    if not bulk and not args.ids:
        raise Failure("give submission ids, or --problem/--since/--until for a bulk rejudge", EXIT_USAGE)
    # Which submissions, for a bulk rejudge or a preview.
    selection: dict[str, Any] = {
        "job_class": args.job_class, "ids": args.ids or None, "problem": args.problem,
        "since": _instant(args.since, "--since"), "until": _instant(args.until, "--until"),
    }  # fmt: skip
    if args.preview:
        return _preview(args, env, dsn, selection)

    async def go(conn: Any) -> list[tuple[int, int]]:
        if bulk:
            queue: str = resolve(args, env, QUEUE)
            return await rejudge_many(conn, queue, **selection)
        out = []
        for submission_id in args.ids:
            async with conn.transaction():
                out.append((submission_id, await rejudge(conn, submission_id, job_class=args.job_class)))
        return out

    results = run_pg(dsn, go)
    if args.json:
        print_json([{"id": i, "generation": g} for i, g in results])
    else:
        for i, g in results:
            print(f"{i} requeued as generation {g}")
        if bulk:
            print(f"{len(results)} submissions requeued in one statement")
    return EXIT_OK


def _preview(args: argparse.Namespace, env: Mapping[str, str], dsn: str, selection: dict[str, Any]) -> int:
    from ..store import rejudgings

    queue: str = resolve(args, env, QUEUE)
    opened = run_pg(dsn, lambda conn: rejudgings.preview(conn, queue, **selection), transaction=True)
    if args.json:
        print_json({"rejudging": opened.rejudging, "previewed": opened.previewed, "left_out": opened.left_out})
    else:
        print(f"rejudging {opened.rejudging} opened: {opened.previewed} submissions judged again on the side"
              " (no visible verdict changes until it is applied)")
        if opened.left_out:
            print(f"{opened.left_out} selected submissions left out: still waiting for a verdict, or cancelled")
        print(f"see it with: judgequeue rejudging show {opened.rejudging}")
    return EXIT_OK


def add(commands: Commands) -> None:
    text = "judge submissions again under a new generation (ids, or in bulk by problem and time range)"
    p = commands.add("rejudge", text, parents=[commands.json_flag])
    p.add_argument("ids", nargs="*", type=int, metavar="ID", help="submission id")
    p.add_argument("--class", dest="job_class", metavar="CLASS",
                   help="the priority class of the new judging (default: the queue's lowest)")
    p.add_argument("--problem", help="bulk: every submission of the queue whose payload's problem is this")
    p.add_argument("--since", help="bulk: submissions created at or after this instant (RFC 3339)")
    p.add_argument("--until", help="bulk: submissions created before this instant (RFC 3339)")
    p.add_argument("--preview", action="store_true",
                   help="open a rejudging instead: judge them again on the side, leaving every visible verdict"
                        " as it is until 'judgequeue rejudging apply' (see 'judgequeue rejudging')")
    connection_flags(p)
    p.set_defaults(handler=cmd_rejudge)
