"""Making the tests a package leaves to be made, before it is stored (a Polygon package exported
without its tests: the manual tests' inputs, the generators and a command for every other test).

What :attr:`~.archives.common.PackageDir.generation` lists is made in one box of the program
judge, with its compilers and sandbox, as untrusted code: the package's generators and its main
solution are the problem setter's programs, run as a submission is run.

- Each generator a command names is built like a checker (the files of its directory beside it,
  ``testlib.h``), and run once per command, with the command's arguments, in an otherwise empty
  writable directory, an empty environment and :data:`GENERATOR_LIMITS`: the test is what it
  writes to standard output or, for a test with ``from-file`` (a generator that writes several
  tests), the file of that name it leaves in its directory (``3``, ``03`` or ``003``, as Polygon's
  scripts look for it). A testlib generator seeds its random numbers from its arguments, so the
  same package makes the same bytes.
- Each answer the package does not hold is what its main solution (``tag="main"``) writes for
  the test's input, run with the problem's memory limit and :func:`answer_limits`; for an
  interactive problem, what the interactor writes as its output (testlib's ``tout``) talking to
  the main solution, as Polygon makes it.
- The package's input validators are then run on every made input (:meth:`ProgramJudge.validate_inputs`).

A made file is taken into the package through :meth:`~.archives.common.Files.take_made`, under
the bounds every file of a package is held to, and stored exactly as a test the package held. A
command that fails, runs out of a limit, writes more than a file may be, or makes an input the
validator refuses refuses the package with one line naming the test and the command.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import Verdict
from ..sandbox import Limits, RunFacts, run
from .archives.common import Generation, InvalidPackage, Made, PackageDir, mib, total_bytes
from .boxes import Box, read_bounded, write_bytes
from .graders.interactive import converse_in
from .languages import LANGUAGES
from .problem import HELPER_LIMITS, helper_of

if TYPE_CHECKING:
    from .judge import ProgramJudge

#: A generator's limits (the output limit is the package's per-file bound).
GENERATOR_LIMITS = replace(HELPER_LIMITS, cpu=10, wall=20)
#: How many bytes of a failing program's standard error a refusal quotes (its last line).
SAID_MAX = 300


def answer_limits(time_limit: float, memory_mb: int, output: int, processes: int) -> Limits:
    """The limits the main solution makes an answer under (pure): the problem's memory, three
    times its time limit (at least 5 s of CPU), and the package's per-file bound on its output."""
    cpu = max(5.0, 3 * time_limit)
    memory = memory_mb * 1024 * 1024
    return Limits(
        cpu=cpu, wall=2 * cpu + 1, memory=memory, output=output, file_size=max(output, 1024 * 1024), stack=memory,
        processes=processes, open_files=64, scratch=16 * 1024 * 1024,
    )  # fmt: skip


def failure(facts: RunFacts, limits: Limits) -> str | None:
    """Why a run did not make what it was asked for, in words (pure), or None when it exited 0."""
    said = facts.stderr.decode("utf-8", "replace").strip().splitlines()
    words = f": {said[-1][:SAID_MAX]}" if said else ""
    if facts.stuck:
        return "did not stop after it was killed"
    if facts.killed_for == "output":
        return f"wrote more than the {mib(limits.output)} a file of a package may be (JUDGEQUEUE_ARCHIVE_MAX_FILE_MB)"
    if facts.killed_for == "cpu":
        return f"ran out of its {limits.cpu:g} s of CPU time"
    if facts.killed_for == "wall":
        return f"did not finish within {limits.wall:g} s"
    if facts.oom_killed:
        return f"ran out of its {mib(limits.memory)} of memory"
    if facts.exit_code != 0:
        code = "did not report its exit" if facts.exit_code is None else f"exited {facts.exit_code}"
        return f"failed ({code}){words}"
    return None


def _shown(made: Made) -> str:
    return f"test {made.test}: generator command {made.cmd!r}"


class _Maker:
    """One package's making, in one box: the generators built one after another in the box's
    helper directory, the main solution in its own."""

    def __init__(self, judge: ProgramJudge, plan: Generation, manifest: dict[str, Any], staging: Path) -> None:
        self.judge = judge
        self.plan = plan
        self.manifest = manifest
        self.staging = staging
        self.max_file = plan.files.bounds.max_file_bytes
        self.limits = replace(GENERATOR_LIMITS, output=self.max_file, file_size=self.max_file)

    def path_of(self, sha: str) -> Path:
        return self.plan.files[sha].path if sha in self.plan.files else self.plan.paths[sha]

    def keep(self, made: Made, suffix: str, data: bytes, what: str) -> str:
        """Write a made file into the staging directory and take it into the package; its sha256."""
        path = self.staging / f"{made.test:02d}{suffix}"
        path.write_bytes(data)
        return self.plan.files.take_made(path, f"test {made.test}'s {what}").sha256

    async def build_generator(self, name: str, box: Box) -> list[str]:
        helper = helper_of(self.plan.generators[name], f"generator {name}", self.path_of, "the package")
        assert helper is not None
        deadline = time.monotonic() + self.judge.settings.budget
        built = await self.judge.builder.prepare_helper(helper, box, deadline, box.helper_dir, box.helper_group)
        if isinstance(built, Verdict):
            output = str(built.details.get("output") or built.details.get("reason") or built.status)
            entry = self.plan.generators[name]
            raise InvalidPackage(
                f"the generator {entry.get('name')} does not build ({entry.get('language')}), so the package is "
                f"refused:\n{output.rstrip()}"
            )
        return built

    async def inputs(self, box: Box) -> dict[int, bytes]:
        """Every test's input a command makes, by test number."""
        made_inputs: dict[int, bytes] = {}
        by_generator: dict[str, list[Made]] = {}
        for made in self.plan.tests:
            if made.generator is not None:
                by_generator.setdefault(made.generator, []).append(made)
        for name in sorted(by_generator):
            argv = await self.build_generator(name, box)
            built = set(await asyncio.to_thread(os.listdir, box.helper_dir))
            ran: dict[tuple[str, ...], set[str]] = {}  # a several-test command's files, read once per command
            for made in by_generator[name]:
                if made.from_file is None:
                    facts = await self.run(argv, made, box, stdin=b"")
                    made_inputs[made.test] = facts.stdout
                    continue
                if made.args not in ran:
                    await asyncio.to_thread(self.clear, box.helper_dir, built)
                    await self.run(argv, made, box, stdin=b"")
                    ran[made.args] = set(await asyncio.to_thread(os.listdir, box.helper_dir)) - built
                made_inputs[made.test] = await asyncio.to_thread(self.from_file, made, box.helper_dir, ran[made.args])
        return made_inputs

    async def run(self, argv: list[str], made: Made, box: Box, *, stdin: bytes) -> RunFacts:
        facts = await run(
            [*argv, *made.args], box=box.helper_dir, uid=box.uid, stdin=stdin, limits=self.limits,
            isolation=self.judge.isolation, group=box.helper_group, writable_box=True,
        )  # fmt: skip
        why = failure(facts, self.limits)
        if why is not None:
            raise InvalidPackage(f"{_shown(made)} {why}")
        return facts

    def from_file(self, made: Made, directory: str, written: set[str]) -> bytes:
        """The test a several-test command wrote to a file of its directory (Polygon's scripts take
        ``N``, ``0N`` or ``00N``), read without following a link, within the per-file bound."""
        assert made.from_file is not None
        for name in (made.from_file, made.from_file.zfill(2), made.from_file.zfill(3)):
            if name in written:
                data = read_bounded(os.path.join(directory, name), self.max_file + 1)
                if len(data) > self.max_file:
                    raise InvalidPackage(f"{_shown(made)} wrote more than the {mib(self.max_file)} a file may be")
                return data
        raise InvalidPackage(f"{_shown(made)} wrote no file {made.from_file!r} (its test's from-file)")

    async def interactor(self, box: Box) -> list[str] | None:
        """The problem's interactor built in the box's helper directory (an interactive problem's
        answer is what its interactor writes as its output talking to the main solution, as Polygon
        makes it), or None when the problem has none."""
        spec = self.manifest.get("interactor")
        if spec is None:
            return None
        helper = helper_of(spec, "interactor", self.path_of, "the package")
        assert helper is not None
        deadline = time.monotonic() + self.judge.settings.budget
        built = await self.judge.builder.prepare_helper(helper, box, deadline, box.helper_dir, box.helper_group)
        if isinstance(built, Verdict):
            output = str(built.details.get("output") or built.details.get("reason") or built.status)
            raise InvalidPackage(f"the interactor {spec.get('name')} does not build, so the package is refused:\n"
                                 f"{output.rstrip()}")  # fmt: skip
        return built

    async def converse(
        self, box: Box, argv: list[str], interactor: list[str], given: bytes, limits: Limits
    ) -> tuple[str | None, bytes]:
        """The main solution talking to the interactor on one input (testlib's: input, output and
        an empty answer file): why it failed (None: it did not), and the interactor's output."""
        directory = box.helper_dir

        def write() -> None:
            write_bytes(os.path.join(directory, "input"), given)
            write_bytes(os.path.join(directory, "answer"), b"")
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(directory, "output"))

        await asyncio.to_thread(write)
        inside = self.judge.boxes.inside(directory)
        talk = [*interactor, f"{inside}/input", f"{inside}/output", f"{inside}/answer"]
        sub, inter = await converse_in(box, self.judge.boxes, argv, talk, limits)
        why = failure(sub, limits)
        said = failure(inter, HELPER_LIMITS)
        if why is None and said is not None:
            why = f"did not satisfy the interactor, which {said}"
        output = await asyncio.to_thread(read_bounded, os.path.join(directory, "output"), self.max_file + 1)
        if len(output) > self.max_file:
            why = why or f"made the interactor write more than the {mib(self.max_file)} a file of a package may be"
        return why, output

    @staticmethod
    def clear(directory: str, keep: set[str]) -> None:
        """Remove what an earlier command wrote beside the built generator."""
        for name in set(os.listdir(directory)) - keep:
            path = os.path.join(directory, name)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    os.unlink(path)

    async def answers(self, box: Box, inputs: dict[int, bytes]) -> dict[int, bytes]:
        """Every answer the main solution makes, by test number."""
        wanted = [m for m in self.plan.tests if m.answer]
        main = self.plan.main
        if not wanted or main is None:
            return {}
        language = LANGUAGES[main["language"]]
        limits_of = self.manifest["limits"]
        await asyncio.to_thread(self.judge.boxes.make_dir, box.dir, box.uid)
        source = await asyncio.to_thread(self.path_of(main["file"]).read_text)
        beside = tuple((n, self.path_of(d).read_bytes()) for n, d in sorted((main.get("files") or {}).items()))
        deadline = time.monotonic() + self.judge.settings.budget
        built = await self.judge.builder.build(
            language, source, box.dir, box, box.group, deadline, std=main.get("std"),
            memory_mb=int(limits_of["memory_mb"]), cache=True, beside=beside,
        )  # fmt: skip
        if isinstance(built, Verdict):
            output = str(built.details.get("output") or built.details.get("reason") or built.status)
            raise InvalidPackage(f"the main solution {main.get('name')} does not build, so the package is refused:\n"
                                 f"{output.rstrip()}")  # fmt: skip
        limits = answer_limits(float(limits_of["time"]), int(limits_of["memory_mb"]), self.max_file, language.processes)
        interactor = await self.interactor(box)
        made_answers: dict[int, bytes] = {}
        for made in wanted:
            given = inputs.get(made.test)
            if given is None:
                given = await asyncio.to_thread(self.path_of(self.manifest["tests"][made.test - 1]["input"]).read_bytes)
            cmd = f" (made by {made.cmd!r})" if made.cmd else ""
            if interactor is None:
                facts = await run(
                    built, box=box.dir, uid=box.uid, stdin=given, limits=limits, isolation=self.judge.isolation,
                    group=box.group,
                )  # fmt: skip
                why = failure(facts, limits)
                made_answers[made.test] = facts.stdout
            else:
                why, made_answers[made.test] = await self.converse(box, built, interactor, given, limits)
            if why is not None:
                raise InvalidPackage(f"test {made.test}{cmd}: the main solution {main.get('name')} {why}")
        return made_answers


async def make_tests(judge: ProgramJudge, package: PackageDir, staging: Path) -> PackageDir:
    """The package with every test it leaves to be made made (its files in ``staging``, a private
    directory that must outlive the package's use), its input validators run on the made inputs;
    the package itself when it leaves nothing. InvalidPackage names the test and the command of
    whatever fails."""
    plan = package.generation
    if plan is None:
        return package
    manifest = {**package.manifest, "tests": [dict(t) for t in package.manifest["tests"]]}
    maker = _Maker(judge, plan, manifest, staging)
    async with judge.boxes.slot() as box:
        inputs = await maker.inputs(box)
        for made in plan.tests:
            if made.test in inputs:
                manifest["tests"][made.test - 1]["input"] = maker.keep(made, "", inputs[made.test], "input")
        answers = await maker.answers(box, inputs)
    for made in plan.tests:
        if made.test in answers:
            manifest["tests"][made.test - 1]["answer"] = maker.keep(made, ".a", answers[made.test], "answer")
    if manifest.get("validators") and inputs:
        checked = {**manifest, "tests": [manifest["tests"][n - 1] for n in sorted(inputs)]}
        by_name = {made.test: made for made in plan.tests}
        for check in await judge.validate_inputs(checked, maker.path_of):
            if check.valid is not True:
                made = by_name[int(check.test)] if check.test.isdigit() else plan.tests[0]
                said = f": {' '.join(check.message.split())[:SAID_MAX]}" if check.message else ""
                why = "is refused by" if check.valid is False else "could not be checked by"
                raise InvalidPackage(f"{_shown(made)} makes an input that {why} the validator {check.validator}{said}")
    return replace(package, manifest=total_bytes(manifest, plan.files), generation=None)


__all__ = ["GENERATOR_LIMITS", "answer_limits", "failure", "make_tests"]
