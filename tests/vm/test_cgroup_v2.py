"""The program judge's sandbox catalogue on cgroup v2: run inside the VM, reported here test by test.

One boot runs the sandbox tests of the process tier (attacks, lane and sessions, fail-closed, the
worker as PID 1) and the cgroup v2 tests of ``tests/vm/guest`` with this checkout and its interpreter
shared read-only; each inner test is one test here, failing with the inner failure. Postgres and
Redis are the host's, reached through qemu's user network.

Also here: the VM runner itself (a script's exit code, output, files and network come back; qemu is
killed at its deadline), which the real-node tier builds on.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.databases import ADMIN_DSN, REDIS_URL
from tests.vm import machine
from tests.vm.conftest import FIGURES
from tests.vm.machine import ROOT, Share

CATALOGUE = (
    "tests/process/test_sandbox_attacks.py",
    "tests/process/test_sandbox_lane.py",
    "tests/process/test_sandbox_fail_closed.py",
    "tests/process/test_sandbox_as_pid1.py",
    "tests/vm/guest/test_delegation.py",
)
CATALOGUE_DEADLINE = 1800.0  # seconds for the whole inner run (measured: see docs/judges.md)
CPU_SCALE = 8  # see tests/support/sandbox_host.py


def inner_tests() -> list[str]:
    """The node ids of the catalogue, collected here as the guest will collect them."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *CATALOGUE],
        capture_output=True, text=True, cwd=ROOT, timeout=300, env={**os.environ, "JUDGEQUEUE_VM_GUEST": "1"},
    )  # fmt: skip
    ids = [line.strip() for line in done.stdout.splitlines() if "::" in line]
    if done.returncode != 0 or not ids:
        raise RuntimeError(f"collecting the cgroup v2 catalogue failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    return ids


INNER = inner_tests()


def shares() -> list[Share]:
    """The checkout and the interpreter's installation, read-only at their own paths (a system
    Python under /usr is the guest's own: the disk has the same Debian release)."""
    wanted: list[str] = []
    for path in sorted({str(ROOT), sys.prefix, sys.base_prefix}, key=len):
        if path.startswith("/usr") or any(path == w or path.startswith(w + "/") for w in wanted):
            continue
        wanted.append(path)
    return [Share(p, p) for p in wanted]


def from_guest(url: str) -> str:
    """A loopback URL of this host as the guest reaches it (qemu's user network: 10.0.2.2)."""
    for local in ("127.0.0.1", "localhost"):
        url = url.replace(f"@{local}:", "@10.0.2.2:").replace(f"//{local}:", "//10.0.2.2:")
    return url


@dataclass(frozen=True)
class Result:
    outcome: str  # passed, failed, error, skipped
    message: str


@dataclass(frozen=True)
class CatalogueRun:
    outcome: machine.Outcome
    results: dict[str, Result]
    kernel: str
    filesystem: str


def parse_junit(path: Path) -> dict[str, Result]:
    """Each test case of a junit report by node id (its file's module path and name)."""
    results: dict[str, Result] = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        nodeid = case.get("classname", "").replace(".", "/") + ".py::" + case.get("name", "")
        outcome, message = "passed", ""
        for kind in ("failure", "error", "skipped"):
            found = case.find(kind)
            if found is not None:
                outcome = {"failure": "failed"}.get(kind, kind)
                message = (found.get("message") or "") + "\n" + (found.text or "")
                if kind == "error" and results.get(nodeid, Result("", "")).outcome == "failed":
                    outcome = "failed"  # a teardown error after a failure: keep both messages
                break
        if nodeid in results and outcome == "passed":
            continue  # a test's teardown passing does not hide its call's failure
        results[nodeid] = Result(outcome, message.strip())
    return results


JOB = """set -u
cd {root}
uname -r > /jqvm/out/kernel
stat -fc %T /sys/fs/cgroup > /jqvm/out/filesystem
cut -d' ' -f1 /proc/uptime > /jqvm/out/uptime
exec {python} -m pytest -p no:cacheprovider -q -rfEs --junitxml=/jqvm/out/junit.xml {files}
"""


@pytest.fixture(scope="session")
def catalogue(tmp_path_factory: pytest.TempPathFactory) -> CatalogueRun:
    """One boot running the whole catalogue (the disk is built first when it is not cached)."""
    started = time.monotonic()
    machine.disk()
    FIGURES["disk_ready_seconds"] = round(time.monotonic() - started, 1)
    env = {
        "JUDGEQUEUE_VM_GUEST": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
        "JUDGEQUEUE_TEST_REDIS_URL": from_guest(REDIS_URL),
        "JUDGEQUEUE_TEST_POSTGRES_DSN": from_guest(ADMIN_DSN),
        # qemu's TCG runs a Python start ~20 times slower than this host (~0.4 s of CPU, measured).
        "JUDGEQUEUE_TEST_CPU_SCALE": str(CPU_SCALE),
    }
    job = JOB.format(root=ROOT, python=sys.executable, files=" ".join(CATALOGUE))
    outcome = machine.run(
        job, job_dir=tmp_path_factory.mktemp("vm-catalogue"), shares=shares(), env=env, deadline=CATALOGUE_DEADLINE
    )
    junit = outcome.out_dir / "junit.xml"
    results = parse_junit(junit) if junit.exists() else {}
    kernel = (outcome.out_dir / "kernel").read_text().strip() if (outcome.out_dir / "kernel").exists() else ""
    filesystem = (outcome.out_dir / "filesystem").read_text().strip() if kernel else ""
    FIGURES["catalogue_boot_to_poweroff_seconds"] = round(outcome.seconds, 1)
    if (outcome.out_dir / "uptime").exists():
        FIGURES["catalogue_boot_to_job_seconds"] = float((outcome.out_dir / "uptime").read_text())
    FIGURES["catalogue_kernel"] = kernel
    FIGURES["catalogue_results"] = {k: sum(r.outcome == k for r in results.values()) for k in ("passed", "failed")}
    return CatalogueRun(outcome, results, kernel, filesystem)


def test_the_catalogue_ran_to_its_end_on_cgroup_v2(catalogue: CatalogueRun) -> None:
    tail = catalogue.outcome.output[-4000:] or catalogue.outcome.console[-4000:]
    assert catalogue.filesystem == "cgroup2fs", f"not booted on cgroup v2:\n{tail}"
    assert catalogue.outcome.returncode is not None, f"the inner run did not finish in {CATALOGUE_DEADLINE} s:\n{tail}"
    assert set(catalogue.results) == set(INNER), (
        f"collected here but not reported there: {sorted(set(INNER) - set(catalogue.results))}; "
        f"reported but not collected: {sorted(set(catalogue.results) - set(INNER))}\n{tail}"
    )
    assert catalogue.outcome.returncode == 0, tail


@pytest.mark.parametrize("inner", INNER)
def test_on_cgroup_v2(catalogue: CatalogueRun, inner: str) -> None:
    result = catalogue.results.get(inner)
    if result is None:
        tail = catalogue.outcome.output[-3000:] or catalogue.outcome.console[-3000:]
        pytest.fail(f"{inner} did not report from the VM (exit {catalogue.outcome.returncode}):\n{tail}")
    if result.outcome != "passed":
        pytest.fail(f"{inner} {result.outcome} on cgroup v2 (Linux {catalogue.kernel}):\n{result.message}")


# --- the runner itself ----------------------------------------------------------------------------

PROBE = """set -eu
cat /proc/self/cgroup
stat -fc %T /sys/fs/cgroup
cat "$SHARED/in.txt"
echo from-the-guest > /jqvm/out/back.txt
python3 -c 'import socket, sys; socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10).close()' \\
    10.0.2.2 "$PORT"
echo reached-the-host
exit 3
"""


def test_the_runner_runs_a_script_and_brings_back_its_exit_code_output_and_files(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    # Shared at its own path under /tmp, as a checkout under /tmp is: the guest's boot-time clean-up
    # of /tmp must not remove the mount point.
    shared = Path(tempfile.mkdtemp(dir="/tmp", prefix="jq-vm-share-"))
    request.addfinalizer(lambda: shutil.rmtree(shared))
    (shared / "in.txt").write_text("from-the-host\n")
    port = REDIS_URL.rsplit(":", 1)[1].split("/")[0]
    outcome = machine.run(
        PROBE, job_dir=tmp_path / "job", shares=[Share(str(shared), str(shared))],
        env={"SHARED": str(shared), "PORT": port}, deadline=300,
    )  # fmt: skip
    FIGURES["probe_boot_to_poweroff_seconds"] = round(outcome.seconds, 1)
    assert outcome.returncode == 3, outcome.output + outcome.console[-3000:]
    lines = outcome.output.splitlines()
    assert lines[0] == "0::/system.slice/jqvm.service" and lines[1] == "cgroup2fs", lines  # delegated, v2 only
    assert lines[2:] == ["from-the-host", "reached-the-host"], lines
    assert (outcome.out_dir / "back.txt").read_text() == "from-the-guest\n"


def test_the_runner_kills_the_machine_at_its_deadline(tmp_path: Path) -> None:
    started = time.monotonic()
    outcome = machine.run("sleep 600\n", job_dir=tmp_path / "job", deadline=5, grace=0)
    assert outcome.returncode is None and time.monotonic() - started < 60
    qemus = subprocess.run(["pgrep", "-f", str(tmp_path / "job")], capture_output=True, text=True)
    assert qemus.stdout == "", "qemu outlived its deadline"
