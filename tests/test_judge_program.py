"""The judges: plugin loading, built-ins, and the program judge's verdicts and containment."""

from __future__ import annotations

import asyncio
import glob
import os
import shutil
import time
from typing import Any

import pytest

from judgequeue.core.judges import UnknownJudge, Verdict, available_judges, load_judge
from judgequeue.core.judges.builtin import JudgeCrashed, NoopJudge, SleepJudge
from judgequeue.core.judges.program import ProgramJudge, classify_run, outputs_match, parse_payload, run_limits
from judgequeue.core.judges.sandbox import Isolation, Limits, RunResult, build_command, decode_status
from tests.helpers import eventually

SUM = [{"input": "2 3\n", "output": "5\n"}, {"input": "10 -4\n", "output": "6"}]
PY_SUM = "a, b = map(int, input().split())\nprint(a + b)\n"


def py(source: str, **limits: Any) -> dict[str, Any]:
    payload: dict[str, Any] = {"language": "python", "source": source, "tests": SUM}
    if limits:
        payload["limits"] = limits
    return payload


@pytest.fixture(scope="module")
def judge() -> ProgramJudge:
    if shutil.which("prlimit") is None:
        pytest.skip("prlimit (util-linux) is not installed")
    return ProgramJudge()


def _processes_of(uids: range) -> list[int]:
    found = []
    for status in glob.glob("/proc/[0-9]*/status"):
        try:
            with open(status) as f:
                uid_line = next(line for line in f if line.startswith("Uid:"))
        except (OSError, StopIteration):
            continue
        if int(uid_line.split()[1]) in uids:
            found.append(int(status.split("/")[2]))
    return found


# --- plugins and built-ins ------------------------------------------------------------------------


def test_plugins_are_registered_and_unknown_name_lists_them() -> None:
    assert {"noop", "sleep", "program"} <= set(available_judges())
    assert isinstance(load_judge("noop"), NoopJudge)
    with pytest.raises(UnknownJudge, match=r"JUDGEQUEUE_JUDGE='nope' .*available: noop, program, sleep"):
        load_judge("nope")


async def test_builtin_judges() -> None:
    before = time.time()
    noop = await NoopJudge().judge({})
    assert noop.status == "ACCEPTED" and before <= noop.details["started_at"] <= time.time()
    assert (await SleepJudge().judge({"seconds": 0.01, "status": "WRONG_ANSWER"})).status == "WRONG_ANSWER"
    with pytest.raises(JudgeCrashed):
        await SleepJudge().judge({"crash": True})
    hang = asyncio.create_task(SleepJudge().judge({"hang": True}))
    done, _ = await asyncio.wait([hang], timeout=0.05)
    assert not done
    hang.cancel()
    with pytest.raises(ValueError, match="unknown verdict status"):
        Verdict("MAYBE")  # type: ignore[arg-type]


# --- pure decisions ---------------------------------------------------------------------------------


def test_output_comparison_ignores_trailing_whitespace_only() -> None:
    assert outputs_match(b"5  \n6\t\n\n\n", "5\n6")
    assert outputs_match(b"5\r\n", "5\n")
    assert not outputs_match(b" 5\n", "5\n")
    assert not outputs_match(b"5\n\n6\n", "5\n6\n")
    assert not outputs_match(b"", "5")


def test_status_decoding_and_verdict_mapping() -> None:
    assert decode_status(0) == (0, None) and decode_status(-9) == (None, 9) and decode_status(152) == (None, 24)
    assert decode_status(3) == (3, None)
    limits = Limits(cpu=1, wall=3, memory=64 << 20, output=1024)

    def result(**kw: Any) -> RunResult:
        base: dict[str, Any] = {"exit_code": 0, "signal": None, "stdout": b"5\n", "stderr": b"", "wall": 0.1}
        base.update(kw)
        return RunResult(**base)

    assert classify_run(result(), limits, "5")[0] == "ACCEPTED"
    assert classify_run(result(stdout=b"4"), limits, "5")[0] == "WRONG_ANSWER"
    assert classify_run(result(timed_out=True, exit_code=None, signal=9), limits, "5")[0] == "TIME_LIMIT"
    assert classify_run(result(exit_code=None, signal=24), limits, "5")[0] == "TIME_LIMIT"
    assert classify_run(result(exit_code=1, stderr=b"MemoryError\n"), limits, "5")[0] == "MEMORY_LIMIT"
    assert classify_run(result(exit_code=None, signal=6, stderr=b"std::bad_alloc"), limits, "5")[0] == "MEMORY_LIMIT"
    assert classify_run(result(exit_code=None, signal=11), limits, "5") == ("RUNTIME_ERROR", "killed by signal SIGSEGV")
    assert classify_run(result(output_exceeded=True, exit_code=None, signal=9), limits, "5")[0] == "RUNTIME_ERROR"
    assert classify_run(result(exit_code=2), limits, "5") == ("RUNTIME_ERROR", "exit code 2")


def test_payload_validation_and_limits() -> None:
    program = parse_payload(py(PY_SUM, time=1.5, memory_mb=64, output_kb=8))
    limits = run_limits(program)
    assert (limits.cpu, limits.wall, limits.memory, limits.output) == (1.5, 4.0, 64 << 20, 8192)
    for bad in ({}, {"language": "rust", "source": "", "tests": SUM}, py(PY_SUM, time=0), {**py(PY_SUM), "tests": []}):
        with pytest.raises(ValueError):
            parse_payload(bad)


def test_full_isolation_command_drops_privileges_and_namespaces() -> None:
    iso = Isolation("full", True, "/usr/bin/prlimit")
    cmd = build_command(["/bin/prog"], box="/b", limits=Limits(cpu=1.5), isolation=iso, uid=4242, writable_box=False)
    assert cmd[:6] == ["unshare", "--net", "--mount", "--pid", "--fork", "--kill-child"]
    assert "--reuid=4242" in cmd and "--no-new-privs" in cmd and "/b/run" in cmd and "tmpfs" in cmd
    assert "--cpu=2:3" in cmd and "--core=0" in cmd and cmd[-1] == "/bin/prog"


# --- the program judge against real processes ------------------------------------------------------


async def test_program_verdicts(judge: ProgramJudge) -> None:
    cases = {
        "ACCEPTED": py(PY_SUM),
        "WRONG_ANSWER": py("print(5)"),
        "RUNTIME_ERROR": py("import sys\nsys.exit(3)"),
        "MEMORY_LIMIT": py("x = bytearray(600 * 1024 * 1024)\nprint(len(x))", memory_mb=128),
    }
    verdicts = await asyncio.gather(*(judge.judge(p) for p in cases.values()))
    assert [v.status for v in verdicts] == list(cases)
    assert verdicts[1].details["failed_test"] == 1  # the first test passes by luck, the second does not
    assert verdicts[2].details["reason"] == "exit code 3"


async def test_time_limit_busy_loop(judge: ProgramJudge) -> None:
    verdict = await judge.judge(py("while True:\n    pass", time=1))
    assert verdict.status == "TIME_LIMIT"


@pytest.mark.skipif(shutil.which("gcc") is None or shutil.which("g++") is None, reason="no C/C++ compiler")
async def test_c_and_cpp(judge: ProgramJudge) -> None:
    c_sum = '#include <stdio.h>\nint main(void){int a,b;scanf("%d %d",&a,&b);printf("%d\\n",a+b);return 0;}'
    cpp_sum = "#include <iostream>\nint main(){int a,b;std::cin>>a>>b;std::cout<<a+b<<'\\n';}"
    ok_c, ok_cpp, broken, segv = await asyncio.gather(
        judge.judge({"language": "c", "source": c_sum, "tests": SUM}),
        judge.judge({"language": "cpp", "source": cpp_sum, "tests": SUM}),
        judge.judge({"language": "c", "source": "int main( { return 0; }", "tests": SUM}),
        judge.judge({"language": "c", "source": "int main(void){ int *p = 0; return *p; }", "tests": SUM}),
    )
    assert (ok_c.status, ok_cpp.status, broken.status, segv.status) == (
        "ACCEPTED",
        "ACCEPTED",
        "COMPILE_ERROR",
        "RUNTIME_ERROR",
    )
    assert "error" in broken.details["output"]


async def test_fork_bomb_is_contained(judge: ProgramJudge) -> None:
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    verdict = await judge.judge(py(bomb, time=1))
    assert verdict.status in ("TIME_LIMIT", "RUNTIME_ERROR")
    # Nothing of the run survives it (the kernel tears the PID namespace down asynchronously),
    # and the worker (this process) is fine.
    uids = range(judge.uid_base, judge.uid_base + 64)
    await eventually(lambda: asyncio.sleep(0, not _processes_of(uids)), within=5, what="bomb processes gone")
    assert (await judge.judge(py(PY_SUM))).status == "ACCEPTED"


async def test_output_flood_is_cut(judge: ProgramJudge) -> None:
    verdict = await judge.judge(py("while True:\n    print('x' * 1000)", output_kb=64))
    assert verdict.status == "RUNTIME_ERROR" and "output limit" in verdict.details["reason"]


async def test_program_cannot_read_worker_secrets_or_reach_network(
    judge: ProgramJudge, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("JQ_FAKE_SECRET", "s3cr3t-token")
    probe = (
        "import glob, os, socket\n"
        "seen = [k for k in os.environ if 'SECRET' in k or 'JUDGEQUEUE' in k]\n"
        "for path in glob.glob('/proc/*/environ') + ['/proc/%d/environ' % os.getppid()]:\n"
        "    try:\n"
        "        if b's3cr3t' in open(path, 'rb').read():\n"
        "            seen.append(path)\n"
        "    except OSError:\n"
        "        pass\n"
        "s = socket.socket()\n"
        "s.settimeout(1)\n"
        "print('secret' if seen else 'clean', 'net' if s.connect_ex(('127.0.0.1', 6379)) == 0 else 'nonet')\n"
    )
    expected = "clean nonet" if judge.isolation.network_namespace else "clean"
    payload = {"language": "python", "source": probe, "tests": [{"input": "", "output": expected}]}
    if not judge.isolation.network_namespace:
        pytest.skip("no network namespace on this host")
    assert os.environ["JQ_FAKE_SECRET"] == "s3cr3t-token"
    verdict = await judge.judge(payload)
    assert verdict.status == "ACCEPTED", verdict.details
