"""A worker pod whose program judge cannot isolate stays up and unready, naming what is missing.

The operator renders workers with ``JUDGEQUEUE_JUDGE_REFUSED=unready``: such a worker serves
``/healthz`` (alive) and ``/metrics``, answers ``/readyz`` with 503 and the judge's reason, opens no
connection and takes no job, and exits 2 when stopped. Without the variable (``judgequeue local``, a
shell) it exits 2 at once (tests/test_sandbox_fail_closed.py). Run as an unprivileged user (nobody),
which is what makes the sandbox unavailable here.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator

import pytest
import redis

from tests.conftest import REDIS_URL

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to become an unprivileged user")

NOBODY = 65534

#: Imports as root (the interpreter may live where nobody cannot read), then becomes nobody before
#: the CLI decides anything.
AS_NOBODY = f"""
import os, sys
import judgequeue.core.cli, judgequeue.core.worker, judgequeue.core.judges.program, judgequeue.core.runtime
import asyncpg, redis.asyncio, uvloop, concurrent.futures.thread, json, logging.handlers, encodings.idna
os.setgroups([])
os.setgid({NOBODY})
os.setuid({NOBODY})
sys.exit(judgequeue.core.cli.main(sys.argv[1:]))
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(port: int, path: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as response:
            return int(response.status), response.read()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read()


def wait_serving(proc: subprocess.Popen[str], port: int, deadline: float = 30.0) -> None:
    """Poll /healthz until it answers (the process must stay alive meanwhile)."""
    until = time.monotonic() + deadline
    while time.monotonic() < until:
        assert proc.poll() is None, proc.communicate()
        try:
            if get(port, "/healthz")[0] == 200:
                return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.05)  # polling an external process's port, not synchronising threads
    raise AssertionError("the worker never served /healthz")


@pytest.fixture
def queue() -> Iterator[str]:
    """A queue whose stream holds one job and the workers' group, as if dispatched already."""
    name = f"unready-{uuid.uuid4().hex[:8]}"
    client = redis.Redis.from_url(REDIS_URL)
    stream = f"jq:{{{name}}}:stream"
    client.xgroup_create(stream, "workers", id="0-0", mkstream=True)
    client.xadd(stream, {"submission": "1", "generation": "1", "attempt": "0", "outbox": "1",
                         "enqueued_at": "0", "deliveries": "0"})
    yield name
    client.delete(stream)
    client.close()


def test_an_unisolated_worker_is_alive_unready_names_the_reason_and_takes_no_job(queue: str) -> None:
    port = free_port()
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "JUDGEQUEUE_POSTGRES_DSN": "postgresql://judge:s3cr3t@127.0.0.1:1/none",
        "JUDGEQUEUE_REDIS_URL": REDIS_URL,
        "JUDGEQUEUE_QUEUE": queue,
        "JUDGEQUEUE_JUDGE": "program",
        "JUDGEQUEUE_METRICS_PORT": str(port),
        "JUDGEQUEUE_METRICS_ADDRESS": "127.0.0.1",
        "JUDGEQUEUE_JUDGE_REFUSED": "unready",
        "JUDGEQUEUE_SANDBOX_DIR": f"/tmp/jq-unready-{uuid.uuid4().hex[:8]}",
    }
    proc = subprocess.Popen([sys.executable, "-c", AS_NOBODY, "worker"], env=env, cwd="/", text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_serving(proc, port)
        status, body = get(port, "/readyz")
        assert status == 503
        readiness = json.loads(body)
        assert readiness["ready"] is False
        reason = readiness["checks"]["judge"]
        assert reason.startswith("the program judge cannot isolate untrusted code")
        assert f"runs as uid {NOBODY}, not root" in reason
        assert get(port, "/metrics")[0] == 200
        # It took no job: the entry is still undelivered and no consumer joined the group.
        client = redis.Redis.from_url(REDIS_URL)
        try:
            group = client.xinfo_groups(f"jq:{{{queue}}}:stream")[0]
            assert (group["consumers"], group["pending"]) == (0, 0)
        finally:
            client.close()
        assert get(port, "/readyz")[0] == 503  # and stays unready
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 2, err
    lines = err.strip().splitlines()
    assert lines[0].startswith("judgequeue: error: the program judge cannot isolate untrusted code"), err
    events = [json.loads(line) for line in lines[1:] if line.startswith("{")]
    assert any(e.get("reason", "").startswith("the program judge cannot isolate") for e in events), err
    assert "s3cr3t" not in err + out


def test_a_bad_refusal_setting_is_named() -> None:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "JUDGEQUEUE_POSTGRES_DSN": "postgresql://h/d",
           "JUDGEQUEUE_REDIS_URL": "redis://h", "JUDGEQUEUE_QUEUE": "q", "JUDGEQUEUE_JUDGE_REFUSED": "later"}
    done = subprocess.run([sys.executable, "-m", "judgequeue.core.cli", "worker"], capture_output=True, text=True,
                          timeout=60, env=env)
    assert done.returncode == 2
    assert "JUDGEQUEUE_JUDGE_REFUSED must be one of exit, unready, got 'later'" in done.stderr
