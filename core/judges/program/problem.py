"""What a submission is judged against (:class:`Problem`), from a payload's own tests or from a
stored package's manifest (pure but for the paths of the package's files), and the limits its runs
get."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..sandbox import Limits
from .checkers import CheckerSpec, InvalidChecker, parse_spec
from .formats import FORMATS, KINDS
from .languages import LANGUAGES, parse_standard
from .payload import InvalidProgramPayload, Program, parse_limits
from .scoring import InvalidScoring, Scoring, parse_scoring

#: A custom checker's or interactor's own limits (it is the problem setter's code, but still boxed).
HELPER_LIMITS = Limits(
    cpu=10, wall=20, memory=512 * 1024 * 1024, output=64 * 1024, file_size=64 * 1024 * 1024, processes=16,
    open_files=64, stack=256 * 1024 * 1024, scratch=64 * 1024 * 1024, stderr=16 * 1024,
)  # fmt: skip


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


def inline_problem(program: Program) -> Problem:
    """The problem of a payload that carries its own tests (pure); with outputs, an output-only one."""
    cases = tuple(Case(str(i + 1), given.encode(), want.encode()) for i, (given, want) in enumerate(program.tests))
    kind = "output-only" if program.outputs is not None else "batch"
    return Problem(
        cases, program.time, program.memory_mb, program.output_kb, program.checker, program.scoring, kind=kind
    )


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
    return helper_of(manifest.get(name), name, path_of, where)


def helper_of(spec: Any, name: str, path_of: Callable[[str], Path], where: str) -> Helper | None:
    """The program a manifest entry ``spec`` describes (a checker, an interactor, an input
    validator: ``name`` in messages), or None when it is no program (pure but for ``path_of``)."""
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
