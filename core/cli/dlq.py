"""``judgequeue dlq``: inspect and handle dead-lettered jobs."""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from typing import Any

from ..base.errors import Failure
from .common import (
    CONNECTION,
    DSN,
    EXIT_FAILURE,
    EXIT_OK,
    EXIT_USAGE,
    QUEUE,
    REDIS,
    Commands,
    connection_flags,
    print_json,
    resolve,
    run_pg_redis,
    run_redis,
)


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
    from ..store import dlq

    redis_url: str = resolve(args, env, REDIS)
    queue: str = resolve(args, env, QUEUE)
    action = args.dlq_command
    if action == "list":
        letters = run_redis(redis_url, lambda r: dlq.list_entries(r, queue, args.count, after=args.after))
        if args.json:
            print_json([_letter_json(x) for x in letters])
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
        letter = run_redis(redis_url, lambda r: dlq.show(r, queue, args.entries[0]))
        if letter is None:
            raise Failure(f"no dead letter {args.entries[0]} in queue {queue}")
        data = _letter_json(letter)
        print(json.dumps(data, indent=2) if args.json else "\n".join(f"{k:<11} {v}" for k, v in data.items()))
        return EXIT_OK
    chosen = _chosen_entries(args)
    if action == "purge":
        removed = run_redis(redis_url, lambda r: dlq.purge(r, queue, chosen))
        print(json.dumps({"purged": removed}) if args.json else f"purged {removed} dead letters")
        return EXIT_OK
    dsn: str = resolve(args, env, DSN)
    result = run_pg_redis(dsn, redis_url, lambda conn, r: dlq.replay(conn, r, queue, chosen))
    if args.json:
        print_json({"outcomes": result.outcomes, "generations": result.generations})
    else:
        for entry_id, outcome in result.outcomes.items():
            extra = f" as generation {result.generations[entry_id]}" if entry_id in result.generations else ""
            print(f"{entry_id}  {outcome}{extra}")
        if not result.outcomes:
            print("no dead letters")
    failed = [o for o in result.outcomes.values() if o not in ("replayed", "superseded")]
    return EXIT_FAILURE if failed else EXIT_OK


def add(commands: Commands) -> None:
    p = commands.add("dlq", "inspect and handle dead-lettered jobs")
    dlq_action = commands.actions(p, "dlq_command", cmd_dlq)
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
        connection_flags(d, CONNECTION if action == "replay" else [REDIS, QUEUE])
