"""A program judge payload validated into a :class:`Program` (pure): the submission (a language and a
source with further files, or output-only outputs) and either its own tests, limits, checker and
scoring or a reference to a stored problem package."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from .checkers import CheckerSpec, InvalidChecker, parse_spec
from .languages import LANGUAGES, UNAVAILABLE, Language, expand, parse_standard, template_values
from .scoring import InvalidScoring, Scoring, parse_scoring

MAX_TIME = 30.0
MAX_MEMORY_MB = 2048
MAX_OUTPUT_KB = 64 * 1024
#: A submission of several files: at most this many besides its main source, this much in all.
MAX_FILES = 64
MAX_FILES_BYTES = 4 * 1024 * 1024
_FILE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]{0,63}")


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
