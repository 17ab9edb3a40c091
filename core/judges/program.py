"""The program judge: compile (C, C++) and run a submitted program against the payload's tests.

Payload::

    {"language": "python" | "c" | "cpp", "source": "...",
     "tests": [{"input": "...", "output": "..."}, ...],
     "limits": {"time": 2, "memory_mb": 256, "output_kb": 1024}}

Tests run in order and judging stops at the first failure. Output matches when it is equal after
dropping trailing whitespace on every line and trailing blank lines. Every compile and run happens
in a box of :mod:`.sandbox` (its own uid, 0700 directory and cgroups); the verdict of a run is
decided from its facts alone by :func:`classify_run`. A submission has a wall-time budget for
everything it runs and a maximum number of tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import shutil
import stat
import time
from dataclasses import dataclass, replace
from typing import Any

from ..errors import ConfigError
from . import Status, Verdict
from .cgroups import BoxGroup, Roots, remove_stale
from .isolation import SANDBOX_DIR_VAR, JudgeSettings, detect, load_judge_settings
from .sandbox import BOX, Isolation, Limits, RunFacts, run

LANGUAGES = ("python", "c", "cpp")
SOURCE_FILES = {"python": "main.py", "c": "main.c", "cpp": "main.cpp"}
MAX_TIME = 30.0
MAX_MEMORY_MB = 2048
MAX_OUTPUT_KB = 64 * 1024
UID_BASE = 200_000  # box uids: UID_BASE + range * slots + slot, nobody else's on a judge host
RANGES = 64  # worker processes that may share one host (each holds one range by a lock file)


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


def parse_payload(payload: Any, *, max_tests: int = 1000) -> Program:
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
    if len(tests) > max_tests:
        raise InvalidProgramPayload(f"tests: {len(tests)} tests, at most {max_tests} per submission")
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
    if not 0.001 <= time_limit <= MAX_TIME:
        raise InvalidProgramPayload(f"limits.time must be between 0.001 and {MAX_TIME:g} seconds")
    if not 16 <= memory_mb <= MAX_MEMORY_MB:
        raise InvalidProgramPayload(f"limits.memory_mb must be between 16 and {MAX_MEMORY_MB}")
    if not 1 <= output_kb <= MAX_OUTPUT_KB:
        raise InvalidProgramPayload(f"limits.output_kb must be between 1 and {MAX_OUTPUT_KB}")
    return Program(language, source, cases, time_limit, memory_mb, output_kb)


def run_limits(program: Program) -> Limits:
    """Limits of one test run (pure).

    CPU time is the payload's, to the millisecond, over every process of the run. The wall guard
    allows for start-up and a loaded machine but stops a program that sleeps (IDLENESS_LIMIT).
    The stack may use all of the memory limit (the cgroup still bounds the total).
    """
    memory = program.memory_mb * 1024 * 1024
    return Limits(
        cpu=program.time,
        wall=program.time * 2 + 0.5,
        memory=memory,
        output=program.output_kb * 1024,
        file_size=max(program.output_kb * 1024, 1024 * 1024),
        stack=memory,
        processes=16,
        open_files=64,
        scratch=16 * 1024 * 1024,
    )


COMPILE_LIMITS = Limits(
    cpu=20, wall=40, memory=1024 * 1024 * 1024, output=64 * 1024, file_size=64 * 1024 * 1024, processes=64,
    open_files=256, stack=64 * 1024 * 1024, scratch=256 * 1024 * 1024, stderr=16 * 1024,
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


def classify_run(facts: RunFacts, limits: Limits, expected: str) -> tuple[Status, str | None]:
    """Verdict status (and a reason) of one test run, from facts only (pure).

    Order: a box that would not die is the system's fault; then the limits the worker itself
    enforced (output, memory by the cgroup's OOM count or peak, CPU by the cgroup's counter, wall);
    then the engine's exit report; then the output. Nothing the program prints decides a verdict
    other than WRONG_ANSWER/ACCEPTED, and no exit status is read as a limit.
    """
    mib = limits.memory // (1024 * 1024)
    if facts.stuck:
        return "SYSTEM_ERROR", "the box did not stop after it was killed"
    if facts.killed_for == "output":
        return "OUTPUT_LIMIT", f"output over {limits.output // 1024} KiB"
    failed = facts.killed_for is not None or facts.exit_code != 0 or facts.signal is not None
    if facts.oom_killed or (failed and facts.memory_peak >= limits.memory):
        return "MEMORY_LIMIT", f"memory over {mib} MiB (peak {facts.memory_peak // (1024 * 1024)} MiB)"
    if facts.cpu >= limits.cpu:
        return "TIME_LIMIT", f"CPU time {facts.cpu:.3f}s over {limits.cpu:g}s"
    if facts.killed_for == "wall":
        return "IDLENESS_LIMIT", f"wall time over {limits.wall:g}s with {facts.cpu:.3f}s of CPU"
    if facts.signal is not None:
        return "RUNTIME_ERROR", f"killed by signal {facts.signal}"
    if facts.exit_code is None:
        return "SYSTEM_ERROR", "the sandbox reported no exit status"
    if facts.exit_code != 0:
        reason = f"exit status {facts.exit_code}"
        if facts.exit_code > 128:
            reason += f" (an exit({facts.exit_code}) or signal {facts.exit_code - 128})"
        return "RUNTIME_ERROR", reason
    if not outputs_match(facts.stdout, expected):
        return "WRONG_ANSWER", None
    return "ACCEPTED", None


def test_report(index: int, status: Status, facts: RunFacts) -> dict[str, Any]:
    """One test's line in the verdict details (pure)."""
    return {
        "test": index,
        "status": status,
        "wall": round(facts.wall, 4),
        "cpu": round(facts.cpu, 4),
        "memory_kb": facts.memory_peak // 1024,
    }


def _write_text(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)


def _tail(data: bytes, limit: int = 2000) -> str:
    return data[-limit:].decode("utf-8", errors="replace")


def _claim_range(sandbox_dir: str) -> tuple[int, int]:
    """Lock one uid range for this worker process: (range, lock fd). The kernel drops the lock
    when the process dies, so a range whose lock is free holds only a crashed worker's leftovers."""
    locks = os.path.join(sandbox_dir, "locks")
    os.makedirs(locks, mode=0o700, exist_ok=True)
    for n in range(RANGES):
        fd = os.open(os.path.join(locks, f"{n}.lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        return n, fd
    raise RuntimeError(f"all {RANGES} sandbox uid ranges under {sandbox_dir} are in use")


def untraversable(path: str) -> str | None:
    """The first directory on ``path`` that other users cannot enter (box uids must reach their box)."""
    current = os.path.abspath(path)
    while True:
        if os.path.exists(current) and not os.stat(current).st_mode & stat.S_IXOTH:
            return current
        parent = os.path.dirname(current)
        if parent == current:
            return None
        current = parent


class ProgramJudge:
    """Judge submitted programs in boxes; ``slots`` bounds concurrent submissions (one box each).

    Construction decides the isolation (and refuses to go on without it, see :mod:`.isolation`),
    claims a uid range and removes whatever a crashed worker left in it.
    """

    def __init__(self, *, settings: JudgeSettings | None = None, slots: int = 64) -> None:
        self.settings = settings or load_judge_settings(os.environ)
        self.isolation: Isolation
        self.roots: Roots | None
        self.isolation, self.roots = detect(self.settings)
        self.slots = slots
        root = self.settings.sandbox_dir
        os.makedirs(root, mode=0o711, exist_ok=True)
        os.chmod(root, 0o711)
        closed = untraversable(root) if self.isolation.mode == "full" else None
        if closed:
            raise ConfigError(f"{SANDBOX_DIR_VAR}={root!r}: box uids cannot enter {closed} (it needs o+x)")
        self.range, self._lock_fd = _claim_range(root)
        self.uid_base = UID_BASE + self.range * slots
        self.boxes_dir = os.path.join(root, str(self.range))
        self.stale_removed = self._remove_stale()
        os.makedirs(self.boxes_dir, mode=0o711, exist_ok=True)
        self._free = asyncio.Queue[int]()
        for i in range(slots):
            self._free.put_nowait(i)
        # A system interpreter: the worker's own may live where a box cannot see it (a venv in /root).
        system = [p for p in ("/usr/bin/python3", "/usr/local/bin/python3") if os.access(p, os.X_OK)]
        self.python = system[0] if system else shutil.which("python3")
        self.compilers = {"c": shutil.which("gcc"), "cpp": shutil.which("g++")}

    def _remove_stale(self) -> list[str]:
        removed = []
        if self.roots is not None:
            removed += remove_stale(self.roots, f"{self.range}-", time.monotonic() + 10)
        if os.path.isdir(self.boxes_dir):
            removed += [os.path.join(self.boxes_dir, n) for n in os.listdir(self.boxes_dir)]
            shutil.rmtree(self.boxes_dir, ignore_errors=True)
        return removed

    def close(self) -> None:
        """Give the uid range back (tests; a worker keeps it until it exits)."""
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1

    async def judge(self, payload: Any) -> Verdict:
        try:
            program = parse_payload(payload, max_tests=self.settings.max_tests)
        except InvalidProgramPayload as exc:
            return Verdict("SYSTEM_ERROR", {"reason": f"invalid payload: {exc}"})
        slot = await self._free.get()
        uid = self.uid_base + slot
        box = os.path.join(self.boxes_dir, str(slot))
        group = BoxGroup(self.roots, f"{self.range}-{slot}") if self.roots is not None else None
        try:
            await asyncio.to_thread(self._make_box, box, uid)
            return await self._judge_in(program, box, uid, group)
        finally:
            await asyncio.shield(asyncio.to_thread(shutil.rmtree, box, True))
            self._free.put_nowait(slot)

    def _make_box(self, box: str, uid: int) -> None:
        shutil.rmtree(box, ignore_errors=True)
        os.mkdir(box, 0o700)
        if self.isolation.mode == "full":
            os.chown(box, uid, uid)

    async def _judge_in(self, program: Program, box: str, uid: int, group: BoxGroup | None) -> Verdict:
        deadline = time.monotonic() + self.settings.budget
        inside = BOX if self.isolation.mode == "full" else box
        await asyncio.to_thread(_write_text, os.path.join(box, SOURCE_FILES[program.language]), program.source)
        if program.language == "python":
            if self.python is None:
                return Verdict("SYSTEM_ERROR", {"reason": "no python3 interpreter on this worker"})
            argv = [self.python, "-I", "-S", "-B", os.path.join(inside, "main.py")]
        else:
            compiled = await self._compile(program, box, inside, uid, group, deadline)
            if isinstance(compiled, Verdict):
                return compiled
            argv = [compiled]
        limits = run_limits(program)
        results: list[dict[str, Any]] = []
        base = {"isolation": self.isolation.mode}
        for i, (stdin, expected) in enumerate(program.tests):
            left = deadline - time.monotonic()
            if left <= 0:
                used_up = f"submission time budget of {self.settings.budget:g}s used up before test {i}"
                return Verdict("TIME_LIMIT", {**base, "failed_test": i, "tests": results, "reason": used_up})
            this = replace(limits, wall=min(limits.wall, left))
            facts = await run(
                argv, box=box, uid=uid, stdin=stdin.encode(), limits=this, isolation=self.isolation, group=group,
            )  # fmt: skip
            status, reason = classify_run(facts, this, expected)
            if status == "IDLENESS_LIMIT" and this.wall < limits.wall:
                status, reason = "TIME_LIMIT", f"submission time budget of {self.settings.budget:g}s used up"
            results.append(test_report(i, status, facts))
            if status != "ACCEPTED":
                details: dict[str, Any] = {**base, "failed_test": i, "tests": results}
                if reason:
                    details["reason"] = reason
                if facts.stderr:
                    details["stderr"] = _tail(facts.stderr)
                return Verdict(status, details)
        return Verdict("ACCEPTED", {**base, "tests": results})

    async def _compile(
        self, program: Program, box: str, inside: str, uid: int, group: BoxGroup | None, deadline: float
    ) -> str | Verdict:
        compiler = self.compilers.get(program.language)
        if compiler is None:
            return Verdict("SYSTEM_ERROR", {"reason": f"no compiler for {program.language} on this worker"})
        flags = ["-std=c17"] if program.language == "c" else ["-std=c++17"]
        source = os.path.join(inside, SOURCE_FILES[program.language])
        binary = os.path.join(inside, "main")
        argv = [compiler, "-O2", "-pipe", *flags, "-o", binary, source, "-lm"]
        limits = replace(COMPILE_LIMITS, wall=max(0.001, min(COMPILE_LIMITS.wall, deadline - time.monotonic())))
        facts = await run(
            argv, box=box, uid=uid, stdin=b"", limits=limits, isolation=self.isolation, group=group, writable_box=True,
        )  # fmt: skip
        built = await asyncio.to_thread(os.path.exists, os.path.join(box, "main"))
        if facts.stuck:
            return Verdict("SYSTEM_ERROR", {"reason": "the compiler's box did not stop after it was killed"})
        if facts.killed_for is not None or facts.oom_killed or facts.exit_code != 0 or not built:
            reason = "compilation failed"
            if facts.killed_for is not None:
                reason = f"compiler stopped: {facts.killed_for} limit"
            elif facts.oom_killed:
                reason = "compiler stopped: memory limit"
            return Verdict("COMPILE_ERROR", {"reason": reason, "output": _tail(facts.stderr + facts.stdout, 4000)})
        return binary

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()
