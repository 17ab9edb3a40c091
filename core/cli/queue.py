"""``judgequeue queue``: create, list and show queues."""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from typing import Any

from .common import (
    DSN,
    EXIT_OK,
    Commands,
    connection_flags,
    flags_json,
    flags_line,
    print_json,
    print_listing,
    queue_arg,
    resolve,
    run_pg,
)


def cmd_queue(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    from ..store.queues import create_queue, get_queue, list_queues

    dsn: str = resolve(args, env, DSN)
    if args.queue_command == "list":
        print_listing(run_pg(dsn, list_queues), args.json, flags_json, flags_line, "no queues")
        return EXIT_OK
    name = queue_arg(args, env)
    if args.queue_command == "classes":
        return _classes(args, dsn, name)
    if args.queue_command == "create":
        flags = run_pg(dsn, lambda conn: create_queue(conn, name, mode=args.mode))
    else:
        from ..store.outbox import stats

        async def show(conn: Any) -> Any:
            return await get_queue(conn, name), await stats(conn, name)

        flags, outbox = run_pg(dsn, show)
        if args.json:
            print_json({**flags_json(flags), "outbox": outbox.by_state})
        else:
            print(flags_line(flags))
            print("outbox " + "  ".join(f"{k}={v}" for k, v in outbox.by_state.items()))
        return EXIT_OK
    print(json.dumps(flags_json(flags)) if args.json else flags_line(flags))
    return EXIT_OK


def _classes(args: argparse.Namespace, dsn: str, name: str) -> int:
    from ..base.classes import parse_class_list
    from ..base.errors import UnknownQueue
    from ..store.outbox import class_backlog
    from ..store.queues import get_classes, set_classes

    wanted = parse_class_list(args.set, "--set") if args.set else None

    async def go(conn: Any) -> Any:
        if wanted is not None:
            await set_classes(conn, name, wanted)
        found = await get_classes(conn, name)
        if found is None:
            raise UnknownQueue(f"unknown queue {name!r} (create it with: judgequeue queue create {name})")
        return found, {b.name: b for b in await class_backlog(conn, name)}

    classes, backlog = run_pg(dsn, go)
    if args.json:
        print_json([{"name": c.name, "rank": i, "share": c.share, "waiting": backlog[c.name].waiting,
                     "oldest_age": round(backlog[c.name].age, 3)} for i, c in enumerate(classes)])  # fmt: skip
    else:
        print(" > ".join(f"{c.name}" + (f" ({c.share}% first)" if c.share else "") for c in classes))
        for c in classes:
            print(f"  {c.name}: {backlog[c.name].waiting} waiting, oldest {backlog[c.name].age:.1f}s")
    return EXIT_OK


def add(commands: Commands) -> None:
    p = commands.add("queue", "create, list and show queues (Postgres only)")
    queue_action = commands.actions(p, "queue_command", cmd_queue)
    for action, text in (("create", "create a queue (idempotent)"), ("show", "show a queue's flags and outbox")):
        q = queue_action(action, text)
        q.add_argument("name", nargs="?", help="queue name (default: $JUDGEQUEUE_QUEUE)")
        connection_flags(q)
        if action == "create":
            q.add_argument("--mode", choices=("live", "shadow"), default="live", help="initial mode (default live)")
    connection_flags(queue_action("list", "list every queue"), [DSN])
    c = queue_action("classes", "show or declare a queue's priority classes (an operator's queue: use spec.classes)")
    c.add_argument("name", nargs="?", help="queue name (default: $JUDGEQUEUE_QUEUE)")
    c.add_argument("--set", nargs="+", metavar="NAME[:SHARE]",
                   help="the classes, highest first; SHARE: percent of claims in which it goes first (default 5)")
    connection_flags(c)
