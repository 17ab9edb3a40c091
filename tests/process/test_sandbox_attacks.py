"""The program judge against hostile submissions: each attack of the audit, its verdict, and the host
afterwards (no process, file, IPC object, cgroup or box left). Needs root (CI runs as root)."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from judgequeue.core.judges import Verdict
from judgequeue.core.judges.program import ProgramJudge
from judgequeue.core.judges.sandbox.isolation import JudgeSettings
from tests.support.sandbox_host import CPU_SCALE, assert_host_clean, box_leftovers, box_uids, processes_of
from tests.support.waiting import eventually

pytestmark = pytest.mark.usefixtures("as_root")

SUM = [{"input": "2 3\n", "output": "5\n"}, {"input": "10 -4\n", "output": "6"}]
PY_SUM = "a, b = map(int, input().split())\nprint(a + b)\n"


def py(source: str, expected: str | None = None, **limits: Any) -> dict[str, Any]:
    tests = SUM if expected is None else [{"input": "", "output": expected}]
    payload: dict[str, Any] = {"language": "python", "source": source, "tests": tests}
    if CPU_SCALE != 1:
        limits.setdefault("time", 2 * CPU_SCALE)  # the default limit, on a slower CPU
    if limits:
        payload["limits"] = limits
    return payload


@pytest.fixture(scope="module", params=["submission", "test"])
def judge(sandbox_dir: str, request: pytest.FixtureRequest) -> Iterator[ProgramJudge]:
    """Every attack meets both a submission's shared box (its runner) and a box per test."""
    j = ProgramJudge(settings=JudgeSettings(sandbox_dir=sandbox_dir, box=request.param), slots=16)
    assert j.isolation.mode == "full"
    yield j
    j.close()


@pytest.fixture
async def clean(judge: ProgramJudge) -> AsyncIterator[ProgramJudge]:
    """The judge, with the host checked after the test."""
    yield judge
    await assert_host_clean(judge)


async def judged(judge: ProgramJudge, payload: dict[str, Any], tries: int = 3) -> Verdict:
    """The judge's verdict on ``payload``, judged again (``tries`` in all) while it is the
    SYSTEM_ERROR of a starved run: the judge gives no verdict on a program the machine gave no CPU,
    which says nothing of what these tests check (a VM or a control plane may run beside them)."""
    for _ in range(tries):
        verdict = await judge.judge(payload)
        if verdict.status != "SYSTEM_ERROR" or "overloaded" not in str(verdict.details.get("reason", "")):
            break
    return verdict


async def expect(judge: ProgramJudge, payload: dict[str, Any], status: str) -> dict[str, Any]:
    verdict = await judged(judge, payload)
    assert verdict.status == status, verdict.details
    assert verdict.details.get("isolation") in ("full", None)
    return verdict.details


# --- ordinary programs ------------------------------------------------------------------------------


async def test_verdicts_of_ordinary_programs(clean: ProgramJudge) -> None:
    cases = {
        "ACCEPTED": py(PY_SUM),
        "WRONG_ANSWER": py("print(5)"),
        "RUNTIME_ERROR": py("import sys\nsys.exit(3)"),
        "MEMORY_LIMIT": py("x = bytearray(600 * 1024 * 1024)\nprint(len(x))", memory_mb=128),
        "TIME_LIMIT": py("while True:\n    pass", time=0.25),
        "IDLENESS_LIMIT": py("import time\ntime.sleep(60)", time=0.25 * CPU_SCALE),  # the start fits the limit
        "OUTPUT_LIMIT": py("while True:\n    print('x' * 1000)", output_kb=64),
    }
    verdicts = await asyncio.gather(*(clean.judge(p) for p in cases.values()))
    assert [v.status for v in verdicts] == list(cases), [v.details for v in verdicts]
    assert verdicts[1].details["failed_test"] == 2  # the first test passes by luck, the second does not
    assert verdicts[2].details["reason"] == "exit status 3"
    ok = verdicts[0].details["tests"][0]
    assert ok["cpu_ms"] > 0 and ok["memory_kb"] > 0
    # time: 0.25 is 0.25 s of CPU, not rounded up to a second (how far past it the run gets depends
    # on how busy the machine is when the worker checks: no tighter bound here).
    tle = verdicts[4].details["tests"][0]
    assert 250 <= tle["cpu_ms"] < 1000 * CPU_SCALE, tle


async def test_c_and_cpp(clean: ProgramJudge) -> None:
    c_sum = '#include <stdio.h>\nint main(void){int a,b;scanf("%d %d",&a,&b);printf("%d\\n",a+b);return 0;}'
    cpp_sum = "#include <iostream>\nint main(){int a,b;std::cin>>a>>b;std::cout<<a+b<<'\\n';}"
    null_read = "int main(void){ int *p = 0; return *p; }"
    ok_c, ok_cpp, broken, segv, segv_alone = await asyncio.gather(
        clean.judge({"language": "c", "source": c_sum, "tests": SUM}),
        clean.judge({"language": "cpp", "source": cpp_sum, "tests": SUM}),
        clean.judge({"language": "c", "source": "int main( { return 0; }", "tests": SUM}),
        clean.judge({"language": "c", "source": null_read, "tests": SUM}),
        clean.judge({"language": "c", "source": null_read, "tests": SUM[:1]}),
    )
    statuses = (ok_c.status, ok_cpp.status, broken.status, segv.status, segv_alone.status)
    assert statuses == ("ACCEPTED", "ACCEPTED", "COMPILE_ERROR", "RUNTIME_ERROR", "RUNTIME_ERROR"), (ok_c, segv)
    assert "error" in broken.details["output"]
    # Tests run by the box runner report the wait status itself; a lone test (or any, with a box per
    # test) runs cold, where bubblewrap folds a signal into 128 + n.
    folded = "exit status 139 (an exit(139) or signal 11)"
    assert segv.details["reason"] == ("killed by signal 11" if clean.settings.box == "submission" else folded)
    assert segv_alone.details["reason"] == folded


# --- secrets --------------------------------------------------------------------------------------


THIS_FILE = str(Path(__file__).resolve())


async def test_no_secret_in_environment_proc_or_files(clean: ProgramJudge, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JUDGEQUEUE_POSTGRES_DSN", "postgresql://judge:s3cr3t@db/judge")
    probe = f"""
import glob, os
leaks = [k for k in os.environ if k not in ('PATH', 'TMPDIR', 'PWD', 'LC_CTYPE')]  # LC_CTYPE: Python's own
for path in glob.glob('/proc/*/environ') + ['/proc/1/environ', '/proc/{os.getpid()}/environ', '/proc/self/environ']:
    try:
        open(path, 'rb').read()
        leaks.append(path)
    except OSError:
        pass
for path in ['/etc/passwd', '/etc/shadow', '/root', '/home', '/work', '/var/run/postgresql', '/run', '/sys',
             '/proc', {THIS_FILE!r}, {clean.settings.sandbox_dir!r}]:
    try:
        os.listdir(path) if os.path.isdir(path) else open(path, 'rb').read(1)
        leaks.append(path)
    except OSError:
        pass
print(' '.join(leaks) or 'clean')
"""
    await expect(clean, py(probe, "clean"), "ACCEPTED")


async def test_cannot_read_the_workers_memory(clean: ProgramJudge) -> None:
    hidden = f"expected-output-{uuid.uuid4()}".encode()  # another job's expected output, in this process
    probe = f"""
import ctypes, glob, os
found = []
for path in ['/proc/{os.getpid()}/mem', '/proc/{os.getppid()}/mem'] + glob.glob('/proc/*/mem'):
    try:
        with open(path, 'rb') as f:
            f.read(1)
        found.append(path)
    except OSError:
        pass
libc = ctypes.CDLL(None, use_errno=True)
class iovec(ctypes.Structure):
    _fields_ = [('base', ctypes.c_void_p), ('len', ctypes.c_size_t)]
buf = ctypes.create_string_buffer(64)
local = iovec(ctypes.cast(buf, ctypes.c_void_p), 64)
remote = iovec({id(hidden)}, 64)
if libc.process_vm_readv({os.getpid()}, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0) > 0:
    found.append('process_vm_readv')
print(' '.join(found) or 'clean')
"""
    await expect(clean, py(probe, "clean"), "ACCEPTED")
    assert hidden.startswith(b"expected-output")


# --- sockets ----------------------------------------------------------------------------------------


async def test_no_socket_of_any_kind(clean: ProgramJudge) -> None:
    abstract = f"jq-attack-{uuid.uuid4().hex}"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind("\0" + abstract)
    listener.listen()
    listener.setblocking(False)
    pg_socket = "/var/run/postgresql/.s.PGSQL.5432"
    probe = f"""
import socket
reached = []
def attempt(name, family, kind, address, udp=False):
    try:
        s = socket.socket(family, kind)
        s.settimeout(1)
        if udp:
            s.sendto(b'x', address)
        else:
            s.connect(address)
        reached.append(name)
    except OSError:
        pass
attempt('postgres-tcp', socket.AF_INET, socket.SOCK_STREAM, ('127.0.0.1', 5432))
attempt('redis-tcp', socket.AF_INET, socket.SOCK_STREAM, ('127.0.0.1', 6379))
attempt('udp', socket.AF_INET, socket.SOCK_DGRAM, ('127.0.0.1', 53), udp=True)
attempt('tcp6', socket.AF_INET6, socket.SOCK_STREAM, ('::1', 6379))
attempt('postgres-unix', socket.AF_UNIX, socket.SOCK_STREAM, {pg_socket!r})
attempt('abstract', socket.AF_UNIX, socket.SOCK_STREAM, '\\0{abstract}')
attempt('netlink', socket.AF_NETLINK, socket.SOCK_RAW, (0, 0))
print(' '.join(reached) or 'none')
"""
    try:
        await expect(clean, py(probe, "none"), "ACCEPTED")
        with pytest.raises(BlockingIOError):
            listener.accept()
    finally:
        listener.close()


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/status") as f:
        return next(line.split()[1] for line in f if line.startswith("State:"))


def _existing(paths: list[str]) -> list[str]:
    return [p for p in paths if os.path.exists(p)]


def _ipc_keys() -> list[str]:
    keys = []
    for kind in ("shm", "sem", "msg"):
        with open(f"/proc/sysvipc/{kind}") as f:
            keys += [line.split()[0] for line in f.read().splitlines()[1:]]
    return keys


# --- signals, tracing, outliving ------------------------------------------------------------------


async def test_cannot_trace_stop_or_kill_the_worker_or_its_siblings(clean: ProgramJudge) -> None:
    sibling = await asyncio.create_subprocess_exec("sleep", "60")
    try:
        probe = f"""
import ctypes, os, signal
done = []
libc = ctypes.CDLL(None, use_errno=True)
if libc.ptrace(16, {os.getpid()}, 0, 0) == 0:  # PTRACE_ATTACH
    done.append('ptrace')
for pid, sig in (({os.getpid()}, signal.SIGSTOP), ({sibling.pid}, signal.SIGKILL)):
    try:
        os.kill(pid, sig)
        done.append(str(pid))
    except OSError:
        pass
print(' '.join(done) or 'none', flush=True)
try:
    os.kill(1, signal.SIGKILL)  # the box's init: the kernel ignores it from inside
    os.kill(-1, signal.SIGKILL)
except OSError:
    pass
"""
        await expect(clean, py(probe, "none"), "ACCEPTED")
        assert sibling.returncode is None and (await asyncio.to_thread(_state, sibling.pid)) == "S"
    finally:
        sibling.kill()
        await sibling.wait()


NAMESPACES_C = r"""
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
static void *nothing(void *arg) { return arg; }
static int refused(long flags) {
    long r = syscall(SYS_clone, flags | SIGCHLD, 0, 0, 0, 0);
    if (r == 0) _exit(0);
    if (r > 0) waitpid((pid_t)r, 0, 0);
    return r == -1 && errno == EPERM;
}
int main(void) {
    printf("%d %d %d %d ", refused(CLONE_NEWUSER), refused(CLONE_NEWNET), refused(CLONE_NEWNS), refused(CLONE_NEWPID));
    long r = syscall(435 /* clone3 */, 0, 0);
    printf("%d ", r == -1 && errno == ENOSYS);
    pthread_t t;
    printf("%d ", pthread_create(&t, 0, nothing, 0) == 0 && pthread_join(t, 0) == 0);
    pid_t p = fork();
    if (p == 0) _exit(0);
    printf("%d\n", p > 0 && waitpid(p, 0, 0) == p);
    return 0;
}
"""


async def test_no_namespace_of_its_own_but_threads_and_forks_work(clean: ProgramJudge) -> None:
    """clone with a namespace flag is refused and clone3 is ENOSYS (its flags cannot be read by a
    filter), in every box, so a box cannot nest user namespaces even where bubblewrap's
    --disable-userns cannot work (a container's read-only /proc/sys); threads and forks still run."""
    await expect(clean, {"language": "c", "source": NAMESPACES_C, "tests": [{"input": "", "output": "1 1 1 1 1 1 1"}]},
                 "ACCEPTED")
    await expect(clean, py("import threading\nt = threading.Thread(target=print, args=('ok',))\nt.start()\nt.join()",
                           expected="ok"), "ACCEPTED")


async def test_a_daemon_does_not_outlive_its_accepted_run(clean: ProgramJudge) -> None:
    daemon = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n        time.sleep(600)\n"
    daemon += "    os._exit(0)\n" + PY_SUM
    await expect(clean, py(daemon), "ACCEPTED")
    # assert_host_clean (the fixture) finds no process of any box uid.


async def test_files_and_ipc_objects_do_not_survive(clean: ProgramJudge) -> None:
    marker = f"jq-attack-{uuid.uuid4().hex}"
    probe = f"""
import ctypes, os
made = []
for d in ('/tmp', '/var/tmp', '/dev/shm', '/box', '/'):
    try:
        with open(os.path.join(d, {marker!r}), 'w') as f:
            f.write('x')
        made.append(d)
    except OSError:
        pass
libc = ctypes.CDLL(None, use_errno=True)
if libc.shmget(0x4A51, 600 << 20, 0o1666) >= 0:  # IPC_CREAT | 0666
    made.append('shm')
if libc.semget(0x4A52, 1, 0o1666) >= 0:
    made.append('sem')
if libc.msgget(0x4A53, 0o1666) >= 0:
    made.append('msg')
print(' '.join(made))
"""
    # The box's own /tmp is writable (private, size-capped, charged to its memory); nothing else is.
    await expect(clean, py(probe, "/tmp"), "ACCEPTED")
    assert (
        await asyncio.to_thread(_existing, [os.path.join(d, marker) for d in ("/tmp", "/var/tmp", "/dev/shm", "/")])
        == []
    )
    # Keys 0x4A51-0x4A53 as the host's /proc/sysvipc lists them (decimal).
    assert not {"19025", "19026", "19027"} & set(await asyncio.to_thread(_ipc_keys))


async def test_closing_its_fds_and_sleeping_cannot_hang_the_judge(clean: ProgramJudge) -> None:
    started = time.monotonic()
    sleeper = py("import os, time\nos.closerange(0, 65536)\ntime.sleep(3600)", time=0.5 * CPU_SCALE)
    await expect(clean, sleeper, "IDLENESS_LIMIT")
    assert time.monotonic() - started < 60  # bounded by the wall guard, not the program's hour


# --- limits over the whole tree -------------------------------------------------------------------


async def test_memory_is_limited_over_every_process(clean: ProgramJudge) -> None:
    forks = """
import os
kids = []
for _ in range(8):
    pid = os.fork()
    if pid == 0:
        block = bytearray(200 << 20)
        os._exit(0)
    kids.append(pid)
for pid in kids:
    os.waitpid(pid, 0)
print(5)
"""
    details = await expect(clean, py(forks, "5", memory_mb=256), "MEMORY_LIMIT")
    assert details["tests"][0]["memory_kb"] <= 256 * 1024


async def test_cpu_time_is_limited_over_every_process(clean: ProgramJudge) -> None:
    spin = "import os\nfor _ in range(3):\n    if os.fork() == 0:\n        break\nwhile True:\n    pass\n"
    details = await expect(clean, py(spin, "", time=1), "TIME_LIMIT")
    run = details["tests"][0]
    # Counted over the whole tree: four spinning processes stop at the limit, not at four times it.
    # (How far past it depends on how busy the machine is when the worker checks; no timing here.)
    assert 1000 <= run["cpu_ms"] < 3000, run


async def test_a_fork_bomb_is_contained(clean: ProgramJudge) -> None:
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    await expect(clean, py(bomb, "", time=1), "TIME_LIMIT")
    assert (await clean.judge(py(PY_SUM))).status == "ACCEPTED"


async def test_file_size_is_limited(clean: ProgramJudge) -> None:
    writer = "with open('/tmp/big', 'wb') as f:\n    f.write(b'x' * (8 << 20))\nprint(5)\n"
    details = await expect(clean, py(writer, "5", output_kb=64), "RUNTIME_ERROR")
    assert "File too large" in details["stderr"]  # Python ignores SIGXFSZ: the write fails with EFBIG at 1 MiB


# --- verdicts the program cannot fake ---------------------------------------------------------------


async def test_exit_status_and_stderr_do_not_fake_limits(clean: ProgramJudge) -> None:
    exit152, sigxcpu, fake_oom = await asyncio.gather(
        clean.judge(py("import sys\nsys.exit(152)")),
        clean.judge(py("import os, signal\nos.kill(os.getpid(), signal.SIGXCPU)")),
        clean.judge(py("import sys\nsys.stderr.write('MemoryError\\nstd::bad_alloc\\nout of memory\\n')\nsys.exit(1)")),
    )
    assert (exit152.status, sigxcpu.status, fake_oom.status) == ("RUNTIME_ERROR",) * 3


async def test_stdout_floods_never_hang_the_judge(clean: ProgramJudge) -> None:
    flood = py("import sys\nwhile True:\n    sys.stdout.write('x' * 65536)", output_kb=64)
    started = time.monotonic()
    for _ in range(5):
        verdicts = await asyncio.wait_for(asyncio.gather(*(clean.judge(flood) for _ in range(8))), 60)
        assert {v.status for v in verdicts} == {"OUTPUT_LIMIT"}
    assert time.monotonic() - started < 60


# --- submissions cannot see each other ----------------------------------------------------------------


async def test_each_box_has_its_own_uid_and_private_directory(clean: ProgramJudge) -> None:
    waiting = asyncio.create_task(clean.judge(py("import time\ntime.sleep(1.5)\nprint(5)", "5", time=CPU_SCALE)))
    boxes: list[str] = []

    async def box_appears() -> bool:
        await asyncio.sleep(0)
        boxes[:] = [os.path.join(clean.boxes_dir, n) for n in os.listdir(clean.boxes_dir)]
        return bool(boxes)

    await eventually(box_appears, within=5, what="a box directory")
    info = os.stat(boxes[0])
    assert info.st_mode & 0o777 == 0o700 and info.st_uid in box_uids(clean) and info.st_uid != 0
    other = os.path.join(boxes[0], "main.py")
    probe = f"import os\nseen = os.listdir('/box')\ntry:\n    open({other!r}).read()\n    seen.append('other')\n"
    probe += "except OSError:\n    pass\nprint(' '.join(sorted(seen)))\n"
    await expect(clean, py(probe, "main.py"), "ACCEPTED")
    assert (await waiting).status == "ACCEPTED"


# --- budget and test count ------------------------------------------------------------------------------


async def test_a_submission_has_a_time_budget_and_a_test_count(sandbox_dir: str) -> None:
    judge = ProgramJudge(settings=JudgeSettings(sandbox_dir=sandbox_dir, budget=1.5, max_tests=5), slots=2)
    try:
        spin = "import time\nend = time.process_time() + 0.6\nwhile time.process_time() < end:\n    pass\nprint(5)"
        payload = {"language": "python", "source": spin, "tests": [{"input": "", "output": "5"}] * 5,
                   "limits": {"time": 1}}  # fmt: skip
        verdict = await judged(judge, payload)
        assert verdict.status == "TIME_LIMIT" and "budget" in verdict.details["reason"], verdict.details
        assert len(verdict.details["tests"]) < 5
        too_many = await judge.judge({**payload, "tests": [{"input": "", "output": "5"}] * 6})
        assert too_many.status == "SYSTEM_ERROR" and "at most 5" in too_many.details["reason"]
        await assert_host_clean(judge)
    finally:
        judge.close()


# --- a crashed worker's boxes -------------------------------------------------------------------------

CRASHING_WORKER = """
import asyncio, sys
from judgequeue.core.judges.sandbox.isolation import JudgeSettings
from judgequeue.core.judges.program import ProgramJudge
judge = ProgramJudge(settings=JudgeSettings(sandbox_dir=sys.argv[1]), slots=2)
print(judge.range, judge.uid_base, flush=True)
asyncio.run(judge.judge({"language": "python", "source": "import time\\ntime.sleep(600)", "tests":
                         [{"input": "", "output": ""}], "limits": {"time": 30}}))
"""


async def test_a_crashed_workers_boxes_are_removed_on_the_next_start(sandbox_dir: str) -> None:
    sandbox_dir = os.path.join(sandbox_dir, "crash")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", CRASHING_WORKER, sandbox_dir, stdout=asyncio.subprocess.PIPE
    )
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), 30)
        first_range, uid_base = map(int, line.split())
        uids = range(uid_base, uid_base + 2)
        boxes = os.path.join(sandbox_dir, str(first_range))

        def running() -> bool:
            # Its box, not only a process of its uids: another worker on this host (another sandbox
            # directory, the same range number) runs its boxes under the same uids.
            return bool(processes_of(uids)) and os.path.isdir(boxes) and bool(os.listdir(boxes))

        await eventually(running, within=10, what="the sleeping submission running")
    finally:
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
    assert await asyncio.to_thread(os.listdir, boxes)  # the crash left its box behind
    judge = ProgramJudge(settings=JudgeSettings(sandbox_dir=sandbox_dir), slots=2)
    try:
        assert judge.range == first_range and judge.stale_removed
        await assert_host_clean(judge)
        assert box_leftovers(judge) == []
    finally:
        judge.close()
