"""The program judge in a worker that is its PID namespace's init, as in a pod (the image's entry
point is the worker itself): every process a box leaves to it is reaped, none stays a zombie.

bubblewrap's monitor exits without waiting for the namespace's init, which is then re-parented to
PID 1. Without reaping, every test left one zombie in the worker's pod, each holding a pid of the
pod's limit. Needs root (CI runs as root): the worker starts under ``unshare --pid --fork``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

pytestmark = pytest.mark.usefixtures("as_root")

WORKER_AS_PID1 = """
import asyncio, json, os, sys
from judgequeue.core.judges.sandbox.isolation import JudgeSettings
from judgequeue.core.judges.program import ProgramJudge

assert os.getpid() == 1


def zombies():
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] == "Z" and int(fields[1]) == 1:
            found.append(int(pid))
    return found


LEAVES_A_CHILD = "import os, time\\nif os.fork() == 0:\\n    time.sleep(60)\\n"


async def main():
    judge = ProgramJudge(settings=JudgeSettings(sandbox_dir=sys.argv[1]), slots=2)
    tests = [{"input": f"{i} {i}", "output": str(2 * i)} for i in range(6)]
    source = "a, b = map(int, input().split())\\nprint(a + b)\\n"
    verdicts = await asyncio.gather(
        judge.judge({"language": "python", "source": source, "tests": tests}),
        # fails on its first test: the run armed for the second is killed unused
        judge.judge({"language": "python", "source": "print(0)", "tests": tests}),
        # leaves a child behind: the box's init is still waiting for it when the program is done
        judge.judge({"language": "python", "source": LEAVES_A_CHILD + source, "tests": tests[:2]}),
        judge.judge({"language": "python", "source": "while True: pass", "tests": tests[:1],
                     "limits": {"time": 0.2}}),
    )
    print(json.dumps({"verdicts": [v.status for v in verdicts], "zombies": zombies()}))


asyncio.run(main())
"""


def test_a_worker_that_is_pid_1_leaves_no_zombie(sandbox_dir: str) -> None:
    unshare = shutil.which("unshare")
    assert unshare, "util-linux's unshare is part of the test environment"
    done = subprocess.run(
        [unshare, "--pid", "--fork", "--mount-proc", sys.executable, "-c", WORKER_AS_PID1, sandbox_dir],
        capture_output=True, text=True, timeout=120, env={**os.environ},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["verdicts"] == ["ACCEPTED", "WRONG_ANSWER", "ACCEPTED", "TIME_LIMIT"]
    assert report["zombies"] == []
