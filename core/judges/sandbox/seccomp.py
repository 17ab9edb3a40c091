"""The sandbox's seccomp filter: an allow-list of ordinary process system calls (pure).

bubblewrap has no policy of its own; it loads whatever classic BPF program it is given with
``--seccomp FD`` just before it runs the command. This module assembles that program: a call
outside the list fails with EPERM (a program that probes, say, ``socket`` gets an error it can
handle, not a crash), and any other architecture or the x32 ABI kills the process, so a 32-bit
``int 0x80`` cannot reach the unfiltered table.

Left out on purpose: every socket but ``socketpair`` (no ``socket``, ``connect``, ``bind``),
``ptrace`` and ``process_vm_*``, mounts and namespaces (``mount``, ``unshare``, ``setns``,
``pivot_root``, ``chroot``), SysV and POSIX IPC (``shmget``, ``semget``, ``msgget``, ``mq_open``),
keyrings, ``bpf``, ``perf_event_open``, ``userfaultfd``, ``io_uring_*``, modules, ``reboot``,
``kexec*``, ``personality``, ``modify_ldt``, uid/gid changes, ``chown`` and ``mknod``.
"""

from __future__ import annotations

import platform
import struct

#: x86_64 numbers of the allowed calls (from the kernel's ``syscall_64.tbl``).
ALLOWED_X86_64: dict[str, int] = {
    "read": 0,
    "write": 1,
    "open": 2,
    "close": 3,
    "stat": 4,
    "fstat": 5,
    "lstat": 6,
    "poll": 7,
    "lseek": 8,
    "mmap": 9,
    "mprotect": 10,
    "munmap": 11,
    "brk": 12,
    "rt_sigaction": 13,
    "rt_sigprocmask": 14,
    "rt_sigreturn": 15,
    "ioctl": 16,
    "pread64": 17,
    "pwrite64": 18,
    "readv": 19,
    "writev": 20,
    "access": 21,
    "pipe": 22,
    "select": 23,
    "sched_yield": 24,
    "mremap": 25,
    "msync": 26,
    "mincore": 27,
    "madvise": 28,
    "dup": 32,
    "dup2": 33,
    "pause": 34,
    "nanosleep": 35,
    "getitimer": 36,
    "alarm": 37,
    "setitimer": 38,
    "getpid": 39,
    "sendfile": 40,
    "sendto": 44,
    "recvfrom": 45,
    "sendmsg": 46,
    "recvmsg": 47,
    "shutdown": 48,
    "getsockname": 51,
    "getpeername": 52,
    "socketpair": 53,
    "setsockopt": 54,
    "getsockopt": 55,
    "clone": 56,
    "fork": 57,
    "vfork": 58,
    "execve": 59,
    "exit": 60,
    "wait4": 61,
    "kill": 62,
    "uname": 63,
    "fcntl": 72,
    "flock": 73,
    "fsync": 74,
    "fdatasync": 75,
    "truncate": 76,
    "ftruncate": 77,
    "getdents": 78,
    "getcwd": 79,
    "chdir": 80,
    "fchdir": 81,
    "rename": 82,
    "mkdir": 83,
    "rmdir": 84,
    "creat": 85,
    "link": 86,
    "unlink": 87,
    "symlink": 88,
    "readlink": 89,
    "chmod": 90,
    "fchmod": 91,
    "umask": 95,
    "gettimeofday": 96,
    "getrlimit": 97,
    "getrusage": 98,
    "sysinfo": 99,
    "times": 100,
    "getuid": 102,
    "getgid": 104,
    "geteuid": 107,
    "getegid": 108,
    "setpgid": 109,
    "getppid": 110,
    "getpgrp": 111,
    "setsid": 112,
    "getgroups": 115,
    "getresuid": 118,
    "getresgid": 120,
    "getpgid": 121,
    "getsid": 124,
    "rt_sigpending": 127,
    "rt_sigtimedwait": 128,
    "rt_sigqueueinfo": 129,
    "rt_sigsuspend": 130,
    "sigaltstack": 131,
    "statfs": 137,
    "fstatfs": 138,
    "getpriority": 140,
    "sched_getparam": 143,
    "sched_getscheduler": 145,
    "sched_get_priority_max": 146,
    "sched_get_priority_min": 147,
    "sched_rr_get_interval": 148,
    "mlock": 149,
    "munlock": 150,
    "prctl": 157,
    "arch_prctl": 158,
    "gettid": 186,
    "readahead": 187,
    "getxattr": 191,
    "lgetxattr": 192,
    "fgetxattr": 193,
    "time": 201,
    "futex": 202,
    "sched_setaffinity": 203,
    "sched_getaffinity": 204,
    "epoll_create": 213,
    "getdents64": 217,
    "set_tid_address": 218,
    "restart_syscall": 219,
    "fadvise64": 221,
    "timer_create": 222,
    "timer_settime": 223,
    "timer_gettime": 224,
    "timer_getoverrun": 225,
    "timer_delete": 226,
    "clock_gettime": 228,
    "clock_getres": 229,
    "clock_nanosleep": 230,
    "exit_group": 231,
    "epoll_wait": 232,
    "epoll_ctl": 233,
    "tgkill": 234,
    "get_mempolicy": 239,
    "waitid": 247,
    "openat": 257,
    "mkdirat": 258,
    "newfstatat": 262,
    "unlinkat": 263,
    "renameat": 264,
    "readlinkat": 267,
    "fchmodat": 268,
    "faccessat": 269,
    "pselect6": 270,
    "ppoll": 271,
    "set_robust_list": 273,
    "get_robust_list": 274,
    "splice": 275,
    "tee": 276,
    "sync_file_range": 277,
    "utimensat": 280,
    "epoll_pwait": 281,
    "timerfd_create": 283,
    "eventfd": 284,
    "fallocate": 285,
    "timerfd_settime": 286,
    "timerfd_gettime": 287,
    "eventfd2": 290,
    "epoll_create1": 291,
    "dup3": 292,
    "pipe2": 293,
    "preadv": 295,
    "pwritev": 296,
    "rt_tgsigqueueinfo": 297,
    "prlimit64": 302,
    "getcpu": 309,
    "sched_getattr": 315,
    "renameat2": 316,
    "getrandom": 318,
    "memfd_create": 319,
    "execveat": 322,
    "membarrier": 324,
    "copy_file_range": 326,
    "preadv2": 327,
    "pwritev2": 328,
    "statx": 332,
    "rseq": 334,
    "pidfd_open": 434,
    "clone3": 435,
    "close_range": 436,
    "faccessat2": 439,
    "epoll_pwait2": 441,
    "futex_waitv": 449,
}

AUDIT_ARCH_X86_64 = 0xC000003E
X32_SYSCALL_BIT = 0x40000000
EPERM = 1
ENOSYS = 38
#: CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET (CLONE_NEWTIME exists only
#: for clone3 and unshare, which a box cannot call).
CLONE_NAMESPACE_FLAGS = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000

_LD_W_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
_JEQ_K = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_JGE_K = 0x35  # BPF_JMP | BPF_JGE | BPF_K
_JSET_K = 0x45  # BPF_JMP | BPF_JSET | BPF_K
_RET_K = 0x06  # BPF_RET | BPF_K
RET_ALLOW = 0x7FFF0000
RET_ERRNO = 0x00050000
RET_KILL_PROCESS = 0x80000000
_NR_OFFSET = 0  # struct seccomp_data: int nr; __u32 arch; ...
_ARCH_OFFSET = 4
_ARG0_LOW_OFFSET = 16  # ... __u64 instruction_pointer; __u64 args[6]: args[0]'s low word (little-endian)


class SeccompUnsupported(RuntimeError):
    """No filter is defined for this machine's architecture."""


def _insn(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def build_filter(allowed: dict[str, int] | None = None, machine: str | None = None) -> bytes:
    """The BPF program (a packed ``struct sock_filter`` array) for ``allowed`` calls (pure).

    Layout: check the architecture (else kill), refuse the x32 ABI, answer ``clone3`` with ENOSYS
    (its flags live in memory a filter cannot read; C libraries and runtimes then fall back to
    ``clone``), let ``clone`` through only without a namespace flag, compare the call number with
    each other allowed one (jump to ALLOW on a match), fall through to ERRNO(EPERM). Refusing
    namespaces here keeps a box from nesting user namespaces even where bubblewrap's own
    ``--disable-userns`` cannot work (a container's read-only ``/proc/sys``).
    """
    machine = machine or platform.machine()
    if machine != "x86_64":
        raise SeccompUnsupported(f"no seccomp allow-list for {machine} (only x86_64)")
    table = allowed if allowed is not None else ALLOWED_X86_64
    special = {table[name] for name in ("clone", "clone3") if name in table}
    numbers = sorted(set(table.values()) - special)
    if len(numbers) > 240:  # conditional jumps reach at most 255 instructions ahead
        raise ValueError("allow-list too long for a linear filter")
    # Instructions with symbolic jump targets, resolved to relative offsets below.
    prog: list[tuple[int, str | int, str | int, int]] = [
        (_LD_W_ABS, 0, 0, _ARCH_OFFSET),
        (_JEQ_K, 1, 0, AUDIT_ARCH_X86_64),
        (_RET_K, 0, 0, RET_KILL_PROCESS),
        (_LD_W_ABS, 0, 0, _NR_OFFSET),
        (_JGE_K, "eperm", 0, X32_SYSCALL_BIT),
    ]
    if "clone3" in table:
        prog.append((_JEQ_K, "enosys", 0, table["clone3"]))
    if "clone" in table:
        prog.append((_JEQ_K, "clone", 0, table["clone"]))
    prog += [(_JEQ_K, "allow", 0, nr) for nr in numbers]
    labels = {"eperm": len(prog), "allow": len(prog) + 1, "enosys": len(prog) + 2, "clone": len(prog) + 3}
    prog += [
        (_RET_K, 0, 0, RET_ERRNO | EPERM),
        (_RET_K, 0, 0, RET_ALLOW),
        (_RET_K, 0, 0, RET_ERRNO | ENOSYS),
        (_LD_W_ABS, 0, 0, _ARG0_LOW_OFFSET),  # clone's flags: every namespace flag is in the low word
        (_JSET_K, 0, 1, CLONE_NAMESPACE_FLAGS),
        (_RET_K, 0, 0, RET_ERRNO | EPERM),
        (_RET_K, 0, 0, RET_ALLOW),
    ]

    def offset(target: str | int, at: int) -> int:
        return labels[target] - at - 1 if isinstance(target, str) else target

    return b"".join(_insn(code, offset(jt, i), offset(jf, i), k) for i, (code, jt, jf, k) in enumerate(prog))
