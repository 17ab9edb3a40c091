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
the worker sends ``run`` with three descriptors (stdin, stdout, stderr); the runner answers
``done <wait status> <clean: 0|1>``. End of file from the worker ends the runner.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import sys

PR_SET_DUMPABLE = 4
SCRATCH = "/tmp"
EXEC_FAILED = 127 << 8  # a wait status of exit(127): what a shell reports for a command it cannot run


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
            # The program is done: nothing it started may see the next test.
            with contextlib.suppress(ProcessLookupError):
                os.kill(-1, signal.SIGKILL)


def run_once(argv: list[str], env: dict[str, str], fds: list[int]) -> int:
    """Run the program on the test's three descriptors; its raw wait status."""
    for fd in fds:
        os.set_inheritable(fd, False)  # the program gets them only as 0, 1 and 2
    actions = [(os.POSIX_SPAWN_DUP2, fd, target) for target, fd in enumerate(fds)]
    defaults = [signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT]  # what Python itself changed
    try:
        child = os.posix_spawn(argv[0], argv, env, file_actions=actions, setsigdef=defaults, setsigmask=())
    except OSError as exc:
        os.write(fds[2], f"cannot run {argv[0]}: {exc.strerror}\n".encode())
        return EXEC_FAILED
    finally:
        for fd in fds:
            os.close(fd)
    status = reap_all(child)
    with contextlib.suppress(ProcessLookupError):  # a kill that raced a fork (pids.max bounds the forks)
        os.kill(-1, signal.SIGKILL)
    reap_all(-1)
    return status


def main() -> None:
    for number in range(1, signal.NSIG):
        try:
            if callable(signal.getsignal(number)):
                signal.signal(number, signal.SIG_DFL)  # init ignores what it has no handler for
        except (OSError, ValueError):
            pass
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        sys.exit(125)
    channel_fd = int(sys.argv[1])
    os.set_inheritable(channel_fd, False)
    os.closerange(3, channel_fd)  # nothing else may reach a program (the box has no /proc to list them)
    os.closerange(channel_fd + 1, 1024)
    channel = socket.socket(fileno=channel_fd)
    argv = sys.argv[2:]
    env = {key: os.environ[key] for key in ("PATH", "TMPDIR") if key in os.environ}
    channel.send(b"ready")
    while True:
        message, fds, _flags, _addr = socket.recv_fds(channel, 64, 3)
        if not message:
            return
        if message != b"run" or len(fds) != 3:
            sys.exit(126)
        status = run_once(argv, env, fds)
        clean = 1
        try:
            wipe(SCRATCH)
        except (OSError, RecursionError):
            clean = 0
        channel.send(b"done %d %d" % (status, clean))


if __name__ == "__main__":
    main()
