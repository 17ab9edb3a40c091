"""``judgequeue shadow``: where the legacy judge and the shadow workers disagree."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

from ..base.errors import Failure
from .common import (
    DSN,
    EXIT_OK,
    EXIT_USAGE,
    QUEUE,
    Commands,
    connection_flags,
    overrides_from,
    print_listing,
    resolve,
    run_pg,
)


def _mismatch_json(m: Any) -> dict[str, Any]:
    return {
        "submission": m.submission, "queue": m.queue, "generation": m.generation,
        "legacy": {"status": m.legacy, "details": m.legacy_details, "reported_at": m.reported_at.isoformat()},
        "shadow": {"status": m.shadow, "details": m.shadow_details, "judged_at": m.judged_at.isoformat()},
    }  # fmt: skip


def _mismatch_lines(m: Any) -> list[str]:
    """Both verdicts of a mismatch for people: each side's summary and per-test table (judges.report)."""
    from ..judges.report import render_verdict

    lines = [f"submission {m.submission}  queue {m.queue}  generation {m.generation}:"
             f" legacy {m.legacy}, shadow {m.shadow}"]
    for side, status, details, at in (("legacy", m.legacy, m.legacy_details, m.reported_at),
                                      ("shadow", m.shadow, m.shadow_details, m.judged_at)):
        summary, *rest = render_verdict(status, details if isinstance(details, dict) else {}, indent="      ")
        lines.append(f"  {side}  {summary}  ({'reported' if side == 'legacy' else 'judged'} {at.isoformat()})")
        lines += rest
    return lines


def cmd_shadow(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    """``shadow diff``: the submissions the legacy and the shadow judge disagree on, newest first."""
    from ..store import shadow

    dsn: str = resolve(args, env, DSN)
    queue: str | None = resolve(args, env, QUEUE) if overrides_from(args).get(QUEUE) or env.get(QUEUE) else None
    if args.limit < 1:
        raise Failure("shadow diff: --limit must be 1 or more", EXIT_USAGE)
    found = run_pg(dsn, lambda conn: shadow.mismatches(conn, queue, limit=args.limit))
    none = f"no mismatches{f' in queue {queue}' if queue else ''}"
    print_listing(found, args.json, _mismatch_json, lambda m: "\n".join(_mismatch_lines(m)), none, between="\n\n")
    return EXIT_OK


def add(commands: Commands) -> None:
    text = "shadow judging: compare the legacy judge's verdicts with the shadow workers' (Postgres only)"
    p = commands.add("shadow", text)
    shadow_action = commands.actions(p, "shadow_command", cmd_shadow)
    text = ("list the submissions the legacy and the shadow judge disagree on (their statuses differ), newest "
            "first, with both verdicts and their per-test details; every queue unless --queue or $JUDGEQUEUE_QUEUE")
    d = shadow_action("diff", text)
    d.add_argument("--limit", type=int, default=20, help="at most this many mismatches (default 20)")
    connection_flags(d)
