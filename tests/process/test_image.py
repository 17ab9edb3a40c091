"""The container image, without a Docker engine: the Dockerfile's shape, and what it installs.

The Dockerfile is parsed (stages, COPY sources, USER, ENTRYPOINT, CMD) and its build stage is
replayed as far as this machine allows: the files it copies (and only those) are put in a temporary
directory, a wheel is built from them with ``pip wheel --no-deps``, and the wheel is installed into a
fresh venv. The dependencies come from the project venv through a path entry (not its ``.pth``
files, so the editable install of the working tree stays out of sight); every role's command then
runs from that venv the way ``docker run IMAGE <role>`` would.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
UID = 10001
ROLES = ("dispatcher", "worker", "reaper")


@dataclass
class Stage:
    """One ``FROM`` block: its base, name and instructions (keyword, argument text)."""

    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [arg for kw, arg in self.instructions if kw == keyword]

    def last(self, keyword: str) -> str | None:
        found = self.all(keyword)
        return found[-1] if found else None


def parse_dockerfile(text: str) -> tuple[dict[str, str], list[Stage]]:
    """Global ARG defaults and the stages (line continuations joined, comments dropped)."""
    lines: list[str] = []
    pending = ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        lines.append(pending + stripped)
        pending = ""
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in lines:
        keyword, _, rest = line.partition(" ")
        keyword = keyword.upper()
        rest = rest.strip()
        if keyword == "FROM":
            words = rest.split()
            base = words[0]
            for arg_name, value in args.items():
                base = base.replace("${" + arg_name + "}", value).replace("$" + arg_name, value)
            stage_name = words[2] if len(words) >= 3 and words[1].upper() == "AS" else None
            stages.append(Stage(base, stage_name))
        elif not stages:
            if keyword == "ARG" and "=" in rest:
                key, _, value = rest.partition("=")
                args[key] = value
        else:
            stages[-1].instructions.append((keyword, rest))
    return args, stages


def copy_sources(stage: Stage) -> list[str]:
    """Context paths the stage COPYs (``--from`` copies excluded)."""
    sources: list[str] = []
    for arg in stage.all("COPY"):
        words = [w for w in arg.split() if not w.startswith("--")]
        if "--from" in arg:
            continue
        sources.extend(words[:-1])
    return sources


def dockerignore_excludes(path: str, patterns: list[str]) -> bool:
    """Whether Docker's build context leaves ``path`` out (last matching pattern wins; ``!`` re-includes)."""
    excluded = False
    parts = path.strip("/").split("/")
    for pattern in patterns:
        negate = pattern.startswith("!")
        pat = pattern[1:] if negate else pattern
        pat = pat.strip("/")
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        if any(fnmatch.fnmatch(p, pat) or fnmatch.fnmatch(p, pat.replace("**/", "")) for p in prefixes):
            excluded = not negate
    return excluded


@pytest.fixture(scope="module")
def dockerfile() -> tuple[dict[str, str], list[Stage]]:
    return parse_dockerfile(DOCKERFILE.read_text())


# --- the Dockerfile --------------------------------------------------------------------------------


def test_multi_stage_on_slim_python_311(dockerfile: tuple[dict[str, str], list[Stage]]) -> None:
    _, stages = dockerfile
    assert len(stages) >= 2
    build, final = stages[0], stages[-1]
    for stage in stages:
        assert stage.base.startswith("python:3.11-slim"), stage.base
    assert build.name == "build"
    assert any("pip wheel" in run for run in build.all("RUN"))
    runs = " ".join(final.all("RUN"))
    assert "--no-index" in runs and f"from={build.name}" in runs  # installs only the build stage's wheels
    for tool in ("build-essential", "python -m build", "pip wheel"):
        assert tool not in runs, f"final stage must not install Python build tools ({tool})"
    # The OS packages the final stage adds are the program judge's: its isolation engine and the C and
    # C++ compilers with the C headers (only a Recommends of gcc), without recommends; each is run once.
    installs = re.findall(r"apt-get install ((?:-[-\w]+ )*)([\w.+-]+(?: [\w.+-]+)*)", runs)
    assert [(flags.split(), sorted(pkgs.split())) for flags, pkgs in installs] == [
        (["-y", "--no-install-recommends"], ["bubblewrap", "g++", "gcc", "libc6-dev"])], installs
    for check in ("bwrap --version", "setpriv --version", "| gcc -x c", "| g++ -x c++", "/tmp/c-ok && /tmp/cpp-ok"):
        assert check in runs, check
    assert "rm -rf /var/lib/apt/lists/*" in runs
    assert "pip uninstall --yes setuptools wheel" in runs



def test_runs_as_fixed_non_root_user(dockerfile: tuple[dict[str, str], list[Stage]]) -> None:
    final = dockerfile[1][-1]
    user = final.last("USER")
    assert user is not None
    uid, _, gid = user.partition(":")
    assert uid == str(UID) and gid == str(UID)  # numeric: Kubernetes runAsNonRoot can verify it
    runs = " ".join(final.all("RUN"))
    assert f"--uid {UID}" in runs and f"--gid {UID}" in runs
    from judgequeue.controllers.render import RUN_AS_USER

    assert RUN_AS_USER == UID  # what the operator renders for the role pods


def test_entrypoint_selects_the_role(dockerfile: tuple[dict[str, str], list[Stage]]) -> None:
    final = dockerfile[1][-1]
    entrypoint, cmd = final.last("ENTRYPOINT"), final.last("CMD")
    assert entrypoint is not None and cmd is not None
    assert json.loads(entrypoint) == ["judgequeue"]  # exec form: `docker run IMAGE worker` runs `judgequeue worker`
    assert json.loads(cmd) == ["--help"]
    assert final.last("EXPOSE") == "9090"


def test_dockerignore_keeps_exactly_what_the_build_copies(dockerfile: tuple[dict[str, str], list[Stage]]) -> None:
    patterns = [ln.strip() for ln in DOCKERIGNORE.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    sources = copy_sources(dockerfile[1][0])
    assert set(sources) == {"pyproject.toml", "README.md", "core", "controllers"}
    for source in sources:
        assert not dockerignore_excludes(source, patterns), f".dockerignore leaves out {source}"
    for inside in ("core/cli/__init__.py", "core/store/sql/schema.sql", "controllers/operator.py"):
        assert not dockerignore_excludes(inside, patterns), f".dockerignore leaves out {inside}"
    for other in (".venv", ".git", "tests/test_image.py", "charts/judgequeue/Chart.yaml", "core/__pycache__/x.pyc"):
        assert dockerignore_excludes(other, patterns), f".dockerignore should leave out {other}"


# --- the package the image installs ---------------------------------------------------------------


@dataclass(frozen=True)
class CleanInstall:
    wheel: Path
    bin: Path


def _site_packages(prefix: Path) -> Path:
    purelib = sysconfig.get_path("purelib", vars={"base": str(prefix), "platbase": str(prefix)})
    return Path(purelib)


@pytest.fixture(scope="session")
def clean_install(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CleanInstall]:
    """Build the wheel from exactly the build stage's COPY sources; install it into a fresh venv."""
    tmp = tmp_path_factory.mktemp("image")
    context = tmp / "src"
    context.mkdir()
    _, stages = parse_dockerfile(DOCKERFILE.read_text())
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".mypy_cache")
    for source in copy_sources(stages[0]):
        src = ROOT / source
        if src.is_dir():
            shutil.copytree(src, context / source, ignore=ignore)
        else:
            shutil.copy2(src, context / source)
    dist = tmp / "dist"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet", "--wheel-dir",
         str(dist), str(context)],
        check=True, cwd=tmp, timeout=180,
    )
    (wheel,) = dist.glob("judgequeue-*.whl")
    env_dir = tmp / "venv"
    venv.EnvBuilder(with_pip=False, clear=True).create(env_dir)
    env_python = env_dir / "bin" / "python"
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(env_python), "install", "--no-deps", "--no-index", "--quiet",
         str(wheel)],
        check=True, timeout=180,
    )
    # Dependencies from the project venv, appended after the clean venv's own site-packages. A path
    # line (not addsitedir) leaves the project's editable-install finder out.
    deps = _site_packages(Path(sys.prefix))
    clean_site = _site_packages(env_dir)
    (clean_site / "zz_project_deps.pth").write_text(str(deps) + "\n")
    yield CleanInstall(wheel=wheel, bin=env_dir / "bin")


def run(install: CleanInstall, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("JUDGEQUEUE_", "PYTHON"))}
    base["PATH"] = f"{install.bin}{os.pathsep}{base.get('PATH', '')}"
    return subprocess.run(
        [str(install.bin / "judgequeue"), *args], capture_output=True, text=True, timeout=60, cwd="/",
        env={**base, **(env or {})},
    )


def test_wheel_holds_packages_data_and_entry_points(clean_install: CleanInstall) -> None:
    with zipfile.ZipFile(clean_install.wheel) as wheel:
        names = set(wheel.namelist())
        entry_points = next(wheel.read(n).decode() for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "judgequeue/core/cli/__init__.py" in names and "judgequeue/controllers/operator.py" in names
    assert "judgequeue/core/store/sql/schema.sql" in names
    # The history too: an existing database upgrades through it.
    history = (ROOT / "core" / "store" / "migrations").glob("*.sql")
    assert {f"judgequeue/core/store/migrations/{p.name}" for p in history} <= names
    assert {"judgequeue/core/py.typed", "judgequeue/controllers/py.typed"} <= names
    assert not any(n.startswith(("core/", "controllers/", "tests/")) for n in names)  # no bare top-level modules
    assert "judgequeue = judgequeue.core.cli:main" in entry_points
    for judge in ("noop", "sleep", "program"):
        assert f"{judge} = judgequeue.core.judges" in entry_points


def test_clean_install_imports_from_itself(clean_install: CleanInstall) -> None:
    code = "import judgequeue.core, judgequeue.controllers; print(judgequeue.core.__file__)"
    out = subprocess.run([str(clean_install.bin / "python"), "-c", code], capture_output=True, text=True,
                         timeout=60, cwd="/", check=True)
    assert out.stdout.strip().startswith(str(clean_install.bin.parent)), out.stdout


def test_the_label_says_the_version_the_image_installs(
    clean_install: CleanInstall, dockerfile: tuple[dict[str, str], list[Stage]]
) -> None:
    """The runtime stage labels the image with its VERSION argument, whose default is the version
    of the wheel it installs; the build's own check (``judgequeue --version`` against VERSION) passes
    on the wheel built from exactly what the Dockerfile copies, and would fail on another VERSION."""
    _, stages = dockerfile
    final = stages[-1]
    version_args = [a.partition("=")[2] for a in final.all("ARG") if a.startswith("VERSION=")]
    assert len(version_args) == 1
    labels = " ".join(final.all("LABEL"))
    assert 'org.opencontainers.image.version="${VERSION}"' in labels
    assert re.fullmatch(rf"judgequeue-{re.escape(version_args[0])}-py3-none-any\.whl", clean_install.wheel.name)
    result = run(clean_install, "--version")
    assert result.returncode == 0 and result.stdout.strip() == f"judgequeue {version_args[0]}", result


def test_default_command_prints_help(clean_install: CleanInstall) -> None:
    result = run(clean_install, "--help")  # ENTRYPOINT + CMD
    assert result.returncode == 0, result.stderr
    for command in (*ROLES, "operator", "migrate", "status"):
        assert command in result.stdout


@pytest.mark.parametrize("command", [*ROLES, "operator", "migrate", "status", "queue", "cutover", "dlq"])
def test_role_commands_answer_help(clean_install: CleanInstall, command: str) -> None:
    result = run(clean_install, command, "--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"usage: judgequeue {command}")


@pytest.mark.parametrize("role", ROLES)
def test_role_without_configuration_stops_with_one_clear_line(clean_install: CleanInstall, role: str) -> None:
    result = run(clean_install, role)  # `docker run IMAGE worker` with no env
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "JUDGEQUEUE_" in lines[0], result.stderr


def test_judge_plugins_load_from_the_installed_entry_points(clean_install: CleanInstall) -> None:
    code = (
        "from importlib.metadata import entry_points\n"
        "eps = {e.name: e for e in entry_points(group='judgequeue.judges')}\n"
        "[e.load() for e in eps.values()]\n"
        "import json; print(json.dumps(sorted(eps)))"
    )
    out = subprocess.run([str(clean_install.bin / "python"), "-c", code], capture_output=True, text=True,
                         timeout=60, cwd="/", check=True)
    assert {"noop", "sleep", "program"} <= set(json.loads(out.stdout))
