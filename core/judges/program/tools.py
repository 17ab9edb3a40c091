"""Where the languages' tools are on this worker: each tool of :data:`~.languages.LANGUAGES` found
on the system path (never the worker's own interpreter, which may live where a box cannot see it),
or by a finder for what is not a plain command (a JDK's home, the dynamic loader, classpaths of the
toolchains scripts/install-languages puts under :data:`~.languages.TOOLCHAIN_DIR`)."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable

from .languages import LANGUAGES, SYSTEM_PATH, TOOLCHAIN_DIR

#: Where ``scripts/install-languages`` makes a box-ready copy of Debian's JDK (hard links, and the
#: configuration Debian keeps in /etc/java-*, which no box sees, copied in).
BOX_JDK = os.path.join(TOOLCHAIN_DIR, "jdk")


def _listdir(path: str) -> list[str]:
    """Sorted names in ``path`` ([] when it is not a readable directory). Not ``glob``: a worker that
    drops to another uid (trusted mode's test) may no longer read the interpreter's library to import it."""
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def find_jdk(root: str = "/usr/lib/jvm") -> str | None:
    """A JDK a box can run: one whose files all live under /usr (Debian's own JDK keeps its
    configuration in /etc/java-*, which no box sees; a vendor JDK such as Temurin is self-contained).
    The default ``javac``'s JDK first, then the others by name, then :data:`BOX_JDK`."""
    homes = []
    javac = shutil.which("javac", path=SYSTEM_PATH)
    if javac is not None:
        homes.append(os.path.dirname(os.path.dirname(os.path.realpath(javac))))
    with contextlib.suppress(OSError):
        homes += sorted(os.path.join(root, n) for n in os.listdir(root))
    homes.append(BOX_JDK)
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


def find_jars(name: str, *prefixes: str) -> Callable[[], str | None]:
    """A finder of a classpath: the jars under ``TOOLCHAIN_DIR/<name>`` (all of them, or those whose
    file names start with one of ``prefixes``), joined by ``:``; None when there are none."""

    def find() -> str | None:
        where = os.path.join(TOOLCHAIN_DIR, name)
        jars = [os.path.join(where, n) for n in _listdir(where) if n.endswith(".jar") and n.startswith(prefixes or "")]
        return ":".join(jars) or None

    return find


def find_ghc(root: str = "/usr/lib/ghc") -> str | None:
    """GHC's top directory, when its compiler binary is there."""
    return root if os.path.isfile(os.path.join(root, "bin", "ghc")) else None


def find_ghc_libs(root: str = "/usr/lib/ghc") -> str | None:
    """The library path GHC's own binary finds through ``$ORIGIN``: its package directories with
    shared libraries."""
    dirs = [os.path.join(root, d) for d in _listdir(root)]
    return ":".join(d for d in dirs if any(n.endswith(".so") for n in _listdir(d))) or None


def find_ghc_db() -> str | None:
    """GHC's package database where a box can read it (``scripts/install --languages`` copies it
    from Debian's /var/lib/ghc)."""
    path = os.path.join(TOOLCHAIN_DIR, "ghc", "package.conf.d")
    return path if os.path.isdir(path) else None


def find_ppcx64(root: str = "/usr/lib/x86_64-linux-gnu/fpc") -> str | None:
    """Free Pascal's compiler proper (``fpc`` is a driver that reads /etc/fpc.cfg)."""
    found = [os.path.join(root, d, "ppcx64") for d in _listdir(root)]
    found = [p for p in found if os.path.isfile(p)]
    return found[-1] if found else None


def find_fpc_units() -> str | None:
    """The units directory of the Free Pascal compiler :func:`find_ppcx64` finds."""
    compiler = find_ppcx64()
    units = os.path.join(os.path.dirname(compiler), "units", "x86_64-linux") if compiler else ""
    return units if units and os.path.isdir(units) else None


#: Tools not found by name on the system PATH (their values are used as they are).
TOOL_FINDERS: dict[str, Callable[[], str | None]] = {
    "jdk": find_jdk,
    "ld.so": find_loader,
    "kotlin.compiler": find_jars("kotlin"),
    "kotlin.stdlib": find_jars("kotlin", "kotlin-stdlib-"),
    "scala.compiler": find_jars("scala"),
    "scala.library": find_jars("scala", "scala-library-", "scala3-library_3-"),
    "ghc.top": find_ghc,
    "ghc.libs": find_ghc_libs,
    "ghc.db": find_ghc_db,
    "ppcx64": find_ppcx64,
    "fpc.units": find_fpc_units,
}


def find_tools(path: str = SYSTEM_PATH) -> dict[str, str]:
    """Absolute paths (or finder values) of every tool some language uses that exists on ``path``."""
    found = {}
    for tool in sorted({t for lang in LANGUAGES.values() for t in lang.tools()}):
        finder = TOOL_FINDERS.get(tool)
        if finder is not None:
            value = finder()
            if value is not None:
                found[tool] = value
            continue
        where = shutil.which(tool, path=path)
        if where is not None:
            found[tool] = os.path.realpath(where)  # /etc/alternatives is not in a box; its target is
    return found
