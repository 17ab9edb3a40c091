"""``judgequeue problem``: upload, list and verify problem packages."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..config import (
    archive_variable_names,
    load_archive_settings,
)
from .common import (
    DSN,
    EXIT_FAILURE,
    EXIT_OK,
    Commands,
    add_variable_flags,
    connection_flags,
    flag_for,
    overrides_from,
    print_json,
    print_listing,
    resolve,
    run_async,
    run_pg,
)

if TYPE_CHECKING:
    import asyncpg

    from ..judges.program import ProgramJudge
    from ..judges.program.archives import PackageDir
    from ..verify import Verification


def cmd_problem(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    from ..store.problems import list_problems, upload

    if args.problem_command == "verify":
        return _verify(args, env)
    dsn: str = resolve(args, env, DSN)
    if args.problem_command == "list":
        def line(r: dict[str, Any]) -> str:
            return (f"{r['id']}  version={r['version']}  tests={r['tests']}  bytes={r['total_bytes']}  "
                    f"sha256={r['sha256'][:16]}")  # fmt: skip

        print_listing(run_pg(dsn, list_problems), args.json, dict, line, "no problems")
        return EXIT_OK
    bounds = load_archive_settings(env, overrides_from(args), override_name=flag_for)
    done = run_pg(dsn, lambda conn: upload(
        conn, Path(args.dir), version=args.version, problem_id=args.id, time_limit=args.time_limit, fmt=args.format,
        bounds=bounds, judge_env=env,
    ))  # fmt: skip
    if args.json:
        print_json({**vars(done), "notes": list(done.notes)})
    else:
        print(f"{done.id} version {done.version} ({done.format} package): {done.tests} tests, {done.total_bytes} "
              f"bytes ({done.new_files} new files), sha256 {done.sha256[:16]}")
        for note in done.notes:
            print(f"note: {note}")
        print(f'submit with: {{"problem": "{done.id}", "version": {done.version}, "language": ..., "source": ...}}')
    return EXIT_OK


async def _verify_stored(
    conn: asyncpg.Connection, args: argparse.Namespace, judge: ProgramJudge, copies: Path
) -> Verification:
    from ..verify import stored_package, verify

    return await verify(await stored_package(conn, args.problem, args.version, copies), judge, cap=args.time_cap)


async def _verify_made(package: PackageDir, judge: ProgramJudge, made: Path, cap: float) -> Verification:
    """Verify a package read from a directory or zip, the tests it leaves to be made made first (in ``made``)."""
    from ..judges.program.generation import make_tests
    from ..verify import verify

    return await verify(await make_tests(judge, package, made), judge, cap=cap)


def _verify(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    import tempfile

    from ..base.errors import ConfigError
    from ..judges.program import ProgramJudge
    from ..judges.program.archives import open_package
    from ..judges.sandbox.isolation import load_judge_settings

    if (args.dir is None) == (args.problem is None) or (args.problem is None) != (args.version is None):
        raise ConfigError("problem verify takes a package directory (or zip), or --problem ID --version N (stored)")
    bounds = load_archive_settings(env, overrides_from(args), override_name=flag_for)
    dsn = resolve(args, env, DSN) if args.problem is not None else None
    try:
        judge = ProgramJudge(settings=load_judge_settings(env))
    except ConfigError as exc:
        raise ConfigError(f"a package is verified in the judge's sandbox: {exc}") from None
    try:
        if dsn is not None:
            with tempfile.TemporaryDirectory(prefix="judgequeue-verify-") as copies:
                found = run_pg(dsn, lambda conn: _verify_stored(conn, args, judge, Path(copies)))
        else:
            with (
                open_package(Path(args.dir), problem_id=args.id, time_limit=args.time_limit, fmt=args.format,
                             bounds=bounds) as package,
                tempfile.TemporaryDirectory(prefix="judgequeue-made-") as made,
            ):  # fmt: skip
                found = run_async(_verify_made(package, judge, Path(made), args.time_cap))
    finally:
        judge.close()
    if args.json:
        print_json(found.as_dict())
        return EXIT_OK if found.ok else EXIT_FAILURE
    print(f"{found.problem} ({found.format} package): time limit {found.time_limit:g} s "
          f"({'the package' + chr(39) + 's' if found.time_limit_source == 'package' else 'derived'})"
          + (f", slowest accepted solution {found.slowest_accepted:.3f} s" if found.slowest_accepted is not None
             else ""))  # fmt: skip
    if found.inputs:
        valid = sum(1 for c in found.inputs if c.valid)
        print(f"input validators: {valid} of {len(found.inputs)} checks valid")
    for s in found.solutions:
        print(f"  {s.name}: {s.verdict} ({s.seconds:.3f} s), expected {' or '.join(s.expected) or 'anything'}: "
              f"{s.outcome}")  # fmt: skip
    if found.time_limit_source == "derived" and found.derived_time_limit is not None:
        print(f"suggested time limit: {found.derived_time_limit:g} s (upload with --time-limit "
              f"{found.derived_time_limit:g}, or give limits.time_limit)")  # fmt: skip
    for warning in found.warnings:
        print(f"warning: {warning}")
    for error in found.errors:
        print(f"error: {error}")
    count = f"{len(found.errors)} error" + ("s" if len(found.errors) > 1 else "")
    print("verified: ready for a contest" if found.ok else f"{count}: not ready for a contest")
    return EXIT_OK if found.ok else EXIT_FAILURE


def add(commands: Commands) -> None:
    p = commands.add("problem", "upload and list problem packages (tests, checker, interactor, limits, subtasks)")
    problem_action = commands.actions(p, "problem_command", cmd_problem)
    text = ("store the package in DIR (a directory, or a zip archive of one) as a new version: judgequeue "
            "(problem.yaml with an id, tests/NAME.in + NAME.ans), ICPC/Kattis (problem.yaml, data/, "
            "output_validators/) or Polygon (problem.xml); its generated tests are made and its checker, interactor "
            "and validators built first")
    q = problem_action("upload", text)
    q.add_argument("dir", help="the package: a directory, or a zip archive of one (as Polygon exports it)")
    q.add_argument("--version", type=int,
                   help="version number (default: the package's own (problem.yaml's, Polygon's revision), else the "
                        "next free one)")  # fmt: skip
    q.add_argument("--id", help="problem id (default: problem.yaml's id, Polygon's short-name, "
                                "a Kattis package's directory name)")  # fmt: skip
    q.add_argument("--time-limit", type=float, metavar="SECONDS",
                   help="a Kattis package's time limit when it gives none (limits.time_limit, .timelimit)")
    q.add_argument("--format", choices=("judgequeue", "kattis", "polygon"),
                   help="the package format (default: detected)")  # fmt: skip
    connection_flags(q, [DSN])
    add_variable_flags(q, archive_variable_names(), "what a package may hold (docs/judges.md)")
    connection_flags(problem_action("list", "list stored packages"), [DSN])
    v = problem_action("verify", "check the package in DIR before a contest, storing nothing: its checker and "
                                 "validators build, its input validators accept every test, every shipped solution "
                                 "gets the verdict its folder or tag expects, the time limit has problemtools' "
                                 "margins (one is derived when the package gives none); exit 1 on any error")
    v.add_argument("dir", nargs="?", help="the package: a directory, or a zip archive of one")
    v.add_argument("--problem", metavar="ID", help="verify a stored package instead: its id (with --version)")
    v.add_argument("--version", type=int, metavar="N", help="the stored package's version (with --problem)")
    v.add_argument("--id", help="problem id (as for upload)")
    v.add_argument("--time-limit", type=float, metavar="SECONDS",
                   help="a Kattis package's time limit when it gives none (default: derived from its accepted "
                        "solutions)")  # fmt: skip
    v.add_argument("--format", choices=("judgequeue", "kattis", "polygon"),
                   help="the package format (default: detected)")  # fmt: skip
    v.add_argument("--time-cap", type=float, default=10.0, metavar="SECONDS",
                   help="the time limit accepted solutions run at when the package gives none (default: 10)")
    add_variable_flags(v, archive_variable_names(), "what a package may hold (docs/judges.md)")
    connection_flags(v, [DSN], "connection (a stored package)")
