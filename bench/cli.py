"""Command-line plumbing shared by the benchmark scripts: progress lines, option sets, the private-server runner."""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from bench import servers
from judgequeue.core.config import INTAKES, WorkerSettings

#: The intake the product runs when nobody sets one: what a benchmark measures unless told.
DEFAULT_INTAKE = WorkerSettings().intake


def reporter(name: str) -> Callable[[str], None]:
    """A ``progress(message)`` that prints ``[name HH:MM:SS] message`` to stderr."""

    def progress(message: str) -> None:
        print(f"[{name} {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)

    return progress


def new_parser(doc: str | None) -> argparse.ArgumentParser:
    """A parser whose help is the script's docstring, verbatim."""
    return argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)


def add_counts(p: argparse.ArgumentParser, **defaults: int) -> None:
    """Add one integer option per keyword, in order: ``workers=2`` becomes ``--workers`` defaulting to 2."""
    for name, default in defaults.items():
        p.add_argument("--" + name.replace("_", "-"), type=int, default=default)


def add_run_options(
    p: argparse.ArgumentParser, *, plots: bool = False, out: str = "bench/out"
) -> argparse.ArgumentParser:
    """Add ``--servers``, ``--out`` (and ``--plots``) and the hidden ``--inner`` that every server script takes."""
    p.add_argument("--servers", choices=("private", "system"), default="private")
    p.add_argument(
        "--intake", choices=INTAKES, default=DEFAULT_INTAKE,
        help=f"JUDGEQUEUE_INTAKE of this tree's roles (default: the product's, {DEFAULT_INTAKE}; docs/design.md)",
    )  # fmt: skip
    p.add_argument(
        "--offers", type=int, default=None,
        help="JUDGEQUEUE_OFFERS of this tree's roles (default: theirs; 0: direct intake without offers)",
    )  # fmt: skip
    p.add_argument("--out", type=Path, default=Path(out))
    if plots:
        p.add_argument("--plots", type=Path, default=Path("docs/img"))
    p.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    return p


def with_servers(module: str, argv: list[str], mode: str, *, max_connections: int | None = None) -> int:
    """Re-run ``python -m module argv --inner`` against private servers (or the system ones).

    ``max_connections``: the private cluster's (default: ``servers.private_servers``'s)."""
    env = dict(os.environ)
    if mode == "system":
        pm, rp = servers.system_pids(
            env.get("JUDGEQUEUE_TEST_POSTGRES_DSN", ""), env.get("JUDGEQUEUE_TEST_REDIS_URL", "")
        )
        env.setdefault("JUDGEQUEUE_TEST_POSTGRES_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")
        env.setdefault("JUDGEQUEUE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
        env.update({"BENCH_POSTMASTER_PID": str(pm or ""), "BENCH_REDIS_PID": str(rp or "")})
        return subprocess.call([sys.executable, "-m", module, *argv, "--inner"], env=env)
    with servers.private_servers(max_connections=max_connections or servers.MAX_CONNECTIONS) as srv:
        reporter(module.rpartition(".")[2])(f"private servers: {srv.admin_dsn}, {srv.redis_url}")
        env.update(
            {
                "JUDGEQUEUE_TEST_POSTGRES_DSN": srv.admin_dsn,
                "JUDGEQUEUE_TEST_REDIS_URL": srv.redis_url,
                "BENCH_POSTMASTER_PID": str(srv.postmaster_pid),
                "BENCH_REDIS_PID": str(srv.redis_pid),
            }
        )
        return subprocess.call([sys.executable, "-m", module, *argv, "--inner"], env=env)


def run_on_servers(
    module: str, parser: argparse.ArgumentParser, inner: Callable[[argparse.Namespace], Coroutine[Any, Any, int]]
) -> int:
    """Entry point: without ``--inner`` start the servers and re-run ``module``; with it, run ``inner``."""
    args = parser.parse_args()
    if not args.inner:
        return with_servers(module, sys.argv[1:], args.servers, max_connections=getattr(args, "max_connections", None))
    os.environ[INTAKE_VARIABLE] = args.intake  # read by bench.pipeline.stack for every role it starts
    if args.offers is not None:
        os.environ[OFFERS_VARIABLE] = str(args.offers)
    return asyncio.run(inner(args))


#: How a benchmark's ``--intake`` (and ``--offers``) reach the roles ``bench.pipeline.stack`` starts.
INTAKE_VARIABLE = "BENCH_INTAKE"
OFFERS_VARIABLE = "BENCH_OFFERS"
