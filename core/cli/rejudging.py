"""``judgequeue rejudging``: rejudgings opened by ``judgequeue rejudge --preview``: list, show (the
old -> new matrix and the changed submissions with both per-test tables), apply, cancel."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

from ..base.errors import Failure, RejudgingRefused
from .common import EXIT_FAILURE, EXIT_OK, Commands, connection_flags, pg_and_queue, print_json, print_listing, run_pg


def _details(doc: dict[str, Any] | None) -> dict[str, Any]:
    details = doc.get("details") if isinstance(doc, dict) else None
    return details if isinstance(details, dict) else {}


def _summary_line(s: Any) -> str:
    when = s.created_at.isoformat(timespec="seconds")
    line = f"rejudging {s.rejudging}  {s.state:<9} class {s.job_class}  opened {when}  judged {s.judged}/{s.items}"
    if s.state == "APPLIED":
        line += f"  applied {s.applied}, stale {s.stale}, missing {s.missing}"
    if s.left_out:
        line += f"  ({s.left_out} left out)"
    return line


def _matrix_lines(matrix: dict[tuple[str, str], int]) -> list[str]:
    """The old -> new matrix as a table: a row per old status, a column per new status."""
    olds = sorted({o for o, _ in matrix})
    news = sorted({n for _, n in matrix})
    corner = "old \\ new"
    width = max([len(corner), *(len(o) for o in olds)])
    cols = [max(len(n), 5) for n in news]
    head = f"{corner:<{width}}  " + "  ".join(f"{n:>{w}}" for n, w in zip(news, cols, strict=True))
    rows = [head]
    for o in olds:
        cells = "  ".join(f"{matrix.get((o, n), 0):>{w}}" for n, w in zip(news, cols, strict=True))
        rows.append(f"{o:<{width}}  {cells}")
    return rows


def _change_lines(c: Any) -> list[str]:
    from ..judges.report import render_verdict

    lines = [f"submission {c.submission_id}: {c.old_status} -> {c.new_status}"
             + ("  (moved on since the preview: apply skips it)" if c.moved_on and c.outcome is None else "")
             + (f"  [{c.outcome}]" if c.outcome else "")]
    for side, status, doc in (("old", c.old_status, c.old_verdict), ("new", c.new_status, c.new_verdict)):
        summary, *rest = render_verdict(status, _details(doc), indent="      ")
        lines.append(f"  {side}  {summary}")
        lines += rest
    return lines


def cmd_rejudging(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    from ..store import rejudgings

    dsn, queue = pg_and_queue(args, env)
    command = args.rejudging_command
    if command == "list":
        found = run_pg(dsn, lambda conn: rejudgings.list_all(conn, queue))
        print_listing(found, args.json, lambda s: s.to_json(), _summary_line, f"no rejudgings in queue {queue}")
        return EXIT_OK
    number: int = args.id
    if command == "show":
        report = run_pg(dsn, lambda conn: rejudgings.show(conn, queue, number))
        if args.json:
            print_json(report.to_json())
            return EXIT_OK
        print(_summary_line(report.summary))
        print()
        print("\n".join(_matrix_lines(report.matrix)) if report.matrix else "it previews no submission")
        print()
        if report.changed:
            print(f"{len(report.changed)} changed:")
            print("\n\n".join("\n".join(_change_lines(c)) for c in report.changed))
        else:
            print("no proposed verdict changes a status (so far)")
        return EXIT_OK
    if command == "apply":
        try:
            done = run_pg(dsn, lambda conn: rejudgings.apply(conn, queue, number, partial=args.partial),
                          transaction=True)
        except RejudgingRefused as exc:
            hint = " (--partial)" if "apply it partially" in str(exc) else ""
            raise Failure(f"{exc}{hint}", EXIT_FAILURE) from exc
        if args.json:
            print_json({"rejudging": number, "applied": done.applied, "stale": done.stale, "missing": done.missing,
                        "applied_now": done.applied_now, "stale_ids": list(done.stale_ids)})
        else:
            prefix = "" if done.applied_now else "was applied already: "
            print(f"rejudging {number} {prefix}{done.applied} verdicts applied, {done.stale} stale"
                  f" (their submissions moved on since the preview; kept as they are), {done.missing} missing")
            if done.stale_ids:
                print("stale: " + " ".join(str(i) for i in done.stale_ids))
        return EXIT_OK
    # cancel
    gone = run_pg(dsn, lambda conn: rejudgings.cancel(conn, queue, number), transaction=True)
    if args.json:
        print_json({"rejudging": number, "cancelled_now": gone.cancelled_now, "stopped": gone.stopped})
    elif gone.cancelled_now:
        print(f"rejudging {number} cancelled: no visible verdict changed; {gone.stopped} of its jobs stopped")
    else:
        print(f"rejudging {number} was cancelled already; nothing changed")
    return EXIT_OK


def add(commands: Commands) -> None:
    text = "rejudgings (judgequeue rejudge --preview): show the old -> new matrix, apply, cancel"
    p = commands.add("rejudging", text)
    action = commands.actions(p, "rejudging_command", cmd_rejudging)
    lst = action("list", "the queue's rejudgings, newest first, with their state and progress")
    connection_flags(lst)
    s = action("show", "a rejudging's old -> new matrix and its changed submissions with both per-test tables")
    s.add_argument("id", type=int, metavar="N", help="rejudging id")
    connection_flags(s)
    a = action("apply", "make every proposed verdict visible in one transaction (stale ones are skipped)")
    a.add_argument("id", type=int, metavar="N", help="rejudging id")
    a.add_argument("--partial", action="store_true",
                   help="apply the proposed verdicts judged so far while others are missing (those are cancelled)")
    connection_flags(a)
    c = action("cancel", "discard a rejudging: every visible verdict stays as it is (idempotent)")
    c.add_argument("id", type=int, metavar="N", help="rejudging id")
    connection_flags(c)
