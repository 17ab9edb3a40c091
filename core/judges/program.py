"""The program judge: compile (C, C++) and run a submitted program against the payload's tests.

Payload::

    {"language": "python" | "c" | "cpp", "source": "...",
     "tests": [{"input": "...", "output": "..."}, ...],
     "limits": {"time": 2, "memory_mb": 256, "output_kb": 1024}}

Tests run in order and judging stops at the first failure. Output matches when it is equal after
dropping trailing whitespace on every line and trailing blank lines. Each run happens in a fresh
temporary directory under :mod:`.sandbox`; decisions (limits, verdict mapping, comparison) are pure
functions below.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import tempfile
from dataclasses import dataclass
from typing import Any

from . import Status, Verdict
from .sandbox import Isolation, Limits, RunResult, detect_isolation, run

LANGUAGES = ("python", "c", "cpp")
SOURCE_FILES = {"python": "main.py", "c": "main.c", "cpp": "main.cpp"}
MAX_TIME = 30.0
MAX_MEMORY_MB = 2048
MAX_OUTPUT_KB = 64 * 1024
MEMORY_MARKERS = (b"MemoryError", b"std::bad_alloc", b"Cannot allocate memory", b"out of memory")


class InvalidProgramPayload(ValueError):
    """The payload does not describe a program to judge."""


@dataclass(frozen=True)
class Program:
    language: str
    source: str
    tests: list[tuple[str, str]]
    time: float
    memory_mb: int
    output_kb: int


def parse_payload(payload: Any) -> Program:
    """Validate a payload into a :class:`Program` (pure), or raise InvalidProgramPayload saying why."""
    if not isinstance(payload, dict):
        raise InvalidProgramPayload("payload must be a JSON object")
    language = payload.get("language")
    if language not in LANGUAGES:
        raise InvalidProgramPayload(f"language must be one of {', '.join(LANGUAGES)}, got {language!r}")
    source = payload.get("source")
    if not isinstance(source, str):
        raise InvalidProgramPayload("source must be a string")
    tests = payload.get("tests")
    if not isinstance(tests, list) or not tests:
        raise InvalidProgramPayload("tests must be a non-empty list")
    cases = []
    for i, case in enumerate(tests):
        ok = isinstance(case, dict) and isinstance(case.get("input", ""), str) and isinstance(case.get("output"), str)
        if not ok:
            raise InvalidProgramPayload(f"tests[{i}] must be an object with string input and output")
        cases.append((case.get("input", ""), case["output"]))
    limits = payload.get("limits") or {}
    if not isinstance(limits, dict):
        raise InvalidProgramPayload("limits must be an object")
    try:
        time_limit = float(limits.get("time", 2))
        memory_mb = int(limits.get("memory_mb", 256))
        output_kb = int(limits.get("output_kb", 1024))
    except (TypeError, ValueError) as exc:
        raise InvalidProgramPayload(f"limits: {exc}") from None
    if not (0 < time_limit <= MAX_TIME and 16 <= memory_mb <= MAX_MEMORY_MB and 1 <= output_kb <= MAX_OUTPUT_KB):
        raise InvalidProgramPayload(
            f"limits out of range (time 0-{MAX_TIME}s, memory_mb 16-{MAX_MEMORY_MB}, output_kb 1-{MAX_OUTPUT_KB})"
        )
    return Program(language, source, cases, time_limit, memory_mb, output_kb)


def run_limits(program: Program) -> Limits:
    """Limits of one test run (pure): the wall clock allows for start-up and a loaded machine."""
    return Limits(
        cpu=program.time,
        wall=program.time * 2 + 1.0,
        memory=program.memory_mb * 1024 * 1024,
        output=program.output_kb * 1024,
        file_size=max(program.output_kb * 1024, 1024 * 1024),
    )


COMPILE_LIMITS = Limits(
    cpu=20, wall=40, memory=1024 * 1024 * 1024, output=64 * 1024, file_size=64 * 1024 * 1024, processes=64,
    open_files=256, stderr=16 * 1024,
)  # fmt: skip


def normalise_output(text: str) -> list[str]:
    """Lines without trailing whitespace, trailing blank lines dropped (pure)."""
    lines = [line.rstrip() for line in text.replace("\r\n", "\n").split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def outputs_match(actual: bytes, expected: str) -> bool:
    """Compare a program's output with the expected text, ignoring trailing whitespace (pure)."""
    return normalise_output(actual.decode("utf-8", errors="replace")) == normalise_output(expected)


def classify_run(result: RunResult, limits: Limits, expected: str) -> tuple[Status, str | None]:
    """Verdict status (and a reason) of one test run (pure)."""
    if result.timed_out:
        return "TIME_LIMIT", f"wall time over {limits.wall:g}s"
    if result.signal == signal.SIGXCPU or (result.signal == signal.SIGKILL and result.wall >= limits.cpu):
        return "TIME_LIMIT", f"CPU time over {limits.cpu:g}s"
    if result.output_exceeded:
        return "RUNTIME_ERROR", f"output limit exceeded ({limits.output // 1024} KiB)"
    if (result.exit_code != 0 or result.signal is not None) and any(m in result.stderr for m in MEMORY_MARKERS):
        return "MEMORY_LIMIT", f"memory limit exceeded ({limits.memory // (1024 * 1024)} MiB)"
    if result.signal == signal.SIGXFSZ:
        return "RUNTIME_ERROR", "file size limit exceeded"
    if result.signal is not None:
        return "RUNTIME_ERROR", f"killed by signal {signal.Signals(result.signal).name}"
    if result.exit_code != 0:
        return "RUNTIME_ERROR", f"exit code {result.exit_code}"
    if not outputs_match(result.stdout, expected):
        return "WRONG_ANSWER", None
    return "ACCEPTED", None


def _write_text(path: str, text: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def _tail(data: bytes, limit: int = 2000) -> str:
    return data[-limit:].decode("utf-8", errors="replace")


class ProgramJudge:
    """Judge submitted programs in the sandbox; ``slots`` bounds concurrent runs (one uid each)."""

    def __init__(
        self,
        *,
        isolation: Isolation | None = None,
        work_root: str | None = None,
        uid_base: int | None = None,
        slots: int = 64,
    ) -> None:
        self.isolation = isolation or detect_isolation()
        self.work_root = work_root
        # Different worker processes on one host pick different uid ranges (by pid) so their runs
        # do not share a process budget; collisions are unlikely, not impossible (docs/judges.md).
        self.uid_base = uid_base if uid_base is not None else 200_000 + (os.getpid() % 1000) * slots
        self._free_uids = asyncio.Queue[int]()
        for i in range(slots):
            self._free_uids.put_nowait(self.uid_base + i)
        # A system interpreter: the worker's own may live where the sandbox uid cannot read (/root).
        system = [p for p in ("/usr/bin/python3", "/usr/local/bin/python3") if os.access(p, os.X_OK)]
        self.python = system[0] if system else shutil.which("python3")
        self.compilers = {"c": shutil.which("gcc"), "cpp": shutil.which("g++")}

    async def judge(self, payload: Any) -> Verdict:
        try:
            program = parse_payload(payload)
        except InvalidProgramPayload as exc:
            return Verdict("SYSTEM_ERROR", {"reason": f"invalid payload: {exc}"})
        uid = await self._free_uids.get()
        box = tempfile.mkdtemp(prefix="jq-box-", dir=self.work_root)
        try:
            os.chmod(box, 0o755)
            if self.isolation.mode == "full":
                os.chown(box, uid, uid)
            return await self._judge_in(program, box, uid)
        finally:
            await asyncio.to_thread(shutil.rmtree, box, True)
            self._free_uids.put_nowait(uid)

    async def _judge_in(self, program: Program, box: str, uid: int) -> Verdict:
        source = os.path.join(box, SOURCE_FILES[program.language])
        await asyncio.to_thread(_write_text, source, program.source)
        if program.language == "python":
            if self.python is None:
                return Verdict("SYSTEM_ERROR", {"reason": "no python3 interpreter on this worker"})
            argv = [self.python, "-I", "-S", "-B", source]
        else:
            compiled = await self._compile(program, box, uid, source)
            if isinstance(compiled, Verdict):
                return compiled
            argv = [compiled]
        limits = run_limits(program)
        results = []
        for i, (stdin, expected) in enumerate(program.tests):
            res = await run(
                argv, box=box, stdin=stdin.encode(), limits=limits, isolation=self.isolation, uid=uid,
            )  # fmt: skip
            status, reason = classify_run(res, limits, expected)
            results.append({"test": i, "status": status, "wall": round(res.wall, 4)})
            if status != "ACCEPTED":
                details: dict[str, Any] = {"failed_test": i, "tests": results, "isolation": self.isolation.mode}
                if reason:
                    details["reason"] = reason
                if res.stderr:
                    details["stderr"] = _tail(res.stderr)
                return Verdict(status, details)
        return Verdict("ACCEPTED", {"tests": results, "isolation": self.isolation.mode})

    async def _compile(self, program: Program, box: str, uid: int, source: str) -> str | Verdict:
        compiler = self.compilers.get(program.language)
        if compiler is None:
            return Verdict("SYSTEM_ERROR", {"reason": f"no compiler for {program.language} on this worker"})
        binary = os.path.join(box, "main")
        flags = ["-std=c17"] if program.language == "c" else ["-std=c++17"]
        argv = [compiler, "-O2", "-pipe", *flags, "-o", binary, source, "-lm"]
        res = await run(
            argv, box=box, stdin=b"", limits=COMPILE_LIMITS, isolation=self.isolation, uid=uid, writable_box=True,
            env={"PATH": "/usr/local/bin:/usr/bin:/bin", "TMPDIR": box},
        )  # fmt: skip
        built = await asyncio.to_thread(os.path.exists, binary)
        if res.timed_out or res.signal is not None or res.exit_code != 0 or not built:
            reason = "compiler timed out" if res.timed_out else "compilation failed"
            return Verdict("COMPILE_ERROR", {"reason": reason, "output": _tail(res.stderr + res.stdout, 4000)})
        return binary
