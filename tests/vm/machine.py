"""A throwaway cgroup v2 machine: boot the VM disk, run one script in it, collect what it left.

The disk comes from ``scripts/build-vm`` (built on first use, cached by content in
``${JUDGEQUEUE_CACHE:-/var/cache/judgequeue}``); each boot writes to a snapshot, so every run starts
from the same disk and leaves it unchanged. qemu emulates the CPU (TCG): this host's KVM is not one
Debian's kernel boots under.

What a run gets:

* the kernel command line asks systemd for the unified hierarchy only (cgroup v2);
* ``script`` runs as root from a systemd unit with ``Delegate=yes`` (it owns its cgroup subtree),
  with ``env`` as its whole environment (plus ``PATH`` and ``HOME``), bounded by ``deadline``;
* ``shares``: host directories over 9p at the guest paths given (read-only unless ``writable``);
  the job's own directory is ``/jqvm`` in the guest, with ``/jqvm/out`` for whatever it leaves;
* a network to the host through qemu's user networking: the guest is 10.0.2.15 and reaches the
  host's loopback services at 10.0.2.2 (e.g. Postgres and Redis), DNS at 10.0.2.3.

The machine always powers off or is killed by ``deadline``; :func:`run` returns the script's exit
code (None when it did not finish), its output, the serial console and the time from boot.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "scripts" / "build-vm"
GUEST_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
KERNEL_ARGS = (
    "root=/dev/vda rw console=ttyS0 systemd.unified_cgroup_hierarchy=1 net.ifnames=0 panic=-1 systemd.show_status=false"
)
POWER_OFF_GRACE = 60.0  # seconds the guest gets past the script's deadline to power off itself


@dataclass(frozen=True)
class Share:
    """A host directory mounted in the guest over 9p."""

    host: str
    guest: str
    writable: bool = False


@dataclass(frozen=True)
class Outcome:
    """How a run ended."""

    returncode: int | None  # the script's exit code; None: it did not finish (deadline, crash)
    output: str  # the script's stdout and stderr
    console: str  # the serial console: the kernel's and systemd's messages
    seconds: float  # from qemu's start to its exit
    out_dir: Path  # what the script left in /jqvm/out


def disk() -> Path:
    """The VM disk's directory, built first when it is missing or out of date (a flock makes a
    second caller wait for a build in progress)."""
    built = subprocess.run([str(BUILD)], capture_output=True, text=True, timeout=3600)
    if built.returncode != 0:
        raise RuntimeError(f"scripts/build-vm failed:\n{built.stdout[-3000:]}\n{built.stderr[-3000:]}")
    where = subprocess.run([str(BUILD), "--print-dir"], capture_output=True, text=True, check=True)
    return Path(where.stdout.strip())


def boot_script(shares: Sequence[Share], env: Mapping[str, str], deadline: float) -> str:
    """The guest's ``/jqvm/boot.sh`` (pure): mount the shares, bring the network up, run the job
    with its deadline, record its exit code, power off."""
    lines = [
        "#!/bin/sh",
        "exec >/jqvm/boot.log 2>&1",
        "set -x",
        # The unit that runs this script is not ordered after the boot-time clean-up of /tmp (it
        # starts as soon as the disk is mounted), which would remove a mount point made under /tmp
        # for a checkout there: wait for that clean-up before making any.
        "systemctl start systemd-tmpfiles-setup.service",
    ]
    for n, share in enumerate(shares):
        options = "trans=virtio,version=9p2000.L,msize=512000," + ("cache=none" if share.writable else "cache=loose,ro")
        lines += [f"mkdir -p {shlex.quote(share.guest)}", f"mount -t 9p -o {options} s{n} {shlex.quote(share.guest)}"]
    lines += [
        "ip link set lo up",
        "ip link set eth0 up && ip addr add 10.0.2.15/24 dev eth0 && ip route add default via 10.0.2.2",
        "echo 'nameserver 10.0.2.3' > /etc/resolv.conf",
        "mkdir -p /jqvm/out",
    ]
    assignments = " ".join(f"{k}={shlex.quote(v)}" for k, v in {"PATH": GUEST_PATH, "HOME": "/root", **env}.items())
    seconds = max(1, int(deadline))
    lines += [
        f"cd / && env -i {assignments} timeout -k 10 {seconds} /bin/sh /jqvm/job.sh >/jqvm/job.log 2>&1",
        "echo $? > /jqvm/rc",
        "sync",
        "poweroff -f",
    ]
    return "\n".join(lines) + "\n"


def qemu_argv(image: Path, job_dir: Path, shares: Sequence[Share], *, memory_mb: int, cpus: int) -> list[str]:
    """qemu's command line for one run (pure)."""
    argv = [
        "qemu-system-x86_64", "-machine", "q35", "-accel", "tcg,thread=multi", "-smp", str(cpus),
        "-m", str(memory_mb), "-nodefaults", "-display", "none", "-no-reboot",
        "-kernel", str(image / "vmlinuz"), "-initrd", str(image / "initrd.img"), "-append", KERNEL_ARGS,
        "-drive", f"file={image / 'disk.img'},if=virtio,format=raw,snapshot=on",
        "-serial", f"file:{job_dir / 'console.log'}",
        "-netdev", "user,id=net0", "-device", "virtio-net-pci,netdev=net0",
        "-virtfs", f"local,path={job_dir},mount_tag=jqvm,security_model=none,id=jqvm",
    ]  # fmt: skip
    for n, share in enumerate(shares):
        readonly = "" if share.writable else ",readonly=on"
        argv += ["-virtfs", f"local,path={share.host},mount_tag=s{n},security_model=none,id=s{n}{readonly}"]
    return argv


def run(
    script: str,
    *,
    job_dir: Path,
    shares: Sequence[Share] = (),
    env: Mapping[str, str] | None = None,
    deadline: float = 600.0,
    memory_mb: int = 3072,
    cpus: int = 2,
    grace: float = POWER_OFF_GRACE,
) -> Outcome:
    """Boot the VM, run ``script`` (``sh``) in it, and return how it ended; qemu is gone when this
    returns, whatever happened. ``job_dir`` (empty or new) becomes the guest's ``/jqvm``. The
    script is stopped at ``deadline`` seconds; qemu is killed ``grace`` seconds after that (boot
    included) if the guest has not powered off."""
    image = disk()
    job_dir.mkdir(parents=True, exist_ok=True)
    (job_dir / "out").mkdir(exist_ok=True)
    (job_dir / "job.sh").write_text(script)
    (job_dir / "boot.sh").write_text(boot_script(shares, env or {}, deadline))
    started = time.monotonic()
    proc = subprocess.Popen(
        qemu_argv(image, job_dir, shares, memory_mb=memory_mb, cpus=cpus),
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        qemu_said, _ = proc.communicate(timeout=deadline + grace)
    except subprocess.TimeoutExpired:
        qemu_said = b""
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    seconds = time.monotonic() - started
    rc_file = job_dir / "rc"
    returncode = int(rc_file.read_text().strip()) if rc_file.exists() and rc_file.read_text().strip() else None
    console = _text(job_dir / "console.log")
    if qemu_said:
        console += "\n[qemu] " + qemu_said.decode(errors="replace")
    return Outcome(returncode, _text(job_dir / "job.log"), console, seconds, job_dir / "out")


def _text(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:
        return ""
