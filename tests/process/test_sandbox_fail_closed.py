"""Fail closed: a worker that cannot isolate refuses to run the program judge, naming what is missing,
unless JUDGEQUEUE_SANDBOX=trusted says the code is trusted; in a pod (JUDGEQUEUE_JUDGE_REFUSED=unready)
it stays up and unready instead of exiting. Run as an unprivileged user (nobody)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator

import pytest
import redis

from tests.support.databases import REDIS_URL
from tests.support.redis_servers import free_port
from tests.support.roles import http_get, stop_process, wait_serving
from tests.support.sandbox_host import fail_closed_worker_env

pytestmark = pytest.mark.usefixtures("as_root")  # to become an unprivileged user

NOBODY = 65534

#: Becomes nobody after the imports, then runs ``judgequeue <args>`` in-process. The interpreter may
#: live where nobody cannot read (a pyenv build under /root), so it has to be loaded as root first;
#: everything the worker does, including deciding its isolation, happens as nobody.
AS_NOBODY = f"""
import os, sys
import judgequeue.core.cli, judgequeue.core.roles.worker.role, judgequeue.core.judges.program
import judgequeue.core.runtime.process
import asyncpg, redis.asyncio, uvloop, concurrent.futures.thread, json, logging.handlers, encodings.idna
os.setgroups([])
os.setgid({NOBODY})
os.setuid({NOBODY})
assert os.geteuid() == {NOBODY}
sys.exit(judgequeue.core.cli.main(sys.argv[1:]))
"""


def as_nobody(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(nobody_argv(args), capture_output=True, text=True, timeout=60, env=env, cwd="/")


def nobody_argv(args: list[str]) -> list[str]:
    """``judgequeue ARGS`` as nobody (see :data:`AS_NOBODY`)."""
    return [sys.executable, "-c", AS_NOBODY, *args]


@pytest.fixture
def nobody_dir() -> Iterator[str]:
    path = f"/tmp/jq-nobody-{uuid.uuid4().hex[:8]}"
    os.mkdir(path, 0o700)
    os.chown(path, NOBODY, NOBODY)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def worker_env(sandbox_dir: str, **extra: str) -> dict[str, str]:
    return fail_closed_worker_env(sandbox_dir, "fail-closed", **extra)


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


@pytest.fixture
def dispatched_queue() -> Iterator[str]:
    """A queue whose stream holds one job and the workers' group, as if dispatched already."""
    name = f"unready-{uuid.uuid4().hex[:8]}"
    client = redis.Redis.from_url(REDIS_URL)
    stream = f"jq:{{{name}}}:stream"
    client.xgroup_create(stream, "workers", id="0-0", mkstream=True)
    client.xadd(stream, {"submission": "1", "generation": "1", "attempt": "0", "outbox": "1",
                         "enqueued_at": "0", "deliveries": "0"})  # fmt: skip
    yield name
    client.delete(stream)
    client.close()


def test_in_a_pod_an_unisolated_worker_stays_up_unready_and_takes_no_job(
    nobody_dir: str, dispatched_queue: str
) -> None:
    port = free_port()
    env = worker_env(
        os.path.join(nobody_dir, "sandbox"), JUDGEQUEUE_REDIS_URL=REDIS_URL, JUDGEQUEUE_QUEUE=dispatched_queue,
        JUDGEQUEUE_METRICS_PORT=str(port), JUDGEQUEUE_METRICS_ADDRESS="127.0.0.1", JUDGEQUEUE_JUDGE_REFUSED="unready",
    )  # fmt: skip
    proc = subprocess.Popen(nobody_argv(["worker"]), env=env, cwd="/", stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    try:
        wait_serving(proc, port, 30, "the unready worker to serve /healthz")
        status, body = http_get(port, "/readyz")
        assert status == 503
        readiness = json.loads(body)
        assert readiness["ready"] is False
        reason = readiness["checks"]["judge"]
        assert reason.startswith("the program judge cannot isolate untrusted code")
        assert f"runs as uid {NOBODY}, not root" in reason
        assert http_get(port, "/metrics")[0] == 200
        # It took no job: the entry is still undelivered and no consumer joined the group.
        client = redis.Redis.from_url(REDIS_URL)
        try:
            group = client.xinfo_groups(f"jq:{{{dispatched_queue}}}:stream")[0]
            assert (group["consumers"], group["pending"]) == (0, 0)
        finally:
            client.close()
        assert http_get(port, "/readyz")[0] == 503  # and stays unready
    finally:
        code = stop_process(proc, 30)
        out, err = (b.decode(errors="replace") for b in proc.communicate(timeout=30))
    assert code == 2, err
    lines = err.strip().splitlines()
    assert lines[0].startswith("judgequeue: error: the program judge cannot isolate untrusted code"), err
    events = [json.loads(line) for line in lines[1:] if line.startswith("{")]
    assert any(e.get("reason", "").startswith("the program judge cannot isolate") for e in events), err
    assert "s3cr3t" not in err + out


def test_a_bad_refusal_setting_is_named(nobody_dir: str) -> None:
    done = as_nobody(["worker"], worker_env(os.path.join(nobody_dir, "sandbox"), JUDGEQUEUE_JUDGE_REFUSED="later"))
    assert done.returncode == 2
    assert "JUDGEQUEUE_JUDGE_REFUSED must be one of exit, unready, got 'later'" in done.stderr
