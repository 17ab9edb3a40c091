"""``judgequeue submit``: one JSON payload to a queue, and its verdict when asked to wait."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from ..base.errors import Failure
from ..config import (
    parse_duration,
)
from .common import EXIT_FAILURE, EXIT_OK, EXIT_USAGE, Commands, connection_flags, pg_and_queue, print_json, run_pg


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
    from ..store import submissions

    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while True:
        found = await submissions.read(conn, ids)
        if all(i in found and submissions.is_terminal(found[i]["status"]) for i in ids) or loop.time() >= deadline:
            return found
        await asyncio.sleep(poll)


def verdict_json(row: Any) -> dict[str, Any]:
    return {"id": row["id"], "status": row["status"], "generation": row["generation"], "verdict": row["verdict"]}


def verdict_lines(row: Any) -> list[str]:
    """A stored verdict for people: summary, per-test table, groups (see judges.report)."""
    from ..judges.report import render_verdict

    doc = verdict_json(row)["verdict"] or {}
    details = doc.get("details") if isinstance(doc, dict) else None
    shown = dict(details) if isinstance(details, dict) else {}
    if isinstance(doc, dict) and isinstance(doc.get("reason"), str):
        shown.setdefault("reason", doc["reason"])  # a cancellation's reason is the document's own
    return render_verdict(row["status"], shown)


def cmd_submit(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    from ..store.outbox import submit
    from ..store.submissions import is_terminal

    dsn, queue = pg_and_queue(args, env)
    payload = _read_payload(args)

    async def go(conn: Any) -> tuple[int, dict[int, Any]]:
        async with conn.transaction():
            submission_id = await submit(conn, queue, payload, job_class=args.job_class, key=args.key)
        rows = await wait_for_verdicts(conn, [submission_id], args.timeout) if args.wait else {}
        return submission_id, rows

    submission_id, rows = run_pg(dsn, go)
    if not args.wait:
        print(json.dumps({"id": submission_id, "queue": queue}) if args.json else submission_id)
        return EXIT_OK
    row = rows.get(submission_id)
    done = row is not None and is_terminal(row["status"])
    if args.json:
        print_json({**verdict_json(row), "queue": queue, "finished": done} if row else {"id": submission_id})
    else:
        print(f"{submission_id} {row['status'] if row else 'UNKNOWN'}")
        if done:
            print("\n".join(verdict_lines(row)[1:]))
    if not done:
        print(f"judgequeue: error: no verdict for submission {submission_id} within {args.timeout:g}s", file=sys.stderr)
        return EXIT_FAILURE
    return EXIT_OK


def add(commands: Commands) -> None:
    text = "submit one JSON payload to a queue; prints the submission id"
    p = commands.add("submit", text, parents=[commands.json_flag])
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--payload", help="the payload as JSON text")
    src.add_argument("--file", help="read the JSON payload from a file ('-' for standard input)")
    p.add_argument("--class", dest="job_class", metavar="CLASS",
                   help="one of the queue's priority classes (default: its first, highest)")
    p.add_argument("--key", help="fairness key within the class (a contest id): keys take turns")
    p.add_argument("--wait", action="store_true", help="wait for the verdict and print it (exit 1 on timeout)")
    p.add_argument("--timeout", type=parse_duration, default=60.0, help="--wait: give up after this long (default 60s)")
    connection_flags(p)
    p.set_defaults(handler=cmd_submit)
