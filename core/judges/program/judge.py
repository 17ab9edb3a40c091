"""The program judge itself (:class:`ProgramJudge`): a submission is validated, given a slot's box,
built, and graded test by test by the grader of its problem's kind (:mod:`.graders`); its verdict is
the first failing test's, or its score's (:func:`~.classify.verdict_details`)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from .. import PackageSource, Verdict, current_progress
from ..sandbox import Isolation, Limits, run
from ..sandbox.cgroups import Roots
from ..sandbox.isolation import JudgeSettings, detect, load_judge_settings
from .boxes import Box, Boxes, read_data
from .building import Builder, submission_files
from .builds import BuildCache
from .classify import result_of, verdict_details
from .graders import GRADERS, Grading
from .languages import LANGUAGES
from .payload import InvalidProgramPayload, Program, parse_payload
from .problem import HELPER_LIMITS, Problem, helper_of, inline_problem, package_problem, run_limits
from .scoring import TestResult, finished, should_run
from .tools import find_tools


@dataclass(frozen=True)
class InputCheck:
    """An input validator's judgement of one test's input: ``valid`` True or False, or None when
    the validator itself failed (did not build, crashed, ran out of a limit); ``message`` says
    why (the validator's last words)."""

    validator: str
    test: str
    valid: bool | None
    message: str = ""


#: How an input validator says an input is valid (and invalid): Kattis' 42 (43); testlib's 0 (3).
_KATTIS_VALID, _KATTIS_INVALID = 42, 43


class ProgramJudge:
    """Judge submitted programs in boxes; ``slots`` bounds concurrent submissions (one box each).

    Construction decides the isolation (and refuses to go on without it, see
    :mod:`~judgequeue.core.judges.sandbox.isolation`), claims a uid range and removes whatever a
    crashed worker left in it (:class:`~.boxes.Boxes`). Problem packages come from a
    :class:`~judgequeue.core.judges.PackageSource` the worker attaches (:meth:`attach_packages`).
    """

    def __init__(self, *, settings: JudgeSettings | None = None, slots: int = 64) -> None:
        self.settings = settings or load_judge_settings(os.environ)
        self.isolation: Isolation
        self.roots: Roots | None
        self.isolation, self.roots = detect(self.settings)
        self.slots = slots
        # System tools only: the worker's own interpreter may live where a box cannot see it (a venv).
        tools = find_tools()
        runner = tools.get("python3") if self.settings.box == "submission" else None
        self.boxes = Boxes(self.settings.sandbox_dir, self.isolation, self.roots, slots, runner)
        # Built submissions (see Builder.build); like the helpers', a crashed worker's are not trusted.
        self.builds = BuildCache(os.path.join(self.settings.sandbox_dir, "builds", str(self.boxes.range)))
        self.builder = Builder(self.boxes, tools, self.builds)
        self.packages: PackageSource | None = None

    @property
    def tools(self) -> dict[str, str]:
        """The system tools the languages use, found at start-up (what builds are made with)."""
        return self.builder.tools

    @tools.setter
    def tools(self, tools: dict[str, str]) -> None:
        self.builder.tools = tools

    @property
    def range(self) -> int:
        """The uid range this worker holds."""
        return self.boxes.range

    @property
    def uid_base(self) -> int:
        """The first box uid of this worker's range."""
        return self.boxes.uid_base

    @property
    def group_prefix(self) -> str:
        """What the names of this worker's box groups start with."""
        return self.boxes.group_prefix

    @property
    def boxes_dir(self) -> str:
        """Where this worker's boxes' directories are."""
        return self.boxes.boxes_dir

    @property
    def stale_removed(self) -> list[str]:
        """What a crashed worker of the same range left and this one removed at start-up."""
        return self.boxes.stale_removed

    @property
    def helper_builds(self) -> int:
        """Checkers and interactors built (rather than found kept) by this worker."""
        return self.builder.helper_builds

    # --- packages (injected by the worker: judges never talk to Postgres) --------------------------

    def package_cache(self) -> tuple[str, int]:
        """Where this judge wants its package cache and how big: one directory per uid range, so a
        worker that crashed leaves its copies to the next worker holding the range, not to others."""
        return os.path.join(self.settings.cache_dir, str(self.range)), self.settings.problem_cache_mb * 1024 * 1024

    def attach_packages(self, source: PackageSource) -> None:
        self.packages = source

    def fault(self) -> str | None:
        """Why this worker can no longer judge (see :meth:`~.boxes.Boxes.fault`), or None."""
        return self.boxes.fault()

    def close(self) -> None:
        """Give the uid range back (tests; a worker keeps it until it exits)."""
        self.boxes.close()

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
        """Build a package's checker, interactor and input validators as judging one of its
        submissions would (the same boxes, limits and compilers), before the package is stored: what
        does not build, by name (``checker``, ``interactor``, ``validator N`` for the manifest's
        N-th input validator), with the compiler's words. A build that works is kept as judging
        keeps one, so this worker's first submission of the package does not build it again."""
        checker = manifest.get("checker")
        found: list[tuple[str, Any]] = []
        for kind in ("interactor", "checker"):
            if kind == "checker" and not (isinstance(checker, dict) and checker.get("type") == "custom"):
                continue  # a built-in checker: nothing to build
            found.append((kind, manifest.get(kind)))
        validators = manifest.get("validators") or []
        found.extend((f"validator {n}", spec) for n, spec in enumerate(validators, 1))
        helpers = []
        failed: dict[str, str] = {}
        for kind, spec in found:
            try:
                helper = helper_of(spec, kind, path_of, "the package")
            except InvalidProgramPayload as exc:
                failed[kind] = str(exc)
                continue
            if helper is not None:
                helpers.append((kind, helper))
        if not helpers:
            return failed
        async with self.boxes.slot() as box:
            deadline = time.monotonic() + self.settings.budget
            for kind, helper in helpers:
                directory = box.helper_dir if kind == "interactor" else box.check_dir
                prepared = await self.builder.prepare_helper(helper, box, deadline, directory, box.helper_group)
                if isinstance(prepared, Verdict):
                    details = prepared.details
                    failed[kind] = str(details.get("output") or details.get("reason") or prepared.status)
        return failed

    async def validate_inputs(self, manifest: dict[str, Any], path_of: Callable[[str], Path]) -> list[InputCheck]:
        """Run each input validator of a package on every test's input, built and run as its
        checker is (the same sandbox and limits): one :class:`InputCheck` per validator and test.
        A Kattis validator reads the input on stdin, with its test's ``input_validator_flags`` as
        arguments, and exits 42 (valid) or 43 (invalid); a testlib validator (Polygon) exits 0 or
        reports the input's fault on stderr."""
        kattis = manifest.get("format") == "kattis"
        checks: list[InputCheck] = []
        for spec in manifest.get("validators") or []:
            name = str(spec.get("name"))
            try:
                helper = helper_of(spec, "validator", path_of, "the package")
            except InvalidProgramPayload as exc:
                checks.append(InputCheck(name, "", None, str(exc)))
                continue
            assert helper is not None
            async with self.boxes.slot() as box:
                deadline = time.monotonic() + self.settings.budget
                built = await self.builder.prepare_helper(helper, box, deadline, box.check_dir, box.helper_group)
                if isinstance(built, Verdict):
                    why = built.details.get("output") or built.details.get("reason") or built.status
                    checks.append(InputCheck(name, "", None, f"does not build: {why}"))
                    continue
                for test in manifest.get("tests", []):
                    given = await read_data(path_of(test["input"]))
                    facts = await run(
                        [*built, *test.get("input_flags", [])], box=box.check_dir, uid=box.uid, stdin=given,
                        limits=HELPER_LIMITS, isolation=self.isolation, group=box.helper_group,
                    )  # fmt: skip
                    said = (facts.stderr or facts.stdout).decode("utf-8", "replace").strip()[-500:]
                    words = f": {said}" if said else ""
                    code = facts.exit_code
                    if facts.killed_for is not None or facts.oom_killed or code is None:
                        why = f"stopped ({facts.killed_for})" if facts.killed_for is not None else "did not finish"
                        checks.append(InputCheck(name, test["name"], None, f"the validator {why}{words}"))
                    elif kattis and code not in (_KATTIS_VALID, _KATTIS_INVALID):
                        checks.append(InputCheck(name, test["name"], None, f"the validator exited {code}{words}"))
                    else:
                        valid = code == (_KATTIS_VALID if kattis else 0)
                        checks.append(InputCheck(name, test["name"], valid, "" if valid else said))
        return checks

    async def _judge_with(self, program: Program, problem: Problem) -> Verdict:
        async with self.boxes.slot() as box:
            await asyncio.to_thread(self.boxes.make_dir, box.dir, box.uid)
            return await self._judge_in(program, problem, box)

    async def _judge_in(self, program: Program, problem: Problem, box: Box) -> Verdict:
        deadline = time.monotonic() + self.settings.budget
        base = verdict_base(program, problem, self.isolation.mode)
        refused = kind_refusal(program, problem)
        if refused is not None:
            return Verdict("SYSTEM_ERROR", {**base, "reason": f"invalid payload: {refused}"})
        ready = await self._prepare(program, problem, box, deadline)
        if isinstance(ready, Verdict):
            return Verdict(ready.status, {**base, **ready.details})
        limits = run_limits(problem, LANGUAGES[program.language].processes)
        results, stderr = await self._grade(ready, limits, deadline)
        return verdict_details(results, problem, base, stderr)

    async def _prepare(self, program: Program, problem: Problem, box: Box, deadline: float) -> Grading | Verdict:
        """Build the submission (an output-only one has nothing to build) and the problem's
        interactor and checker: what grading needs, or the verdict of what did not build."""
        argv: list[str] = []
        if program.outputs is None:
            language = LANGUAGES[program.language]
            beside, units = submission_files(program, language)
            built = await self.builder.build(
                language, program.source, box.dir, box, box.group, deadline,
                std=program.std, memory_mb=problem.memory_mb, cache=True, beside=beside, units=units,
            )  # fmt: skip
            current_progress().compiled(not isinstance(built, Verdict))
            if isinstance(built, Verdict):
                return built
            argv = built
        helpers: dict[str, list[str]] = {}
        for kind, helper, directory in (
            ("interactor", problem.interactor, box.helper_dir),
            ("checker", problem.checker_program, box.check_dir),
        ):
            if helper is None:
                continue
            prepared = await self.builder.prepare_helper(helper, box, deadline, directory, box.helper_group)
            if isinstance(prepared, Verdict):
                why = prepared.details.get("output") or prepared.details.get("reason", "")
                return Verdict("SYSTEM_ERROR", {"reason": f"the {kind} does not build: {why}"[:2000]})
            helpers[kind] = prepared
        return Grading(
            problem, box, self.boxes, argv, helpers.get("checker"), helpers.get("interactor"), program.outputs
        )

    async def _grade(
        self, g: Grading, limits: Limits, deadline: float
    ) -> tuple[list[TestResult], dict[int, bytes]]:
        """Grade the tests in order by the grader of the problem's kind, within the submission's
        wall-time budget: each test's results and the stderr of those that wrote any."""
        problem = g.problem
        grader = GRADERS[problem.kind]
        results: list[TestResult] = []
        stderr: dict[int, bytes] = {}
        report, total = current_progress(), len(problem.tests)
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
            report.test_started(number, total)
            result, err = await grader.grade(g, number, case, await read_data(case.input), this)
            if "wall time over" in result.message and this.wall < limits.wall:
                used_up = f"submission time budget of {self.settings.budget:g}s used up"
                result = replace(result, verdict="TIME_LIMIT", message=used_up)
            results.append(result)
            report.test_finished(number, total, result.verdict, (result.cpu_ms or result.wall_ms) / 1000)
            if err:
                stderr[number] = err
            if result.verdict == "SYSTEM_ERROR":
                break  # the judging itself failed: no later test can be trusted to mean anything
        return results, stderr

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()


def verdict_base(program: Program, problem: Problem, isolation: str) -> dict[str, Any]:
    """What every verdict of a submission says besides its tests (pure): the isolation, the
    language, and the package (with its format when it is not judgequeue's own)."""
    base: dict[str, Any] = {"isolation": isolation}
    if program.outputs is None:
        base["language"] = program.language
    if problem.ref is not None:
        base["problem"] = problem.ref
        if problem.format != "judgequeue":
            base["format"] = problem.format
    return base


def kind_refusal(program: Program, problem: Problem) -> str | None:
    """Why the submission does not fit the problem's kind (outputs for a program's problem, or a
    program for an output-only one), or None (pure)."""
    if (program.outputs is not None) == (problem.kind == "output-only"):
        return None
    if program.outputs is not None:
        return "outputs: this problem takes a program (language and source), not outputs"
    return "this problem is output-only: submit outputs (test name to output), not a program"
