"""The program judge: build a submitted program and judge it test by test, as contest judges do.

Payload, either with its own tests::

    {"language": "python" | "c" | "cpp" | "java" | ..., "source": "...", "std": "c++20",
     "tests": [{"input": "...", "output": "..."}, ...],
     "limits": {"time": 2, "memory_mb": 256, "output_kb": 1024},
     "checker": "lines", "scoring": {"run_all": true}}          # both optional

or naming an uploaded problem package (tests, limits, checker, interactor, scoring come from it)::

    {"problem": "mean", "version": 3, "language": "cpp", "source": "..."}

``language`` is a name of :data:`~.languages.LANGUAGES`; ``std`` (optional, C and C++ only) one of
that language's standards. A submission of several files adds ``"files": {"util.h": "...",
"util.cpp": "..."}`` beside its ``source`` (C and C++ compile the further ``.c``/``.cpp`` files with
it; every language finds them in its directory); an output-only problem's submission is
``"outputs": {"<test name>": "..."}`` instead of a language and a source. A submission's build is
kept by the worker (:mod:`.builds`): the same sources in the same language and standard are built
once per worker.

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

A package's format (judgequeue, ICPC/Kattis, Polygon) brings its own verdict rules, applied to its
submissions only: how a Kattis output validator is run and read, the order of verdicts of an
interactive test (:func:`classify_interactive`), how tests are grouped and scored.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import functools
import hashlib
import json
import os
import re
import shutil
import socket
import stat
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from . import STATUSES, PackageSource, Status, Verdict
from .builds import BuildCache, build_key, keep_copy
from .checkers import (
    MAX_MESSAGE,
    CheckerSpec,
    CheckResult,
    InvalidChecker,
    check,
    custom_outcome,
    kattis_outcome,
    parse_spec,
)
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
from .sandbox import BOX, Isolation, Limits, RunFacts, read_ready, run
from .sandbox.cgroups import BoxGroup, Roots, box_group, remove_stale
from .sandbox.isolation import SANDBOX_DIR_VAR, JudgeSettings, detect, load_judge_settings
from .sandbox.lane import Lane
from .scoring import InvalidScoring, Scoring, TestResult, finished, parse_scoring, should_run, summarize

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
#: A submission of several files: at most this many besides its main source, this much in all.
MAX_FILES = 64
MAX_FILES_BYTES = 4 * 1024 * 1024
_FILE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]{0,63}")
#: Further translation units a C or C++ build compiles with its main source (by suffix).
UNITS = {"c": (".c",), "cpp": (".cpp", ".cc", ".cxx", ".c++", ".C")}
#: What of a Kattis output validator's feedback directory is read (each file, at most).
FEEDBACK_MAX = 128 * 1024


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
    files: tuple[tuple[str, str], ...] = ()  # further files of the submission, beside its main source
    outputs: dict[str, str] | None = None  # an output-only submission: its output for each test, by name


@dataclass(frozen=True)
class Helper:
    """A checker or interactor program of a package: its language, its main source on local disk,
    the files its package ships beside it, and the build's identity (packages are content-addressed:
    the same digest is the same program). ``protocol`` is how it is run and read: ``testlib``
    (input, output, answer; testlib's exit codes) or ``kattis`` (input, answer, feedback directory;
    exit 42/43)."""

    language: str
    path: Path
    sha256: str = ""
    protocol: str = "testlib"
    files: tuple[tuple[str, Path], ...] = ()
    units: tuple[str, ...] = ()  # files beside it compiled with it (Kattis validators of several sources)
    std: str | None = None  # the C/C++ standard its format compiles it with (None: the language's default)


@dataclass(frozen=True)
class Case:
    """One test: its input and answer, as bytes (inline tests) or files (a cached package), and the
    flags a Kattis validator gets for it."""

    name: str
    input: bytes | Path
    answer: bytes | Path
    flags: tuple[str, ...] = ()


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
    format: str = "judgequeue"  # whose verdict rules apply: judgequeue, kattis or polygon
    kind: str = "batch"  # batch, interactive or output-only
    custom_score: bool = False  # Kattis: the validator may give a score (score.txt)


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


def own_files(language: Language, source: str, std: str | None = None) -> tuple[str, str | None]:
    """The names of a program's main source and of what its build must leave, in its directory (pure):
    the table's templates filled from the source (Java's file is named after its public class)."""
    values = template_values(language, source, std, 0)
    main = expand((language.source,), "", {}, values)[0]
    artifact = expand((language.artifact,), "", {}, values)[0] if language.artifact else None
    return main, artifact


def _parse_files(files: Any, language: str, source: str, std: str | None) -> tuple[tuple[str, str], ...]:
    """A submission's further files, checked: plain names, not its main source's, bounded (pure)."""
    if files is None:
        return ()
    if not isinstance(files, dict) or not all(isinstance(v, str) for v in files.values()):
        raise InvalidProgramPayload("files must be an object of file name to text")
    if len(files) > MAX_FILES or sum(len(v.encode()) for v in files.values()) > MAX_FILES_BYTES:
        raise InvalidProgramPayload(f"files: at most {MAX_FILES} files and {MAX_FILES_BYTES >> 20} MiB")
    main, artifact = own_files(LANGUAGES[language], source, std)
    for name in files:
        if not isinstance(name, str) or _FILE_NAME.fullmatch(name) is None or name in (main, artifact):
            raise InvalidProgramPayload(
                f"files: {name!r} must be a plain file name (letters, digits, '_', '.', '+', '-'), not {main!r}"
            )
    return tuple(sorted(files.items()))


def _parse_outputs(outputs: Any) -> dict[str, str]:
    if not isinstance(outputs, dict) or not outputs or not all(isinstance(v, str) for v in outputs.values()):
        raise InvalidProgramPayload("outputs must be an object of test name to the output for that test")
    if sum(len(v.encode()) for v in outputs.values()) > MAX_OUTPUT_KB * 1024:
        raise InvalidProgramPayload(f"outputs: at most {MAX_OUTPUT_KB // 1024} MiB in all")
    return {str(k): v for k, v in outputs.items()}


def parse_payload(payload: Any, *, max_tests: int = 1000) -> Program:
    """Validate a payload into a :class:`Program` (pure), or raise InvalidProgramPayload saying why."""
    if not isinstance(payload, dict):
        raise InvalidProgramPayload("payload must be a JSON object")
    outputs: dict[str, str] | None = None
    files: tuple[tuple[str, str], ...] = ()
    std: str | None = None
    if "outputs" in payload:
        for program_field in ("language", "source", "files", "std"):
            if program_field in payload:
                raise InvalidProgramPayload(f"{program_field}: an output-only submission gives outputs, not a program")
        outputs = _parse_outputs(payload["outputs"])
        language, source = "python", ""
    else:
        named, given = payload.get("language"), payload.get("source")
        if isinstance(named, str) and named in UNAVAILABLE:
            raise InvalidProgramPayload(f"language {named!r} is not offered here: {UNAVAILABLE[named]}")
        if not isinstance(named, str) or named not in LANGUAGES:
            raise InvalidProgramPayload(f"language must be one of {', '.join(LANGUAGES)}, got {named!r}")
        if not isinstance(given, str):
            raise InvalidProgramPayload("source must be a string")
        language, source = named, given
        try:
            std = parse_standard(LANGUAGES[language], payload.get("std"))
        except ValueError as exc:
            raise InvalidProgramPayload(str(exc)) from None
        files = _parse_files(payload.get("files"), language, source, std)
    if "problem" in payload:
        problem, version = payload["problem"], payload.get("version")
        if not isinstance(problem, str) or not problem:
            raise InvalidProgramPayload(f"problem must be a package id (a string), got {problem!r}")
        if isinstance(version, bool) or not isinstance(version, int) or version < 1:
            raise InvalidProgramPayload(f"version must be a positive integer (the package version), got {version!r}")
        for own in ("tests", "limits", "checker", "scoring"):
            if own in payload:
                raise InvalidProgramPayload(f"{own}: a payload naming a problem package takes its {own} from it")
        return Program(language, source, [], problem=problem, version=version, std=std, files=files, outputs=outputs)
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
    return Program(
        language, source, cases, time_limit, memory_mb, output_kb, checker=checker, scoring=scoring, std=std,
        files=files, outputs=outputs,
    )  # fmt: skip


def inline_problem(program: Program) -> Problem:
    """The problem of a payload that carries its own tests (pure); with outputs, an output-only one."""
    cases = tuple(Case(str(i + 1), given.encode(), want.encode()) for i, (given, want) in enumerate(program.tests))
    kind = "output-only" if program.outputs is not None else "batch"
    return Problem(
        cases, program.time, program.memory_mb, program.output_kb, program.checker, program.scoring, kind=kind
    )


FORMATS = ("judgequeue", "kattis", "polygon")
KINDS = ("batch", "interactive", "output-only")


def package_problem(
    manifest: dict[str, Any], path_of: Callable[[str], Path], ref: dict[str, Any], *, max_tests: int
) -> Problem:
    """The problem a stored package manifest describes (pure but for ``path_of``), or
    InvalidProgramPayload naming the package and the field."""
    where = f"problem {ref['id']} version {ref['version']}"
    fmt, kind = manifest.get("format", "judgequeue"), manifest.get("type")
    if fmt not in FORMATS:
        raise InvalidProgramPayload(f"{where}: format {fmt!r} is not one this judge knows")
    try:
        time_limit, memory_mb, output_kb = parse_limits(manifest.get("limits"), f"{where}: limits")
        raw_tests = manifest.get("tests") or []
        if len(raw_tests) > max_tests:
            raise InvalidProgramPayload(f"{where}: {len(raw_tests)} tests, at most {max_tests} per submission")
        cases = tuple(
            Case(str(t["name"]), path_of(t["input"]), path_of(t["answer"]), tuple(t.get("flags") or ()))
            for t in raw_tests
        )
        if not cases:
            raise InvalidProgramPayload(f"{where}: tests: the package has no tests")
        checker = parse_spec(manifest.get("checker"))
        raw_scoring = manifest.get("scoring") or None
        scoring = parse_scoring(raw_scoring, len(cases))
    except (InvalidChecker, InvalidScoring) as exc:
        raise InvalidProgramPayload(f"{where}: {exc}") from None

    custom = package_helper(manifest, "checker", path_of, where) if checker.kind == "custom" else None
    if checker.kind == "custom" and custom is None:
        raise InvalidProgramPayload(f"{where}: checker: a custom checker needs its program file")
    interactor = package_helper(manifest, "interactor", path_of, where)
    kind = kind or ("interactive" if interactor is not None else "batch")
    if kind not in KINDS or (kind == "interactive") != (interactor is not None):
        raise InvalidProgramPayload(f"{where}: type {kind!r} does not fit its interactor")
    custom_score = bool(isinstance(raw_scoring, dict) and raw_scoring.get("custom_score"))
    return Problem(
        cases, time_limit, memory_mb, output_kb, checker, scoring, custom, interactor, ref, fmt, kind, custom_score
    )


def package_helper(
    manifest: dict[str, Any], name: str, path_of: Callable[[str], Path], where: str
) -> Helper | None:
    """The program a package manifest names as its ``name`` (``checker``, ``interactor``), or None
    when it names none (pure but for ``path_of``); InvalidProgramPayload naming the field."""
    spec = manifest.get(name)
    if not isinstance(spec, dict) or "file" not in spec:
        return None
    if spec.get("language") not in LANGUAGES:
        raise InvalidProgramPayload(f"{where}: {name}.language {spec.get('language')!r} is not known here")
    try:
        std = parse_standard(LANGUAGES[spec["language"]], spec.get("std"))
    except ValueError as exc:
        raise InvalidProgramPayload(f"{where}: {name}.{exc}") from None
    beside = tuple(sorted((str(n), path_of(str(d))) for n, d in (spec.get("files") or {}).items()))
    units = tuple(str(u) for u in spec.get("units") or ())
    # The build's identity: the main source, every file built or included with it, the standard.
    identity = json.dumps([spec["file"], sorted((spec.get("files") or {}).items()), units, std])
    return Helper(
        spec["language"], path_of(spec["file"]), hashlib.sha256(identity.encode()).hexdigest(),
        str(spec.get("protocol", "testlib")), beside, units, std,
    )  # fmt: skip


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


def helper_outcome(facts: RunFacts, *, absolute_points: bool = False) -> CheckResult:
    """What a testlib-protocol checker or interactor said, from its facts (pure): testlib's exit
    codes, its message from stderr (or stdout); a checker stopped by its limits or killed is
    SYSTEM_ERROR."""
    limited = facts.killed_for is not None or facts.oom_killed or facts.stuck
    return custom_outcome(
        facts.exit_code, facts.signal, facts.stderr or facts.stdout, timed_out=limited, absolute_points=absolute_points
    )


def kattis_helper_outcome(facts: RunFacts, feedback: dict[str, bytes], *, score_allowed: bool) -> CheckResult:
    """What a Kattis output validator said, from its facts and feedback directory (pure)."""
    limited = facts.killed_for is not None or facts.oom_killed or facts.stuck
    return kattis_outcome(
        facts.exit_code, facts.signal, feedback, facts.stderr, timed_out=limited, score_allowed=score_allowed
    )


def format_facts(facts: RunFacts, limits: Limits, fmt: str) -> tuple[Status, str] | None:
    """:func:`classify_facts` under a format's rules (pure): Kattis has no idleness verdict, a run
    stopped by the wall clock is over its time limit there."""
    forced = classify_facts(facts, limits)
    if forced is not None and forced[0] == "IDLENESS_LIMIT" and fmt == "kattis":
        return "TIME_LIMIT", forced[1]
    return forced


def classify_interactive(
    submission: RunFacts, limits: Limits, interactor: RunFacts, said: CheckResult, fmt: str = "judgequeue"
) -> tuple[Status, float, str]:
    """Verdict, score and message of one interactive test (pure), by the package format's rules.

    judgequeue and Polygon (testlib): an interactor that failed (crashed, its limits, exit 3) is
    the system's fault; then the submission's limits (IDLENESS_LIMIT when it waited forever: it
    is stopped before the interactor, so the interactor's complaint about EOF does not hide it);
    then the interactor's verdict (a wrong guess, too many queries: the submission may have died
    writing to it, so this comes before the submission's exit status); then the submission's crash.

    ICPC/Kattis (problemtools' rules): a validator that failed is a judge error; a wrong answer
    from a validator that ended before the submission wins over anything the submission did after
    (a wrong guess, then a spin); then the submission's time limit (wall clock included), its
    crash (a crash at once is a run-time error even if the validator then says wrong answer), and
    last the validator's verdict.
    """
    if fmt == "kattis":
        if interactor.stuck or said.verdict == "SYSTEM_ERROR":
            return "SYSTEM_ERROR", 0.0, f"output validator: {said.message}"[:MAX_MESSAGE]
        validator_first = 0 < interactor.ended < submission.ended or (interactor.ended and not submission.ended)
        if said.verdict == "WRONG_ANSWER" and validator_first:
            return "WRONG_ANSWER", 0.0, said.message
        forced = format_facts(submission, limits, fmt)
        if forced is not None:
            return forced[0], 0.0, forced[1]
        return said.verdict, said.score, said.message
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


def result_of(
    number: int, verdict: Status, facts: RunFacts | None, score: float, message: str, points: float | None = None
) -> TestResult:
    """One test's line in the verdict details (pure)."""
    if facts is None:
        return TestResult(number, verdict, score, message=message[:MAX_MESSAGE], points=points)
    return TestResult(
        test=number, verdict=verdict, score=score,
        cpu_ms=round(facts.cpu * 1000), wall_ms=round(facts.wall * 1000), memory_kb=facts.memory_peak // 1024,
        exit_code=facts.exit_code, signal=facts.signal, message=message[:MAX_MESSAGE], points=points,
    )  # fmt: skip


def verdict_details(
    results: list[TestResult], problem: Problem, base: dict[str, Any], stderr: dict[int, bytes] | None = None
) -> Verdict:
    """The submission's verdict from its test results (pure): the first failing test's verdict (or,
    for a Kattis package, its test data tree's), that test as ``failed_test`` with its message as the
    reason and its stderr, and the score when the problem is scored. The test named is always one
    whose verdict is the submission's, and the stderr is that test's own."""
    summary = summarize(results, problem.scoring, len(problem.tests))
    details: dict[str, Any] = {**base, "tests": [r.as_dict() for r in results]}
    ordered = sorted(results, key=lambda r: r.test)
    failing = None
    if summary.verdict != "ACCEPTED":
        failing = next((r for r in ordered if r.verdict == summary.verdict), None)
        failing = failing or next((r for r in ordered if r.verdict != "ACCEPTED"), None)
    if failing is not None:
        details["failed_test"] = failing.test
        if failing.message:
            details["reason"] = failing.message
        if stderr and stderr.get(failing.test):
            details["stderr"] = _tail(stderr[failing.test])
    if summary.score is not None:
        details.update(score=summary.score, max_score=summary.max_score)
        if summary.groups:
            details["groups"] = summary.groups
    status = next(s for s in STATUSES if s == summary.verdict)  # every test verdict is a Status
    return Verdict(status, details)


def _write_bytes(path: str, data: bytes) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def with_units(argv: list[str], main: str, directory: str, units: tuple[str, ...]) -> list[str]:
    """A build's argv with further translation units right after its main source (pure): libraries
    named later on the line (``-lm``) then serve them too."""
    if not units:
        return argv
    at = argv.index(main) + 1 if main in argv else len(argv)
    return [*argv[:at], *(f"{directory}/{unit}" for unit in units), *argv[at:]]


def _read_bounded(path: str, limit: int = HELPER_LIMITS.file_size) -> bytes:
    """A file a helper wrote (never following a link it made), at most ``limit`` bytes; b"" if none."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return b""
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            return b""
        return f.read(limit)


def _read_feedback(directory: str) -> dict[str, bytes]:
    """The files a Kattis validator left in its feedback directory, each cut at FEEDBACK_MAX."""
    try:
        names = sorted(os.listdir(directory))[:16]
    except OSError:
        return {}
    return {name: _read_bounded(os.path.join(directory, name), FEEDBACK_MAX) for name in names}


class _Drain:
    """A pipe read end the worker holds through an interaction: idle while the side reading the
    pipe lives (it must get every byte), then read and dropped once that side has ended, so its
    partner's writes neither fail nor block."""

    def __init__(self, loop: asyncio.AbstractEventLoop, fd: int) -> None:
        self.loop, self.fd, self.reading = loop, fd, False

    def start(self) -> None:
        if self.fd < 0 or self.reading:
            return
        os.set_blocking(self.fd, False)  # nobody else reads this pipe any more
        self.loop.add_reader(self.fd, self._read)
        self.reading = True

    def _read(self) -> None:
        chunk = read_ready(self.fd)
        if chunk is None:
            return
        if not chunk:  # the writer is gone too
            self.loop.remove_reader(self.fd)
            self.reading = False

    def close(self) -> None:
        if self.fd >= 0:
            if self.reading:
                self.loop.remove_reader(self.fd)
            os.close(self.fd)
            self.fd = -1


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
    """One submission's place: its uid, its directory and groups, and its helpers' directories and
    groups, which the submission's runs never see: the interactor's (or a Kattis validator's, both
    run with a writable directory) and the checker's."""

    uid: int
    dir: str
    group: BoxGroup | None
    helper_dir: str
    helper_group: BoxGroup | None
    tests: Lane  # the submission's test runs: one box for all (a session) or armed ahead (groups -a and -b)
    checks: Lane  # the custom checker's runs, one per test, alike (groups -ca and -cb)
    check_dir: str = ""


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

    def fault(self) -> str | None:
        """Why this worker can no longer judge: a directory it made at start-up is gone (a pod's
        emptyDir removed under a running container, a cleaner sweeping /tmp), or the lock file of
        its uid range was replaced (another worker could claim the same range and uids)."""
        root = self.settings.sandbox_dir
        for path in (self.staging_dir, self.boxes_dir, self.helpers_dir):
            if not os.path.isdir(path):
                return f"the sandbox directory {path} was removed while the worker ran (something cleaned {root})"
        lock = os.path.join(root, "locks", f"{self.range}.lock")
        try:
            found, held = os.stat(lock), os.fstat(self._lock_fd)
            same = (found.st_dev, found.st_ino) == (held.st_dev, held.st_ino)
        except OSError:
            same = False
        if not same:
            return f"the lock of sandbox uid range {self.range} ({lock}) was removed while the worker ran"
        return None

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

    async def build_helpers(self, manifest: dict[str, Any], path_of: Callable[[str], Path]) -> dict[str, str]:
        """Build a package's checker and interactor as judging one of its submissions would (the same
        boxes, limits and compilers), before the package is stored: what does not build, by name
        (``checker``, ``interactor``), with the compiler's words. A build that works is kept as
        judging keeps one, so this worker's first submission of the package does not build it again."""
        checker = manifest.get("checker")
        helpers = []
        failed: dict[str, str] = {}
        for kind in ("interactor", "checker"):
            if kind == "checker" and not (isinstance(checker, dict) and checker.get("type") == "custom"):
                continue  # a built-in checker: nothing to build
            try:
                found = package_helper(manifest, kind, path_of, "the package")
            except InvalidProgramPayload as exc:
                failed[kind] = str(exc)
                continue
            if found is not None:
                helpers.append((kind, found))
        if not helpers:
            return failed
        async with self._slot() as box:
            deadline = time.monotonic() + self.settings.budget
            for kind, helper in helpers:
                directory = box.helper_dir if kind == "interactor" else box.check_dir
                prepared = await self._prepare_helper(helper, box, deadline, directory, box.helper_group)
                if isinstance(prepared, Verdict):
                    details = prepared.details
                    failed[kind] = str(details.get("output") or details.get("reason") or prepared.status)
        return failed

    async def _judge_with(self, program: Program, problem: Problem) -> Verdict:
        async with self._slot() as box:
            await asyncio.to_thread(self._make_dir, box.dir, box.uid)
            return await self._judge_in(program, problem, box)

    @contextlib.asynccontextmanager
    async def _slot(self) -> AsyncIterator[_Box]:
        """A free slot's box (its uid, directories and groups), given back clean."""
        slot = await self._free.get()
        uid = self.uid_base + slot
        named = f"{self.group_prefix}{slot}"
        groups = (box_group(self.roots, f"{named}-a"), box_group(self.roots, f"{named}-b")) if self.roots else None
        checks = (box_group(self.roots, f"{named}-ca"), box_group(self.roots, f"{named}-cb")) if self.roots else None
        helper_dir = os.path.join(self.boxes_dir, f"{slot}-helper")
        check_dir = os.path.join(self.boxes_dir, f"{slot}-check")
        directory = os.path.join(self.boxes_dir, str(slot))
        runner = self.tools.get("python3") if self.settings.box == "submission" else None
        box = _Box(
            uid, directory, box_group(self.roots, named) if self.roots else None,
            helper_dir, box_group(self.roots, f"{named}-h") if self.roots else None,
            Lane(box=directory, uid=uid, isolation=self.isolation, groups=groups, python=runner),
            Lane(box=check_dir, uid=uid, isolation=self.isolation, groups=checks, python=runner),
            check_dir,
        )  # fmt: skip
        try:
            yield box
        finally:
            await asyncio.shield(box.tests.close())
            await asyncio.shield(box.checks.close())
            await asyncio.shield(asyncio.to_thread(self._remove_dirs, box))
            self._free.put_nowait(slot)

    @staticmethod
    def _remove_dirs(box: _Box) -> None:
        for path in (box.dir, box.helper_dir, box.check_dir):
            shutil.rmtree(path, ignore_errors=True)

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
        beside: tuple[tuple[str, bytes], ...] = (),
        units: tuple[str, ...] = (),
    ) -> list[str] | Verdict:
        """Write and (if the language compiles) build a program; its run argv, or the verdict of a failure.

        ``memory_mb`` is the run's memory limit, which some runtimes are told (a helper's by default);
        ``cache``: look the build up in, and add it to, the worker's :class:`~.builds.BuildCache`.
        ``beside`` are further files written next to the main source (headers such as testlib.h, a
        submission's other files); ``units`` name those of them compiled with it. A kept build is
        keyed by all of them: the same main source with other files beside it is another build.
        """
        missing = missing_toolchain(language, self.tools)
        if missing:
            return Verdict("SYSTEM_ERROR", {"reason": missing})
        inside = self._inside(directory)
        values = template_values(language, source, std, memory_mb or HELPER_LIMITS.memory // (1024 * 1024))
        name, artifact = own_files(language, source, std)
        run_template = language.helper_run if helper and language.helper_run else language.run
        run_argv = expand(run_template, inside, self.tools, values)

        def write() -> None:
            for other, data in beside:
                _write_bytes(os.path.join(directory, other), data)
            # The main source last: a file beside it of the same name never replaces it.
            _write_bytes(os.path.join(directory, name), source.encode())

        if language.compile is None:
            await asyncio.to_thread(write)
            return run_argv
        argv = with_units(expand(language.compile, inside, self.tools, values), f"{inside}/{name}", inside, units)
        key = build_key(language.name, argv, source, self.tools, sorted(language.tools()), beside) if cache else None
        owner = box.uid if self.isolation.mode == "full" else None
        if key is not None and await asyncio.to_thread(self.builds.restore, key, directory, owner):
            return run_argv
        await asyncio.to_thread(write)
        limits = replace(COMPILE_LIMITS, wall=max(0.001, min(COMPILE_LIMITS.wall, deadline - time.monotonic())))
        facts = await run(
            argv, box=directory, uid=box.uid, stdin=b"", limits=limits,
            isolation=self.isolation, group=group, writable_box=True,
        )  # fmt: skip
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
        base: dict[str, Any] = {"isolation": self.isolation.mode}
        if program.outputs is None:
            base["language"] = program.language
        if problem.ref is not None:
            base["problem"] = problem.ref
            if problem.format != "judgequeue":
                base["format"] = problem.format
        if (program.outputs is not None) != (problem.kind == "output-only"):
            why = (
                "outputs: this problem takes a program (language and source), not outputs"
                if program.outputs is not None
                else "this problem is output-only: submit outputs (test name to output), not a program"
            )
            return Verdict("SYSTEM_ERROR", {**base, "reason": f"invalid payload: {why}"})
        language = LANGUAGES[program.language]
        argv: list[str] = []
        if program.outputs is None:  # an output-only submission has nothing to build
            beside = tuple((name, text.encode()) for name, text in program.files)
            units = tuple(name for name, _ in program.files if name.endswith(UNITS.get(language.name, ())))
            built = await self._build(
                language, program.source, box.dir, box, box.group, deadline,
                std=program.std, memory_mb=problem.memory_mb, cache=True, beside=beside, units=units,
            )  # fmt: skip
            if isinstance(built, Verdict):
                return Verdict(built.status, {**base, **built.details})
            argv = built
        interactor_argv: list[str] | None = None
        checker_argv: list[str] | None = None
        for kind, helper, directory, group in (
            ("interactor", problem.interactor, box.helper_dir, box.helper_group),
            ("checker", problem.checker_program, box.check_dir, box.helper_group),
        ):
            if helper is None:
                continue
            prepared = await self._prepare_helper(helper, box, deadline, directory, group)
            if isinstance(prepared, Verdict):
                why = prepared.details.get("output") or prepared.details.get("reason", "")
                return Verdict("SYSTEM_ERROR", {**base, "reason": f"the {kind} does not build: {why}"[:2000]})
            if kind == "interactor":
                interactor_argv = prepared
            else:
                checker_argv = prepared
        limits = run_limits(problem, language.processes)
        results: list[TestResult] = []
        stderr: dict[int, bytes] = {}
        for number, case in enumerate(problem.tests, 1):
            if not should_run(number, results, problem.scoring):
                if not problem.scoring.scored or finished(results, problem.scoring):
                    break
                continue
            left = deadline - time.monotonic()
            if left <= 0:
                used_up = f"submission time budget of {self.settings.budget:g}s used up before test {number}"
                results.append(result_of(number, "TIME_LIMIT", None, 0.0, used_up))
                break
            this = replace(limits, wall=min(limits.wall, left))
            given = await _read(case.input)
            if program.outputs is not None:
                result = await self._output_only(number, case, given, program.outputs, checker_argv, problem, box)
                err = b""
            elif interactor_argv is not None:
                result, err = await self._interact(number, case, given, argv, interactor_argv, checker_argv, this, box,
                                                   problem)  # fmt: skip
            else:
                result, err = await self._test(number, case, given, argv, checker_argv, problem, this, box)
            if "wall time over" in result.message and this.wall < limits.wall:
                used_up = f"submission time budget of {self.settings.budget:g}s used up"
                result = replace(result, verdict="TIME_LIMIT", message=used_up)
            results.append(result)
            if err:
                stderr[number] = err
            if result.verdict == "SYSTEM_ERROR":
                break  # the judging itself failed: no later test can be trusted to mean anything
        return verdict_details(results, problem, base, stderr)

    async def _prepare_helper(
        self, helper: Helper, box: _Box, deadline: float, directory: str, group: BoxGroup | None
    ) -> list[str] | Verdict:
        """Put a checker or interactor into its directory, ready to run, with the files its package
        ships beside it.

        A compiled one is built once per worker and build identity (its sources' digests): a testlib
        checker takes seconds to compile, which every submission of the problem would otherwise pay.
        The build's directory is kept (root's, 0700) and copied into each later submission's.
        """
        language = LANGUAGES[helper.language]
        await asyncio.to_thread(self._make_dir, directory, box.uid)
        kept = os.path.join(self.helpers_dir, f"{helper.sha256}-{helper.language}") if helper.sha256 else None
        source = await asyncio.to_thread(helper.path.read_text)
        if language.compile is not None and kept is not None and await asyncio.to_thread(os.path.isdir, kept):
            await asyncio.to_thread(self._restore_helper, kept, directory, box.uid)
            run_template = language.helper_run or language.run
            values = template_values(language, source, helper.std, HELPER_LIMITS.memory // (1024 * 1024))
            return expand(run_template, self._inside(directory), self.tools, values)
        beside = tuple([(name, await _read(path)) for name, path in helper.files])
        built = await self._build(
            language, source, directory, box, group, deadline, helper=True, std=helper.std, beside=beside,
            units=helper.units,
        )  # fmt: skip
        if not isinstance(built, Verdict) and language.compile is not None and kept is not None:
            await asyncio.to_thread(self._keep_helper, directory, kept)
            self.helper_builds += 1
        return built

    def _keep_helper(self, built: str, kept: str) -> None:
        keep_copy(built, kept)  # False: another submission kept the same helper first, as good
        entries = sorted(
            (os.path.join(self.helpers_dir, n) for n in os.listdir(self.helpers_dir)), key=os.path.getmtime
        )
        for old in entries[: max(0, len(entries) - MAX_KEPT_HELPERS)]:
            shutil.rmtree(old, ignore_errors=True)

    def _restore_helper(self, kept: str, directory: str, uid: int) -> None:
        shutil.copytree(kept, directory, symlinks=True, dirs_exist_ok=True)
        if self.isolation.mode == "full":
            for where, dirs, files in os.walk(directory):
                for name in dirs + files:
                    os.lchown(os.path.join(where, name), uid, uid)

    async def _test(
        self, number: int, case: Case, given: bytes, argv: list[str], checker_argv: list[str] | None,
        problem: Problem, limits: Limits, box: _Box,
    ) -> tuple[TestResult, bytes]:  # fmt: skip
        """Run one ordinary test and check its output."""
        ahead = number < len(problem.tests)
        facts = await box.tests.run(argv, stdin=given, limits=limits, ahead=ahead)
        forced = format_facts(facts, limits, problem.format)
        if forced is not None:
            return result_of(number, forced[0], facts, 0.0, forced[1]), facts.stderr
        said = await self._judge_output(case, given, facts.stdout, checker_argv, problem, box, ahead)
        return result_of(number, said.verdict, facts, said.score, said.message, said.points), facts.stderr

    async def _judge_output(
        self, case: Case, given: bytes, output: bytes, checker_argv: list[str] | None, problem: Problem, box: _Box,
        ahead: bool,
    ) -> CheckResult:  # fmt: skip
        """Check one output against the test: the built-in checker, or the package's checker program
        by its protocol."""
        answer = await _read(case.answer)
        if checker_argv is None:
            return check(problem.checker, output, answer, case.flags)
        assert problem.checker_program is not None
        if problem.checker_program.protocol == "kattis":
            return await self._validate(checker_argv, case, given, output, answer, problem, box)
        return await self._check(checker_argv, given, output, answer, box, ahead, problem.format == "polygon")

    async def _output_only(
        self, number: int, case: Case, given: bytes, outputs: dict[str, str], checker_argv: list[str] | None,
        problem: Problem, box: _Box,
    ) -> TestResult:  # fmt: skip
        """One test of an output-only problem: the output submitted for it, checked; none is a wrong answer."""
        output = outputs.get(case.name)
        if output is None:
            return result_of(number, "WRONG_ANSWER", None, 0.0, f"no output submitted for test {case.name}")
        data = output.encode()
        if len(data) > problem.output_kb * 1024:
            return result_of(number, "OUTPUT_LIMIT", None, 0.0, f"output over {problem.output_kb} KiB")
        ahead = number < len(problem.tests)
        said = await self._judge_output(case, given, data, checker_argv, problem, box, ahead)
        return result_of(number, said.verdict, None, said.score, said.message, said.points)

    async def _check(
        self, argv: list[str], given: bytes, output: bytes, answer: bytes, box: _Box, ahead: bool,
        absolute_points: bool = False,
    ) -> CheckResult:  # fmt: skip
        """Run the custom checker on one test (testlib arguments: input, output, answer); in one box
        for all of a submission's tests, like the tests (the files are rewritten before each run)."""

        def write() -> None:
            for name, data in (("input", given), ("output", output), ("answer", answer)):
                _write_bytes(os.path.join(box.check_dir, name), data)

        await asyncio.to_thread(write)
        inside = self._inside(box.check_dir)
        paths = [f"{inside}/input", f"{inside}/output", f"{inside}/answer"]
        facts = await box.checks.run([*argv, *paths], stdin=b"", limits=HELPER_LIMITS, ahead=ahead)
        return helper_outcome(facts, absolute_points=absolute_points)

    async def _validate(
        self, argv: list[str], case: Case, given: bytes, output: bytes, answer: bytes, problem: Problem, box: _Box
    ) -> CheckResult:
        """Run a Kattis output validator on one test: ``validator input answer feedback/ [flags] <
        output``, in its directory (writable: the feedback directory is in it), then read its feedback."""

        def write() -> None:
            for name, data in (("input", given), ("answer", answer)):
                _write_bytes(os.path.join(box.check_dir, name), data)
            self._fresh_feedback(box.check_dir, box.uid)

        await asyncio.to_thread(write)
        inside = self._inside(box.check_dir)
        command = [*argv, f"{inside}/input", f"{inside}/answer", f"{inside}/feedback/", *case.flags]
        facts = await run(
            command, box=box.check_dir, uid=box.uid, stdin=output, limits=HELPER_LIMITS, isolation=self.isolation,
            group=box.helper_group, writable_box=True,
        )  # fmt: skip
        feedback = await asyncio.to_thread(_read_feedback, os.path.join(box.check_dir, "feedback"))
        return kattis_helper_outcome(facts, feedback, score_allowed=problem.custom_score)

    def _fresh_feedback(self, directory: str, uid: int) -> None:
        """An empty feedback directory for a Kattis validator, owned by the box's uid."""
        path = os.path.join(directory, "feedback")
        shutil.rmtree(path, ignore_errors=True)
        os.mkdir(path, 0o700)
        if self.isolation.mode == "full":
            os.chown(path, uid, uid)

    async def _interact(
        self, number: int, case: Case, given: bytes, argv: list[str], interactor: list[str],
        checker: list[str] | None, limits: Limits, box: _Box, problem: Problem,
    ) -> tuple[TestResult, bytes]:  # fmt: skip
        """Run the submission and the interactor connected by two pipes; the verdict comes from the
        interactor by the format's rules (:func:`classify_interactive`) and, for a testlib
        interactor whose problem has a checker, from that checker judging what the interactor wrote.

        The worker keeps a read end of each pipe until both sides are gone, and drains the one whose
        reader has ended: a side that writes to a partner that already left is never killed by
        SIGPIPE (whether it was depended on how soon the box of the side that left was torn down)."""
        answer = await _read(case.answer)
        kattis = problem.interactor is not None and problem.interactor.protocol == "kattis"

        def write() -> None:
            for name, data in (("input", given), ("answer", answer)):
                _write_bytes(os.path.join(box.helper_dir, name), data)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(box.helper_dir, "output"))
            if kattis:
                self._fresh_feedback(box.helper_dir, box.uid)

        await asyncio.to_thread(write)
        inside = self._inside(box.helper_dir)
        if kattis:
            interactor_argv = [*interactor, f"{inside}/input", f"{inside}/answer", f"{inside}/feedback/", *case.flags]
        else:
            interactor_argv = [*interactor, f"{inside}/input", f"{inside}/output", f"{inside}/answer"]
        loop = asyncio.get_running_loop()
        fds: list[int] = []
        drains: list[_Drain] = []
        try:
            to_sub_r, to_sub_w = os.pipe2(os.O_CLOEXEC)
            fds += [to_sub_r, to_sub_w]
            to_int_r, to_int_w = os.pipe2(os.O_CLOEXEC)
            fds += [to_int_r, to_int_w]
            drains = [_Drain(loop, os.dup(to_sub_r)), _Drain(loop, os.dup(to_int_r))]
            helper_limits = replace(HELPER_LIMITS, wall=limits.wall + INTERACTOR_GRACE)
            # Each run owns (and closes) the two ends it is given, so either side sees EOF once the other
            # is gone; a task group cancels (and so kills) one side if the other fails to start.
            fds = []
            async with asyncio.TaskGroup() as both:
                boxed = functools.partial(run, uid=box.uid, stdin=b"", isolation=self.isolation)
                sub_run = both.create_task(
                    boxed(argv, box=box.dir, limits=limits, group=box.group, stdin_fd=to_sub_r, stdout_fd=to_int_w)
                )
                inter_run = both.create_task(
                    boxed(interactor_argv, box=box.helper_dir, limits=helper_limits, group=box.helper_group,
                          writable_box=True, stdin_fd=to_int_r, stdout_fd=to_sub_w)
                )  # fmt: skip
                sub_run.add_done_callback(lambda _: drains[0].start())
                inter_run.add_done_callback(lambda _: drains[1].start())
        finally:
            for fd in fds:
                os.close(fd)
            for drain in drains:
                drain.close()
        sub, inter = sub_run.result(), inter_run.result()
        if kattis:
            feedback = await asyncio.to_thread(_read_feedback, os.path.join(box.helper_dir, "feedback"))
            said = kattis_helper_outcome(inter, feedback, score_allowed=problem.custom_score)
        else:
            said = helper_outcome(inter)
        verdict, score, message = classify_interactive(sub, limits, inter, said, problem.format)
        points = said.points if verdict == "ACCEPTED" else None
        if verdict == "ACCEPTED" and checker is not None and not kattis:
            # Polygon: the interactor's output file is what the checker judges.
            written = await asyncio.to_thread(_read_bounded, os.path.join(box.helper_dir, "output"))
            checked = await self._check(checker, given, written, answer, box, number < len(problem.tests),
                                        problem.format == "polygon")  # fmt: skip
            verdict, score, message, points = checked.verdict, checked.score, checked.message, checked.points
        return result_of(number, verdict, sub, score, message, points), sub.stderr

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()
