"""The judges: plugin loading, built-ins, and the program judge's verdicts and containment."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from judgequeue.core.base.errors import ConfigError
from judgequeue.core.judges import UnknownJudge, Verdict, available_judges, load_judge
from judgequeue.core.judges.builtin import JudgeCrashed, NoopJudge, SleepJudge
from judgequeue.core.judges.program import (
    InvalidProgramPayload,
    classify_run,
    outputs_match,
    parse_payload,
    run_limits,
)
from judgequeue.core.judges.sandbox import (
    Isolation,
    Limits,
    RunFacts,
    build_command,
    engine_child_pid,
    engine_exit_code,
    next_check,
    run_fit,
    shim_script,
    wall_left,
)
from judgequeue.core.judges.sandbox.isolation import (
    BOX_CAPABILITIES,
    JudgeSettings,
    load_judge_settings,
    missing_capabilities,
)
from judgequeue.core.judges.sandbox.seccomp import ALLOWED_X86_64, SeccompUnsupported, build_filter
from judgequeue.core.judges.sandbox.session import RUNNER_SOURCE, exit_facts, parse_done, runner_argv

SUM = [{"input": "2 3\n", "output": "5\n"}, {"input": "10 -4\n", "output": "6"}]
PY_SUM = "a, b = map(int, input().split())\nprint(a + b)\n"


def py(source: str, **limits: Any) -> dict[str, Any]:
    payload: dict[str, Any] = {"language": "python", "source": source, "tests": SUM}
    if limits:
        payload["limits"] = limits
    return payload


# --- plugins and built-ins ------------------------------------------------------------------------


def test_plugins_are_registered_and_unknown_name_lists_them() -> None:
    assert {"noop", "sleep", "program"} <= set(available_judges())
    assert isinstance(load_judge("noop"), NoopJudge)
    with pytest.raises(UnknownJudge, match=r"JUDGEQUEUE_JUDGE='nope' .*available: http-call, noop, program, sleep"):
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


def facts(**kw: Any) -> RunFacts:
    base: dict[str, Any] = {
        "exit_code": 0, "signal": None, "stdout": b"5\n", "stderr": b"", "wall": 0.1, "cpu": 0.05,
        "memory_peak": 4 << 20, "oom_killed": False,
    }  # fmt: skip
    base.update(kw)
    return RunFacts(**base)


def test_verdicts_come_from_facts_not_from_text_or_exit_status() -> None:
    limits = Limits(cpu=1, wall=2.5, memory=64 << 20, output=1024)
    assert classify_run(facts(), limits, "5") == ("ACCEPTED", None)
    assert classify_run(facts(stdout=b"4"), limits, "5") == ("WRONG_ANSWER", None)
    # CPU over the limit is TIME_LIMIT even when the program finished before the worker looked.
    assert classify_run(facts(cpu=1.0004), limits, "5")[0] == "TIME_LIMIT"
    assert classify_run(facts(cpu=1.2, killed_for="cpu", exit_code=137), limits, "5")[0] == "TIME_LIMIT"
    assert classify_run(facts(cpu=0.999, killed_for="wall", exit_code=None), limits, "5")[0] == "IDLENESS_LIMIT"
    assert classify_run(facts(killed_for="output", exit_code=137), limits, "5")[0] == "OUTPUT_LIMIT"
    assert classify_run(facts(oom_killed=True, exit_code=137), limits, "5")[0] == "MEMORY_LIMIT"
    assert classify_run(facts(exit_code=1, memory_peak=64 << 20), limits, "5")[0] == "MEMORY_LIMIT"
    # A program that reached the limit in passing (page cache) and succeeded is not MEMORY_LIMIT.
    assert classify_run(facts(memory_peak=64 << 20), limits, "5")[0] == "ACCEPTED"
    # Text on stderr decides nothing; an exit status above 128 is not read as a signal.
    assert classify_run(facts(exit_code=1, stderr=b"MemoryError\nstd::bad_alloc"), limits, "5") == (
        "RUNTIME_ERROR",
        "exit status 1",
    )
    assert classify_run(facts(exit_code=152), limits, "5") == (
        "RUNTIME_ERROR",
        "exit status 152 (an exit(152) or signal 24)",
    )
    assert classify_run(facts(exit_code=None, signal=11), limits, "5") == ("RUNTIME_ERROR", "killed by signal 11")
    assert classify_run(facts(exit_code=None), limits, "5")[0] == "SYSTEM_ERROR"
    assert classify_run(facts(stuck=True, killed_for="wall"), limits, "5")[0] == "SYSTEM_ERROR"
    # stopped at the guard's hard cap having mostly waited for a CPU: the worker's fault, said so
    starved = classify_run(facts(cpu=0.2, wall=10.0, waited=6.0, killed_for="wall", exit_code=None), limits, "5")
    assert starved[0] == "SYSTEM_ERROR" and "overloaded" in (starved[1] or "")
    assert classify_run(facts(cpu=0.2, wall=2.6, waited=0.3, killed_for="wall", exit_code=None), limits, "5")[0] == (
        "IDLENESS_LIMIT"
    )


def test_the_wall_guard_does_not_count_time_spent_waiting_for_a_cpu() -> None:
    assert wall_left(elapsed=2.5, waited=0.0, limit=2.5) == 0  # an unloaded machine: the limit as ever
    assert wall_left(elapsed=1.0, waited=0.0, limit=2.5) == 1.5
    assert wall_left(elapsed=2.5, waited=2.0, limit=2.5) == 2.0  # starved: the idle part alone counts
    assert wall_left(elapsed=9.0, waited=8.9, limit=2.5) == 1.0  # never past STARVED_WALL_FACTOR x limit
    assert wall_left(elapsed=10.0, waited=10.0, limit=2.5) == 0


def test_payload_validation_limits_and_test_count() -> None:
    program = parse_payload(py(PY_SUM, time=0.1, memory_mb=64, output_kb=8))
    limits = run_limits(program)
    assert (limits.cpu, limits.wall, limits.memory, limits.output, limits.stack) == (0.1, 0.7, 64 << 20, 8192, 64 << 20)
    bad_cases = {
        "language must be one of": {"language": "fortran", "source": "", "tests": SUM},
        "limits.time must be between": py(PY_SUM, time=0),
        "tests must be a non-empty list": {**py(PY_SUM), "tests": []},
        "limits.memory_mb must be between": py(PY_SUM, memory_mb=8),
        "payload must be a JSON object": [],
    }
    for message, bad in bad_cases.items():
        with pytest.raises(InvalidProgramPayload, match=message):
            parse_payload(bad)
    with pytest.raises(InvalidProgramPayload, match="3 tests, at most 2 per submission"):
        parse_payload({**py(PY_SUM), "tests": SUM + SUM[:1]}, max_tests=2)


def test_judge_settings_name_the_bad_variable() -> None:
    assert load_judge_settings({}) == JudgeSettings()
    assert load_judge_settings({"JUDGEQUEUE_SANDBOX": "trusted"}).sandbox == "trusted"
    assert load_judge_settings({"JUDGEQUEUE_PROGRAM_BOX": "test"}).box == "test"
    for env, name in (
        ({"JUDGEQUEUE_SANDBOX": "off"}, "JUDGEQUEUE_SANDBOX"),
        ({"JUDGEQUEUE_SANDBOX_DIR": "relative"}, "JUDGEQUEUE_SANDBOX_DIR"),
        ({"JUDGEQUEUE_PROGRAM_MAX_TESTS": "many"}, "JUDGEQUEUE_PROGRAM_MAX_TESTS"),
        ({"JUDGEQUEUE_PROGRAM_MAX_TESTS": "0"}, "JUDGEQUEUE_PROGRAM_MAX_TESTS"),
        ({"JUDGEQUEUE_PROGRAM_BUDGET": "9999"}, "JUDGEQUEUE_PROGRAM_BUDGET"),
        ({"JUDGEQUEUE_PROGRAM_BOX": "each"}, "JUDGEQUEUE_PROGRAM_BOX"),
    ):
        with pytest.raises(ConfigError, match=name):
            load_judge_settings(env)


def test_command_line_drops_privileges_and_isolates() -> None:
    iso = Isolation("full", bwrap="/usr/bin/bwrap", setpriv="/usr/bin/setpriv", ro_paths=("/usr",),
                    symlinks=(("usr/lib", "/lib"),), seccomp=b"x")  # fmt: skip
    files = ["/cg/m/cgroup.procs", "/cg/p/cgroup.procs", "/cg/c/cgroup.procs"]
    cmd = build_command(["/usr/bin/python3", "/box/main.py"], box="/b/1", uid=4242, limits=Limits(),
                        isolation=iso, procs_files=files, writable_box=False, seccomp_fd=7, status_fd=8)  # fmt: skip
    assert cmd[:2] == ["/bin/sh", "-c"] and cmd[4:7] == files
    assert "--reuid=4242" in cmd and "--no-new-privs" in cmd and "--bounding-set=-all" in cmd
    bw = cmd[cmd.index("/usr/bin/bwrap") :]
    for flag in ("--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent", "--new-session",
                 "--clearenv"):  # fmt: skip
        assert flag in bw
    assert bw[bw.index("--seccomp") + 1] == "7" and bw[bw.index("--json-status-fd") + 1] == "8"
    assert bw[bw.index("/b/1") - 1 : bw.index("/b/1") + 2] == ["--ro-bind", "/b/1", "/box"]
    assert cmd[-2:] == ["/usr/bin/python3", "/box/main.py"]
    assert "--proc" not in bw  # no /proc at all: nothing of other processes to look at


def test_shim_joins_every_group_before_the_limits_and_exec() -> None:
    script = shim_script(Limits(file_size=1 << 20, stack=8 << 20, open_files=64), 3)
    lines = script.splitlines()
    assert lines[:3] == [f'echo $$ > "${i}" || exit 125' for i in (1, 2, 3)]
    assert "ulimit -f 2048 || exit 125" in lines and "ulimit -s 8192 || exit 125" in lines
    assert lines[-2:] == ["shift 3", 'exec "$@"']


def test_engine_report_and_cpu_polling() -> None:
    assert engine_exit_code(b'{ "child-pid": 12 }\n{ "exit-code": 152 }\n') == 152
    assert engine_exit_code(b'{ "child-pid": 12 }\n') is None
    assert engine_exit_code(b"garbage") is None
    assert engine_child_pid(b'{ "child-pid": 12, "pid-namespace": 4 }\n{ "exit-code": 0 }\n') == 12
    assert engine_child_pid(b"garbage\n") is None
    assert next_check(1.0, 10.0, 2) == 0.05
    assert next_check(0.01, 10.0, 2) == 0.005
    assert next_check(5.0, 0.002, 1) == 0.002
    assert next_check(0.0, 0.0, 1) == 0.001


def test_seccomp_filter_shape() -> None:
    prog = build_filter()
    assert len(prog) % 8 == 0 and len(prog) // 8 == len(set(ALLOWED_X86_64.values())) + 12
    for forbidden in ("socket", "connect", "ptrace", "mount", "unshare", "setns", "shmget", "bpf", "keyctl",
                      "process_vm_readv", "io_uring_setup", "perf_event_open", "userfaultfd"):  # fmt: skip
        assert forbidden not in ALLOWED_X86_64
    with pytest.raises(SeccompUnsupported, match="aarch64"):
        build_filter(machine="aarch64")


def test_the_box_runner_is_init_only_when_asked_and_its_reports_are_parsed_strictly() -> None:
    iso = Isolation("full", bwrap="/usr/bin/bwrap", setpriv="/usr/bin/setpriv", seccomp=b"x")
    argv = runner_argv("/usr/bin/python3", 7, ["/usr/bin/python3", "/box/main.py"])
    assert argv[:6] == ["/usr/bin/python3", "-I", "-S", "-B", "-c", RUNNER_SOURCE] and argv[6:] == [
        "7", "/usr/bin/python3", "/box/main.py"
    ]  # fmt: skip
    boxed = build_command(argv, box="/b/1", uid=1, limits=Limits(), isolation=iso, procs_files=[],
                          writable_box=False, as_pid_1=True)  # fmt: skip
    assert boxed.index("--as-pid-1") < len(boxed) - 1 - boxed[::-1].index("--")
    plain = build_command(["/box/a"], box="/b/1", uid=1, limits=Limits(), isolation=iso, procs_files=[],
                          writable_box=False)  # fmt: skip
    assert "--as-pid-1" not in plain  # a program itself is never init: it could not signal itself
    assert parse_done(b"done 0 1") == (0, True)
    assert parse_done(b"done 2304 0") == (2304, False)
    for bad in (b"", b"ready", b"done 0", b"done x 1", b"done 0 2", b"done 0 1 extra"):
        assert parse_done(bad) is None
    assert exit_facts(0) == (0, None)
    assert exit_facts(3 << 8) == (3, None)
    assert exit_facts(11) == (139, 11)  # killed by SIGSEGV: the signal is known, not guessed
    assert exit_facts(None) == (None, None)


def test_an_armed_command_waits_on_its_block_fd_and_fits_only_the_same_run() -> None:
    iso = Isolation("full", bwrap="/usr/bin/bwrap", setpriv="/usr/bin/setpriv", seccomp=b"x")
    cmd = build_command(["/box/a"], box="/b/1", uid=1, limits=Limits(), isolation=iso, procs_files=[],
                        writable_box=False, block_fd=11)  # fmt: skip
    assert cmd[cmd.index("--block-fd") + 1] == "11" and cmd.index("--block-fd") < len(cmd) - 1 - cmd[::-1].index("--")
    plain = build_command(["/box/a"], box="/b/1", uid=1, limits=Limits(), isolation=iso, procs_files=[],
                          writable_box=False)  # fmt: skip
    assert "--block-fd" not in plain
    fit = run_fit(["/box/a"], box="/b/1", uid=1, limits=Limits(), writable_box=False)
    # CPU, wall and output are enforced from outside: an armed process fits whatever they are.
    assert fit == run_fit(["/box/a"], box="/b/1", uid=1, limits=Limits(cpu=9, wall=1, output=5), writable_box=False)
    for other in (
        run_fit(["/box/b"], box="/b/1", uid=1, limits=Limits(), writable_box=False),
        run_fit(["/box/a"], box="/b/2", uid=1, limits=Limits(), writable_box=False),
        run_fit(["/box/a"], box="/b/1", uid=2, limits=Limits(), writable_box=False),
        run_fit(["/box/a"], box="/b/1", uid=1, limits=Limits(), writable_box=True),
        run_fit(["/box/a"], box="/b/1", uid=1, limits=Limits(memory=1 << 20), writable_box=False),
        run_fit(["/box/a"], box="/b/1", uid=1, limits=Limits(stack=1 << 20), writable_box=False),
        run_fit(["/box/a"], box="/b/1", uid=1, limits=Limits(scratch=1 << 20), writable_box=False),
    ):
        assert other != fit


def test_missing_capabilities_are_named() -> None:
    everything = "Name:\tx\nCapEff:\t000001ffffffffff\n"
    assert missing_capabilities(everything) == []
    # the sandbox's six and nothing else: what the operator renders for a worker pod
    six = "CapEff:\t00000000000000eb\n"
    assert missing_capabilities(six) == []
    assert missing_capabilities("CapEff:\t00000000000000ea\n") == ["CHOWN"]
    assert missing_capabilities("CapEff:\t0000000000000000\n") == list(BOX_CAPABILITIES)


async def test_the_sleep_judge_ignores_a_program_judges_list_of_tests() -> None:
    """The local demo's payloads are the program judge's (``tests`` a list); run by the sleep judge
    they are accepted as before, not a TypeError from reading them as a number of tests."""
    verdict = await SleepJudge().judge({"language": "python", "source": "", "tests": [{"input": "", "output": ""}]})
    assert verdict.status == "ACCEPTED"
