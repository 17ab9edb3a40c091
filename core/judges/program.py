"""The program judge: build a submitted program and judge it test by test, as contest judges do.

Payload, either with its own tests::

    {"language": "python" | "c" | "cpp" | "java" | ..., "source": "...", "std": "c++20",
     "tests": [{"input": "...", "output": "..."}, ...],
     "limits": {"time": 2, "memory_mb": 256, "output_kb": 1024},
     "checker": "lines", "scoring": {"run_all": true}}          # both optional

or naming an uploaded problem package (tests, limits, checker, interactor, scoring come from it)::

    {"problem": "mean", "version": 3, "language": "cpp", "source": "..."}

``language`` is a name of :data:`~.languages.LANGUAGES`; ``std`` (optional, C and C++ only) one of
that language's standards. A submission's build is kept by the worker (:mod:`.builds`): the same
source in the same language and standard is built once per worker.

Each test gives a :class:`~.scoring.TestResult` (verdict, CPU ms, wall ms, peak memory, exit code
or signal, a short checker message). The submission's verdict is the first failing test's, or
ACCEPTED; judging stops at the first failure unless the problem is scored (groups, or
``run_all``), when :func:`~.scoring.should_run` skips only tests that can no longer change the
score. A run's limit verdicts come from facts alone (:func:`classify_facts`); a run that ended
normally is then judged by the checker: a built-in one of :mod:`.checkers`, a custom checker
program, or, for interactive problems, the interactor the submission talked to. Checkers and
interactors run in boxes of their own (the same uid, a separate directory the submission never
sees, their own limits); one that crashes makes the submission SYSTEM_ERROR with its message.
A submission has a wall-time budget for everything it runs and a maximum number of tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import functools
import hashlib
import os
import shutil
import socket
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from . import STATUSES, PackageSource, Status, Verdict
from .builds import BuildCache, build_key
from .cgroups import BoxGroup, Roots, remove_stale
from .checkers import MAX_MESSAGE, CheckerSpec, CheckResult, InvalidChecker, check, custom_outcome, parse_spec
from .isolation import SANDBOX_DIR_VAR, JudgeSettings, detect, load_judge_settings
from .lane import Lane
from .languages import (
    COMPILE_LIMITS,
    COMPILE_OUTPUT_MAX,
    LANGUAGES,
    UNAVAILABLE,
    Language,
    compile_failure,
    expand,
    find_tools,
    missing_toolchain,
    parse_standard,
    template_values,
)
from .sandbox import BOX, Isolation, Limits, RunFacts, run
from .scoring import InvalidScoring, Scoring, TestResult, parse_scoring, should_run, summarize

MAX_TIME = 30.0
MAX_MEMORY_MB = 2048
MAX_OUTPUT_KB = 64 * 1024
UID_BASE = 200_000  # box uids: UID_BASE + range * slots + slot, nobody else's on a judge host
RANGES = 64  # worker processes that may share one host (each holds one range by a lock file)

#: A custom checker's or interactor's own limits (it is the problem setter's code, but still boxed).
HELPER_LIMITS = Limits(
    cpu=10, wall=20, memory=512 * 1024 * 1024, output=64 * 1024, file_size=64 * 1024 * 1024, processes=16,
    open_files=64, stack=256 * 1024 * 1024, scratch=64 * 1024 * 1024, stderr=16 * 1024,
)  # fmt: skip
#: How much longer than the submission an interactor may run: the submission is stopped first, so
#: an interactor waiting on a silent submission sees EOF and answers, and the submission's
#: IDLENESS_LIMIT is what is reported.
INTERACTOR_GRACE = 2.0
#: Built checkers/interactors a worker keeps (oldest removed first).
MAX_KEPT_HELPERS = 32


class InvalidProgramPayload(ValueError):
    """The payload (or the package it names) does not describe a program to judge; says which field."""


@dataclass(frozen=True)
class Program:
    """A validated payload: the submission, and either its own tests or a package reference."""

    language: str
    source: str
    tests: list[tuple[str, str]]  # inline tests; empty when ``problem`` names a package
    time: float = 2.0
    memory_mb: int = 256
    output_kb: int = 1024
    problem: str | None = None
    version: int | None = None
    checker: CheckerSpec = field(default_factory=lambda: CheckerSpec("lines"))
    scoring: Scoring = field(default_factory=Scoring)
    std: str | None = None  # the language standard asked for (C, C++); None: the language's default


@dataclass(frozen=True)
class Helper:
    """A checker or interactor program of a package: its language, its file on local disk, and the
    file's sha256 (packages are content-addressed: the same digest is the same program)."""

    language: str
    path: Path
    sha256: str = ""


@dataclass(frozen=True)
class Case:
    """One test: its input and answer, as bytes (inline tests) or files (a cached package)."""

    name: str
    input: bytes | Path
    answer: bytes | Path


@dataclass(frozen=True)
class Problem:
    """What a submission is judged against, whichever way the payload gave it."""

    tests: tuple[Case, ...]
    time: float
    memory_mb: int
    output_kb: int
    checker: CheckerSpec
    scoring: Scoring
    checker_program: Helper | None = None
    interactor: Helper | None = None
    ref: dict[str, Any] | None = None  # {"id", "version", "sha256"} of a package


def parse_limits(limits: Any, where: str = "limits") -> tuple[float, int, int]:
    """(time seconds, memory MiB, output KiB) from a limits object, defaults filled in (pure)."""
    if limits is None:
        limits = {}
    if not isinstance(limits, dict):
        raise InvalidProgramPayload(f"{where} must be an object")
    try:
        time_limit = float(limits.get("time", 2))
        memory_mb = int(limits.get("memory_mb", 256))
        output_kb = int(limits.get("output_kb", 1024))
    except (TypeError, ValueError) as exc:
        raise InvalidProgramPayload(f"{where}: {exc}") from None
    if not 0.001 <= time_limit <= MAX_TIME:
        raise InvalidProgramPayload(f"{where}.time must be between 0.001 and {MAX_TIME:g} seconds")
    if not 16 <= memory_mb <= MAX_MEMORY_MB:
        raise InvalidProgramPayload(f"{where}.memory_mb must be between 16 and {MAX_MEMORY_MB}")
    if not 1 <= output_kb <= MAX_OUTPUT_KB:
        raise InvalidProgramPayload(f"{where}.output_kb must be between 1 and {MAX_OUTPUT_KB}")
    return time_limit, memory_mb, output_kb


def parse_payload(payload: Any, *, max_tests: int = 1000) -> Program:
    """Validate a payload into a :class:`Program` (pure), or raise InvalidProgramPayload saying why."""
    if not isinstance(payload, dict):
        raise InvalidProgramPayload("payload must be a JSON object")
    language = payload.get("language")
    if isinstance(language, str) and language in UNAVAILABLE:
        raise InvalidProgramPayload(f"language {language!r} is not offered here: {UNAVAILABLE[language]}")
    if language not in LANGUAGES:
        raise InvalidProgramPayload(f"language must be one of {', '.join(LANGUAGES)}, got {language!r}")
    source = payload.get("source")
    if not isinstance(source, str):
        raise InvalidProgramPayload("source must be a string")
    try:
        std = parse_standard(LANGUAGES[language], payload.get("std"))
    except ValueError as exc:
        raise InvalidProgramPayload(str(exc)) from None
    if "problem" in payload:
        problem, version = payload["problem"], payload.get("version")
        if not isinstance(problem, str) or not problem:
            raise InvalidProgramPayload(f"problem must be a package id (a string), got {problem!r}")
        if isinstance(version, bool) or not isinstance(version, int) or version < 1:
            raise InvalidProgramPayload(f"version must be a positive integer (the package version), got {version!r}")
        for own in ("tests", "limits", "checker", "scoring"):
            if own in payload:
                raise InvalidProgramPayload(f"{own}: a payload naming a problem package takes its {own} from it")
        return Program(language, source, [], problem=problem, version=version, std=std)
    tests = payload.get("tests")
    if not isinstance(tests, list) or not tests:
        raise InvalidProgramPayload("tests must be a non-empty list (or name a package with problem and version)")
    if len(tests) > max_tests:
        raise InvalidProgramPayload(f"tests: {len(tests)} tests, at most {max_tests} per submission")
    cases = []
    for i, case in enumerate(tests):
        ok = isinstance(case, dict) and isinstance(case.get("input", ""), str) and isinstance(case.get("output"), str)
        if not ok:
            raise InvalidProgramPayload(f"tests[{i}] must be an object with string input and output")
        cases.append((case.get("input", ""), case["output"]))
    time_limit, memory_mb, output_kb = parse_limits(payload.get("limits"))
    try:
        checker = parse_spec(payload.get("checker"))
        scoring = parse_scoring(payload.get("scoring"), len(cases))
    except (InvalidChecker, InvalidScoring) as exc:
        raise InvalidProgramPayload(str(exc)) from None
    if checker.kind == "custom":
        raise InvalidProgramPayload("checker: a custom checker comes with a problem package, not inline")
    return Program(language, source, cases, time_limit, memory_mb, output_kb, checker=checker, scoring=scoring, std=std)


def inline_problem(program: Program) -> Problem:
    """The problem of a payload that carries its own tests (pure)."""
    cases = tuple(Case(str(i + 1), given.encode(), want.encode()) for i, (given, want) in enumerate(program.tests))
    return Problem(cases, program.time, program.memory_mb, program.output_kb, program.checker, program.scoring)


def package_problem(
    manifest: dict[str, Any], path_of: Callable[[str], Path], ref: dict[str, Any], *, max_tests: int
) -> Problem:
    """The problem a stored package manifest describes (pure but for ``path_of``), or
    InvalidProgramPayload naming the package and the field."""
    where = f"problem {ref['id']} version {ref['version']}"
    try:
        time_limit, memory_mb, output_kb = parse_limits(manifest.get("limits"), f"{where}: limits")
        raw_tests = manifest.get("tests") or []
        if len(raw_tests) > max_tests:
            raise InvalidProgramPayload(f"{where}: {len(raw_tests)} tests, at most {max_tests} per submission")
        cases = tuple(Case(str(t["name"]), path_of(t["input"]), path_of(t["answer"])) for t in raw_tests)
        if not cases:
            raise InvalidProgramPayload(f"{where}: tests: the package has no tests")
        checker = parse_spec(manifest.get("checker"))
        scoring = parse_scoring(manifest.get("scoring") or None, len(cases))
    except (InvalidChecker, InvalidScoring) as exc:
        raise InvalidProgramPayload(f"{where}: {exc}") from None

    def helper(name: str) -> Helper | None:
        spec = manifest.get(name)
        if not isinstance(spec, dict) or "file" not in spec:
            return None
        if spec.get("language") not in LANGUAGES:
            raise InvalidProgramPayload(f"{where}: {name}.language {spec.get('language')!r} is not known here")
        return Helper(spec["language"], path_of(spec["file"]), str(spec["file"]))

    custom = helper("checker") if checker.kind == "custom" else None
    if checker.kind == "custom" and custom is None:
        raise InvalidProgramPayload(f"{where}: checker: a custom checker needs its program file")
    return Problem(cases, time_limit, memory_mb, output_kb, checker, scoring, custom, helper("interactor"), ref)


def run_limits(spec: Program | Problem, processes: int = 16) -> Limits:
    """Limits of one test run (pure).

    CPU time is the problem's, to the millisecond, over every process of the run. The wall guard
    allows for start-up and a loaded machine but stops a program that sleeps (IDLENESS_LIMIT).
    The stack may use all of the memory limit (the cgroup still bounds the total).
    """
    memory = spec.memory_mb * 1024 * 1024
    return Limits(
        cpu=spec.time,
        wall=spec.time * 2 + 0.5,
        memory=memory,
        output=spec.output_kb * 1024,
        file_size=max(spec.output_kb * 1024, 1024 * 1024),
        stack=memory,
        processes=processes,
        open_files=64,
        scratch=16 * 1024 * 1024,
    )


def normalise_output(text: str) -> list[str]:
    """Lines without trailing whitespace, trailing blank lines dropped (pure)."""
    lines = [line.rstrip() for line in text.replace("\r\n", "\n").split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def outputs_match(actual: bytes, expected: str) -> bool:
    """Compare a program's output with the expected text, ignoring trailing whitespace (pure)."""
    return normalise_output(actual.decode("utf-8", errors="replace")) == normalise_output(expected)


def classify_facts(facts: RunFacts, limits: Limits) -> tuple[Status, str] | None:
    """The verdict a run's facts force (a limit, a crash), or None when it ended normally (pure).

    Order: a box that would not die is the system's fault; then the limits the worker itself
    enforced (output, memory by the cgroup's OOM count or peak, CPU by the cgroup's counter, wall);
    then the engine's exit report. Nothing the program prints decides these, and no exit status is
    read as a limit.
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
    if facts.killed_for == "wall" and facts.waited * 2 >= facts.wall:
        # Stopped at the wall guard's hard cap having mostly waited for a CPU: nothing the program
        # did; a verdict on it would be a guess.
        return "SYSTEM_ERROR", (
            f"the worker was overloaded: the program waited {facts.waited:.1f}s of {facts.wall:.1f}s for a CPU"
        )
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
    return None


def classify_run(facts: RunFacts, limits: Limits, expected: str) -> tuple[Status, str | None]:
    """Verdict of one run against an expected output with the default ``lines`` checker (pure)."""
    forced = classify_facts(facts, limits)
    if forced is not None:
        return forced
    if not outputs_match(facts.stdout, expected):
        return "WRONG_ANSWER", None
    return "ACCEPTED", None


def helper_outcome(facts: RunFacts) -> CheckResult:
    """What a custom checker or interactor said, from its facts (pure): testlib's exit codes, its
    message from stderr (or stdout); a checker stopped by its limits or killed is SYSTEM_ERROR."""
    limited = facts.killed_for is not None or facts.oom_killed or facts.stuck
    return custom_outcome(facts.exit_code, facts.signal, facts.stderr or facts.stdout, timed_out=limited)


def classify_interactive(
    submission: RunFacts, limits: Limits, interactor: RunFacts, said: CheckResult
) -> tuple[Status, float, str]:
    """Verdict, score and message of one interactive test (pure).

    An interactor that failed (crashed, its limits, exit 3) is the system's fault; then the
    submission's limits (IDLENESS_LIMIT when it waited forever: it is stopped before the
    interactor, so the interactor's complaint about EOF does not hide it); then the interactor's
    verdict (a wrong guess, too many queries: the submission may have died writing to it, so this
    comes before the submission's exit status); then the submission's crash.
    """
    if interactor.stuck or said.verdict == "SYSTEM_ERROR":
        return "SYSTEM_ERROR", 0.0, f"interactor: {said.message}"[:MAX_MESSAGE]
    forced = classify_facts(submission, limits)
    if forced is not None and forced[0] != "RUNTIME_ERROR":
        return forced[0], 0.0, forced[1]
    if said.verdict != "ACCEPTED":
        return said.verdict, said.score, said.message
    if forced is not None:
        return forced[0], 0.0, forced[1]
    return "ACCEPTED", said.score, said.message


def result_of(number: int, verdict: Status, facts: RunFacts | None, score: float, message: str) -> TestResult:
    """One test's line in the verdict details (pure)."""
    if facts is None:
        return TestResult(number, verdict, score, message=message[:MAX_MESSAGE])
    return TestResult(
        test=number, verdict=verdict, score=score,
        cpu_ms=round(facts.cpu * 1000), wall_ms=round(facts.wall * 1000), memory_kb=facts.memory_peak // 1024,
        exit_code=facts.exit_code, signal=facts.signal, message=message[:MAX_MESSAGE],
    )  # fmt: skip


def verdict_details(results: list[TestResult], problem: Problem, base: dict[str, Any], stderr: bytes = b"") -> Verdict:
    """The submission's verdict from its test results (pure): the first failing test's verdict (or
    ACCEPTED), its message as the reason, and the score when the problem is scored."""
    summary = summarize(results, problem.scoring, len(problem.tests))
    details: dict[str, Any] = {**base, "tests": [r.as_dict() for r in results]}
    failing = next((r for r in sorted(results, key=lambda r: r.test) if r.verdict != "ACCEPTED"), None)
    if failing is not None:
        details["failed_test"] = failing.test
        if failing.message:
            details["reason"] = failing.message
        if stderr:
            details["stderr"] = _tail(stderr)
    if summary.score is not None:
        details.update(score=summary.score, max_score=summary.max_score)
        if summary.groups:
            details["groups"] = summary.groups
    status = next(s for s in STATUSES if s == summary.verdict)  # every test verdict is a Status
    return Verdict(status, details)


def _write_text(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)


def _write_bytes(path: str, data: bytes) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


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


async def _read(data: bytes | Path) -> bytes:
    return data if isinstance(data, bytes) else await asyncio.to_thread(data.read_bytes)


@dataclass
class _Box:
    """One submission's place: its uid, its directory and groups, and its helper's (checker or
    interactor) directory and groups, which the submission's runs never see."""

    uid: int
    dir: str
    group: BoxGroup | None
    helper_dir: str
    helper_group: BoxGroup | None
    tests: Lane  # the submission's test runs: one box for all (a session) or armed ahead (groups -a and -b)
    checks: Lane  # the custom checker's runs, one per test, alike (groups -ca and -cb)


class ProgramJudge:
    """Judge submitted programs in boxes; ``slots`` bounds concurrent submissions (one box each).

    Construction decides the isolation (and refuses to go on without it, see :mod:`.isolation`),
    claims a uid range and removes whatever a crashed worker left in it. Problem packages come from
    a :class:`~judgequeue.core.judges.PackageSource` the worker attaches (:meth:`attach_packages`).
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
        # The cgroup tree is the whole host's (a node's, under Kubernetes) while ranges are only unique
        # per sandbox directory (per pod): group names carry both, so two workers never share a group
        # or remove each other's as "stale".
        tag = hashlib.sha256(f"{socket.gethostname()}:{os.path.abspath(root)}".encode()).hexdigest()[:8]
        self.group_prefix = f"{tag}-{self.range}-"
        self.uid_base = UID_BASE + self.range * slots
        self.boxes_dir = os.path.join(root, str(self.range))
        self.stale_removed = self._remove_stale()
        # Built checkers and interactors (see _prepare_helper); a crashed worker's are not trusted.
        self.helpers_dir = os.path.join(root, "helpers", str(self.range))
        shutil.rmtree(self.helpers_dir, ignore_errors=True)
        os.makedirs(self.helpers_dir, mode=0o700)
        self.helper_builds = 0
        # Built submissions (see _build); like the helpers', a crashed worker's are not trusted.
        self.builds = BuildCache(os.path.join(root, "builds", str(self.range)))
        self.staging_dir = os.path.join(root, "staging", str(self.range))
        shutil.rmtree(self.staging_dir, ignore_errors=True)
        os.makedirs(self.staging_dir, mode=0o700)
        os.makedirs(self.boxes_dir, mode=0o711, exist_ok=True)
        self._free = asyncio.Queue[int]()
        for i in range(slots):
            self._free.put_nowait(i)
        # System tools only: the worker's own interpreter may live where a box cannot see it (a venv).
        self.tools = find_tools()
        self.packages: PackageSource | None = None

    # --- packages (injected by the worker: judges never talk to Postgres) --------------------------

    def package_cache(self) -> tuple[str, int]:
        """Where this judge wants its package cache and how big: one directory per uid range, so a
        worker that crashed leaves its copies to the next worker holding the range, not to others."""
        return os.path.join(self.settings.cache_dir, str(self.range)), self.settings.problem_cache_mb * 1024 * 1024

    def attach_packages(self, source: PackageSource) -> None:
        self.packages = source

    def _remove_stale(self) -> list[str]:
        removed = []
        if self.roots is not None:
            removed += remove_stale(self.roots, self.group_prefix, time.monotonic() + 10)
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
        if program.problem is None:
            return await self._judge_with(program, inline_problem(program))
        if self.packages is None:
            return Verdict("SYSTEM_ERROR", {"reason": "this worker has no problem package cache attached"})
        assert program.version is not None
        try:
            async with self.packages.package(program.problem, program.version) as package:
                ref = {"id": package.id, "version": package.version, "sha256": package.sha256}
                problem = package_problem(package.manifest, package.path, ref, max_tests=self.settings.max_tests)
                return await self._judge_with(program, problem)
        except InvalidProgramPayload as exc:
            return Verdict("SYSTEM_ERROR", {"reason": f"invalid package: {exc}"})
        except LookupError as exc:  # problems.UnknownProblem: nothing a retry changes
            return Verdict("SYSTEM_ERROR", {"reason": str(exc)})

    async def _judge_with(self, program: Program, problem: Problem) -> Verdict:
        slot = await self._free.get()
        uid = self.uid_base + slot
        named = f"{self.group_prefix}{slot}"
        groups = (BoxGroup(self.roots, f"{named}-a"), BoxGroup(self.roots, f"{named}-b")) if self.roots else None
        checks = (BoxGroup(self.roots, f"{named}-ca"), BoxGroup(self.roots, f"{named}-cb")) if self.roots else None
        helper_dir = os.path.join(self.boxes_dir, f"{slot}-helper")
        directory = os.path.join(self.boxes_dir, str(slot))
        runner = self.tools.get("python3") if self.settings.box == "submission" else None
        box = _Box(
            uid, directory, BoxGroup(self.roots, named) if self.roots else None,
            helper_dir, BoxGroup(self.roots, f"{named}-h") if self.roots else None,
            Lane(box=directory, uid=uid, isolation=self.isolation, groups=groups, python=runner),
            Lane(box=helper_dir, uid=uid, isolation=self.isolation, groups=checks, python=runner),
        )  # fmt: skip
        try:
            await asyncio.to_thread(self._make_dir, box.dir, uid)
            return await self._judge_in(program, problem, box)
        finally:
            await asyncio.shield(box.tests.close())
            await asyncio.shield(box.checks.close())
            await asyncio.shield(asyncio.to_thread(self._remove_dirs, box))
            self._free.put_nowait(slot)

    @staticmethod
    def _remove_dirs(box: _Box) -> None:
        shutil.rmtree(box.dir, ignore_errors=True)
        shutil.rmtree(box.helper_dir, ignore_errors=True)

    def _make_dir(self, path: str, uid: int) -> None:
        """A fresh 0700 directory owned by ``uid``, appearing at ``path`` only once it is both (made
        elsewhere and renamed into place: nobody ever sees it root's or with another mode)."""
        shutil.rmtree(path, ignore_errors=True)
        staging = os.path.join(self.staging_dir, os.path.basename(path))
        shutil.rmtree(staging, ignore_errors=True)
        os.mkdir(staging, 0o700)
        if self.isolation.mode == "full":
            os.chown(staging, uid, uid)
        os.rename(staging, path)

    def _inside(self, path: str) -> str:
        """Where directory ``path`` appears to a run that has it as its box."""
        return BOX if self.isolation.mode == "full" else path

    async def _build(
        self,
        language: Language,
        source: str,
        directory: str,
        box: _Box,
        group: BoxGroup | None,
        deadline: float,
        *,
        helper: bool = False,
        std: str | None = None,
        memory_mb: int | None = None,
        cache: bool = False,
    ) -> list[str] | Verdict:
        """Write and (if the language compiles) build a program; its run argv, or the verdict of a failure.

        ``memory_mb`` is the run's memory limit, which some runtimes are told (a helper's by default);
        ``cache``: look the build up in, and add it to, the worker's :class:`~.builds.BuildCache`.
        """
        missing = missing_toolchain(language, self.tools)
        if missing:
            return Verdict("SYSTEM_ERROR", {"reason": missing})
        inside = self._inside(directory)
        values = template_values(language, source, std, memory_mb or HELPER_LIMITS.memory // (1024 * 1024))
        name = expand((language.source,), inside, self.tools, values)[0].rsplit("/", 1)[-1]
        run_template = language.helper_run if helper and language.helper_run else language.run
        run_argv = expand(run_template, inside, self.tools, values)
        if language.compile is None:
            await asyncio.to_thread(_write_text, os.path.join(directory, name), source)
            return run_argv
        argv = expand(language.compile, inside, self.tools, values)
        key = build_key(language.name, argv, source, self.tools, sorted(language.tools())) if cache else None
        owner = box.uid if self.isolation.mode == "full" else None
        if key is not None and await asyncio.to_thread(self.builds.restore, key, directory, owner):
            return run_argv
        await asyncio.to_thread(_write_text, os.path.join(directory, name), source)
        limits = replace(COMPILE_LIMITS, wall=max(0.001, min(COMPILE_LIMITS.wall, deadline - time.monotonic())))
        facts = await run(
            argv, box=directory, uid=box.uid, stdin=b"", limits=limits,
            isolation=self.isolation, group=group, writable_box=True,
        )  # fmt: skip
        artifact = expand((language.artifact,), "", self.tools, values)[0] if language.artifact else None
        built = artifact is None or await asyncio.to_thread(os.path.exists, os.path.join(directory, artifact))
        if facts.stuck:
            return Verdict("SYSTEM_ERROR", {"reason": "the compiler's box did not stop after it was killed"})
        if facts.killed_for is not None or facts.oom_killed or facts.exit_code != 0 or not built:
            reason = compile_failure(facts.killed_for, facts.oom_killed, limits)
            output = _tail(facts.stderr + facts.stdout, COMPILE_OUTPUT_MAX)
            return Verdict("COMPILE_ERROR", {"reason": reason, "output": output})
        if key is not None:
            await asyncio.to_thread(self.builds.keep, key, directory)
        return run_argv

    async def _judge_in(self, program: Program, problem: Problem, box: _Box) -> Verdict:
        deadline = time.monotonic() + self.settings.budget
        base: dict[str, Any] = {"isolation": self.isolation.mode, "language": program.language}
        if problem.ref is not None:
            base["problem"] = problem.ref
        language = LANGUAGES[program.language]
        argv = await self._build(
            language, program.source, box.dir, box, box.group, deadline,
            std=program.std, memory_mb=problem.memory_mb, cache=True,
        )  # fmt: skip
        if isinstance(argv, Verdict):
            return Verdict(argv.status, {**base, **argv.details})
        helper_argv: list[str] | None = None
        helper = problem.interactor or problem.checker_program
        if helper is not None:
            kind = "interactor" if problem.interactor is not None else "checker"
            built = await self._prepare_helper(helper, box, deadline)
            if isinstance(built, Verdict):
                why = built.details.get("output") or built.details.get("reason", "")
                return Verdict("SYSTEM_ERROR", {**base, "reason": f"the {kind} does not build: {why}"[:2000]})
            helper_argv = built
        limits = run_limits(problem, language.processes)
        results: list[TestResult] = []
        failing_stderr = b""
        for number, case in enumerate(problem.tests, 1):
            if not should_run(number, results, problem.scoring):
                if not problem.scoring.scored:
                    break
                continue
            left = deadline - time.monotonic()
            if left <= 0:
                used_up = f"submission time budget of {self.settings.budget:g}s used up before test {number}"
                results.append(result_of(number, "TIME_LIMIT", None, 0.0, used_up))
                break
            this = replace(limits, wall=min(limits.wall, left))
            given = await _read(case.input)
            if problem.interactor is not None:
                assert helper_argv is not None
                result, stderr = await self._interact(number, case, given, argv, helper_argv, this, box)
            else:
                result, stderr = await self._test(number, case, given, argv, helper_argv, problem, this, box)
            if result.verdict == "IDLENESS_LIMIT" and this.wall < limits.wall:
                used_up = f"submission time budget of {self.settings.budget:g}s used up"
                result = replace(result, verdict="TIME_LIMIT", message=used_up)
            results.append(result)
            if result.verdict != "ACCEPTED" and not failing_stderr:
                failing_stderr = stderr
            if result.verdict == "SYSTEM_ERROR":
                break  # the judging itself failed: no later test can be trusted to mean anything
        return verdict_details(results, problem, base, failing_stderr)

    async def _prepare_helper(self, helper: Helper, box: _Box, deadline: float) -> list[str] | Verdict:
        """Put a checker or interactor into the box's helper directory, ready to run.

        A compiled one is built once per worker and program (its sha256): a testlib checker takes
        seconds to compile, which every submission of the problem would otherwise pay. The build's
        directory is kept (root's, 0700) and copied into each later submission's helper directory.
        """
        language = LANGUAGES[helper.language]
        await asyncio.to_thread(self._make_dir, box.helper_dir, box.uid)
        kept = os.path.join(self.helpers_dir, f"{helper.sha256}-{helper.language}") if helper.sha256 else None
        source = await asyncio.to_thread(helper.path.read_text)
        if language.compile is not None and kept is not None and await asyncio.to_thread(os.path.isdir, kept):
            await asyncio.to_thread(self._restore_helper, kept, box)
            run_template = language.helper_run or language.run
            values = template_values(language, source, None, HELPER_LIMITS.memory // (1024 * 1024))
            return expand(run_template, self._inside(box.helper_dir), self.tools, values)
        built = await self._build(language, source, box.helper_dir, box, box.helper_group, deadline, helper=True)
        if not isinstance(built, Verdict) and language.compile is not None and kept is not None:
            await asyncio.to_thread(self._keep_helper, box.helper_dir, kept)
            self.helper_builds += 1
        return built

    def _keep_helper(self, built: str, kept: str) -> None:
        staging = f"{kept}.{os.getpid()}-{time.monotonic_ns()}"
        shutil.copytree(built, staging, symlinks=True)
        try:
            os.rename(staging, kept)
        except OSError:  # another submission kept the same build first
            shutil.rmtree(staging, ignore_errors=True)
        entries = sorted(
            (os.path.join(self.helpers_dir, n) for n in os.listdir(self.helpers_dir)), key=os.path.getmtime
        )
        for old in entries[: max(0, len(entries) - MAX_KEPT_HELPERS)]:
            shutil.rmtree(old, ignore_errors=True)

    def _restore_helper(self, kept: str, box: _Box) -> None:
        shutil.copytree(kept, box.helper_dir, symlinks=True, dirs_exist_ok=True)
        if self.isolation.mode == "full":
            for where, dirs, files in os.walk(box.helper_dir):
                for name in dirs + files:
                    os.lchown(os.path.join(where, name), box.uid, box.uid)

    async def _test(
        self, number: int, case: Case, given: bytes, argv: list[str], checker_argv: list[str] | None,
        problem: Problem, limits: Limits, box: _Box,
    ) -> tuple[TestResult, bytes]:  # fmt: skip
        """Run one ordinary test and check its output."""
        ahead = number < len(problem.tests)
        facts = await box.tests.run(argv, stdin=given, limits=limits, ahead=ahead)
        forced = classify_facts(facts, limits)
        if forced is not None:
            return result_of(number, forced[0], facts, 0.0, forced[1]), facts.stderr
        answer = await _read(case.answer)
        if checker_argv is None:
            said = check(problem.checker, facts.stdout, answer)
        else:
            said = await self._check(checker_argv, given, facts.stdout, answer, box, ahead)
        return result_of(number, said.verdict, facts, said.score, said.message), facts.stderr

    async def _check(
        self, argv: list[str], given: bytes, output: bytes, answer: bytes, box: _Box, ahead: bool
    ) -> CheckResult:
        """Run the custom checker on one test (testlib arguments: input, output, answer); in one box
        for all of a submission's tests, like the tests (the files are rewritten before each run)."""

        def write() -> None:
            for name, data in (("input", given), ("output", output), ("answer", answer)):
                _write_bytes(os.path.join(box.helper_dir, name), data)

        await asyncio.to_thread(write)
        inside = self._inside(box.helper_dir)
        paths = [f"{inside}/input", f"{inside}/output", f"{inside}/answer"]
        facts = await box.checks.run([*argv, *paths], stdin=b"", limits=HELPER_LIMITS, ahead=ahead)
        return helper_outcome(facts)

    async def _interact(
        self, number: int, case: Case, given: bytes, argv: list[str], interactor: list[str], limits: Limits, box: _Box
    ) -> tuple[TestResult, bytes]:
        """Run the submission and the interactor connected by two pipes; the interactor's verdict
        decides (:func:`classify_interactive`). It gets the test's input and answer as files."""
        answer = await _read(case.answer)

        def write() -> None:
            for name, data in (("input", given), ("answer", answer)):
                _write_bytes(os.path.join(box.helper_dir, name), data)

        await asyncio.to_thread(write)
        inside = self._inside(box.helper_dir)
        to_sub_r, to_sub_w = os.pipe2(os.O_CLOEXEC)
        try:
            to_int_r, to_int_w = os.pipe2(os.O_CLOEXEC)
        except OSError:
            os.close(to_sub_r)
            os.close(to_sub_w)
            raise
        helper_limits = replace(HELPER_LIMITS, wall=limits.wall + INTERACTOR_GRACE)
        # Each run owns (and closes) the two ends it is given, so either side sees EOF once the other is
        # gone; a task group cancels (and so kills) one side if the other fails to start.
        async with asyncio.TaskGroup() as both:
            boxed = functools.partial(run, uid=box.uid, stdin=b"", isolation=self.isolation)
            sub_run = both.create_task(
                boxed(argv, box=box.dir, limits=limits, group=box.group, stdin_fd=to_sub_r, stdout_fd=to_int_w)
            )
            interactor_argv = [*interactor, f"{inside}/input", f"{inside}/output", f"{inside}/answer"]
            inter_run = both.create_task(
                boxed(interactor_argv, box=box.helper_dir, limits=helper_limits, group=box.helper_group,
                      writable_box=True, stdin_fd=to_int_r, stdout_fd=to_sub_w)
            )  # fmt: skip
        sub, inter = sub_run.result(), inter_run.result()  # fmt: skip
        said = helper_outcome(inter)
        verdict, score, message = classify_interactive(sub, limits, inter, said)
        return result_of(number, verdict, sub, score, message), sub.stderr

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()
