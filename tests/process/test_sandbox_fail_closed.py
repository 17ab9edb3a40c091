"""Fail closed: a worker that cannot isolate refuses to run the program judge, naming what is missing,
unless JUDGEQUEUE_SANDBOX=trusted says the code is trusted. Run as an unprivileged user (nobody)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator

import pytest

pytestmark = pytest.mark.usefixtures("as_root")  # to become an unprivileged user

NOBODY = 65534

#: Becomes nobody after the imports, then runs ``judgequeue <args>`` in-process. The interpreter may
#: live where nobody cannot read (a pyenv build under /root), so it has to be loaded as root first;
#: everything the worker does, including deciding its isolation, happens as nobody.
AS_NOBODY = f"""
import os, sys
import judgequeue.core.cli, judgequeue.core.worker, judgequeue.core.judges.program
import asyncpg, redis.asyncio, uvloop, concurrent.futures.thread, json, logging.handlers
os.setgroups([])
os.setgid({NOBODY})
os.setuid({NOBODY})
assert os.geteuid() == {NOBODY}
sys.exit(judgequeue.core.cli.main(sys.argv[1:]))
"""


def as_nobody(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-c", AS_NOBODY, *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env, cwd="/")


@pytest.fixture
def nobody_dir() -> Iterator[str]:
    path = f"/tmp/jq-nobody-{uuid.uuid4().hex[:8]}"
    os.mkdir(path, 0o700)
    os.chown(path, NOBODY, NOBODY)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def worker_env(sandbox_dir: str, **extra: str) -> dict[str, str]:
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "JUDGEQUEUE_POSTGRES_DSN": "postgresql://judge:s3cr3t@127.0.0.1:1/none",
        "JUDGEQUEUE_REDIS_URL": "redis://127.0.0.1:1/0",
        "JUDGEQUEUE_QUEUE": "fail-closed",
        "JUDGEQUEUE_JUDGE": "program",
        "JUDGEQUEUE_METRICS_PORT": "0",
        "JUDGEQUEUE_SANDBOX_DIR": sandbox_dir,
        **extra,
    }


def test_an_unprivileged_worker_refuses_the_program_judge(nobody_dir: str) -> None:
    done = as_nobody(["worker"], worker_env(os.path.join(nobody_dir, "sandbox")))
    assert done.returncode == 2, (done.stdout, done.stderr)
    errors = done.stderr.strip().splitlines()
    assert len(errors) == 1, done.stderr  # one clear line, before any connection is tried
    message = errors[0]
    assert message.startswith("judgequeue: error: the program judge cannot isolate untrusted code")
    assert f"runs as uid {NOBODY}, not root" in message and "JUDGEQUEUE_SANDBOX=trusted" in message
    assert "s3cr3t" not in done.stderr


def test_a_bad_sandbox_setting_names_its_variable(nobody_dir: str) -> None:
    env = worker_env(os.path.join(nobody_dir, "sandbox"), JUDGEQUEUE_SANDBOX="off")
    done = as_nobody(["worker"], env)
    assert done.returncode == 2 and "JUDGEQUEUE_SANDBOX must be one of required, trusted" in done.stderr


TRUSTED_RUN = f"""
import asyncio, json, os, concurrent.futures.thread, resource
from judgequeue.core.judges import load_judge
os.setgroups([])
os.setgid({NOBODY})
os.setuid({NOBODY})
judge = load_judge("program")
verdict = asyncio.run(judge.judge({{"language": "python", "source": "print(int(input()) * 2)",
                                   "tests": [{{"input": "21", "output": "42"}}]}}))
print(json.dumps([verdict.status, verdict.details["isolation"]]))
"""


def test_trusted_mode_runs_without_isolation_and_says_so(nobody_dir: str) -> None:
    env = worker_env(os.path.join(nobody_dir, "sandbox"), JUDGEQUEUE_SANDBOX="trusted")
    done = subprocess.run([sys.executable, "-c", TRUSTED_RUN], capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == ["ACCEPTED", "trusted"]
