"""The problem package cache: judged tests/s of a 100-test package cold (cache miss) and warm (hit).

Uploads one package (``--tests`` tests of ``--input-kb`` KiB input each, a tokens checker, every
test run) into a throwaway database, then judges the same accepted Python submission ``--rounds``
times each way through the program judge in its sandbox:

* cold: a new, empty :class:`~judgequeue.core.store.problems.ProblemCache` per submission, so the judge
  waits for every test file to be copied out of Postgres (chunked, digest-checked) first;
* warm: one cache kept across submissions, so every judge after the first finds the package on disk.

Prints the median tests/s of each, the ratio, and the median time of a cold fetch alone. Run as root
(the sandbox needs it): ``.venv/bin/python -m bench.package_bench``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import asyncpg

from bench.common import create_database, drop_database, judge_accepted
from judgequeue.core.judges.program import ProgramJudge
from judgequeue.core.judges.sandbox.isolation import JudgeSettings
from judgequeue.core.store.problems import ProblemCache, upload

SOLUTION = "import sys\nprint(sum(map(int, sys.stdin.buffer.read().split())) % 1000003)\n"


def write_package(root: Path, tests: int, input_kb: int) -> None:
    """A package of ``tests`` tests, each about ``input_kb`` KiB of numbers, answers computed here."""
    (root / "tests").mkdir(parents=True)
    (root / "problem.yaml").write_text(
        "id: bench-sum\nversion: 1\nlimits: {time: 2, memory_mb: 256}\nchecker: tokens\nscoring: {run_all: true}\n"
    )
    for i in range(1, tests + 1):
        numbers = [(i * 7919 + k * 104729) % 1_000_000 for k in range(input_kb * 1024 // 7)]
        (root / "tests" / f"{i}.in").write_text(" ".join(map(str, numbers)) + "\n")
        (root / "tests" / f"{i}.ans").write_text(f"{sum(numbers) % 1000003}\n")


async def judge_once(judge: ProgramJudge, cache: ProblemCache, tests: int) -> float:
    """Seconds to judge the submission once (including any fetch into ``cache``); fails loudly."""
    judge.attach_packages(cache)
    payload = {"problem": "bench-sum", "version": 1, "language": "python", "source": SOLUTION}
    return await judge_accepted(judge, payload, tests, "benchmark submission")


async def main(args: argparse.Namespace) -> dict[str, Any]:
    dsn = await create_database("jq_pkgbench")
    work = Path(tempfile.mkdtemp(prefix="jq-pkgbench-"))
    sandbox_dir = f"/tmp/jq-pkgbench-sandbox-{uuid.uuid4().hex[:8]}"
    judge = ProgramJudge(settings=JudgeSettings(sandbox_dir=sandbox_dir), slots=2)
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=2)
    try:
        write_package(work / "package", args.tests, args.input_kb)
        async with pool.acquire() as conn:
            stored = await upload(conn, work / "package")
        await judge_once(judge, ProblemCache(work / "warmup", 1 << 34, pool), args.tests)  # page cache, imports
        cold, warm, fetch = [], [], []
        warm_cache = ProblemCache(work / "warm", 1 << 34, pool)
        await judge_once(judge, warm_cache, args.tests)  # the one miss of the warm cache
        for _ in range(args.rounds):
            # Interleaved so machine load affects both alike.
            cold.append(await judge_once(judge, ProblemCache(work / "cold", 1 << 34, pool), args.tests))
            shutil.rmtree(work / "cold")  # a cold cache is an empty one; old copies would only fill the disk
            warm.append(await judge_once(judge, warm_cache, args.tests))
            alone = ProblemCache(work / "fetch", 1 << 34, pool)
            started = time.monotonic()
            async with alone.package("bench-sum", 1):
                fetch.append(time.monotonic() - started)
            shutil.rmtree(work / "fetch")
        assert warm_cache.stats.misses == 1 and warm_cache.stats.hits == args.rounds, warm_cache.stats
        cold_rate = args.tests / statistics.median(cold)
        warm_rate = args.tests / statistics.median(warm)
        return {
            "tests": args.tests, "input_kb": args.input_kb, "package_mb": round(stored.total_bytes / 2**20, 1),
            "rounds": args.rounds, "cold_tests_per_s": round(cold_rate, 1), "warm_tests_per_s": round(warm_rate, 1),
            "warm_over_cold": round(warm_rate / cold_rate, 2), "cold_fetch_ms": round(statistics.median(fetch) * 1000),
            "loadavg": round(os.getloadavg()[0], 1),
        }  # fmt: skip
    finally:
        await pool.close()
        judge.close()
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(sandbox_dir, ignore_errors=True)
        await drop_database(dsn)


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--tests", type=int, default=100, help="tests in the package (default 100)")
    parser.add_argument("--input-kb", type=int, default=256, help="KiB of input per test (default 256)")
    parser.add_argument("--rounds", type=int, default=5, help="submissions judged each way (default 5)")
    result = asyncio.run(main(parser.parse_args()))
    print(
        f"package of {result['tests']} tests ({result['package_mb']} MiB): cold {result['cold_tests_per_s']} tests/s, "
        f"warm {result['warm_tests_per_s']} tests/s, warm/cold {result['warm_over_cold']}x "
        f"(cold fetch alone {result['cold_fetch_ms']} ms; median of {result['rounds']}; load {result['loadavg']})"
    )


if __name__ == "__main__":
    cli()
