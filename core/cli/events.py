"""``judgequeue events``: the verdict events (docs/events.md): print them, and a webhook endpoint's
dead-letter list and its replay."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Mapping
from typing import Any

from ..base.errors import Failure
from .common import (
    DSN,
    EXIT_OK,
    EXIT_USAGE,
    Commands,
    connection_flags,
    pg_and_queue,
    print_json,
    resolve,
    run_async,
    run_pg,
)


def _line(event: Any, as_json: bool) -> str:
    if as_json:
        return json.dumps(event.to_json(), separators=(",", ":"))
    if event.kind == "progress":
        return (f"{event.position}  {event.queue}  submission={event.submission_id} generation={event.generation}  "
                f"progress {_progress(event.progress or {})}")  # fmt: skip
    score = "" if event.score is None else f" score={json.dumps(event.score)}"
    reason = "" if event.reason is None else f"  {event.reason}"
    return (f"{event.position}  {event.queue}  submission={event.submission_id} generation={event.generation}  "
            f"{event.status}{score}{reason}")  # fmt: skip


def _progress(p: Mapping[str, Any]) -> str:
    """A progress state in a few words: ``compiled``, ``test 7 of 40 running``, ``3/40 done, last ACCEPTED 0.12s``."""
    if p.get("compile_error"):
        return "compile error"
    done, total = p.get("tests_done", 0), p.get("tests_total")
    testing = p.get("phase") == "testing"
    words = [f"{done}/{total if total is not None else '?'} done"] if testing else [p.get("phase", "?")]
    if p.get("running") is not None:
        words.append(f"test {p['running']} running")
    if p.get("last_verdict") is not None:
        words.append(f"last {p['last_verdict']} {p.get('last_time', 0):.3f}s")
    return ", ".join(str(w) for w in words)


def _start(text: str) -> Any:
    from ..store import events

    if text in ("start", "now"):
        return text
    try:
        return events.Position.parse(text)
    except events.InvalidPosition as exc:
        raise Failure(f"--after: {exc}", EXIT_USAGE) from None


def cmd_tail(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    from ..runtime import event_feed
    from ..store import events

    dsn: str = resolve(args, env, DSN)
    start = _start(args.after)

    async def position(conn: Any) -> events.Position:
        if start == "now":
            return await events.head(conn)
        return events.START if start == "start" else start

    after: events.Position = run_pg(dsn, position)
    kinds = list(events.KINDS) if args.progress else ["verdict"]
    if args.follow:

        async def follow() -> None:
            async for event in event_feed.follow(dsn, after=after, queue=args.queue, kinds=kinds):
                print(_line(event, args.json), flush=True)

        with contextlib.suppress(KeyboardInterrupt):
            run_async(follow())
        return EXIT_OK

    async def read(conn: Any) -> list[events.VerdictEvent]:
        found: list[events.VerdictEvent] = []
        while True:
            batch = await events.read(conn, found[-1].position if found else after, queue=args.queue, limit=500,
                                      kinds=kinds)
            found += batch
            if len(batch) < 500:
                return found

    got = run_pg(dsn, read)
    for event in got:
        print(_line(event, args.json))
    # Where to go on from (to stderr, so the events alone can be piped): --after takes it back.
    print(f"next: --after {got[-1].position if got else after}", file=sys.stderr)
    return EXIT_OK


def cmd_webhooks(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    from ..roles.reaper.webhooks import endpoint_key
    from ..store import events

    dsn, queue = pg_and_queue(args, env)
    name = endpoint_key(queue, args.endpoint)
    if args.events_command == "dead":
        dead = run_pg(dsn, lambda conn: events.dead(conn, name, limit=args.count))
        if args.json:
            print_json([{**d, "created_at": d["created_at"].isoformat()} for d in dead])
        else:
            for d in dead:
                print(f"{d['event_id']}  submission={d['submission_id']} generation={d['generation']}  "
                      f"attempts={d['attempts']}  {d['last_error']}")  # fmt: skip
            if not dead:
                print("no dead deliveries")
        return EXIT_OK
    if args.all == bool(args.events):
        raise Failure("events replay: give event ids or --all (not both)", EXIT_USAGE)
    replayed = run_pg(dsn, lambda conn: events.replay(conn, name, args.events))
    print(json.dumps({"replayed": replayed}) if args.json else f"replayed {len(replayed)} dead deliveries")
    return EXIT_OK


def add(commands: Commands) -> None:
    p = commands.add("events", "verdict events: print them; webhook dead letters and their replay")
    action = commands.actions(p, "events_command", cmd_tail)
    t = action("tail", "print the verdict events after a position (--follow: and every later one, as it commits)")
    t.add_argument("--after", default="start", metavar="POSITION",
                   help="start (every event still retained; the default), now, or a position <txid>-<id>")  # fmt: skip
    t.add_argument("--queue", default=None, help="only this queue's events (default: every queue)")
    t.add_argument("--progress", action="store_true",
                   help="also the live progress of submissions being judged (queues whose workers report it)")
    t.add_argument("--follow", "-f", action="store_true", help="keep printing events as they commit (Ctrl-C stops)")
    connection_flags(t, [DSN])
    for name, text in (
        ("dead", "list a webhook endpoint's dead deliveries (refused, or out of attempts), oldest first"),
        ("replay", "send a webhook endpoint's dead deliveries again, with fresh attempts"),
    ):
        w = action(name, text)
        w.set_defaults(handler=cmd_webhooks)
        w.add_argument("--endpoint", required=True, help="the endpoint's name in JUDGEQUEUE_WEBHOOKS")
        if name == "dead":
            w.add_argument("--count", type=int, default=100, help="at most this many (default 100)")
        else:
            w.add_argument("events", nargs="*", type=int, metavar="EVENT", help="event id of a dead delivery")
            w.add_argument("--all", action="store_true", help="every dead delivery of the endpoint")
        connection_flags(w)
