"""Polygon packages (Codeforces' problem preparation system), read from ``problem.xml``.

What is read, and how it maps onto a stored manifest:

- the ``tests`` testset: time limit (ms), memory limit (bytes), the tests by the input and answer
  path patterns (``tests/%02d``, ``tests/%02d.a``), each test's ``points`` and ``group``; a
  generated test (``cmd``) whose input is not in the package, and an answer that is not, are left
  to be made (:class:`~.common.Generation`, from ``<files><executables>`` and the ``main``
  solution; :mod:`..generation` makes them at upload);
- ``<groups>``: ``points-policy`` ``complete-group`` (the group's ``points``, or the sum of its
  tests' points, only when every test passes) or ``each-test`` (the points of each test that
  passes), and ``<dependencies>`` (a group earns nothing unless those passed entirely). Tests with
  points but no groups are one ``each-test`` group; neither makes the problem unscored (first
  failure decides, as in ICPC rounds);
- ``<assets><checker>`` and ``<interactor>``: testlib programs, built with every file of their
  directory beside them (``files/testlib.h`` and the like); an interactive problem's checker
  judges what the interactor wrote to its output file;
- ``<assets><validators>``: the input validators (testlib's ``registerValidation``), built at
  upload like the checker (one that does not build refuses the package), stored as the manifest's
  ``validators``;
- ``<assets><solutions>``: each solution with the verdicts its tag expects (``main``,
  ``accepted``, ``wrong-answer``, ``time-limit-exceeded``, ``rejected``...).

A solution's ``.desc`` file (``File name:``, ``Tag:``, as Polygon writes one beside each
solution) is read, never stored: it must agree with ``problem.xml``, which is what is judged.

testlib's ``quitp`` points count as the test's points in a Polygon package (Codeforces' rule):
they replace the points the test would earn.
"""

from __future__ import annotations

import math
import re
import shlex
import xml.etree.ElementTree as ET  # the uploader's own file; expat refuses external entities
from pathlib import Path
from typing import Any

from ..languages import LANGUAGES
from .bounds import ArchiveBounds
from .common import (
    MAX_TESTS,
    Files,
    Generation,
    InvalidPackage,
    Made,
    PackageDir,
    add,
    check_id,
    inside,
    program,
    siblings,
    total_bytes,
)  # fmt: skip

FAILURES = ["WRONG_ANSWER", "PRESENTATION_ERROR", "TIME_LIMIT", "MEMORY_LIMIT", "RUNTIME_ERROR", "IDLENESS_LIMIT",
            "OUTPUT_LIMIT"]  # fmt: skip
#: The verdicts each solution tag expects.
TAGS: dict[str, list[str]] = {
    "main": ["ACCEPTED"],
    "accepted": ["ACCEPTED"],
    "wrong-answer": ["WRONG_ANSWER"],
    "presentation-error": ["PRESENTATION_ERROR"],
    "time-limit-exceeded": ["TIME_LIMIT", "IDLENESS_LIMIT"],
    "time-limit-exceeded-or-accepted": ["TIME_LIMIT", "IDLENESS_LIMIT", "ACCEPTED"],
    "time-limit-exceeded-or-memory-limit-exceeded": ["TIME_LIMIT", "IDLENESS_LIMIT", "MEMORY_LIMIT"],
    "memory-limit-exceeded": ["MEMORY_LIMIT"],
    "failed": ["RUNTIME_ERROR"],
    "rejected": FAILURES,
}


def is_polygon(root: Path) -> bool:
    return (root / "problem.xml").is_file()


#: Polygon source types as rows of the judge's table, by prefix (the first that fits): Codeforces'
#: compilers, each the row that runs its language. PyPy types are the ``pypy`` row; Java's 8, 11
#: and 21 are the JDK here; Delphi, PascalABC.NET and D are no row of the table (not recognised);
#: C#'s and Python 2's types are refused with the reason (languages.UNAVAILABLE).
POLYGON_TYPES: tuple[tuple[str, str], ...] = (
    ("c.", "c"), ("cpp.", "cpp"), ("javascript", "javascript"), ("js.", "javascript"), ("java", "java"),
    ("kotlin", "kotlin"), ("scala", "scala"), ("python.pypy2", "python2"), ("python.2", "python2"),
    ("python.pypy3", "pypy"), ("python.3", "python"), ("go", "go"), ("rust", "rust"), ("ruby", "ruby"),
    ("php", "php"), ("perl", "perl"), ("haskell", "haskell"), ("ocaml", "ocaml"), ("pas.fpc", "pascal"),
    ("csharp", "csharp"),
)  # fmt: skip
_CPP_VERSION = re.compile(r"\+\+(\d\d)(?!\d)")


def language_of(kind: str | None) -> tuple[str, str | None] | None:
    """The judge's row and standard for a Polygon source type (pure), or None when no row runs it.

    A C++ type's standard is the one it names (``cpp.g++17``, ``cpp.gcc13-64-winlibs-g++20``,
    ``cpp.gcc14-64-msys2-g++23``) in the GNU dialect, the table's; one that names none
    (``cpp.g++``, ``cpp.ms2017``) is the row's default. C types are Codeforces' GNU C11."""
    kind = kind or ""
    language = next((row for prefix, row in POLYGON_TYPES if kind.startswith(prefix)), None)
    if language == "cpp":
        version = _CPP_VERSION.search(kind)
        std = f"gnu++{version.group(1)}" if version else None
        return language, std if std in LANGUAGES["cpp"].standards else None
    if language == "c":
        return language, "gnu11"
    return (language, None) if language is not None else None


def _source(
    root: Path, element: ET.Element | None, where: str, files: Files, *, helper: bool = True
) -> dict[str, Any]:
    """A program of the package: a checker or interactor (``helper``: built with every file of its
    directory, speaking testlib) or a solution (its source alone: the ``.desc`` files and the other
    solutions beside it are no part of it)."""
    source = element.find("source") if element is not None else None
    if source is None or not source.get("path"):
        raise InvalidPackage(f"problem.xml: {where} has no <source path=...>")
    main = inside(root, str(source.get("path")), f"problem.xml: {where} source")
    found = language_of(source.get("type"))
    if found is None:
        raise InvalidPackage(f"problem.xml: {where} is {source.get('type')!r}, a language this judge does not run")
    language, std = found
    if not helper:
        return program(main, language, files, std=std, where=where)
    return program(main, language, files, beside=siblings(main), protocol="testlib", std=std, where=where)


#: A test path pattern as Polygon writes them: one ``%d`` conversion (``%02d``), ``%%`` for a percent sign.
_PATTERN = re.compile(r"(?:[^%]|%%)*%[-0]?[0-9]{0,2}d(?:[^%]|%%)*")


def path_pattern(text: str, which: str) -> str:
    """A testset's ``input-path-pattern`` or ``answer-path-pattern``, refused unless it numbers
    files inside the package (pure): one ``%d``, a relative path, no ``..``."""
    if _PATTERN.fullmatch(text) is None:
        raise InvalidPackage(
            f"problem.xml: {which} {text!r} must number the tests with one %d (as tests/%02d does), and hold no "
            "other % but %%"
        )
    parts = (text % 1).replace("\\", "/").split("/")
    if text.startswith(("/", "\\")) or ".." in parts or re.match(r"[A-Za-z]:", text):
        raise InvalidPackage(
            f"problem.xml: {which} {text!r} leaves the package: a path pattern names files inside it (no '..', "
            "not absolute)"
        )
    return text


def _int(text: str | None, where: str) -> int:
    try:
        return int(str(text).strip())
    except ValueError:
        raise InvalidPackage(f"problem.xml: {where} must be an integer, got {text!r}") from None


def _points(value: str | None, where: str) -> float | None:
    if value is None:
        return None
    try:
        points = float(value)
    except ValueError:
        raise InvalidPackage(f"problem.xml: {where} must be a number, got {value!r}") from None
    if not math.isfinite(points) or points < 0:
        raise InvalidPackage(f"problem.xml: {where} must be a number of points, got {value!r}")
    return points


def _scoring(testset: ET.Element, tests: list[ET.Element]) -> dict[str, Any]:
    points = [_points(t.get("points"), f"test {i + 1} points") for i, t in enumerate(tests)]
    groups_el = testset.find("groups")
    if groups_el is None or not list(groups_el):
        if all(p is None for p in points):
            return {}
        values = [p or 0.0 for p in points]
        group = {"name": "tests", "points": sum(values), "tests": list(range(1, len(tests) + 1)), "each_test": True}
        return {"groups": [group], "test_points": values}
    members: dict[str, list[int]] = {}
    for i, t in enumerate(tests):
        name = t.get("group")
        if name is None:
            raise InvalidPackage(f"problem.xml: test {i + 1} is in no group, but the testset has groups")
        members.setdefault(name, []).append(i + 1)
    values = [p or 0.0 for p in points]
    groups = []
    for g in groups_el.findall("group"):
        name = g.get("name")
        if name is None or name not in members:
            raise InvalidPackage(f"problem.xml: group {name!r} has no tests")
        policy = g.get("points-policy", "complete-group")
        if policy not in ("complete-group", "each-test"):
            raise InvalidPackage(f"problem.xml: group {name!r} has points-policy {policy!r}")
        own = _points(g.get("points"), f"group {name} points")
        total = own if own is not None else sum(values[t - 1] for t in members[name])
        depends = [d.get("group") for d in g.findall("dependencies/dependency") if d.get("group")]
        entry: dict[str, Any] = {"name": name, "points": total, "tests": members[name]}
        if policy == "each-test":
            entry["each_test"] = True
        if depends:
            entry["depends"] = depends
        groups.append(entry)
    missing = sorted(set(members) - {g["name"] for g in groups})
    if missing:
        raise InvalidPackage(f"problem.xml: tests name group {missing[0]!r}, which <groups> does not declare")
    return {"groups": groups, "test_points": values}


#: How much of a solution's .desc file is read: a few lines, in any package Polygon wrote.
MAX_DESC_BYTES = 64 * 1024


def check_desc(root: Path, path: str, tag: str) -> None:
    """Refuse a solution whose ``.desc`` file (when it has one) names another file or another tag
    than ``problem.xml`` gives it: one of the two is wrong, and the upload cannot tell which."""
    desc = root / f"{path}.desc"
    if not desc.is_file():
        return
    where = f"{path}.desc"
    with inside(root, where, "problem.xml: a solution's description").open("rb") as f:
        text = f.read(MAX_DESC_BYTES).decode("utf-8", "replace")
    fields = dict(line.partition(":")[::2] for line in text.splitlines() if ":" in line)
    given = {k.strip().lower(): v.strip() for k, v in fields.items()}
    named = given.get("file name")
    if named is not None and named != Path(path).name:
        raise InvalidPackage(f"{where} describes {named!r}, not {Path(path).name!r}: the package is inconsistent")
    said = given.get("tag")
    if said is not None and said.lower().replace("_", "-") != tag:
        raise InvalidPackage(
            f"{where} tags the solution {said!r} but problem.xml tags it {tag!r}: the package is inconsistent"
        )


def read(
    root: Path, *, problem_id: str | None = None, bounds: ArchiveBounds | None = None
) -> PackageDir:
    """Validate a Polygon package directory (reads and hashes its files)."""
    try:
        doc = ET.parse(root / "problem.xml").getroot()
    except (OSError, ET.ParseError) as exc:
        raise InvalidPackage(f"problem.xml cannot be read: {exc}") from None
    pid = check_id(problem_id or doc.get("short-name"), "the problem id (problem.xml's short-name, or --id)")
    revision = doc.get("revision")
    judging = doc.find("judging")
    testset = judging.find("testset[@name='tests']") if judging is not None else None
    if judging is None or testset is None:
        raise InvalidPackage("problem.xml: no <judging><testset name='tests'>")
    for attribute in ("input-file", "output-file"):
        if judging.get(attribute):
            raise InvalidPackage(
                f"problem.xml: {attribute} is {judging.get(attribute)!r}: only standard input and output are supported"
            )
    files = Files(root, bounds)
    manifest, made = _testset(root, testset, files)
    _assets(root, doc.find("assets"), manifest, files)
    generation = _generation(root, doc, made, manifest, files) if made else None
    version = int(revision) if revision and revision.isdigit() and int(revision) > 0 else None
    return PackageDir(pid, version, total_bytes(manifest, files), files, generation=generation)


def command(cmd: str, test: int) -> tuple[str, tuple[str, ...]]:
    """A generator command as problem.xml or a Polygon script line gives it (pure): the executable
    it names and its arguments. A script line's target (``gen 1 2 > 5``, ``> $``, ``> {3-5}``) is
    dropped: a test's place in the testset says which test it is."""
    try:
        words = shlex.split(cmd)
    except ValueError as exc:
        raise InvalidPackage(f"problem.xml: test {test}: generator command {cmd!r} cannot be read: {exc}") from None
    if ">" in words:
        words = words[: words.index(">")]
    elif words and words[-1].startswith(">"):
        words = words[:-1]
    if not words:
        raise InvalidPackage(f"problem.xml: test {test}: generator command {cmd!r} names no generator")
    return words[0], tuple(words[1:])


def _generation(
    root: Path, doc: ET.Element, made: list[Made], manifest: dict[str, Any], files: Files
) -> Generation:
    """What is left to make (``made``): the generators the commands name, among problem.xml's
    ``<files><executables>`` (by file name without its suffix, as Polygon names them), and the
    main solution, which makes the answers."""
    executables: dict[str, ET.Element] = {}
    for e in doc.findall("files/executables/executable"):
        source = e.find("source")
        if source is not None and source.get("path"):
            executables.setdefault(Path(str(source.get("path"))).stem, e)
    generators: dict[str, dict[str, Any]] = {}
    for m in made:
        if m.generator is None or m.generator in generators:
            continue
        element = executables.get(m.generator)
        if element is None:
            raise InvalidPackage(
                f"problem.xml: test {m.test}: generator {m.generator!r} (of {m.cmd!r}) is no <files><executables> entry"
            )
        generators[m.generator] = _source(root, element, f"generator {m.generator}", files)
    main = None
    if any(m.answer for m in made):
        found = [s for s in doc.findall("assets/solutions/solution") if s.get("tag") == "main"]
        if not found:
            test = next(m.test for m in made if m.answer)
            raise InvalidPackage(
                f"test {test}: its answer is not in the package and no solution is tagged main to make it"
            )
        main = _source(root, found[0], "the main solution", files, helper=False)
        main["name"] = str(found[0].find("source").get("path"))  # type: ignore[union-attr]
    paths = {sha: f.path for sha, f in files.items()}
    return Generation(tuple(made), generators, main, paths, files)


def _testset(root: Path, testset: ET.Element, files: Files) -> tuple[dict[str, Any], list[Made]]:
    """The manifest's limits, tests and scoring from the ``tests`` testset, and what is left to
    make: a generated test whose input is not in the package (its ``cmd``, made at upload), a test
    whose answer is not (made by the main solution). A manual test's input must be in it."""
    time_ms = _int(testset.findtext("time-limit"), "time-limit")
    memory = _int(testset.findtext("memory-limit"), "memory-limit")
    tests_el = testset.findall("tests/test")
    count = _int(testset.findtext("test-count", str(len(tests_el))), "test-count")
    if count != len(tests_el) or not tests_el:
        raise InvalidPackage(f"problem.xml: test-count is {count} but {len(tests_el)} <test> elements are listed")
    if count > MAX_TESTS:
        raise InvalidPackage(f"{count} tests is more than {MAX_TESTS}")
    input_pattern = path_pattern(testset.findtext("input-path-pattern") or "tests/%02d", "input-path-pattern")
    answer_pattern = path_pattern(testset.findtext("answer-path-pattern") or "tests/%02d.a", "answer-path-pattern")
    output_pattern = testset.findtext("output-path-pattern")
    if output_pattern:  # some packages have one beside the answers': never read, still held to the rules
        path_pattern(output_pattern, "output-path-pattern")
    tests = []
    made: list[Made] = []
    for i, t in enumerate(tests_el, 1):
        given, answer = root / (input_pattern % i), root / (answer_pattern % i)
        entry: dict[str, Any] = {"name": f"{i:02d}"}
        cmd = t.get("cmd") if t.get("method") == "generated" else None
        if given.is_file():
            entry["input"] = add(given, files)
        elif cmd:
            entry["cmd"] = cmd
        else:
            raise InvalidPackage(f"test {i}: {given.relative_to(root)} must exist (a manual test is in the package)")
        if answer.is_file() and "input" in entry:
            entry["answer"] = add(answer, files)
        if "input" not in entry or "answer" not in entry:
            generator, args = command(cmd, i) if "input" not in entry and cmd else (None, ())
            made.append(Made(i, cmd if generator else None, generator, args, t.get("from-file"), "answer" not in entry))
        if t.get("sample") == "true":
            entry["sample"] = True
        tests.append(entry)
    return {
        "format": "polygon",
        "limits": {"time": time_ms / 1000, "memory_mb": max(16, memory // (1024 * 1024))},
        "tests": tests,
        "scoring": _scoring(testset, tests_el),
        "type": "batch",
    }, made


def _assets(root: Path, assets: ET.Element | None, manifest: dict[str, Any], files: Files) -> None:
    """The checker (testlib only), the interactor, the validators and the tagged solutions, into
    ``manifest``; a solution in a language this judge does not run is left out."""
    checker = assets.find("checker") if assets is not None else None
    if checker is None:
        raise InvalidPackage("problem.xml: no <assets><checker>")
    if checker.get("type", "testlib") != "testlib":
        raise InvalidPackage(f"problem.xml: checker type {checker.get('type')!r}: only testlib checkers are supported")
    manifest["checker"] = {"type": "custom", **_source(root, checker, "checker", files)}
    interactor = assets.find("interactor") if assets is not None else None
    if interactor is not None:
        manifest["interactor"] = _source(root, interactor, "interactor", files)
        manifest["type"] = "interactive"
    validators = []
    for n, v in enumerate(assets.findall("validators/validator") if assets is not None else []):
        entry = _source(root, v, f"validator {n + 1}", files)
        entry["name"] = str(v.find("source").get("path"))  # type: ignore[union-attr]
        validators.append(entry)
    if validators:
        manifest["validators"] = validators
    solutions = []
    for n, s in enumerate(assets.findall("solutions/solution") if assets is not None else []):
        source = s.find("source")
        if source is not None and source.get("path"):
            check_desc(root, str(source.get("path")), s.get("tag", ""))
        try:
            entry = _source(root, s, f"solution {n + 1}", files, helper=False)
        except InvalidPackage:
            continue  # a language this judge does not run: not recorded
        entry["name"] = str(s.find("source").get("path"))  # type: ignore[union-attr]
        tag = s.get("tag", "")
        if tag in TAGS:
            entry["expected"] = TAGS[tag]
        solutions.append(entry)
    if solutions:
        manifest["solutions"] = solutions
