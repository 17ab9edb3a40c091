"""A real Kubernetes node for the node test tier: kubelet, kube-proxy, containerd, runc and CNI.

The node lives in a network namespace of its own, joined to the host by a veth pair: the host
side holds the address the API server (and the Postgres and Redis the pods use) listen on, the
node side the node's InternalIP. Pods get addresses on a CNI bridge inside that namespace and
leave it masqueraded, so nothing in the host's own network changes. kubelet, kube-proxy and
containerd share one private mount namespace (kubelet mounts volumes that containerd bind-mounts
into containers) in which the host sysctls kubelet insists on are bind-mounted from files, so
the host's values stay as they are. Each node has its own cgroup root below every hierarchy.

kubelet and kube-proxy are built by ``scripts/build-kube`` at the control plane's release;
containerd, runc and the CNI plugins are Debian's and the pause image is compiled from
kubernetes' own source by ``scripts/build-node``; the judgequeue image is the Dockerfile's, built
by ``scripts/build-image``. Every wait has a deadline; a component that exits early fails it
with its log's tail.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from tests.kube.cluster import ROOT, Cluster, Component, wait_until

CNI_BIN = Path("/usr/lib/cni")
RUNC = shutil.which("runc") or "/usr/sbin/runc"
#: Host sysctls kubelet sets when they differ (kubelet's ``setupKernelTunables``): seen through
#: files of these values in the node's mount namespace, the host's own stay untouched.
KUBELET_SYSCTLS = {
    "vm/overcommit_memory": "1",
    "vm/panic_on_oom": "0",
    "kernel/panic": "10",
    "kernel/panic_on_oops": "1",
    "kernel/keys/root_maxkeys": "1000000",
    "kernel/keys/root_maxbytes": "25000000",
}


class NodeError(RuntimeError):
    """The node could not be set up or a component of it died."""


def run(*argv: str, check: bool = True, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    if check and result.returncode != 0:
        why = result.stderr.strip() or result.stdout.strip()
        raise NodeError(f"{' '.join(argv)} exited {result.returncode}: {why}")
    return result


def script_output(script: str, *args: str, tree: Path = ROOT) -> dict[str, str]:
    """Run one of scripts/build-* of ``tree`` (this checkout, or an earlier revision's tree: see
    tests/support/revisions.py), building on demand, and parse its ``KEY=value`` lines."""
    done = subprocess.run([str(tree / "scripts" / script), *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise NodeError(f"{tree}/scripts/{script} failed:\n{done.stderr[-3000:]}")
    return dict(line.split("=", 1) for line in done.stdout.split() if "=" in line)


def cgroup_v1() -> bool:
    """Whether this host runs the legacy (v1 or hybrid) cgroup hierarchy."""
    return not Path("/sys/fs/cgroup/cgroup.controllers").exists()


@dataclass
class Addresses:
    """The node's addresses: a /24 for the veth pair and one for its pods, picked at random so two
    runs on one machine do not collide."""

    host: str
    node: str
    pod_subnet: str

    @classmethod
    def pick(cls) -> Addresses:
        taken = run("ip", "-o", "addr").stdout
        for _ in range(50):
            n = random.randint(1, 250)
            if f"10.213.{n}." not in taken and f"10.214.{n}." not in taken:
                return cls(host=f"10.213.{n}.1", node=f"10.213.{n}.2", pod_subnet=f"10.214.{n}.0/24")
        raise NodeError("no free 10.213.x.0/24 for a test node")


@dataclass
class RealNode:
    """One node registered with ``cluster`` (whose API server must listen on ``addresses.host``)."""

    cluster: Cluster
    workdir: Path
    addresses: Addresses
    name: str = "node-1"
    images: list[Path] = field(default_factory=list)
    suffix: str = field(default_factory=lambda: os.urandom(3).hex())
    components: dict[str, Component] = field(default_factory=dict)
    holder: subprocess.Popen[bytes] | None = None

    @property
    def netns(self) -> str:
        return f"jq-{self.suffix}"

    @property
    def socket(self) -> Path:
        return self.workdir / "containerd" / "containerd.sock"

    @property
    def cgroup_root(self) -> str:
        return f"/jq-node-{self.suffix}"

    # -- network --------------------------------------------------------------------------------
    @staticmethod
    def make_network(addresses: Addresses, suffix: str) -> None:
        """The node's network namespace and the veth pair to the host (before the API server starts,
        which listens on the host end)."""
        netns, host_if, node_if = f"jq-{suffix}", f"jqh{suffix}", f"jqn{suffix}"
        run("ip", "netns", "add", netns)
        run("ip", "link", "add", host_if, "type", "veth", "peer", "name", node_if)
        run("ip", "link", "set", node_if, "netns", netns)
        run("ip", "addr", "add", f"{addresses.host}/24", "dev", host_if)
        run("ip", "link", "set", host_if, "up")
        run("ip", "-n", netns, "addr", "add", f"{addresses.node}/24", "dev", node_if)
        run("ip", "-n", netns, "link", "set", node_if, "up")
        run("ip", "-n", netns, "link", "set", "lo", "up")
        run("ip", "-n", netns, "route", "add", "default", "via", addresses.host)
        run("ip", "netns", "exec", netns, "sysctl", "-qw", "net.ipv4.ip_forward=1")

    @staticmethod
    def remove_network(suffix: str) -> None:
        run("ip", "link", "del", f"jqh{suffix}", check=False)
        run("ip", "netns", "del", f"jq-{suffix}", check=False)

    # -- configuration files ----------------------------------------------------------------------
    def _write_configs(self, pause_image: str) -> None:
        w = self.workdir
        for d in ("containerd/root", "containerd/state", "cni", "kubelet", "pod-logs", "sysctl", "runc"):
            (w / d).mkdir(parents=True, exist_ok=True)
        (w / "containerd.toml").write_text(f"""version = 2
root = "{w}/containerd/root"
state = "{w}/containerd/state"
[grpc]
  address = "{self.socket}"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{pause_image}"
  # root here lacks CAP_SYS_RESOURCE: runc may not lower a container's oom_score_adj below its own
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "{RUNC}"
        Root = "{w}/runc"
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_BIN}"
    conf_dir = "{w}/cni"
""")
        (w / "cni" / "10-judgequeue.conflist").write_text(json.dumps({
            "cniVersion": "1.0.0", "name": "jq-pods",
            "plugins": [
                {"type": "bridge", "bridge": "jqbr0", "isGateway": True, "ipMasq": True, "hairpinMode": True,
                 "ipam": {"type": "host-local", "ranges": [[{"subnet": self.addresses.pod_subnet}]],
                          "routes": [{"dst": "0.0.0.0/0"}]}},
                {"type": "portmap", "capabilities": {"portMappings": True}},
            ],
        }))  # fmt: skip
        kubeconfig = yaml.safe_load(self.cluster.kubeconfig.read_text())
        (w / "kubeconfig").write_text(yaml.safe_dump(kubeconfig))
        kubelet: dict[str, object] = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
            "address": self.addresses.node, "healthzBindAddress": self.addresses.node, "readOnlyPort": 0,
            # The API server reaches kubelet (logs, exec) without a client certificate: only the
            # node's own veth leads here.
            "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
            "authorization": {"mode": "AlwaysAllow"},
            "cgroupDriver": "cgroupfs", "cgroupRoot": self.cgroup_root,
            "containerRuntimeEndpoint": f"unix://{self.socket}",
            "failSwapOn": False, "podLogsDir": str(w / "pod-logs"), "resolvConf": "/etc/resolv.conf",
            "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%",
                             "nodefs.inodesFree": "1%"},
            "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
            "serializeImagePulls": False, "maxPods": 60, "staticPodPath": "",
            "syncFrequency": "5s", "nodeStatusUpdateFrequency": "5s",
        }  # fmt: skip
        if cgroup_v1():
            kubelet["failCgroupV1"] = False  # kubelet 1.35+ refuses cgroup v1 hosts unless told
        (w / "kubelet.yaml").write_text(yaml.safe_dump(kubelet))
        (w / "kube-proxy.yaml").write_text(yaml.safe_dump({
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1", "kind": "KubeProxyConfiguration",
            "clientConnection": {"kubeconfig": str(w / "kubeconfig")}, "mode": "iptables",
            "hostnameOverride": self.name, "clusterCIDR": self.addresses.pod_subnet,
            "bindAddress": self.addresses.node, "healthzBindAddress": f"{self.addresses.node}:10256",
            "metricsBindAddress": f"{self.addresses.node}:10249",
            "conntrack": {"maxPerCore": 0},  # the conntrack table size is the host's: leave it
        }))  # fmt: skip
        for key, value in KUBELET_SYSCTLS.items():
            (w / "sysctl" / key.replace("/", ".")).write_text(value + "\n")

    # -- processes ------------------------------------------------------------------------------
    def _start_holder(self) -> None:
        """A process that holds the node's mount namespace, inside its network namespace.

        ``ip netns exec`` would remount /sys and lose the cgroup mounts below it (kubelet: "failed to
        find cgroup mounts"), so the mount namespace comes first, keeps the host's cgroup tree aside,
        enters the network namespace, mounts that namespace's sysfs and puts the cgroup tree back.
        """
        w = self.workdir
        lines = [
            "set -e",
            f"mkdir -p {w}/host-cgroup /run/netns",
            f"mount --rbind /sys/fs/cgroup {w}/host-cgroup",
            f"exec nsenter --net=/run/netns/{self.netns} -- sh -e {w}/holder-inner.sh",
        ]
        inner = [
            "mount -t sysfs sysfs /sys",
            f"mount --rbind {w}/host-cgroup /sys/fs/cgroup",
            "mount -t tmpfs tmpfs /run/netns",  # the pods' network namespaces, private to the node
            *(f"mount --bind {w}/sysctl/{key.replace('/', '.')} /proc/sys/{key}" for key in KUBELET_SYSCTLS),
            "echo ready",
            "exec sleep infinity",
        ]
        (w / "holder.sh").write_text("\n".join(lines) + "\n")
        (w / "holder-inner.sh").write_text("\n".join(inner) + "\n")
        self.holder = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "--", "sh", str(w / "holder.sh")],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
        )  # fmt: skip
        assert self.holder.stdout is not None
        line = self.holder.stdout.readline()
        if line.strip() != b"ready":
            err = self.holder.stderr.read().decode() if self.holder.stderr else ""
            raise NodeError(f"the node's mount namespace could not be set up: {err.strip()}")

    def _in_node(self, name: str, argv: list[str]) -> Component:
        assert self.holder is not None
        log = self.workdir / f"{name}.log"
        with log.open("ab") as handle:
            process = subprocess.Popen(
                ["nsenter", f"--target={self.holder.pid}", "--mount", "--net", "--", *argv],
                stdout=handle, stderr=subprocess.STDOUT, start_new_session=True,
            )
        component = Component(name, process, log)
        self.components[name] = component
        return component

    def _make_cgroup_root(self) -> None:
        for hierarchy in Path("/sys/fs/cgroup").iterdir():
            if hierarchy.is_dir() and not hierarchy.is_symlink() and (hierarchy / "cgroup.procs").exists():
                (hierarchy / self.cgroup_root.lstrip("/")).mkdir(exist_ok=True)

    def _remove_cgroup_root(self) -> None:
        for hierarchy in Path("/sys/fs/cgroup").iterdir():
            top = hierarchy / self.cgroup_root.lstrip("/")
            if not top.is_dir():
                continue
            for d in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
                with contextlib.suppress(OSError):
                    d.rmdir()
            with contextlib.suppress(OSError):
                top.rmdir()

    def start_runtime(self) -> None:
        """containerd, until its socket answers."""
        containerd = self._in_node("containerd", ["containerd", "--config", str(self.workdir / "containerd.toml")])
        wait_until("containerd answering", lambda: self.ctr("version", check=False).returncode == 0, timeout=30,
                   check=containerd.check)

    def start_kubelet(self) -> None:
        bins = self.cluster.bin_dir
        self._in_node("kubelet", [
            str(bins / "kubelet"), f"--config={self.workdir / 'kubelet.yaml'}",
            f"--kubeconfig={self.workdir / 'kubeconfig'}", f"--root-dir={self.workdir / 'kubelet'}",
            f"--hostname-override={self.name}", f"--node-ip={self.addresses.node}", "-v=1",
        ])  # fmt: skip
        if "kube-proxy" not in self.components or self.components["kube-proxy"].process.poll() is not None:
            config = self.workdir / "kube-proxy.yaml"
            self._in_node("kube-proxy", [str(bins / "kube-proxy"), f"--config={config}", "-v=1"])

    def ctr(self, *args: str, check: bool = True, timeout: float = 300.0) -> subprocess.CompletedProcess[str]:
        return run("ctr", "--address", str(self.socket), "--namespace", "k8s.io", *args, check=check, timeout=timeout)

    def start(self, *, pause: tuple[str, Path], images: list[Path], timeout: float = 120.0) -> None:
        """Start the node (its network exists already), import the images, and wait until Ready."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._write_configs(pause[0])
        self._make_cgroup_root()
        self._start_holder()
        self.start_runtime()
        self.import_images(pause[1], *images)
        self.start_kubelet()
        self.wait_ready(timeout)

    def import_images(self, *archives: Path) -> None:
        """Load docker-archives into the node's containerd, where pods with ``imagePullPolicy: Never``
        (or ``IfNotPresent``) find them: the node has no registry."""
        for archive in archives:
            self.ctr("images", "import", str(archive))

    def wait_ready(self, timeout: float = 120.0) -> None:
        def ready() -> bool:
            node = self.cluster.get(f"/api/v1/nodes/{self.name}")
            conditions = (node or {}).get("status", {}).get("conditions", [])
            return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

        wait_until(f"node {self.name} Ready", ready, timeout=timeout, check=self.check_alive)

    def check_alive(self) -> None:
        for component in self.components.values():
            component.check()

    def stop_kubelet_and_runtime(self, how: int = signal.SIGKILL) -> None:
        """Stop kubelet and containerd as a node crash or restart would (containers keep running:
        their shims outlive containerd, as on a real node)."""
        for name in ("kubelet", "containerd"):
            component = self.components.pop(name, None)
            if component and component.process.poll() is None:
                component.process.send_signal(how)
                component.process.wait(timeout=30)

    def restart_kubelet_and_runtime(self) -> None:
        self.stop_kubelet_and_runtime()
        self.start_runtime()
        self.start_kubelet()
        self.wait_ready()

    def stop(self) -> None:
        """Delete every pod's containers, stop the components, and remove what the node made."""
        for name in ("kubelet", "kube-proxy"):
            component = self.components.pop(name, None)
            if component:
                component.stop()
        # Every container the shims still run, through runc's own state, then containerd and its shims.
        runc_root = self.workdir / "runc"
        if runc_root.is_dir():
            for container in runc_root.iterdir():
                run(RUNC, "--root", str(runc_root), "kill", container.name, "KILL", check=False)
        component = self.components.pop("containerd", None)
        if component:
            component.stop()
        self._kill_leftovers()
        if self.holder is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.holder.pid, signal.SIGKILL)
            self.holder.wait(timeout=10)
        self._remove_cgroup_root()

    def _kill_leftovers(self) -> None:
        """Kill every process still in the node's cgroups (pods and shims), until none is left."""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            pids: set[int] = set()
            for hierarchy in Path("/sys/fs/cgroup").iterdir():
                top = hierarchy / self.cgroup_root.lstrip("/")
                if top.is_dir():
                    for procs in top.rglob("cgroup.procs"):
                        with contextlib.suppress(OSError):
                            pids.update(int(p) for p in procs.read_text().split())
            for pid in self._shim_pids():
                pids.add(pid)
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.05)  # the kernel finishes the exits

    def pod_processes(self, pod_uid: str) -> list[tuple[int, int, str]]:
        """(pid, real uid, command line) of every live process in the pod's cgroups, as the node sees them."""
        found = []
        top = Path("/sys/fs/cgroup/pids") / self.cgroup_root.lstrip("/")
        for pod_dir in top.rglob(f"pod{pod_uid}"):
            for procs in pod_dir.rglob("cgroup.procs"):
                with contextlib.suppress(OSError):
                    found += [p for p in map(_live_process, procs.read_text().split()) if p is not None]
        return found

    def _shim_pids(self) -> list[int]:
        """containerd-shim processes of this node (their command line names its containerd socket)."""
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            with contextlib.suppress(OSError):
                cmdline = (entry / "cmdline").read_bytes()
                if b"containerd-shim" in cmdline and str(self.socket).encode() in cmdline:
                    found.append(int(entry.name))
        return found


def _live_process(pid: str) -> tuple[int, int, str] | None:
    """(pid, real uid, command line) of a live process; None for a zombie or one gone meanwhile."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return None
    status = dict(line.split(":", 1) for line in lines if ":" in line)
    if status.get("State", "").strip().startswith("Z"):
        return None
    return int(pid), int(status["Uid"].split()[0]), cmdline.strip()
