"""The languages the program judge speaks, in one table: adding a language is one :data:`LANGUAGES` entry.

An entry names the source file, the command that builds it (for interpreted languages a syntax
check, so a syntax error is a COMPILE_ERROR as on Kattis and Codeforces, not a run-time error), the
command that runs the result, the tools both need and where those come from (:class:`Toolchain`).
Commands are argument templates: ``{dir}`` is the box directory as the box sees it, ``{<tool>}`` the
absolute path (or value) of a tool found on this worker's system ``PATH`` (never a virtualenv's: a box
only sees the system's directories) or by a finder of :data:`TOOL_FINDERS`, and a few values of the
submission (:func:`template_values`): ``{std}`` the chosen language standard, ``{memory_mb}`` the
run's memory limit, ``{stack_kb}``, ``{entry}`` the class a JVM runs.

A box has no ``/proc`` and no ``/etc`` but ``/etc/ld.so.cache`` (docs/judges.md, threat model), which
shapes several entries: a runtime whose libraries are found through ``$ORIGIN`` (a JDK, GHC) is
started through the dynamic loader with its library path named; a tool reached through
``/etc/alternatives`` is named by its real path; a compiler's configuration that lives in ``/etc``
(Free Pascal) is given on its command line instead. Runtimes that size their heap from the machine
(a JVM, V8, Go's GC) are told the run's memory limit, so they collect garbage to fit it; the box's
memory cgroup still enforces the limit, and exceeding it is MEMORY_LIMIT whatever the runtime says.

Compiling happens in the same sandbox as running, under :data:`COMPILE_LIMITS`; a compiler that
needs more than those gets a compile-time-limit verdict of its own (``COMPILE_ERROR`` saying which
limit), and its output is returned cut to :data:`COMPILE_OUTPUT_MAX` characters.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from ..sandbox.command import Limits

#: Where tools are looked up: the system's directories, which every box binds read-only.
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"
#: Compiler output kept in a COMPILE_ERROR verdict (the tail: the error is usually last).
COMPILE_OUTPUT_MAX = 4000
#: Where ``scripts/install --languages`` puts toolchains that do not come as Debian packages (JVM
#: languages' compiler jars from Maven Central, GHC's package database): under /usr, so boxes see it.
TOOLCHAIN_DIR = "/usr/local/lib/judgequeue"


@dataclass(frozen=True)
class Toolchain:
    """Where a language's tools come from: what ``scripts/install`` installs and the docs list.

    ``debian``: Debian 12 packages (``apt-get install``); ``maven``: Maven Central coordinates whose
    jars (with their dependencies) go to ``TOOLCHAIN_DIR/<language>``; ``base``: installed by every
    ``scripts/install`` (small, or the machine has them anyway), else only on demand
    (``scripts/install --languages``), so the quickstart stays quick.
    """

    debian: tuple[str, ...] = ()
    maven: tuple[str, ...] = ()
    base: bool = False


@dataclass(frozen=True)
class Language:
    """How to build and run one language's programs."""

    name: str
    source: str  # file the source is written to, in the box directory (a template: Java's is its class)
    run: tuple[str, ...]  # argv template of a run
    compile: tuple[str, ...] | None = None  # argv template of the build (or syntax check), None: none
    artifact: str | None = None  # file the build must leave in the box directory (a template)
    processes: int = 16  # processes and threads a run may have (a JVM needs more than a C program)
    helper_run: tuple[str, ...] | None = None  # how a checker/interactor runs, when not like ``run``
    title: str = ""  # the language and toolchain, for people (docs table)
    toolchain: Toolchain = field(default_factory=Toolchain)
    standards: tuple[str, ...] = ()  # values the payload's ``std`` may take (C, C++)
    default_standard: str | None = None
    entry: Callable[[str], str] | None = None  # the program's main class, read from its source
    notes: str = ""  # memory model and conventions, for people (docs table)

    def tools(self) -> set[str]:
        """Names of the tools the templates use (pure)."""
        parts = (*self.run, *(self.compile or ()), *(self.helper_run or ()), self.source, self.artifact or "")
        return {name for part in parts for name in _PLACEHOLDER.findall(part)} - VALUES


_PLACEHOLDER = re.compile(r"\{([^{}]+)\}")
#: Placeholders filled from the submission rather than the worker's tools (see template_values).
VALUES = frozenset({"dir", "std", "memory_mb", "stack_kb", "entry", "entry_path", "class"})


# --- reading a JVM program's main class --------------------------------------------------------------

_JAVA_NOISE = re.compile(r'//[^\n]*|/\*.*?\*/|""".*?"""|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', re.S)
_JAVA_TYPE = re.compile(
    r"(?<![\w$])((?:(?:public|abstract|final|strictfp|sealed|non-sealed|static)\s+)*)"
    r"(class|interface|enum|record)\s+([^\W\d][\w$]*)"
)
_JAVA_PACKAGE = re.compile(r"^\s*package\s+([^\W\d][\w$]*(?:\s*\.\s*[^\W\d][\w$]*)*)\s*;")
_SCALA_MAIN = re.compile(r"@main\s+def\s+([^\W\d][\w$]*)")
_SCALA_OBJECT = re.compile(r"(?<![\w$])object\s+([^\W\d][\w$]*)")
MAX_CLASS_NAME = 120  # a class name is a file name: well under any filesystem's 255 bytes


def _top_level(source: str) -> str:
    """``source`` without comments and literals, and with everything inside braces blanked (pure)."""
    text = _JAVA_NOISE.sub(" ", source)
    out, depth = [], 0
    for ch in text:
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth = max(0, depth - 1)
        elif depth == 0:
            out.append(ch)
            continue
        out.append(" ")
    return "".join(out)


def _class_name(name: str | None) -> str:
    return name if name and len(name.encode()) <= MAX_CLASS_NAME else "Main"


def java_entry(source: str) -> str:
    """The class to run (pure): the top-level public class, as Kattis and Codeforces take it, else the
    first top-level class, else ``Main``; qualified by the source's package when it declares one."""
    top = _top_level(source)
    types = [(m.group(1).split(), m.group(3)) for m in _JAVA_TYPE.finditer(top)]
    public = [name for modifiers, name in types if "public" in modifiers]
    name = _class_name(public[0] if public else types[0][1] if types else None)
    package = _JAVA_PACKAGE.match(_JAVA_NOISE.sub(" ", source))
    return "".join(package.group(1).split()) + "." + name if package else name


def scala_entry(source: str) -> str:
    """The class to run (pure): an ``@main`` method's name, else the first top-level ``object``."""
    text = _JAVA_NOISE.sub(" ", source)
    main = _SCALA_MAIN.search(text)
    if main:
        return _class_name(main.group(1))
    found = _SCALA_OBJECT.search(_top_level(source))
    return _class_name(found.group(1) if found else None)


# --- the table ------------------------------------------------------------------------------------------


#: Runs a Python checker or interactor so that an uncaught exception is a checker failure (testlib's
#: exit code 3, reported as SYSTEM_ERROR with the exception first) rather than exit status 1, which
#: testlib reads as WRONG_ANSWER: a checker's bug must never be the submission's wrong answer. Its
#: directory comes first on ``sys.path``, as for a script run directly: a validator of several files
#: imports the others.
PYTHON_HELPER = (
    "import os, runpy, sys, traceback\n"
    "path = sys.argv[1]\n"
    "sys.argv = sys.argv[1:]\n"
    "sys.path.insert(0, os.path.dirname(path))\n"
    "try:\n"
    "    runpy.run_path(path, run_name='__main__')\n"
    "except SystemExit:\n"
    "    raise\n"
    "except BaseException as exc:\n"
    "    print(type(exc).__name__ + ': ' + str(exc), file=sys.stderr)\n"
    "    traceback.print_exc()\n"
    "    sys.exit(3)\n"
)
#: A Python syntax check that writes nothing (the box directory is the submission's; no __pycache__):
#: the main source, then every other ``.py`` file beside it (a submission's modules, as problemtools
#: compiles all of a program's files).
PYTHON_CHECK = (
    "import os, sys\n"
    "main = sys.argv[1]\n"
    "here = os.path.dirname(main)\n"
    "others = sorted(os.path.join(here, n) for n in os.listdir(here) if n.endswith('.py'))\n"
    "for p in [main] + [p for p in others if p != main]:\n"
    "    compile(open(p, 'rb').read(), p, 'exec')\n"
)

C_STANDARDS = ("c99", "c11", "c17", "c2x", "gnu99", "gnu11", "gnu17", "gnu2x")
CPP_STANDARDS = tuple(f"{d}++{v}" for d in ("c", "gnu") for v in ("11", "14", "17", "20", "23"))
#: A JVM: the box has no /proc, so the JDK's $ORIGIN library path cannot be resolved: the loader is
#: named with the JDK's lib directory explicitly ({ld.so} and {jdk}, see TOOL_FINDERS). Serial GC and
#: the client compiler start fastest and use one GC thread; no perf-data file in /tmp.
JVM = ("{ld.so}", "--library-path", "{jdk}/lib", "{jdk}/bin/java", "-XX:+UseSerialGC", "-XX:-UsePerfData")
#: A JVM program's run: its heap may grow to the memory limit (so the cgroup, not the JVM, decides
#: MEMORY_LIMIT, and the GC sizes itself to the limit instead of a quarter of the host's memory).
JVM_RUN = (*JVM, "-XX:TieredStopAtLevel=1", "-Xmx{memory_mb}m", "-Xss64m")
#: A JVM compiler's heap: inside COMPILE_LIMITS' 1 GiB with room for the JVM's own memory.
JVM_COMPILER = (*JVM, "-Xmx640m", "-Xss16m")
KOTLIN_VERSION = "2.2.20"
SCALA_VERSION = "3.3.6"

LANGUAGES: dict[str, Language] = {
    lang.name: lang
    for lang in (
        Language(
            "c", "main.c", ("{dir}/main",),
            compile=("{gcc}", "-O2", "-pipe", "-std={std}", "-o", "{dir}/main", "{dir}/main.c", "-lm"),
            artifact="main", title="C (gcc 12)", standards=C_STANDARDS, default_standard="gnu17",
            toolchain=Toolchain(debian=("gcc", "libc6-dev"), base=True),
            notes="`std` one of " + ", ".join(C_STANDARDS) + "; GNU C17 by default, as ICPC and Codeforces",
        ),
        Language(
            "cpp", "main.cpp", ("{dir}/main",),
            compile=("{g++}", "-O2", "-pipe", "-std={std}", "-o", "{dir}/main", "{dir}/main.cpp", "-lm"),
            artifact="main", title="C++ (g++ 12)", standards=CPP_STANDARDS, default_standard="gnu++17",
            toolchain=Toolchain(debian=("g++",), base=True),
            notes="`std` one of " + ", ".join(CPP_STANDARDS) + "; GNU C++17 by default, as Codeforces",
        ),
        Language(
            "java", "{class}.java", (*JVM_RUN, "-cp", "{dir}", "{entry}"),
            compile=("{ld.so}", "--library-path", "{jdk}/lib", "{jdk}/bin/javac", "-J-XX:+UseSerialGC",
                     "-J-XX:-UsePerfData", "-J-Xmx640m", "-encoding", "UTF-8", "-d", "{dir}", "{dir}/{class}.java"),
            artifact="{entry_path}.class", processes=64, title="Java (JDK 17 or later)",
            entry=java_entry, toolchain=Toolchain(debian=("openjdk-17-jdk-headless",)),
            notes="any class name: the top-level public class (else the first) is the file's name and is run; "
                  "heap up to the memory limit (`-Xmx`), 64 MiB thread stacks, 64 threads",
        ),
        Language(
            "kotlin", "main.kt", (*JVM_RUN, "-cp", "{dir}:{kotlin.stdlib}", "MainKt"),
            compile=(*JVM_COMPILER, "-cp", "{kotlin.compiler}", "org.jetbrains.kotlin.cli.jvm.K2JVMCompiler",
                     "-no-reflect", "-no-stdlib", "-classpath", "{kotlin.stdlib}", "-d", "{dir}", "{dir}/main.kt"),
            artifact="MainKt.class", processes=64, title=f"Kotlin {KOTLIN_VERSION} (JVM)",
            toolchain=Toolchain(maven=(f"org.jetbrains.kotlin:kotlin-compiler-embeddable:{KOTLIN_VERSION}",)),
            notes="top-level `fun main()`; run on the Java row's JDK with the same memory model",
        ),
        Language(
            "scala", "main.scala", (*JVM_RUN, "-cp", "{dir}:{scala.library}", "{entry}"),
            compile=(*JVM_COMPILER, "-cp", "{scala.compiler}", "dotty.tools.dotc.Main", "-classpath", "{scala.library}",
                     "-d", "{dir}", "{dir}/main.scala"),
            artifact="{entry_path}.class", processes=64, title=f"Scala {SCALA_VERSION} (JVM)", entry=scala_entry,
            toolchain=Toolchain(maven=(f"org.scala-lang:scala3-compiler_3:{SCALA_VERSION}",)),
            notes="an `object` with `main` (the first top-level one) or an `@main` method; JVM memory model",
        ),
        Language(
            # -E -s, not -I: isolated mode also leaves the script's directory off sys.path, and a
            # submission's other files (modules it imports) are there.
            "python", "main.py", ("{python3}", "-E", "-s", "-S", "-B", "{dir}/main.py"),
            compile=("{python3}", "-I", "-S", "-B", "-c", PYTHON_CHECK, "{dir}/main.py"),
            helper_run=("{python3}", "-I", "-S", "-B", "-c", PYTHON_HELPER, "{dir}/main.py"),
            title="Python 3 (CPython 3.11)", toolchain=Toolchain(debian=("python3",), base=True),
            notes="syntax checked first (a syntax error is COMPILE_ERROR); no site packages, no `PYTHON*` variables;"
                  " the files of a submission import from its directory",
        ),
        Language(
            "pypy", "main.py", ("{pypy3}", "{dir}/main.py"),
            compile=("{pypy3}", "-c", PYTHON_CHECK, "{dir}/main.py"),
            title="Python 3 (PyPy 7.3)", toolchain=Toolchain(debian=("pypy3",)),
            notes="syntax checked first",
        ),
        Language(
            "go", "main.go", ("{env}", "GOMEMLIMIT={memory_mb}MiB", "{dir}/main"),
            compile=("{env}", "HOME=/tmp", "GOCACHE=/tmp/go-build", "GOPATH=/tmp/go", "GO111MODULE=off",
                     "CGO_ENABLED=0", "{go}", "build", "-o", "{dir}/main", "{dir}/main.go"),
            artifact="main", processes=64, title="Go 1.19", toolchain=Toolchain(debian=("golang-go",)),
            notes="one file, standard library only; `GOMEMLIMIT` is the memory limit; 64 threads",
        ),
        Language(
            "rust", "main.rs", ("{dir}/main",),
            compile=("{rustc}", "--edition", "2021", "-O", "-C", "linker={gcc}", "-o", "{dir}/main", "{dir}/main.rs"),
            artifact="main", title="Rust 1.96 (rustc-web)", toolchain=Toolchain(debian=("rustc-web",)),
            notes="edition 2021, standard library only (Debian's `rustc` 1.63 needs /proc; `rustc-web` does not)",
        ),
        Language(
            "javascript", "main.js",
            ("{node}", "--max-old-space-size={memory_mb}", "--stack-size={stack_kb}", "{dir}/main.js"),
            compile=("{node}", "--check", "{dir}/main.js"),
            processes=32, title="JavaScript (Node.js 20)", toolchain=Toolchain(debian=("nodejs",)),
            notes="CommonJS; V8's old space is the memory limit; stack up to 64 MiB; 32 threads",
        ),
        Language(
            "ruby", "main.rb", ("{ruby}", "{dir}/main.rb"), compile=("{ruby}", "-c", "{dir}/main.rb"),
            title="Ruby 3.1", toolchain=Toolchain(debian=("ruby",)), notes="syntax checked first",
        ),
        Language(
            "php", "main.php", ("{php}", "-n", "-d", "memory_limit=-1", "{dir}/main.php"),
            compile=("{php}", "-n", "-l", "{dir}/main.php"),
            title="PHP 8.2 (CLI)", toolchain=Toolchain(debian=("php-cli",)),
            notes="no php.ini; PHP's own memory limit off (the box's is the limit)",
        ),
        Language(
            "perl", "main.pl", ("{perl}", "{dir}/main.pl"), compile=("{perl}", "-c", "{dir}/main.pl"),
            title="Perl 5.36", toolchain=Toolchain(debian=("perl",), base=True),
            notes="syntax checked first (`perl -c` runs `BEGIN` blocks, in the box)",
        ),
        Language(
            "haskell", "main.hs", ("{dir}/main",),
            compile=("{ld.so}", "--library-path", "{ghc.libs}", "{ghc.top}/bin/ghc", "-B{ghc.top}",
                     "-no-global-package-db", "-no-user-package-db", "-package-db", "{ghc.db}",
                     "-O2", "-outputdir", "/tmp/ghc", "-o", "{dir}/main", "{dir}/main.hs"),
            artifact="main", title="Haskell (GHC 9.0)", toolchain=Toolchain(debian=("ghc",)),
            notes="GHC's boot packages only; its package database is copied under /usr (Debian keeps it in /var)",
        ),
        Language(
            "ocaml", "main.ml", ("{dir}/main",),
            compile=("{ocamlopt}", "-o", "{dir}/main", "unix.cmxa", "str.cmxa", "bigarray.cmxa", "{dir}/main.ml"),
            artifact="main", title="OCaml 4.13 (native)", toolchain=Toolchain(debian=("ocaml-nox",)),
            notes="the standard library with `unix`, `str` and `bigarray` linked, as problemtools links them;"
                  " native code, system stack up to the memory limit",
        ),
        Language(
            "pascal", "main.pas", ("{dir}/main",),
            compile=("{ppcx64}", "-n", "-O2", "-Sgic", "-XS", "-Xs", "-viwn", "-Fu{fpc.units}/*", "-FE{dir}",
                     "-o{dir}/main", "{dir}/main.pas"),
            artifact="main", title="Pascal (Free Pascal 3.2)", toolchain=Toolchain(debian=("fp-compiler",)),
            notes="FPC mode with goto, inline and C operators (Debian's fpc.cfg defaults, given on the command line)",
        ),
        Language(
            "lisp", "main.lisp",
            ("{sbcl}", "--dynamic-space-size", "{memory_mb}MB", "--control-stack-size", "64MB", "--script",
             "{dir}/main.fasl"),
            compile=("{sbcl}", "--non-interactive", "--no-sysinit", "--no-userinit", "--eval",
                     '(compile-file "{dir}/main.lisp")'),
            artifact="main.fasl", title="Common Lisp (SBCL 2.2)", toolchain=Toolchain(debian=("sbcl",)),
            notes="compiled with `compile-file` (a file that does not compile is COMPILE_ERROR; warnings are not);"
                  " dynamic space is the memory limit",
        ),
        Language(
            "prolog", "main.pl",
            ("{swipl}", "--stack-limit={memory_mb}m", "-O", "-q", "-g", "main", "-t", "halt", "{dir}/main.pl"),
            compile=("{swipl}", "--on-error=status", "--on-warning=status", "-q", "-g", "halt", "{dir}/main.pl"),
            title="Prolog (SWI-Prolog 9.0)", toolchain=Toolchain(debian=("swi-prolog-nox",)),
            notes="`main/0` is run, as on Kattis; a submission's further `.pl` files are loaded with"
                  " `main.pl`; loading with an error or warning is COMPILE_ERROR; Prolog stacks up to the"
                  " memory limit",
        ),
    )
}  # fmt: skip

#: Languages contests offer that this judge cannot, and why: refused at validation with the reason.
UNAVAILABLE: dict[str, str] = {
    "python2": "Debian 12 ships no Python 2 (nor PyPy 2): Python 2 reached its end of life in 2020",
    "csharp": "Debian 12's only C# runtime (Mono) refuses to start without /proc, which no box mounts, "
    "and .NET is not packaged in Debian 12",
}

#: Limits of one build: its own CPU/wall budget, so a slow build is a compile-time verdict, not a test's.
#: 60 s as the Kattis problem package format's default compilation time: a JVM compiler (Kotlin, Scala)
#: spends 10-20 s of CPU on a one-file program across its threads, more on a busy worker.
COMPILE_LIMITS = Limits(
    cpu=60, wall=60, memory=1024 * 1024 * 1024, output=64 * 1024, file_size=64 * 1024 * 1024, processes=64,
    open_files=256, stack=64 * 1024 * 1024, scratch=256 * 1024 * 1024, stderr=16 * 1024,
)  # fmt: skip


def template_values(language: Language, source: str, std: str | None, memory_mb: int) -> dict[str, str]:
    """The submission's own placeholder values (pure); ``{dir}`` and the tools come in :func:`expand`."""
    entry = language.entry(source) if language.entry is not None else "Main"
    return {
        "std": std or language.default_standard or "",
        "memory_mb": str(memory_mb),
        "stack_kb": str(min(64 * 1024, memory_mb * 1024 // 2)),
        "entry": entry,
        "entry_path": entry.replace(".", "/"),
        "class": entry.rsplit(".", 1)[-1],
    }


def missing_tools(language: Language, tools: Mapping[str, str]) -> list[str]:
    """The tools ``language`` needs that this worker lacks (pure)."""
    return sorted(language.tools() - set(tools))


def missing_toolchain(language: Language, tools: Mapping[str, str]) -> str | None:
    """Why ``language`` cannot be judged on this worker (pure): the missing tools and where they come from."""
    missing = missing_tools(language, tools)
    if not missing:
        return None
    source = language.toolchain
    debian = debian_packages(language, missing)
    where = [f"Debian packages {' '.join(debian)}" if debian else "",
             f"Maven Central {' '.join(source.maven)}" if source.maven else ""]  # fmt: skip
    how = " and ".join(w for w in where if w)
    return (
        f"no {language.name} toolchain on this worker: {', '.join(missing)} missing "
        f"(install {how}: scripts/install --languages={language.name})"
    )


def debian_packages(language: Language, missing: list[str] | set[str]) -> tuple[str, ...]:
    """The Debian packages that bring ``language``'s ``missing`` tools (pure): its own, and the Java
    row's JDK when a JVM language lacks the JDK."""
    extra = LANGUAGES["java"].toolchain.debian if "jdk" in missing and language.name != "java" else ()
    return tuple(dict.fromkeys((*language.toolchain.debian, *extra)))


def expand(
    template: tuple[str, ...], directory: str, tools: Mapping[str, str], values: Mapping[str, str] | None = None
) -> list[str]:
    """An argv from a template (pure); a missing tool raises KeyError (check :func:`missing_tools` first)."""
    known = {**tools, **(values or {}), "dir": directory}
    return [_PLACEHOLDER.sub(lambda m: known[m.group(1)], part) for part in template]


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


def parse_standard(language: Language, std: object) -> str | None:
    """The payload's ``std`` for ``language`` (pure): None for the default; ValueError naming the field
    and the accepted values otherwise."""
    if std is None:
        return None
    if not language.standards:
        offered = ", ".join(n for n, lang in LANGUAGES.items() if lang.standards)
        raise ValueError(f"std: {language.name} has no standard to choose (only {offered} do), got {std!r}")
    if std not in language.standards:
        raise ValueError(f"std must be one of {', '.join(language.standards)} for {language.name}, got {std!r}")
    return str(std)
