"""scripts/tools.tsv names every outside command the install, the builds and the tests run.

A new machine of the project's kind has only its base (Python, Go, gcc, git, coreutils, ...); every
other command must come from a row of the table, so that ``scripts/tools install`` brings it before
the first long build. These tests read the shell scripts and the Python sources for the commands they
run and fail naming any the table lacks, the way a step that used mmdebstrap without declaring it
once failed only after twenty minutes of builds on a new machine.
"""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TABLE = ROOT / "scripts" / "tools.tsv"
TOOLS = ROOT / "scripts" / "tools"
SHELL_SCRIPTS = (
    "install",
    "prepare-tests",
    "test",
    "build-kube",
    "build-node",
    "build-image",
    "build-vm",
    "tools",
    "check-fresh",
)

#: What the base of a new machine of this kind has (Debian's essential and standard tools, Python,
#: Go, git), the project's own commands, and what the builds make themselves. Nothing here is installed
#: by a script; a command outside this set and outside the table is an undeclared dependency.
BASE = {
    # the shell and coreutils, util-linux, findutils, grep, sed, gawk, dpkg, apt (Debian essential)
    "awk",
    "basename",
    "bash",
    "cat",
    "chmod",
    "chown",
    "cp",
    "cut",
    "date",
    "dd",
    "df",
    "diff",
    "dirname",
    "dpkg",
    "dpkg-query",
    "du",
    "echo",
    "env",
    "find",
    "grep",
    "head",
    "id",
    "kill",
    "ln",
    "ls",
    "mkdir",
    "mktemp",
    "mv",
    "nproc",
    "printf",
    "pwd",
    "readlink",
    "realpath",
    "rm",
    "rmdir",
    "sed",
    "seq",
    "sh",
    "sha256sum",
    "sleep",
    "sort",
    "stat",
    "tail",
    "tee",
    "test",
    "touch",
    "tr",
    "true",
    "false",
    "uname",
    "uniq",
    "wc",
    "xargs",
    "yes",
    "apt-get",
    "apt-cache",
    "chroot",
    "sync",
    "timeout",
    "nohup",
    "getent",
    "hostname",
    "ps",
    "pkill",
    "umount",
    "losetup",
    "ldd",
    "service",
    "gzip",
    "zcat",
    "which",
    "cmp",
    "mkfifo",
    "nice",
    "ionice",
    "setsid",
    "groupadd",
    "useradd",
    "passwd",
    "sysctl",
    "make",
    "gpgv",
    # the languages the machine kind brings
    "python3",
    "python",
    "pip",
    "git",
    "go",
    "cc",
    "c++",
    # the project's own commands and its virtualenvs
    "judgequeue",
    "ruff",
    "mypy",
    "pytest",
    "checkov",
    # what scripts/build-kube builds into the cache and the tests run from there
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubectl",
    "kubelet",
    "kube-proxy",
    "helm",
    "pause",
}


def table_rows() -> list[tuple[str, str, str]]:
    rows = []
    for line in TABLE.read_text().splitlines():
        if line.startswith("#") or not line.strip():
            continue
        fields = line.split("\t")
        assert len(fields) == 4, f"scripts/tools.tsv: {line!r} is not tier, command, package, use"
        rows.append((fields[0], fields[1], fields[2]))
    return rows


def declared() -> set[str]:
    return {Path(command).name if command.startswith("/") else command for _, command, _ in table_rows()}


SHELL_WORDS = {
    "if",
    "then",
    "else",
    "elif",
    "fi",
    "for",
    "in",
    "do",
    "done",
    "while",
    "until",
    "case",
    "esac",
    "function",
    "return",
    "exit",
    "local",
    "export",
    "set",
    "unset",
    "shift",
    "read",
    "eval",
    "exec",
    "source",
    "trap",
    "wait",
    "command",
    "type",
    "declare",
    "mapfile",
    "cd",
    "break",
    "continue",
    "let",
    "printf",
    "echo",
    "true",
    "false",
    "test",
    "time",
    "compgen",
    "shopt",
    "hash",
    "umask",
}


#: Words before a command that are not the command: keywords, and the scripts' own runners
#: (``timed NAME COMMAND``, ``xargs -r COMMAND``).
PREFIXES = {"then", "do", "else", "if", "elif", "while", "until", "!", "exec", "time", "timed", "xargs", "-r"}


def _skeleton(text: str) -> str:
    """The script with here-documents, comments and quoted text taken out, keeping the commands of
    ``$(...)`` substitutions, even inside double quotes, as commands of their own."""
    lines, body_end = [], None
    for line in text.splitlines():
        if body_end is not None:
            if line.strip() == body_end:
                body_end = None
            continue
        heredoc = re.search(r"<<-?\s*['\"]?(\w+)['\"]?", line)
        if heredoc:
            body_end = heredoc.group(1)
        lines.append(line)
    text = "\n".join(lines)
    out: list[str] = []
    stack = ["N"]  # N: plain shell, D: inside "...", S<depth>: a $( ) inside "..."
    i = 0
    while i < len(text):
        c, top = text[i], stack[-1]
        if top == "D":
            if c == "\\":
                i += 2
                continue
            if c == '"':
                stack.pop()
                out.append("Q")
            elif text.startswith("$(", i):
                stack.append("S0")
                out.append("\n")
                i += 2
                continue
            i += 1
            continue
        if c == "#" and (i == 0 or text[i - 1] in " \t\n;"):
            i = text.find("\n", i)
            i = len(text) if i < 0 else i
            continue
        if c == "\\":
            out.append(" " if text.startswith("\\\n", i) else "x")
            i += 2
            continue
        if c == "'":
            end = text.find("'", i + 1)
            i = len(text) if end < 0 else end + 1
            out.append("Q")
            continue
        if c == '"':
            stack.append("D")
            i += 1
            continue
        if top.startswith("S"):
            depth = int(top[1:])
            if c == "(":
                stack[-1] = f"S{depth + 1}"
            elif c == ")":
                if depth == 0:
                    stack.pop()
                    out.append("\n")
                    i += 1
                    continue
                stack[-1] = f"S{depth - 1}"
        out.append(c)
        i += 1
    return "".join(out)


def shell_commands(text: str) -> set[str]:
    """The words a shell script runs as commands (first words of its simple commands), less the
    shell's own words and the script's functions."""
    functions = set(re.findall(r"^\s*([\w-]+)\(\)\s*\{", text, flags=re.M))
    skeleton = re.sub(r"\w+\+?=\([^()]*\)", " ", _skeleton(text))  # array assignments
    skeleton = re.sub(r"(?m)^\s*[^\s()$]+\)", " ", skeleton)  # case patterns: a|b*)
    skeleton = re.sub(r"\{\w+\}(?=[<>])", " ", skeleton)  # a named descriptor: exec {fd}>file
    found, segment, depth = set(), "", 0
    for c in skeleton + "\n":
        if c not in ";&|(){}\n":
            segment += c
            continue
        if c == "(":
            depth += 1
        elif c == ")":
            if depth == 0:  # a case pattern ends here, no command
                segment = ""
                continue
            depth -= 1
        words = segment.split()
        segment = ""
        while words and (re.fullmatch(r"\w+=.*", words[0]) or words[0] in PREFIXES):
            words = words[2 if words[0] == "timed" else 1 :]
        if words and re.fullmatch(r"[a-z][\w.+-]*", words[0]):
            found.add(words[0])
    return found - SHELL_WORDS - functions


def python_commands(path: Path) -> set[str]:
    """Commands a Python file runs: shutil.which("x") and the literal first word of an argv."""
    tree = ast.parse(path.read_text(), str(path))
    found: set[str] = set()
    runners = {"run", "Popen", "check_output", "check_call", "call", "create_subprocess_exec"}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        if not node.args:
            continue
        first = node.args[0]
        if name == "which" and isinstance(first, ast.Constant) and isinstance(first.value, str):
            found.add(first.value)
        elif name in runners:
            if isinstance(first, ast.List | ast.Tuple) and first.elts:
                first = first.elts[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str) and "/" not in first.value:
                found.add(first.value.split()[0])
    return found


def test_every_row_is_tier_command_package_use() -> None:
    tiers = {tier for tier, _, _ in table_rows()}
    assert tiers == {"install", "integration", "kube", "node", "vm"}


@pytest.mark.parametrize("script", SHELL_SCRIPTS)
def test_the_scripts_run_only_declared_commands(script: str) -> None:
    used = shell_commands((ROOT / "scripts" / script).read_text())
    undeclared = sorted(used - declared() - BASE - {f"scripts/{s}" for s in SHELL_SCRIPTS})
    assert not undeclared, f"scripts/{script} runs {undeclared}, which scripts/tools.tsv does not declare"


def test_the_tests_and_benchmarks_run_only_declared_commands() -> None:
    program = ROOT / "core" / "judges" / "program"
    table = (program / "languages.py").read_text() + (program / "tools.py").read_text()
    languages = set(re.findall(r'"([\w.+-]+)"', table))
    undeclared: dict[str, list[str]] = {}
    for folder in ("tests", "bench", "core", "controllers"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for command in python_commands(path) - declared() - BASE - languages:
                undeclared.setdefault(command, []).append(str(path.relative_to(ROOT)))
    assert not undeclared, f"commands run but not declared in scripts/tools.tsv: {undeclared}"


def test_a_check_names_the_missing_command_and_its_package(tmp_path: Path) -> None:
    """With a PATH that lacks the node tier's tools, ``check`` fails at once naming each with its
    package (the failure a new machine would otherwise meet after the builds)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("bash", "grep", "cut", "awk", "sort", "tr", "cat", "dirname", "id"):
        found = subprocess.run(["bash", "-c", f"command -v {tool}"], capture_output=True, text=True).stdout.strip()
        (bin_dir / tool).symlink_to(found)
    result = subprocess.run(
        [str(bin_dir / "bash"), str(TOOLS), "check", "node"],
        capture_output=True,
        text=True,
        env={"PATH": str(bin_dir)},
        timeout=30,
    )
    assert result.returncode == 1
    if not Path("/usr/sbin/mmdebstrap").exists():
        assert "missing: mmdebstrap (Debian package mmdebstrap)" in result.stderr
    assert "missing: buildah (Debian package buildah)" in result.stderr
    assert "scripts/tools install node" in result.stderr


def test_an_unknown_tier_is_refused_with_the_list() -> None:
    result = subprocess.run(["bash", str(TOOLS), "check", "nodes"], capture_output=True, text=True, timeout=30)
    assert result.returncode == 1
    assert "unknown tier 'nodes' (tiers: install integration kube node vm" in result.stderr


def test_prepare_tests_installs_the_tools_before_any_build() -> None:
    lines = (ROOT / "scripts" / "prepare-tests").read_text().splitlines()
    text = "\n".join(line for line in lines if not line.lstrip().startswith("#"))
    tools_at = text.index("scripts/tools install")
    for build in ("scripts/build-kube", "scripts/build-node", "scripts/build-image", "scripts/build-vm"):
        assert tools_at < text.index(build), f"prepare-tests runs {build} before scripts/tools install"


def test_install_with_nothing_missing_installs_nothing_and_succeeds() -> None:
    """A warm machine: ``install`` only checks (it once exited 1, silently, when nothing was missing)."""
    if subprocess.run(["bash", str(TOOLS), "check", "install"], capture_output=True, timeout=30).returncode != 0:
        pytest.skip("this machine lacks a tool of the install tier; scripts/install installs it")
    result = subprocess.run(["bash", str(TOOLS), "install", "install"], capture_output=True, text=True, timeout=30)
    assert (result.returncode, result.stderr) == (0, "")
