"""The program judge per language: judged tests/s with a cold and a warm build cache.

For every language of the table whose toolchain this machine has (or those given with
``--languages``), one accepted submission (tests/support/language_programs.py: read two numbers,
print the sum) with ``--tests`` inline tests is judged ``--rounds`` times each way, alternating,
through the program judge in its sandbox (one box for the submission's tests, as in production):

* cold: the worker's build cache emptied first, so the submission is compiled (or syntax checked);
* warm: the same source again, so its kept build is copied into the box instead.

tests/s = tests / median seconds per submission (build included). Also printed: the median build
time (cold minus warm) and the load average. Run as root (the sandbox needs it), under the benchmark
lock: ``flock /tmp/jq-bench.lock .venv/bin/python -m bench.language_bench``.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import statistics
import tempfile
from typing import Any

from bench.cli import add_counts, new_parser, reporter
from bench.common import judge_accepted
from judgequeue.core.judges.program import ProgramJudge
from judgequeue.core.judges.program.builds import BuildCache
from judgequeue.core.judges.program.languages import LANGUAGES, missing_toolchain
from judgequeue.core.judges.sandbox.isolation import JudgeSettings
from tests.support.language_programs import DEFAULT_INPUT, OK_INPUT, OK_OUTPUT, PROGRAMS

progress = reporter("language_bench")


async def judge_once(judge: ProgramJudge, language: str, tests: int) -> float:
    """Seconds to judge the accepted program once; fails loudly on any other verdict."""
    case = {"input": OK_INPUT.get(language, DEFAULT_INPUT), "output": OK_OUTPUT}
    payload = {"language": language, "source": PROGRAMS[language].ok, "tests": [case] * tests, "limits": {"time": 5}}
    return await judge_accepted(judge, payload, tests, f"{language}: the benchmark submission")


async def bench_language(judge: ProgramJudge, language: str, tests: int, rounds: int) -> dict[str, Any]:
    cold: list[float] = []
    warm: list[float] = []
    for _ in range(rounds):
        judge.builds = BuildCache(judge.builds.root)  # empty: the next judge builds
        cold.append(await judge_once(judge, language, tests))
        hits = judge.builds.hits
        warm.append(await judge_once(judge, language, tests))
        if judge.builds.hits != hits + 1:
            raise SystemExit(f"{language}: the warm judge did not reuse the kept build")
    cold_s, warm_s = statistics.median(cold), statistics.median(warm)
    return {
        "language": language,
        "tests": tests,
        "rounds": rounds,
        "cold_tests_per_s": tests / cold_s,
        "warm_tests_per_s": tests / warm_s,
        "cold_median_s": cold_s,
        "warm_median_s": warm_s,
        "build_s": cold_s - warm_s,
    }


async def main_async(languages: list[str], tests: int, rounds: int) -> list[dict[str, Any]]:
    sandbox_dir = tempfile.mkdtemp(prefix="jq-bench-languages-", dir="/tmp")
    os.chmod(sandbox_dir, 0o711)
    judge = ProgramJudge(settings=JudgeSettings(sandbox_dir=sandbox_dir), slots=1)
    results = []
    try:
        for language in languages:
            missing = missing_toolchain(LANGUAGES[language], judge.tools)
            if missing:
                progress(f"skipped: {missing}")
                continue
            result = await bench_language(judge, language, tests, rounds)
            result["load_average"] = os.getloadavg()[0]
            progress(
                f"{language}: cold {result['cold_tests_per_s']:.1f} tests/s, warm {result['warm_tests_per_s']:.1f}"
                f" tests/s, build {result['build_s'] * 1000:.0f} ms (load {result['load_average']:.1f})"
            )
            results.append(result)
    finally:
        judge.close()
        shutil.rmtree(sandbox_dir, ignore_errors=True)
    return results


def table(results: list[dict[str, Any]]) -> str:
    lines = [
        "| language | cold: tests/s | warm: tests/s | build (cold - warm) | load |",
        "|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| `{r['language']}` | {r['cold_tests_per_s']:.1f} | {r['warm_tests_per_s']:.1f} |"
            f" {r['build_s'] * 1000:,.0f} ms | {r['load_average']:.1f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = new_parser(__doc__)
    add_counts(parser, tests=20, rounds=3)
    parser.add_argument("--languages", default=",".join(LANGUAGES), help="comma-separated (default: all)")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    languages = [n for n in args.languages.split(",") if n]
    unknown = [n for n in languages if n not in LANGUAGES]
    if unknown:
        parser.error(f"unknown language {', '.join(unknown)}")
    results = asyncio.run(main_async(languages, args.tests, args.rounds))
    print(table(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
