"""Live per-test progress, for real: a worker process with the program judge and
``JUDGEQUEUE_PROGRESS=on`` judges a problem of many tests in boxes, and an application reading
``api.verdict_events`` (progress asked for) sees the submission's progress in order, tests done
growing, then its verdict last; a few rows, not two per test. Needs root (the sandbox)."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from judgequeue.core import api
from judgequeue.core.store.events import VerdictEvent
from tests.support.roles import Roles, submit_retrying

pytestmark = pytest.mark.usefixtures("as_root")

TESTS = 30
#: Each test sleeps a little so the whole judging spans several progress intervals (1 s, the default).
SLOW_ECHO = {
    "language": "python",
    "source": "import time\ntime.sleep(0.06)\nprint(int(input()) * 2)\n",
    "tests": [{"input": str(i), "output": str(2 * i)} for i in range(TESTS)],
}


@pytest.fixture
def own_sandbox() -> Iterator[str]:
    path = f"/tmp/jq-progress-{uuid.uuid4().hex[:8]}"
    yield path
    shutil.rmtree(path, ignore_errors=True)


async def test_a_reader_sees_a_program_judgings_progress_then_its_verdict(
    pg_dsn: str, queue: str, own_sandbox: str, tmp_path: Path
) -> None:
    roles = Roles.on(pg_dsn, queue, tmp_path, JUDGEQUEUE_JUDGE="program", JUDGEQUEUE_SANDBOX_DIR=own_sandbox,
                     JUDGEQUEUE_PROGRESS="on")  # fmt: skip
    seen: list[VerdictEvent] = []
    verdict = asyncio.Event()

    async def read() -> None:
        async for event in api.verdict_events(pg_dsn, queue=queue, kinds=("verdict", "progress")):
            seen.append(event)
            if event.kind == "verdict":
                verdict.set()

    reader = asyncio.create_task(read())
    try:
        roles.start("dispatcher")
        roles.start("worker")
        submitted = time.monotonic()
        sid = await submit_retrying(pg_dsn, queue, SLOW_ECHO)
        async with asyncio.timeout(120):
            await verdict.wait()
        elapsed = time.monotonic() - submitted
    finally:
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reader
        codes = roles.stop()
    assert codes == [0, 0], roles.logs()
    mine = [e for e in seen if e.submission_id == sid]
    progress = [e for e in mine if e.kind == "progress"]
    assert mine[-1].kind == "verdict" and mine[-1].status == "ACCEPTED" and mine[-1].generation == 1, mine[-1]
    # A few rows while it ran, never two per test: at most one per 1 s interval (and the first at once).
    assert 2 <= len(progress) <= min(elapsed / 1.0 + 2, TESTS), (len(progress), elapsed)
    print(f"{TESTS} tests judged in {elapsed:.2f}s: {len(progress)} progress rows, then the verdict")
    states = [e.progress or {} for e in progress]
    assert all(e.status == "JUDGING" and e.generation == 1 for e in progress)
    assert states[0]["phase"] in ("compiled", "testing") and not states[0].get("compile_error")
    done = [s.get("tests_done", 0) for s in states]
    assert done == sorted(done) and done[-1] > 0, done
    assert all(s["tests_total"] == TESTS for s in states if s["phase"] == "testing")
    assert any(s.get("last_verdict") == "ACCEPTED" and s.get("last_time", -1) >= 0 for s in states), states
    assert [e.position for e in mine] == sorted(e.position for e in mine)
