"""The program judge's sandbox: what it costs per test, and judged tests/s through the whole system.

Prints, in one run:

* overhead per test: a trivial accepted Python program run ``--runs`` times in a box (cgroups,
  bubblewrap, seccomp, a box uid) against the same interpreter started bare, median and p99;
* realistic load: ``--submissions`` submissions of ``--tests`` tests each through the whole system
  (dispatcher, ``--workers`` workers with the program judge, reaper) against running the same
  programs bare with the same parallelism; judged tests/s and the ratio.

Run as root (the sandbox needs it): ``.venv/bin/python -m bench.sandbox_bench``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from typing import Any

from bench.cli import add_counts, new_parser
from bench.common import span_seconds
from bench.pipeline import percentile, stack, wait_done
from judgequeue.core.judges.program import ProgramJudge, run_limits
from judgequeue.core.judges.sandbox import BOX
from judgequeue.core.judges.sandbox.cgroups import V1Roots, box_group, find_roots
from judgequeue.core.judges.sandbox.isolation import JudgeSettings
from judgequeue.core.judges.sandbox.lane import Lane
from judgequeue.core.store import outbox

PYTHON = "/usr/bin/python3"
TRIVIAL = "print(5)\n"
# A small realistic solution: read numbers, sort, answer.
SOLUTION = "import sys\nnums = sorted(map(int, sys.stdin.read().split()))\nprint(sum(nums[-3:]))\n"


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def test_case(i: int) -> dict[str, str]:
    nums = [(i * 7919 + k * 104729) % 1000 for k in range(200)]
    return {"input": " ".join(map(str, nums)), "output": str(sum(sorted(nums)[-3:]))}


async def overhead(runs: int) -> dict[str, Any]:
    """Wall time per run of the trivial program, boxed and bare, interleaved so load hits both alike.

    Boxed runs go through a :class:`Lane` as a submission's tests do: in one box whose runner runs
    the program per test (:mod:`~judgequeue.core.judges.sandbox.session`), a new box every fourth run (its
    start counted in that run). ``cold`` runs start their own box (a submission's only test): both
    are reported.
    """
    sandbox_dir = tempfile.mkdtemp(prefix="jq-bench-sandbox-", dir="/tmp")
    os.chmod(sandbox_dir, 0o711)
    judge = ProgramJudge(settings=JudgeSettings(sandbox_dir=sandbox_dir), slots=1)
    box = os.path.join(judge.boxes_dir, "0")
    os.mkdir(box, 0o700)
    os.chown(box, judge.uid_base, judge.uid_base)
    bare_dir = tempfile.mkdtemp(prefix="jq-bench-bare-")
    for d in (box, bare_dir):
        await asyncio.to_thread(_write, os.path.join(d, "main.py"), TRIVIAL)
    limits = run_limits(judge_program())
    assert judge.roots is not None
    groups = (box_group(judge.roots, f"{judge.range}-0-a"), box_group(judge.roots, f"{judge.range}-0-b"))
    lane = Lane(box=box, uid=judge.uid_base, isolation=judge.isolation, groups=groups, python=judge.tools["python3"])
    argv = [PYTHON, "-I", "-S", "-B", f"{BOX}/main.py"]
    boxed: list[float] = []
    cold: list[float] = []
    bare: list[float] = []
    try:
        for i in range(runs):
            started = time.perf_counter()
            facts = await lane.run(argv, stdin=b"", limits=limits, ahead=True)
            boxed.append(time.perf_counter() - started)
            assert facts.exit_code == 0 and facts.stdout == b"5\n", facts
            started = time.perf_counter()
            done = await asyncio.to_thread(
                subprocess.run, [PYTHON, "-I", "-S", "-B", "main.py"], cwd=bare_dir, capture_output=True, env={}
            )
            bare.append(time.perf_counter() - started)
            assert done.stdout == b"5\n"
            if i % 4 == 0:  # a submission's first test: nothing armed
                await lane.close()
                started = time.perf_counter()
                facts = await lane.run(argv, stdin=b"", limits=limits, ahead=False)
                cold.append(time.perf_counter() - started)
                assert facts.exit_code == 0 and facts.stdout == b"5\n", facts
        assert lane.in_session == runs, (lane.in_session, lane.ahead_used, lane.cold)
    finally:
        await lane.close()
        judge.close()
        shutil.rmtree(sandbox_dir, ignore_errors=True)
        shutil.rmtree(bare_dir, ignore_errors=True)
    over = [b - a for a, b in zip(sorted(bare), sorted(boxed), strict=True)]
    return {
        "runs": runs,
        "bare_median_ms": statistics.median(bare) * 1000,
        "bare_p99_ms": percentile(bare, 0.99) * 1000,
        "boxed_median_ms": statistics.median(boxed) * 1000,
        "boxed_p99_ms": percentile(boxed, 0.99) * 1000,
        "overhead_median_ms": (statistics.median(boxed) - statistics.median(bare)) * 1000,
        "overhead_p99_ms": percentile(over, 0.99) * 1000,
        "cold_runs": len(cold),
        "cold_median_ms": statistics.median(cold) * 1000,
        "cold_p99_ms": percentile(cold, 0.99) * 1000,
        "cold_overhead_median_ms": (statistics.median(cold) - statistics.median(bare)) * 1000,
    }


def _text(path: str) -> str:
    with open(path) as f:
        return f.read()


def _cpu_of(pids: list[int]) -> float:
    """CPU seconds the processes ``pids`` spent themselves (user + system, not their children's)."""
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            fields = _text(f"/proc/{pid}/stat").rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def judge_program() -> Any:
    from judgequeue.core.judges.program import parse_payload

    return parse_payload({"language": "python", "source": TRIVIAL, "tests": [{"output": "5"}]})


async def bare_load(submissions: int, tests: int, parallel: int) -> float:
    """Tests/s running the same programs and inputs bare, ``parallel`` at a time, checking outputs."""
    work = tempfile.mkdtemp(prefix="jq-bench-bare-")
    await asyncio.to_thread(_write, os.path.join(work, "main.py"), SOLUTION)
    cases = [test_case(i) for i in range(tests)]
    queue: asyncio.Queue[dict[str, str]] = asyncio.Queue()
    for _ in range(submissions):
        for case in cases:
            queue.put_nowait(case)

    async def lane() -> None:
        while not queue.empty():
            case = queue.get_nowait()
            proc = await asyncio.create_subprocess_exec(
                PYTHON, "-I", "-S", "-B", "main.py", cwd=work, env={}, stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
            )  # fmt: skip
            out, _ = await proc.communicate(case["input"].encode())
            assert out.decode().strip() == case["output"]

    started = time.perf_counter()
    await asyncio.gather(*(lane() for _ in range(parallel)))
    elapsed = time.perf_counter() - started
    shutil.rmtree(work, ignore_errors=True)
    return submissions * tests / elapsed


async def system_load(submissions: int, tests: int, workers: int, concurrency: int, box: str) -> dict[str, Any]:
    """Tests/s from the first submit to the last verdict through dispatcher, workers (program judge),
    reaper; ``box``: a box per submission (its runner runs each test) or per test."""
    payload = {"language": "python", "source": SOLUTION, "tests": [test_case(i) for i in range(tests)],
               "limits": {"time": 2, "memory_mb": 256}}  # fmt: skip
    roots = find_roots(_text("/proc/self/mounts"), _text("/proc/self/cgroup"))
    assert isinstance(roots, V1Roots), roots  # the figures are cgroup v1's
    box_cpu = os.path.join(roots.cpuacct, "cpuacct.usage")  # every box of the roles (they are our children)
    async with stack(JUDGE="program", CONCURRENCY=str(concurrency), PROGRAM_BOX=box) as s:
        s.start("dispatcher")
        s.start("worker", workers)
        s.start("reaper")
        async with s.pool.acquire() as conn:
            for _ in range(4):  # warm-up: processes started, judge detected, connections open
                await outbox.submit(conn, s.queue, payload)
            after: int = await conn.fetchval("SELECT max(id) FROM judgequeue.submissions")
        await wait_done(s.pool, 0, 4, 120)
        pids = [p.pid for procs in s.procs.values() for p in procs]
        boxes_before, roles_before = int(_text(box_cpu)), _cpu_of(pids)
        async with s.pool.acquire() as conn, conn.transaction():
            for _ in range(submissions):
                await outbox.submit(conn, s.queue, payload)
        await wait_done(s.pool, after, submissions, 3600)
        boxes, roles = (int(_text(box_cpu)) - boxes_before) / 1e9, _cpu_of(pids) - roles_before
        async with s.pool.acquire() as conn:
            span = await span_seconds(conn, after)
            statuses = dict(
                await conn.fetch("SELECT status, count(*) FROM judgequeue.submissions WHERE id > $1 GROUP BY 1", after)
            )
    done = submissions * tests
    return {
        "rate": done / span, "statuses": statuses, "seconds": span,
        "box_ms": boxes / done * 1000, "roles_ms": roles / done * 1000,
    }  # fmt: skip


async def main() -> int:
    parser = new_parser(__doc__)
    add_counts(parser, runs=200, submissions=1000, tests=10, workers=2)
    parser.add_argument("--concurrency", type=int, default=2, help="judge slots per worker")
    args = parser.parse_args()
    o = await overhead(args.runs)
    print(f"overhead per test ({o['runs']} runs of a trivial accepted Python program):")
    print(f"  bare   median {o['bare_median_ms']:.1f} ms  p99 {o['bare_p99_ms']:.1f} ms")
    print(f"  boxed  median {o['boxed_median_ms']:.1f} ms  p99 {o['boxed_p99_ms']:.1f} ms")
    print(f"  overhead median {o['overhead_median_ms']:.1f} ms  p99 {o['overhead_p99_ms']:.1f} ms  (target <= 10 ms)")
    print(f"  a lone test in its own box (cold, {o['cold_runs']} runs): median {o['cold_median_ms']:.1f} ms"
          f"  p99 {o['cold_p99_ms']:.1f} ms  overhead median {o['cold_overhead_median_ms']:.1f} ms")  # fmt: skip
    parallel = args.workers * args.concurrency
    if args.submissions <= 0:
        return 0
    bare = await bare_load(args.submissions, args.tests, parallel)
    system = await system_load(args.submissions, args.tests, args.workers, args.concurrency, "submission")
    per_test = await system_load(args.submissions, args.tests, args.workers, args.concurrency, "test")
    bare_after = await bare_load(args.submissions, args.tests, parallel)  # load drifts: bare on both sides
    bare_mean = (bare + bare_after) / 2
    print(f"realistic load ({args.submissions} submissions x {args.tests} tests, {args.workers} workers x "
          f"{args.concurrency} slots, {os.cpu_count()} CPUs):")  # fmt: skip
    print(f"  bare                {bare:.0f} then {bare_after:.0f} tests/s ({parallel} at a time)")
    for name, got in (("box per submission", system), ("box per test", per_test)):
        print(f"  {name:<20}{got['rate']:.0f} tests/s in {got['seconds']:.0f}s  {got['statuses']}"
              f"  = {got['rate'] / bare_mean:.0%} of bare; CPU per test {got['box_ms']:.1f} ms in boxes,"
              f" {got['roles_ms']:.1f} ms in the roles' own processes")  # fmt: skip
    print("  target: whole system (the default, a box per submission) >= 60% of bare")
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
