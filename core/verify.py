"""``judgequeue problem verify``: a package checked before a contest, as problemtools'
``verifyproblem`` checks one (docs/judges.md, "Verifying a package").

Nothing is stored: the package is read under the upload's rules (:mod:`.judges.program.archives`),
or a stored version is copied out of Postgres (:func:`stored_package`), then, through the program
judge and its sandbox:

1. its checker, interactor and input validators are built (one that does not build is an error);
2. every input validator is run on every test's input (an input refused, or a validator that
   fails, is an error; a package without one is a warning);
3. its accepted solutions (Kattis ``submissions/accepted/``; a Polygon ``main`` or ``accepted``
   tag; a judgequeue solution expecting ``ACCEPTED`` only) are judged first, and the time limit
   follows from the slowest of them as problemtools derives it: that CPU time times the package's
   ``ac_to_time_limit``, rounded up to its resolution (at least one step; see
   :class:`~.judges.program.archives.common.Timing`: a legacy Kattis package's
   ``time_multiplier``, 5, and ``time_safety_margin``, 2; otherwise 2 and 1.5, 2023-07's). A package that gives its
   time limit keeps it, and a limit tighter than that is an error; one that gives none (a Kattis
   package without ``limits.time_limit`` or ``.timelimit``) is judged at the derived limit, which
   is reported as the one to upload it with;
4. every solution is judged at the time limit and at ``time_limit_to_tle`` times it:
   its verdict at the limit among those its folder or tag expects is ``ok``, only at the higher
   limit ``ok with extra time`` (problemtools' words), neither an error; a verdict that changes
   between the two limits is a warning (the solution is sensitive to the time limit).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import asyncpg

from .judges import Verdict
from .judges.program import MAX_TIME, InputCheck, ProgramJudge
from .judges.program.archives import PackageDir, PackageFile, named_files
from .judges.program.archives.common import Timing, timing_of

#: The time limit accepted solutions run at when a package gives none (problemtools: 300 s; this
#: judge allows at most MAX_TIME per test).
CAP = 10.0


@dataclass(frozen=True)
class SolutionOutcome:
    """One shipped solution judged at the time limit and above it."""

    name: str
    expected: list[str]
    verdict: str  # at the time limit
    verdict_high: str  # at TIME_LIMIT_TO_TLE times it
    seconds: float  # its slowest test's CPU time at the time limit
    outcome: str  # "ok", "ok with extra time" or "disagrees"
    score: float | None = None


@dataclass
class Verification:
    """What ``verify`` found; ``errors`` empty means the package is ready for a contest."""

    problem: str
    format: str
    time_limit: float
    time_limit_source: str  # where the limit judged at came from: the package's, or "derived"
    slowest_accepted: float | None = None
    derived_time_limit: float | None = None
    solutions: list[SolutionOutcome] = field(default_factory=list)
    inputs: list[InputCheck] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}


@dataclass(frozen=True)
class _View:
    id: str
    version: int
    sha256: str
    manifest: dict[str, Any]
    path_of: Callable[[str], Path]

    def path(self, sha256: str) -> Path:
        return self.path_of(sha256)


class _InPlace:
    """A package source giving the judge the package being verified, where it was read, at the
    time limit being tried (the judge's package cache, without the database)."""

    def __init__(self, package: PackageDir, time_limit: float) -> None:
        self.read, self.time_limit = package, time_limit

    @contextlib.asynccontextmanager
    async def package(self, problem: str, version: int) -> AsyncIterator[_View]:
        limits = {**self.read.manifest["limits"], "time": self.time_limit}
        manifest = {**self.read.manifest, "limits": limits, "id": problem, "version": version}
        yield _View(problem, version, "verify", manifest, lambda sha: self.read.files[sha].path)


async def stored_package(conn: asyncpg.Connection, problem: str, version: int, dest: Path) -> PackageDir:
    """A stored package version as ``verify`` reads one: its manifest, and each file it names copied
    (digest-checked) into ``dest``; UnknownProblem when there is no such version."""
    from .store.problems import copy_file, manifest_of

    manifest, _ = await manifest_of(conn, problem, version)
    files = {}
    for sha in sorted(named_files(manifest)):
        size = await copy_file(conn, sha, dest / sha)
        files[sha] = PackageFile(dest / sha, sha, size)
    return PackageDir(problem, version, manifest, files)


def derive_time_limit(slowest: float, timing: Timing) -> float:
    """problemtools' time limit for a package whose slowest accepted solution takes ``slowest``
    seconds (pure): times ``ac_to_time_limit``, rounded up to the resolution, at least one step."""
    steps = math.ceil(slowest * timing.ac_to_time_limit / timing.resolution - 1e-9)
    return max(1, steps) * timing.resolution


def lower_bounds_time_limit(package: PackageDir, solution: dict[str, Any]) -> bool:
    """Whether a solution's time bounds the time limit from below: problemtools counts
    ``accepted/`` (not ``partially_accepted/``); elsewhere, one expected to be accepted only."""
    if package.manifest.get("format") == "kattis":
        return str(solution.get("name", "")).startswith("accepted/")
    return solution.get("expected") == ["ACCEPTED"]


def _payload(package: PackageDir, solution: dict[str, Any]) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "problem": package.id, "version": package.version or 1, "language": solution["language"],
        "source": package.files[solution["file"]].path.read_text(errors="replace"),
    }  # fmt: skip
    if solution.get("std"):
        payload["std"] = solution["std"]
    if solution.get("files"):
        payload["files"] = {n: package.files[d].path.read_text(errors="replace") for n, d in solution["files"].items()}
    return payload


def _seconds(verdict: Verdict) -> float:
    return max((t.get("cpu_ms", 0) for t in verdict.details.get("tests", [])), default=0) / 1000


async def _judge(judge: ProgramJudge, package: PackageDir, solution: dict[str, Any], limit: float) -> Verdict:
    judge.attach_packages(_InPlace(package, min(limit, MAX_TIME)))
    return await judge.judge(_payload(package, solution))


def _first_lines(text: str, lines: int = 5) -> str:
    return "\n".join(text.strip().splitlines()[:lines])


async def verify(package: PackageDir, judge: ProgramJudge, *, cap: float = CAP) -> Verification:
    """Check ``package`` (read, not stored) with ``judge``, as the module's docstring says."""
    manifest = package.manifest
    fixed = None if manifest.get("time_limit_source") == "default" else float(manifest["limits"]["time"])
    found = Verification(package.id, str(manifest.get("format", "judgequeue")), fixed or cap,
                         "package" if fixed is not None else "derived")  # fmt: skip
    path_of = lambda sha: package.files[sha].path  # noqa: E731
    for kind, output in (await judge.build_helpers(manifest, path_of)).items():
        found.errors.append(f"the {kind} does not build:\n{_first_lines(output)}")
    if found.errors:
        return found
    if manifest.get("validators"):
        found.inputs = await judge.validate_inputs(manifest, path_of)
        for check in found.inputs:
            words = f": {check.message}" if check.message else ""
            if check.valid is False:
                found.errors.append(f"input validator {check.validator} refuses test {check.test}{words}")
            elif check.valid is None:
                where = f" on test {check.test}" if check.test else ""
                found.errors.append(f"input validator {check.validator} failed{where}{words}")
    else:
        found.warnings.append("no input validator: the tests' inputs are not checked")
    solutions = manifest.get("solutions") or []
    lower = [s for s in solutions if lower_bounds_time_limit(package, s)]
    if not lower:
        found.errors.append("no accepted solution: the time limit has nothing to be checked against")
    # The accepted solutions first, at a limit with room, to see how much time they need.
    timing = timing_of(manifest)
    first_limit = fixed * timing.time_limit_to_tle if fixed is not None else cap
    timed = {s["name"]: await _judge(judge, package, s, first_limit) for s in lower}
    accepted_times = [_seconds(v) for v in timed.values() if v.status == "ACCEPTED"]
    if accepted_times:
        found.slowest_accepted = max(accepted_times)
        found.derived_time_limit = derive_time_limit(found.slowest_accepted, timing)
        if fixed is None:
            found.time_limit = found.derived_time_limit
        elif found.slowest_accepted * timing.ac_to_time_limit > fixed:
            found.errors.append(
                f"the time limit {fixed:g} s is tighter than the accepted solutions allow: the slowest takes "
                f"{found.slowest_accepted:.3f} s, times {timing.ac_to_time_limit:g} is more (problemtools would set "
                f"{found.derived_time_limit:g} s)"
            )
    elif fixed is None:
        found.errors.append(f"no accepted solution was accepted within {cap:g} s: no time limit can be derived")
    limit, high = found.time_limit, found.time_limit * timing.time_limit_to_tle
    for solution in solutions:
        at_limit = await _judge(judge, package, solution, limit)
        at_high = await _judge(judge, package, solution, high)
        expected = list(solution.get("expected") or [])
        if not expected:
            outcome = "ok"  # a tag that expects nothing in particular
        elif at_limit.status in expected:
            outcome = "ok"
        elif at_high.status in expected:
            outcome = "ok with extra time"
        else:
            outcome = "disagrees"
            reason = at_limit.details.get("reason")
            found.errors.append(
                f"{solution['name']} got {at_limit.status} at {limit:g} s ({at_high.status} at {high:g} s), "
                f"expected {' or '.join(expected)}" + (f": {_first_lines(str(reason), 3)}" if reason else "")
            )
        if at_limit.status != at_high.status or at_limit.details.get("score") != at_high.details.get("score"):
            found.warnings.append(
                f"{solution['name']} is sensitive to the time limit: {at_limit.status} at {limit:g} s, "
                f"{at_high.status} at {high:g} s"
            )
        found.solutions.append(SolutionOutcome(
            solution["name"], expected, at_limit.status, at_high.status, _seconds(at_limit), outcome,
            at_limit.details.get("score"),
        ))  # fmt: skip
    return found
