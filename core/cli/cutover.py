"""``judgequeue cutover``: show or change a queue's cutover flags."""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from ..base.errors import Failure
from .common import EXIT_OK, EXIT_USAGE, Commands, connection_flags, flags_json, flags_line, pg_and_queue, run_pg


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
    from ..store.queues import database_now, get_queue, set_cutover

    dsn, queue = pg_and_queue(args, env)
    if args.cutover_command == "show":
        flags = run_pg(dsn, lambda conn: get_queue(conn, queue))
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

        flags = run_pg(dsn, go)
    print(json.dumps(flags_json(flags)) if args.json else flags_line(flags))
    return EXIT_OK


def add(commands: Commands) -> None:
    p = commands.add("cutover", "show or change a queue's cutover flags (mode, watermark, paused)")
    cutover_action = commands.actions(p, "cutover_command", cmd_cutover)
    connection_flags(cutover_action("show", "show the flags"))
    text = "change flags in one statement; the watermark may only move forward (rollback is --mode shadow)"
    c = cutover_action("set", text)
    c.add_argument("--mode", choices=("live", "shadow"))
    c.add_argument("--watermark", help="RFC 3339 time with zone, or 'now' (database clock)")
    pause = c.add_mutually_exclusive_group()
    pause.add_argument("--pause", dest="paused", action="store_const", const=True, help="dispatchers claim nothing")
    pause.add_argument("--resume", dest="paused", action="store_const", const=False, help="dispatch again")
    connection_flags(c)
