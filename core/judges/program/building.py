"""Building programs in their boxes: a submission (kept by the worker's :class:`~.builds.BuildCache`,
so the same sources in the same language and standard are built once per worker) and a package's
checker or interactor (kept per build identity, as a testlib checker takes seconds to compile)."""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from dataclasses import replace

from .. import Verdict
from ..sandbox import run
from ..sandbox.cgroups import BoxGroup
from .boxes import Box, Boxes, read_data, write_bytes
from .builds import BuildCache, build_key, keep_copy
from .classify import tail
from .languages import (
    COMPILE_LIMITS,
    COMPILE_OUTPUT_MAX,
    LANGUAGES,
    Language,
    compile_failure,
    expand,
    missing_toolchain,
    template_values,
)
from .payload import Program, own_files
from .problem import HELPER_LIMITS, Helper

#: Built checkers/interactors a worker keeps (oldest removed first).
MAX_KEPT_HELPERS = 32
#: Further translation units a build compiles with its main source (by suffix); a language whose
#: run names its main source (Prolog) loads them with it too.
UNITS = {"c": (".c",), "cpp": (".cpp", ".cc", ".cxx", ".c++", ".C"), "prolog": (".pl",)}


def with_units(argv: list[str], main: str, directory: str, units: tuple[str, ...]) -> list[str]:
    """A build's argv with further translation units right after its main source (pure): libraries
    named later on the line (``-lm``) then serve them too."""
    if not units:
        return argv
    at = argv.index(main) + 1 if main in argv else len(argv)
    return [*argv[:at], *(f"{directory}/{unit}" for unit in units), *argv[at:]]


def submission_files(program: Program, language: Language) -> tuple[tuple[tuple[str, bytes], ...], tuple[str, ...]]:
    """A submission's further files as bytes, and which of them its language compiles with its main
    source (pure)."""
    beside = tuple((name, text.encode()) for name, text in program.files)
    units = tuple(name for name, _ in program.files if name.endswith(UNITS.get(language.name, ())))
    return beside, units


class Builder:
    """Builds this worker's programs in the boxes of :class:`~.boxes.Boxes` with the system's
    ``tools``; counts the helpers it built (``helper_builds``: the rest were kept ones)."""

    def __init__(self, boxes: Boxes, tools: dict[str, str], builds: BuildCache) -> None:
        self.boxes = boxes
        self.tools = tools
        self.builds = builds
        self.helper_builds = 0

    async def build(
        self,
        language: Language,
        source: str,
        directory: str,
        box: Box,
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
        inside = self.boxes.inside(directory)
        values = template_values(language, source, std, memory_mb or HELPER_LIMITS.memory // (1024 * 1024))
        name, artifact = own_files(language, source, std)
        run_template = language.helper_run if helper and language.helper_run else language.run
        run_argv = expand(run_template, inside, self.tools, values)
        if f"{inside}/{name}" in run_argv:  # an interpreted program loads its further units too
            run_argv = with_units(run_argv, f"{inside}/{name}", inside, units)

        def write() -> None:
            for other, data in beside:
                write_bytes(os.path.join(directory, other), data)
            # The main source last: a file beside it of the same name never replaces it.
            write_bytes(os.path.join(directory, name), source.encode())

        if language.compile is None:
            await asyncio.to_thread(write)
            return run_argv
        argv = with_units(expand(language.compile, inside, self.tools, values), f"{inside}/{name}", inside, units)
        key = build_key(language.name, argv, source, self.tools, sorted(language.tools()), beside) if cache else None
        owner = box.uid if self.boxes.isolation.mode == "full" else None
        if key is not None and await asyncio.to_thread(self.builds.restore, key, directory, owner):
            return run_argv
        await asyncio.to_thread(write)
        limits = replace(COMPILE_LIMITS, wall=max(0.001, min(COMPILE_LIMITS.wall, deadline - time.monotonic())))
        facts = await run(
            argv, box=directory, uid=box.uid, stdin=b"", limits=limits,
            isolation=self.boxes.isolation, group=group, writable_box=True,
        )  # fmt: skip
        built = artifact is None or await asyncio.to_thread(os.path.exists, os.path.join(directory, artifact))
        if facts.stuck:
            return Verdict("SYSTEM_ERROR", {"reason": "the compiler's box did not stop after it was killed"})
        if facts.killed_for is not None or facts.oom_killed or facts.exit_code != 0 or not built:
            reason = compile_failure(facts.killed_for, facts.oom_killed, limits)
            output = tail(facts.stderr + facts.stdout, COMPILE_OUTPUT_MAX)
            return Verdict("COMPILE_ERROR", {"reason": reason, "output": output})
        if key is not None:
            await asyncio.to_thread(self.builds.keep, key, directory)
        return run_argv

    async def prepare_helper(
        self, helper: Helper, box: Box, deadline: float, directory: str, group: BoxGroup | None
    ) -> list[str] | Verdict:
        """Put a checker or interactor into its directory, ready to run, with the files its package
        ships beside it.

        A compiled one is built once per worker and build identity (its sources' digests): a testlib
        checker takes seconds to compile, which every submission of the problem would otherwise pay.
        The build's directory is kept (root's, 0700) and copied into each later submission's.
        """
        language = LANGUAGES[helper.language]
        await asyncio.to_thread(self.boxes.make_dir, directory, box.uid)
        kept = os.path.join(self.boxes.helpers_dir, f"{helper.sha256}-{helper.language}") if helper.sha256 else None
        source = await asyncio.to_thread(helper.path.read_text)
        if language.compile is not None and kept is not None and await asyncio.to_thread(os.path.isdir, kept):
            await asyncio.to_thread(self.restore_helper, kept, directory, box.uid)
            run_template = language.helper_run or language.run
            values = template_values(language, source, helper.std, HELPER_LIMITS.memory // (1024 * 1024))
            return expand(run_template, self.boxes.inside(directory), self.tools, values)
        beside = tuple([(name, await read_data(path)) for name, path in helper.files])
        built = await self.build(
            language, source, directory, box, group, deadline, helper=True, std=helper.std, beside=beside,
            units=helper.units,
        )  # fmt: skip
        if not isinstance(built, Verdict) and language.compile is not None and kept is not None:
            await asyncio.to_thread(self.keep_helper, directory, kept)
            self.helper_builds += 1
        return built

    def keep_helper(self, built: str, kept: str) -> None:
        keep_copy(built, kept)  # False: another submission kept the same helper first, as good
        entries = sorted(
            (os.path.join(self.boxes.helpers_dir, n) for n in os.listdir(self.boxes.helpers_dir)), key=os.path.getmtime
        )
        for old in entries[: max(0, len(entries) - MAX_KEPT_HELPERS)]:
            shutil.rmtree(old, ignore_errors=True)

    def restore_helper(self, kept: str, directory: str, uid: int) -> None:
        shutil.copytree(kept, directory, symlinks=True, dirs_exist_ok=True)
        if self.boxes.isolation.mode == "full":
            for where, dirs, files in os.walk(directory):
                for name in dirs + files:
                    os.lchown(os.path.join(where, name), uid, uid)
