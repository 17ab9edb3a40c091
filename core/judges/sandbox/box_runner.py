"""The runner inside a submission's box: runs the program once per test, leaving nothing between tests.

This file is not imported by the worker's code paths that run it: its source is given to the box's
own ``python3 -I -S -c`` (the worker's virtualenv is not visible in a box), as the box's PID 1
(bubblewrap's ``--as-pid-1``). It may use the standard library only, and runs on Python 3.9+.

Why it can be trusted with the exit status although it shares the program's uid:

* it is its PID namespace's init, and has no signal handlers: the kernel drops every signal a
  process of the namespace sends it (SIGKILL and SIGSTOP included);
* it is made non-dumpable before any program runs, so the program can neither ``ptrace`` it (the
  seccomp filter forbids that anyway) nor open its ``/proc/1/mem``, ``fd`` or ``environ``;
* its channel to the worker is close-on-exec and never a program's descriptor; the program gets
  only the three descriptors the worker sent for this test as 0, 1 and 2.

After each test it SIGKILLs every other process of the namespace, reaps them all (orphans are
re-parented to it) and empties ``/tmp``, then reports the direct child's raw wait status and whether
the box is clean. The worker checks the groups itself as well and discards a box that is not.

Protocol on the inherited ``SOCK_SEQPACKET`` descriptor (``argv[1]``): the runner sends ``ready``;
the worker sends ``run`` with four descriptors: stdin, stdout, stderr and the file that joins the
test's own group (cgroup v2: the test's cgroup's ``cgroup.procs``; v1: its memory group's
``tasks``), opened for writing by the worker. The program writes itself (``0``) into it between its
fork and its exec (the kernel checks that write against the credentials of whoever opened the file,
Linux 5.16+, and on v2 its cgroup namespace); when it cannot, it never runs and the runner answers
``unjoined``. Otherwise the runner answers ``done <wait status> <clean: 0|1>``. End of file from the
worker ends the runner.
"""

from __future__ import annotations

# The C modules, not their Python wrappers: ``socket``, ``signal`` and ``contextlib`` would cost
# ~15 ms of CPU to import, paid by every submission (``ctypes``, ~3 ms, is kept for prctl).
import _signal
import _socket
import ctypes
import os
import sys

PR_SET_DUMPABLE = 4
FD_BYTES = 4  # a descriptor in SCM_RIGHTS data is a C int
FDS = 4  # stdin, stdout, stderr and the file that joins the test's group
SCRATCH = "/tmp"
EXEC_FAILED = 127 << 8  # a wait status of exit(127): what a shell reports for a command it cannot run
DEFAULTS = (_signal.SIGPIPE, _signal.SIGXFSZ, _signal.SIGINT)  # what Python itself changed


def wipe(path: str, depth: int = 0) -> None:
    """Remove everything below ``path`` (the program may have made directories unwritable)."""
    if depth > 200:
        raise OSError("scratch nested too deep")
    for entry in os.scandir(path):
        if entry.is_dir(follow_symlinks=False):
            os.chmod(entry.path, 0o700)
            wipe(entry.path, depth + 1)
            os.rmdir(entry.path)
        else:
            os.unlink(entry.path)


def kill_others() -> None:
    """SIGKILL every process of the namespace but this one (it is init: ``kill(-1)`` spares it)."""
    try:  # noqa: SIM105 (contextlib is not imported: see above)
        os.kill(-1, _signal.SIGKILL)
    except ProcessLookupError:
        pass


def reap_all(child: int) -> int:
    """Wait for ``child``, then kill and reap every other process of the namespace; its wait status."""
    status = EXEC_FAILED
    while True:
        try:
            pid, got = os.waitpid(-1, 0)
        except ChildProcessError:
            return status
        except InterruptedError:
            continue
        if pid == child:
            status = got
            kill_others()  # the program is done: nothing it started may see the next test


def run_once(argv: list[str], env: dict[str, str], fds: list[int]) -> int | None:
    """Run the program on the test's first three descriptors, in the group of the fourth; its raw
    wait status, None when it could not join."""
    for fd in fds:
        os.set_inheritable(fd, False)  # the program gets them only as 0, 1 and 2
    try:
        child = spawn_joined(argv, env, fds[:3], fds[3])
        if child is None:
            return None
    finally:
        for fd in fds:
            os.close(fd)
    status = reap_all(child)
    kill_others()  # one that raced a fork (pids.max bounds how many there can be)
    reap_all(-1)
    return status


def spawn_joined(argv: list[str], env: dict[str, str], fds: list[int], join_fd: int) -> int | None:
    """Fork a child that joins the test's group (``join_fd``), takes ``fds`` as 0, 1 and 2 and
    execs the program; its pid, or None (reaped) when it could not join.

    A fork, not ``posix_spawn``: the write must come between the two. What the child's few
    steps touch is charged to the runner's group, where it is before the write.
    """
    failed_r, failed_w = os.pipe2(os.O_CLOEXEC)  # a byte: it did not join; EOF at its exec: it did
    child = os.fork()
    if child == 0:
        code = EXEC_FAILED >> 8
        try:  # whatever happens, this child never returns into the runner's loop
            try:
                os.write(join_fd, b"0")
            except OSError:
                code = 125
                os.write(failed_w, b"j")
                raise
            for target, fd in enumerate(fds):
                os.dup2(fd, target)  # inheritable: the program's 0, 1 and 2
            for number in DEFAULTS:
                _signal.signal(number, _signal.SIG_DFL)
            _signal.pthread_sigmask(_signal.SIG_SETMASK, ())
            os.execve(argv[0], argv, env)
        except OSError as exc:
            if code != 125:
                os.write(2, f"cannot run {argv[0]}: {exc.strerror}\n".encode())
        finally:
            os._exit(code)
    os.close(failed_w)
    try:
        joined = os.read(failed_r, 1) == b""
    finally:
        os.close(failed_r)
    if joined:
        return child
    reap_all(child)
    return None


def receive(channel: _socket.socket) -> tuple[bytes, list[int]]:
    """One message and the descriptors sent with it (b"" at the worker's end of file)."""
    message, ancillary, _flags, _addr = channel.recvmsg(64, _socket.CMSG_LEN(FDS * FD_BYTES))
    fds: list[int] = []
    for level, kind, data in ancillary:
        if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
            for i in range(0, len(data) - len(data) % FD_BYTES, FD_BYTES):
                fds.append(int.from_bytes(data[i : i + FD_BYTES], sys.byteorder, signed=True))
    return message, fds


def main() -> None:
    for number in range(1, _signal.NSIG):
        try:
            if callable(_signal.getsignal(number)):
                _signal.signal(number, _signal.SIG_DFL)  # init ignores what it has no handler for
        except (OSError, ValueError):
            pass
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        sys.exit(125)
    channel_fd = int(sys.argv[1])
    os.set_inheritable(channel_fd, False)
    os.closerange(3, channel_fd)  # nothing else may reach a program (the box has no /proc to list them)
    os.closerange(channel_fd + 1, 1024)
    channel = _socket.socket(fileno=channel_fd)
    argv = sys.argv[2:]
    env = {key: os.environ[key] for key in ("PATH", "TMPDIR") if key in os.environ}
    channel.send(b"ready")
    while True:
        message, fds = receive(channel)
        if not message:
            return
        if message != b"run" or len(fds) != FDS:
            sys.exit(126)
        status = run_once(argv, env, fds)
        if status is None:
            channel.send(b"unjoined")
            continue
        clean = 1
        try:
            wipe(SCRATCH)
        except (OSError, RecursionError):
            clean = 0
        channel.send(b"done %d %d" % (status, clean))


if __name__ == "__main__":
    main()
