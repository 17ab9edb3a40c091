"""Decide, once per worker, how the program judge isolates runs, and refuse to start without it.

Full isolation needs: bubblewrap and setpriv, root (to give each box its own uid and to create
cgroups), user namespaces that bubblewrap may create, a cgroup per box this process may create
(cgroup v1: memory/pids/cpuacct groups; cgroup v2: a delegated subtree the worker claims, see
:mod:`.cgroups.v2`), and a seccomp allow-list for the CPU architecture. When any is missing the
judge fails closed: :class:`SandboxUnavailable` names every missing piece, unless
``JUDGEQUEUE_SANDBOX=trusted`` says the code it will run is trusted (then it runs without isolation
and every verdict says so).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass

from ...base.errors import ConfigError
from . import cgroups
from .command import Isolation
from .seccomp import SeccompUnsupported, build_filter

SANDBOX_VAR = "JUDGEQUEUE_SANDBOX"
SANDBOX_DIR_VAR = "JUDGEQUEUE_SANDBOX_DIR"
MAX_TESTS_VAR = "JUDGEQUEUE_PROGRAM_MAX_TESTS"
BUDGET_VAR = "JUDGEQUEUE_PROGRAM_BUDGET"
CACHE_DIR_VAR = "JUDGEQUEUE_PROBLEM_CACHE_DIR"
CACHE_MB_VAR = "JUDGEQUEUE_PROBLEM_CACHE_MB"
BOX_VAR = "JUDGEQUEUE_PROGRAM_BOX"
BOX_SCOPES = ("submission", "test")  # one box for a submission's tests (its runner runs each), or one per test
SANDBOX_MODES = ("required", "trusted")
#: Directories a language runtime needs, bound read-only when they exist (symlinks are recreated).
RUNTIME_PATHS = ("/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin", "/etc/ld.so.cache")


class SandboxUnavailable(ConfigError):
    """Full isolation is not possible here and the code was not declared trusted."""


@dataclass(frozen=True)
class JudgeSettings:
    """The program judge's own settings (environment variables, validated at start-up)."""

    sandbox: str = "required"
    sandbox_dir: str = "/tmp/judgequeue-sandbox"
    max_tests: int = 1000
    budget: float = 120.0  # seconds of wall time for a whole submission (compile + every test)
    problem_cache_dir: str = ""  # local copies of problem packages; "" is <sandbox_dir>/problems
    problem_cache_mb: int = 1024  # bound of that cache (least recently used packages go first)
    box: str = "submission"  # see BOX_SCOPES

    @property
    def cache_dir(self) -> str:
        return self.problem_cache_dir or os.path.join(self.sandbox_dir, "problems")


def load_judge_settings(env: Mapping[str, str]) -> JudgeSettings:
    """Parse the judge's variables; a bad value raises ConfigError naming the variable (pure)."""
    sandbox = env.get(SANDBOX_VAR, "required").strip() or "required"
    if sandbox not in SANDBOX_MODES:
        raise ConfigError(f"{SANDBOX_VAR} must be one of {', '.join(SANDBOX_MODES)}, got {sandbox!r}")
    sandbox_dir = env.get(SANDBOX_DIR_VAR, "/tmp/judgequeue-sandbox")
    if not os.path.isabs(sandbox_dir):
        raise ConfigError(f"{SANDBOX_DIR_VAR} must be an absolute path, got {sandbox_dir!r}")
    max_tests = int(_bounded(env, MAX_TESTS_VAR, "1000", int, 1, 100_000, ""))
    budget = _bounded(env, BUDGET_VAR, "120", float, 1, 3600, " seconds")
    cache_dir = env.get(CACHE_DIR_VAR, "")
    if cache_dir and not os.path.isabs(cache_dir):
        raise ConfigError(f"{CACHE_DIR_VAR} must be an absolute path, got {cache_dir!r}")
    cache_mb = int(_bounded(env, CACHE_MB_VAR, "1024", int, 1, 1024 * 1024, " MiB"))
    box = env.get(BOX_VAR, "submission").strip() or "submission"
    if box not in BOX_SCOPES:
        raise ConfigError(f"{BOX_VAR} must be one of {', '.join(BOX_SCOPES)}, got {box!r}")
    return JudgeSettings(sandbox, sandbox_dir, max_tests, budget, cache_dir, cache_mb, box)


def _bounded(
    env: Mapping[str, str], var: str, default: str, kind: type[int] | type[float], low: float, high: float, unit: str
) -> float:
    """``env[var]`` (or ``default``) as ``kind`` within [low, high]; a ConfigError naming ``var`` otherwise."""
    raw = env.get(var, default)
    try:
        value = kind(raw)
    except ValueError:
        what = "an integer" if kind is int else "a number"
        raise ConfigError(f"{var} must be {what}{unit and ' of' + unit}, got {raw!r}") from None
    if not low <= value <= high:
        raise ConfigError(f"{var} must be between {low:.10g} and {high:.10g}{unit}, got {value:.10g}")
    return value


def runtime_layout(paths: tuple[str, ...] = RUNTIME_PATHS) -> tuple[tuple[str, ...], tuple[tuple[str, str], ...]]:
    """(read-only binds, symlinks) that recreate the runtime's directories inside a box."""
    binds: list[str] = []
    links: list[tuple[str, str]] = []
    for path in paths:
        if os.path.islink(path):
            links.append((os.readlink(path), path))
        elif os.path.exists(path):
            binds.append(path)
    return tuple(binds), tuple(links)


#: The capabilities root needs in the worker's container for its boxes (bit numbers of
#: ``linux/capability.h``): a uid per box (SETUID, SETGID), its directory made, owned and emptied
#: (CHOWN, DAC_OVERRIDE, FOWNER), whatever it leaves killed (KILL).
BOX_CAPABILITIES = {"CHOWN": 0, "DAC_OVERRIDE": 1, "FOWNER": 3, "KILL": 5, "SETGID": 6, "SETUID": 7}


def missing_capabilities(status: str) -> list[str]:
    """The box capabilities absent from ``CapEff`` in a ``/proc/PID/status`` text (pure)."""
    for line in status.splitlines():
        if line.startswith("CapEff:"):
            effective = int(line.split()[1], 16)
            return [name for name, bit in BOX_CAPABILITIES.items() if not effective >> bit & 1]
    return []


def missing_for_full(cgroup_roots: cgroups.Roots | str) -> list[str]:
    """Every reason full isolation is impossible on this host (empty when it is possible)."""
    missing = []
    if shutil.which("bwrap") is None:
        missing.append("bubblewrap (bwrap) is not installed")
    if shutil.which("setpriv") is None:
        missing.append("setpriv (util-linux) is not installed")
    if os.geteuid() != 0:
        missing.append(f"the worker runs as uid {os.geteuid()}, not root (needed for a uid and cgroups per box)")
    else:
        with open("/proc/self/status") as f:
            lacking = missing_capabilities(f.read())
        if lacking:
            missing.append(f"root here lacks the capabilities {', '.join(lacking)} (a container's "
                           "securityContext.capabilities.add)")
    try:
        build_filter()
    except SeccompUnsupported as exc:
        missing.append(str(exc))
    if isinstance(cgroup_roots, str):
        missing.append(cgroup_roots)
    elif os.geteuid() == 0:
        problem = cgroups.memory_controllers_usable(cgroup_roots)
        if problem:
            missing.append(problem)
    if not missing:
        problem = probe_bwrap(disable_userns=disable_userns_works())
        if problem:
            missing.append(problem)
    return missing


def disable_userns_works() -> bool:
    """Whether bubblewrap's ``--disable-userns`` can work here: it writes the box's own
    ``/proc/sys/user/max_user_namespaces``, which a container's read-only ``/proc/sys`` refuses.
    Without it a box still cannot nest namespaces: its seccomp filter refuses every namespace flag."""
    return probe_bwrap(disable_userns=True) is None


def probe_bwrap(uid: int = 65534, *, disable_userns: bool = True) -> str | None:
    """Run bubblewrap once as an unprivileged uid with the namespaces a box uses; None if it works."""
    binds, links = runtime_layout()
    argv = [
        shutil.which("setpriv") or "setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
        "--no-new-privs", "--", shutil.which("bwrap") or "bwrap", "--unshare-all", "--unshare-user",
        *(["--disable-userns"] if disable_userns else []),
        "--die-with-parent", "--as-pid-1",  # no init: nothing left to reap
    ]  # fmt: skip
    for b in binds:
        argv += ["--ro-bind", b, b]
    for target, link in links:
        argv += ["--symlink", target, link]
    argv += ["--", "/bin/true"]
    try:
        with tempfile.TemporaryDirectory() as cwd:
            done = subprocess.run(argv, capture_output=True, timeout=10, env={}, cwd=cwd)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"bubblewrap could not be started ({exc})"
    if done.returncode != 0:
        why = done.stderr.decode(errors="replace").strip().splitlines()
        return f"bubblewrap cannot create namespaces here: {why[-1] if why else done.returncode} (user namespaces?)"
    return None


def detect(settings: JudgeSettings) -> tuple[Isolation, cgroups.Roots | None]:
    """Full isolation, or trusted mode when declared; else raise SandboxUnavailable naming what is missing."""
    roots = cgroups.read_roots()
    missing = missing_for_full(roots)
    if not missing:
        assert isinstance(roots, cgroups.Roots)
        binds, links = runtime_layout()
        isolation = Isolation(
            mode="full", bwrap=shutil.which("bwrap") or "", setpriv=shutil.which("setpriv") or "",
            ro_paths=binds, symlinks=links, seccomp=build_filter(), disable_userns=disable_userns_works(),
        )  # fmt: skip
        return isolation, roots
    if settings.sandbox == "trusted":
        return Isolation(mode="trusted"), None
    raise SandboxUnavailable(
        "the program judge cannot isolate untrusted code on this worker: "
        + "; ".join(missing)
        + f". Fix that (docs/judges.md), or set {SANDBOX_VAR}=trusted if every submission is trusted code."
    )
