"""The languages the program judge speaks, in one table: adding a language is one :data:`LANGUAGES` entry.

An entry names the source file, the command that compiles it (none for interpreted languages),
the command that runs the result, and the tools both need. Commands are argument templates:
``{dir}`` is the box directory as the box sees it, ``{<tool>}`` the absolute path of a tool found
on this worker's system ``PATH`` (never a virtualenv's: a box only sees the system's directories).
Compiling happens in the same sandbox as running, under :data:`COMPILE_LIMITS`; a compiler that
needs more than those gets a compile-time-limit verdict of its own (``COMPILE_ERROR`` saying which
limit), and its output is returned cut to :data:`COMPILE_OUTPUT_MAX` characters.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from .sandbox import Limits

#: Where tools are looked up: the system's directories, which every box binds read-only.
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"
#: Compiler output kept in a COMPILE_ERROR verdict (the tail: the error is usually last).
COMPILE_OUTPUT_MAX = 4000


@dataclass(frozen=True)
class Language:
    """How to build and run one language's programs."""

    name: str
    source: str  # file the source is written to, in the box directory
    run: tuple[str, ...]  # argv template of a run
    compile: tuple[str, ...] | None = None  # argv template of the build, None: interpreted
    artifact: str | None = None  # file the build must leave in the box directory
    processes: int = 16  # processes and threads a run may have (a JVM needs more than a C program)
    helper_run: tuple[str, ...] | None = None  # how a checker/interactor runs, when not like ``run``

    def tools(self) -> set[str]:
        """Names of the tools the templates use (pure)."""
        parts = (*self.run, *(self.compile or ()), *(self.helper_run or ()))
        return {name for part in parts for name in _PLACEHOLDER.findall(part)} - {"dir"}


_PLACEHOLDER = re.compile(r"\{([^{}]+)\}")


#: Runs a Python checker or interactor so that an uncaught exception is a checker failure (testlib's
#: exit code 3, reported as SYSTEM_ERROR with the exception first) rather than exit status 1, which
#: testlib reads as WRONG_ANSWER: a checker's bug must never be the submission's wrong answer.
PYTHON_HELPER = (
    "import runpy, sys, traceback\n"
    "path = sys.argv[1]\n"
    "sys.argv = sys.argv[1:]\n"
    "try:\n"
    "    runpy.run_path(path, run_name='__main__')\n"
    "except SystemExit:\n"
    "    raise\n"
    "except BaseException as exc:\n"
    "    print(type(exc).__name__ + ': ' + str(exc), file=sys.stderr)\n"
    "    traceback.print_exc()\n"
    "    sys.exit(3)\n"
)

LANGUAGES: dict[str, Language] = {
    lang.name: lang
    for lang in (
        Language(
            "python", "main.py", ("{python3}", "-I", "-S", "-B", "{dir}/main.py"),
            helper_run=("{python3}", "-I", "-S", "-B", "-c", PYTHON_HELPER, "{dir}/main.py"),
        ),
        Language(
            "c", "main.c", ("{dir}/main",),
            compile=("{gcc}", "-O2", "-pipe", "-std=c17", "-o", "{dir}/main", "{dir}/main.c", "-lm"), artifact="main",
        ),
        Language(
            "cpp", "main.cpp", ("{dir}/main",),
            compile=("{g++}", "-O2", "-pipe", "-std=c++17", "-o", "{dir}/main", "{dir}/main.cpp", "-lm"),
            artifact="main",
        ),
        # A box has no /proc, so the JDK's $ORIGIN library path cannot be resolved: the loader is
        # named with the JDK's lib directory explicitly ({ld.so} and {jdk}, see TOOL_FINDERS).
        Language(
            "java", "Main.java",
            ("{ld.so}", "--library-path", "{jdk}/lib", "{jdk}/bin/java", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
             "-Xss64m", "-cp", "{dir}", "Main"),
            compile=("{ld.so}", "--library-path", "{jdk}/lib", "{jdk}/bin/javac", "-J-XX:+UseSerialGC",
                     "-encoding", "UTF-8", "-d", "{dir}", "{dir}/Main.java"),
            artifact="Main.class", processes=64,
        ),
    )
}  # fmt: skip

#: Limits of one build: its own CPU/wall budget, so a slow build is a compile-time verdict, not a test's.
COMPILE_LIMITS = Limits(
    cpu=20, wall=40, memory=1024 * 1024 * 1024, output=64 * 1024, file_size=64 * 1024 * 1024, processes=64,
    open_files=256, stack=64 * 1024 * 1024, scratch=256 * 1024 * 1024, stderr=16 * 1024,
)  # fmt: skip


def find_jdk(root: str = "/usr/lib/jvm") -> str | None:
    """A JDK a box can run: one whose files all live under /usr (Debian's own JDK keeps its
    configuration in /etc/java-*, which no box sees; a vendor JDK such as Temurin is self-contained).
    The default ``javac``'s JDK first, then the others by name."""
    homes = []
    javac = shutil.which("javac", path=SYSTEM_PATH)
    if javac is not None:
        homes.append(os.path.dirname(os.path.dirname(os.path.realpath(javac))))
    with contextlib.suppress(OSError):
        homes += sorted(os.path.join(root, n) for n in os.listdir(root))
    for home in homes:
        security = os.path.join(home, "conf", "security", "java.security")
        compiler = os.path.join(home, "bin", "javac")
        if os.path.isfile(compiler) and os.path.realpath(security).startswith("/usr/") and os.path.isfile(security):
            return os.path.realpath(home)
    return None


def find_loader() -> str | None:
    """The dynamic loader, by its real path (a box recreates /lib64 only as a symlink)."""
    for path in ("/lib64/ld-linux-x86-64.so.2", "/lib/ld-linux-aarch64.so.1"):
        if os.path.exists(path):
            return os.path.realpath(path)
    return None


#: Tools not found by name on the system PATH.
TOOL_FINDERS: dict[str, Callable[[], str | None]] = {"jdk": find_jdk, "ld.so": find_loader}


def find_tools(path: str = SYSTEM_PATH) -> dict[str, str]:
    """Absolute paths of every tool some language uses that exists on ``path``."""
    found = {}
    for tool in sorted({t for lang in LANGUAGES.values() for t in lang.tools()}):
        finder = TOOL_FINDERS.get(tool)
        where = finder() if finder is not None else shutil.which(tool, path=path)
        if where is not None:
            found[tool] = os.path.realpath(where)  # /etc/alternatives is not in a box; its target is
    return found


def missing_tools(language: Language, tools: Mapping[str, str]) -> list[str]:
    """The tools ``language`` needs that this worker lacks (pure)."""
    return sorted(language.tools() - set(tools))


def expand(template: tuple[str, ...], directory: str, tools: Mapping[str, str]) -> list[str]:
    """An argv from a template (pure); a missing tool raises KeyError (check :func:`missing_tools` first)."""
    values = {**tools, "dir": directory}
    return [_PLACEHOLDER.sub(lambda m: values[m.group(1)], part) for part in template]


def compile_failure(killed_for: str | None, oom: bool, limits: Limits) -> str:
    """The reason of a failed build (pure): a compile-time limit is named as such, not as a test's limit."""
    if killed_for == "cpu":
        return f"compile time limit: the build used {limits.cpu:g}s of CPU"
    if killed_for == "wall":
        return f"compile time limit: the build ran for {limits.wall:g}s"
    if killed_for == "output":
        return f"compiler output over {limits.output // 1024} KiB"
    if oom:
        return f"compile memory limit: the build needed more than {limits.memory // (1024 * 1024)} MiB"
    return "compilation failed"
