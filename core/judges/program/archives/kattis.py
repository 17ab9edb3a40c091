"""ICPC/Kattis problem packages, as problemtools reads them (the legacy format and 2023-07-draft).

What is read, and how it maps onto a stored manifest:

- ``problem.yaml``: ``problem_format_version`` (absent: legacy), ``type`` (``pass-fail``,
  ``scoring``, ``interactive``, ``submit-answer``; ``multi-pass`` is refused), legacy ``validation``
  (``default`` or ``custom`` with ``interactive`` and/or ``score``) and ``validator_flags``, legacy
  ``grading`` (``accept_score``, ``reject_score``, ``on_reject``), ``limits`` (``memory`` and
  ``output`` in MiB, 2023-07's ``time_limit`` in seconds).
- the time limit: ``limits.time_limit``, else a ``.timelimit`` file (DOMjudge's), else the
  uploader's ``--time-limit``, else 1 second (Kattis itself derives a legacy package's limit from
  its accepted submissions, which an upload does not run; the manifest says which it was).
- ``data/``: every directory is a test data group, walked as problemtools does (entries sorted by
  name, a test is ``NAME.in`` with ``NAME.ans``), each with its ``testdata.yaml`` merged over its
  parent's (``on_reject``, ``accept_score``, ``reject_score``, ``grader_flags``,
  ``output_validator_flags``, ``input_validator_flags``: a test's ``input_flags``); the tree
  becomes the manifest's ``scoring.kattis``.
- the output validator: ``output_validators/`` (legacy; exactly one program) or
  ``output_validator/`` (2023-07); a program is a single source file or a directory whose files
  are all built together. Without one, the default validator (a built-in checker) with the flags.
  An interactive problem's validator is its interactor.
- the input validators: every program in ``input_validators/`` (or the older
  ``input_format_validators/``), a single source file or a directory, stored as the manifest's
  ``validators`` and built at upload like the output validator (one that does not build refuses
  the package). A checktestdata or VIVA specification is no program this judge runs: not stored,
  and the upload's notes say so.
- ``submissions/<verdict>/``: recorded as solutions with the verdict their directory names.
- the time multipliers ``judgequeue problem verify`` uses (legacy ``limits.time_multiplier`` and
  ``time_safety_margin``; 2023-07 ``limits.time_multipliers`` and ``time_resolution``): the
  manifest's ``timing``, only when they are not the format's defaults.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ..checkers import InvalidChecker, kattis_flags
from .bounds import ArchiveBounds
from .common import (
    MAX_TESTS,
    Files,
    InvalidPackage,
    PackageDir,
    Timing,
    add,
    check_id,
    default_timing,
    program,
    read_yaml,
    total_bytes,
)

#: problemtools' languages (its config/languages.yaml) as rows of the judge's table: the row, the
#: file suffixes that are the language's sources, the priority that settles a directory whose files
#: fit several, and the standard problemtools compiles C and C++ with (None: the row's default).
#: Python 3 is CPython here (problemtools runs PyPy; a contest may offer ``pypy``); ``.pl`` is
#: Prolog, as on Kattis; C# and Python 2 are refused with the reason (languages.UNAVAILABLE);
#: Kattis languages that are no row of the table (Objective-C, F#, COBOL) are not recognised, and
#: Haskell's C files (problemtools links them with its sources) are not Haskell's here.
KATTIS_LANGUAGES: dict[str, tuple[str, tuple[str, ...], int, str | None]] = {
    "c": ("c", (".c",), 950, "gnu17"),
    "cpp": ("cpp", (".cc", ".C", ".cpp", ".cxx", ".c++"), 1000, "gnu++23"),
    "csharp": ("csharp", (".cs",), 700, None),
    "go": ("go", (".go",), 400, None),
    "haskell": ("haskell", (".hs",), 600, None),
    "java": ("java", (".java",), 800, None),
    "javascript": ("javascript", (".js",), 500, None),
    "kotlin": ("kotlin", (".kt",), 250, None),
    "lisp": ("lisp", (".lisp", ".cl"), 200, None),
    "ocaml": ("ocaml", (".ml",), 375, None),
    "pascal": ("pascal", (".pas",), 350, None),
    "php": ("php", (".php",), 450, None),
    "prolog": ("prolog", (".pl",), 100, None),
    "python2": ("python2", (".py2",), 860, None),
    "python3": ("python", (".py", ".py3"), 850, None),
    "ruby": ("ruby", (".rb",), 650, None),
    "rust": ("rust", (".rs",), 575, None),
    "scala": ("scala", (".scala", ".sc"), 550, None),
}
LEGACY = "legacy"
V2023 = ("2023-07-draft", "2023-07")
DEFAULT_MEMORY_MB = 1024  # problemtools' defaults (its config/problem.yaml)
DEFAULT_OUTPUT_MB = 8
DEFAULT_TIME = 1.0
#: Expected verdicts of problemtools' submission directories.
EXPECTED: dict[str, list[str]] = {
    "accepted": ["ACCEPTED"],
    "partially_accepted": ["ACCEPTED"],
    "wrong_answer": ["WRONG_ANSWER"],
    "run_time_error": ["RUNTIME_ERROR"],
    "time_limit_exceeded": ["TIME_LIMIT"],
}
_GROUP_KEYS = (
    "on_reject", "accept_score", "reject_score", "grader_flags", "output_validator_flags", "input_validator_flags",
)  # fmt: skip
_DEFAULTS: dict[str, Any] = {
    "on_reject": "break", "accept_score": 1.0, "reject_score": 0.0, "grader_flags": "", "output_validator_flags": "",
}  # fmt: skip


def is_kattis(root: Path) -> bool:
    """An ICPC/Kattis package: ``problem.yaml`` and a ``data`` directory."""
    return (root / "problem.yaml").is_file() and (root / "data").is_dir()


def _number(value: Any, where: str) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise InvalidPackage(f"{where} must be a number, got {value!r}") from None
    if not math.isfinite(number):
        raise InvalidPackage(f"{where} must be a finite number, got {value!r}")
    return number


_PYTHON2 = re.compile(rb"^#!.*python2\b")


def _python2(path: Path) -> bool:
    """A ``.py`` file problemtools counts as Python 2: its first line a ``python2`` shebang."""
    try:
        with path.open("rb") as f:
            return _PYTHON2.search(f.readline()) is not None
    except OSError:
        return False


def language_of(paths: list[Path]) -> tuple[str, str | None, list[Path]] | None:
    """The language problemtools detects for a program's files: the one most of them are sources
    of, the higher priority on a tie (a ``.py`` file is Python 2's only with a ``python2`` shebang).
    Its row of the judge's table, the standard it is compiled with, and its sources (sorted); None
    when no file is a source of any language."""
    best: tuple[int, int] | None = None
    found = None
    for row, suffixes, priority, std in KATTIS_LANGUAGES.values():
        sources = sorted(p for p in paths if p.suffix in suffixes or (row == "python2" and p.suffix == ".py"))
        evidence = [p for p in sources if row != "python2" or p.suffix != ".py" or _python2(p)]
        if evidence and (best is None or (len(evidence), priority) > best):
            best, found = (len(evidence), priority), (row, std, sources)
    return found


def _program_at(path: Path, where: str, files: Files, protocol: str | None) -> dict[str, Any]:
    """A program as problemtools finds one: a single source file, or a directory built as a whole
    (its main file one named ``main.*``, else the first source by name)."""
    if path.is_file():
        paths = [path]
    else:
        paths = sorted(p for p in path.iterdir() if p.is_file() and not p.name.startswith("."))
    detected = language_of(paths)
    if detected is None:
        what = path.name if path.is_file() else f"{path.name}/"
        raise InvalidPackage(f"{where}: {what} holds no source in a language this judge runs")
    language, std, sources = detected
    if path.is_file():
        return program(path, language, files, protocol=protocol, std=std, where=where)
    main = next((p for p in sources if p.stem.lower() == "main"), sources[0])
    entry = program(main, language, files, beside=paths, protocol=protocol, std=std, where=where)
    units = [p.name for p in sources if p != main and language in ("c", "cpp")]
    if units:
        entry["units"] = units  # further translation units problemtools compiles with the main one
    return entry


def _validator(root: Path, version: str, files: Files) -> dict[str, Any] | None:
    folder = root / ("output_validators" if version == LEGACY else "output_validator")
    if not folder.is_dir():
        return None
    if version != LEGACY and language_of([p for p in folder.iterdir() if p.is_file()]) is not None:
        return _program_at(folder, "output_validator", files, "kattis")
    found = sorted(p for p in folder.iterdir() if not p.name.startswith("."))
    if len(found) != 1:
        raise InvalidPackage(f"{folder.name}/ must hold exactly one validator program, found {len(found)}")
    return _program_at(found[0], folder.name, files, "kattis")


#: Where a Kattis package keeps its input validators (problemtools reads the older name too).
INPUT_VALIDATORS = ("input_validators", "input_format_validators")


def _input_validators(root: Path, files: Files, notes: list[str]) -> list[dict[str, Any]]:
    """Every input validator program of the package, by name; what no language of the judge runs
    (checktestdata, VIVA) is left out with a note."""
    out: list[dict[str, Any]] = []
    for folder in (root / name for name in INPUT_VALIDATORS):
        if not folder.is_dir():
            continue
        for entry in sorted(p for p in folder.iterdir() if not p.name.startswith(".")):
            name = f"{folder.name}/{entry.name}" + ("/" if entry.is_dir() else "")
            paths = [entry] if entry.is_file() else [p for p in entry.iterdir() if p.is_file()]
            if language_of(paths) is None:
                notes.append(f"{name}: no program in a language this judge runs (checktestdata, VIVA?): not stored")
                continue
            validator = _program_at(entry, name.rstrip("/"), files, None)
            validator["name"] = name.rstrip("/")
            out.append(validator)
    return out


def _group(
    data: Path, folder: Path, inherited: dict[str, Any], tests: list[dict[str, Any]], files: Files
) -> dict[str, Any]:
    """One test data group and everything under it, as problemtools' ``_load_group`` walks it."""
    config = (
        {k: v for k, v in read_yaml(folder / "testdata.yaml", empty_ok=True).items() if k in _GROUP_KEYS}
        if (folder / "testdata.yaml").is_file()
        else {}
    )
    for key, value in inherited.items():
        config.setdefault(key, value)
    where = f"{folder.relative_to(data.parent)}/testdata.yaml"
    if config["on_reject"] not in ("break", "continue"):
        raise InvalidPackage(f"{where}: on_reject must be break or continue, got {config['on_reject']!r}")
    flags = str(config.get("output_validator_flags") or "").split()
    input_flags = str(config.get("input_validator_flags") or "").split()
    items: list[Any] = []
    for entry in sorted(folder.iterdir()):
        if entry.is_dir():
            items.append(_group(data, entry, config, tests, files))
        elif entry.suffix == ".ans" and entry.with_suffix(".in").is_file():
            if len(tests) >= MAX_TESTS:
                raise InvalidPackage(f"more than {MAX_TESTS} tests")
            test: dict[str, Any] = {
                "name": str(entry.with_suffix("").relative_to(data)),
                "input": add(entry.with_suffix(".in"), files),
                "answer": add(entry, files),
            }
            if flags:
                test["flags"] = flags
            if input_flags:
                test["input_flags"] = input_flags  # for the input validators (judgequeue problem verify)
            tests.append(test)
            items.append(len(tests))
    return {
        "name": str(folder.relative_to(data)) if folder != data else "",
        "items": items,
        "on_reject": config["on_reject"],
        "accept_score": _number(config["accept_score"], f"{where}: accept_score"),
        "reject_score": _number(config["reject_score"], f"{where}: reject_score"),
        "grader_flags": str(config.get("grader_flags") or "").split(),
    }


def _submissions(root: Path, files: Files) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    folder = root / "submissions"
    if not folder.is_dir():
        return out
    for kind in sorted(p for p in folder.iterdir() if p.is_dir()):
        for entry in sorted(kind.iterdir()):
            if entry.name.startswith("."):
                continue
            try:
                solution = _program_at(entry, f"submissions/{kind.name}/{entry.name}", files, None)
            except InvalidPackage:
                continue  # a language this judge does not run: not recorded
            solution["name"] = f"{kind.name}/{entry.name}"
            if kind.name in EXPECTED:
                solution["expected"] = EXPECTED[kind.name]
            out.append(solution)
    return out


def read(
    root: Path,
    *,
    problem_id: str | None = None,
    time_limit: float | None = None,
    bounds: ArchiveBounds | None = None,
) -> PackageDir:
    """Validate an ICPC/Kattis package directory (reads and hashes its files)."""
    spec = read_yaml(root / "problem.yaml", empty_ok=True)
    version = str(spec.get("problem_format_version", LEGACY))
    if version != LEGACY and version not in V2023:
        raise InvalidPackage(f"problem.yaml: problem_format_version {version!r} is not legacy or 2023-07-draft")
    notes: list[str] = []
    pid = check_id(problem_id or root.resolve().name, "the problem id (the directory name, or --id)")
    raw_type = spec.get("type", "pass-fail")
    types = set(raw_type if isinstance(raw_type, list) else str(raw_type).split())
    validation = str(spec.get("validation", "default")).split() if version == LEGACY else []
    if validation and validation[0] == "custom":
        types |= {"interactive"} & set(validation[1:])
    custom_score = ("score" in validation[1:]) if version == LEGACY else "scoring" in types
    if "multi-pass" in types:
        raise InvalidPackage("problem.yaml: type multi-pass is not supported by this judge")
    unknown = types - {"pass-fail", "scoring", "interactive", "submit-answer"}
    if unknown:
        raise InvalidPackage(f"problem.yaml: unknown type {sorted(unknown)[0]!r}")
    limits = spec.get("limits") or {}
    if not isinstance(limits, dict):
        raise InvalidPackage("problem.yaml: limits must be a mapping")
    seconds, source = _time_limit(root, limits, time_limit, notes)
    memory = int(_number(limits.get("memory", DEFAULT_MEMORY_MB), "problem.yaml: limits.memory"))
    output = int(_number(limits.get("output", DEFAULT_OUTPUT_MB), "problem.yaml: limits.output"))
    files = Files(root, bounds)
    tests: list[dict[str, Any]] = []
    tree = _group(root / "data", root / "data", _grading_defaults(spec.get("grading") or {}), tests, files)
    if not tests:
        raise InvalidPackage("data/ has no tests (NAME.in with NAME.ans beside it)")
    flags = str(spec.get("validator_flags") or "").split() if version == LEGACY else []
    if flags:  # every test gets the problem's flags first, then its group's (as problemtools passes them)
        for test in tests:
            test["flags"] = [*flags, *test.get("flags", [])]
    validator = _validator(root, version, files)
    manifest: dict[str, Any] = {
        "format": "kattis",
        "format_version": version,
        "limits": {"time": seconds, "memory_mb": memory, "output_kb": output * 1024},
        "time_limit_source": source,
        "tests": tests,
        "scoring": {"kattis": tree, "scored": "scoring" in types, "custom_score": custom_score},
    }
    custom = validation[:1] == ["custom"] if version == LEGACY else validator is not None
    _add_validation(manifest, types, custom, validator)
    validators = _input_validators(root, files, notes)
    if validators:
        manifest["validators"] = validators
    solutions = _submissions(root, files)
    if solutions:
        manifest["solutions"] = solutions
    timing = _timing(limits, version)
    if timing != default_timing(manifest):  # stored only when the package gives its own
        manifest["timing"] = asdict(timing)
    return PackageDir(pid, None, total_bytes(manifest, files), files, notes)


def _timing(limits: dict[str, Any], version: str) -> Timing:
    """The package's time multipliers as problemtools reads them: legacy ``limits.time_multiplier``
    (5) and ``time_safety_margin`` (2); 2023-07 ``limits.time_multipliers`` (``ac_to_time_limit``
    2, ``time_limit_to_tle`` 1.5) and ``time_resolution`` (1 s)."""
    if version == LEGACY:
        given = {"ac_to_time_limit": limits.get("time_multiplier", 5.0),
                 "time_limit_to_tle": limits.get("time_safety_margin", 2.0)}  # fmt: skip
        names = {"ac_to_time_limit": "limits.time_multiplier", "time_limit_to_tle": "limits.time_safety_margin"}
        resolution = 1.0
    else:
        multipliers = limits.get("time_multipliers") or {}
        if not isinstance(multipliers, dict):
            raise InvalidPackage("problem.yaml: limits.time_multipliers must be a mapping")
        given = {"ac_to_time_limit": multipliers.get("ac_to_time_limit", 2.0),
                 "time_limit_to_tle": multipliers.get("time_limit_to_tle", 1.5)}  # fmt: skip
        names = {k: f"limits.time_multipliers.{k}" for k in given}
        resolution = _number(limits.get("time_resolution", 1.0), "problem.yaml: limits.time_resolution")
        if resolution <= 0:
            raise InvalidPackage(f"problem.yaml: limits.time_resolution must be positive, got {resolution:g}")
    values = {k: _number(v, f"problem.yaml: {names[k]}") for k, v in given.items()}
    for key, value in values.items():
        if value < 1:
            raise InvalidPackage(f"problem.yaml: {names[key]} must be at least 1, got {value:g}")
    return Timing(values["ac_to_time_limit"], values["time_limit_to_tle"], resolution)


def _time_limit(root: Path, limits: dict[str, Any], given: float | None, notes: list[str]) -> tuple[float, str]:
    """The time limit and where it came from: ``limits.time_limit``, a ``.timelimit`` file, the
    uploader's ``--time-limit``, or the default (with a note saying so)."""
    if "time_limit" in limits:
        return _number(limits["time_limit"], "problem.yaml: limits.time_limit"), "limits.time_limit"
    if (root / ".timelimit").is_file():
        return _number((root / ".timelimit").read_text().strip(), ".timelimit"), ".timelimit"
    if given is not None:
        return given, "--time-limit"
    notes.append(f"no time limit in the package: {DEFAULT_TIME:g} s (give --time-limit, or .timelimit)")
    return DEFAULT_TIME, "default"


def _grading_defaults(grading: Any) -> dict[str, Any]:
    """What every test data group inherits unless it says otherwise: problemtools' defaults, with
    ``problem.yaml``'s ``grading`` scores and ``on_reject``."""
    inherited = dict(_DEFAULTS)
    if isinstance(grading, dict):
        for key in ("accept_score", "reject_score"):
            if grading.get(key) is not None:
                inherited[key] = grading[key]
        if grading.get("on_reject") in ("first_error", "grade"):
            inherited["on_reject"] = "break" if grading["on_reject"] == "first_error" else "continue"
    return inherited


def _add_validation(
    manifest: dict[str, Any], types: set[str], custom: bool, validator: dict[str, Any] | None
) -> None:
    """How the package's outputs are judged, into its manifest: its output validator as the
    interactor (interactive), as a custom checker, or the default validator with each test's flags
    checked now; and the problem's kind."""
    tests: list[dict[str, Any]] = manifest["tests"]
    if "interactive" in types:
        if validator is None:
            raise InvalidPackage("an interactive problem needs its output validator (the interactor)")
        manifest["interactor"] = validator
        manifest["type"] = "interactive"
    elif custom:
        if validator is None:
            raise InvalidPackage("validation: custom needs a program in output_validators/")
        manifest["checker"] = {"type": "custom", **validator}
    else:
        try:
            for test in tests:
                kattis_flags(test.get("flags", []))
        except InvalidChecker as exc:
            raise InvalidPackage(f"default validator: {exc}") from None
        manifest["checker"] = {"type": "kattis"}
    manifest.setdefault("type", "output-only" if "submit-answer" in types else "batch")
