"""A real Kubernetes control plane on loopback for the kube test tier.

etcd, kube-apiserver, kube-controller-manager and kube-scheduler run from the binaries
``scripts/build-kube`` put in the version-keyed cache (``$JUDGEQUEUE_CACHE``, default
``/var/cache/judgequeue``). The API server runs as a real cluster's would where it matters to the
operator and chart: RBAC authorization, the OwnerReferencesPermissionEnforcement admission plugin,
service-account tokens signed with a key of its own, TLS with openssl-made certificates. There is no
kubelet; tests that need pods running start :mod:`tests.kube.node` (a node agent of their own).

Every wait has a deadline; a component that exits early fails the wait with its log's tail.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml

from tests.support.roles import stop_process

ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = ROOT / "scripts" / "build-kube"

T = TypeVar("T")


class KubeTierError(RuntimeError):
    """The control plane could not be set up (missing binaries, a component died, a deadline passed)."""


def binary_dirs() -> dict[str, Path]:
    """Where ``scripts/build-kube`` keeps each pinned binary set (asks the script: one source of versions)."""
    out = subprocess.run([str(BUILD_SCRIPT), "--print-dir"], check=True, capture_output=True, text=True).stdout
    return {k: Path(v) for k, v in (line.split("=", 1) for line in out.split())}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(what: str, probe: Callable[[], T | None], *, timeout: float, interval: float = 0.1,
               check: Callable[[], None] | None = None) -> T:
    """Poll ``probe`` until it returns something truthy or ``timeout`` passes (then raise naming ``what``).

    ``check`` runs on every round and may raise early (e.g. a component exited)."""
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None
    while True:
        if check is not None:
            check()
        try:
            value = probe()
            if value:
                return value
        except Exception as exc:  # reported if the deadline passes
            last_error = exc
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout:.0f}s (last error: {last_error!r})")
        time.sleep(interval)


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_certificates(pki: Path, extra_ips: Sequence[str] = ()) -> None:
    """A CA, the API server's serving certificate (loopback, ``extra_ips`` and in-cluster names) and
    the SA key pair."""
    pki.mkdir(parents=True, exist_ok=True)
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "30", "-subj", "/CN=judgequeue-test-ca",
             "-keyout", "ca.key", "-out", "ca.crt", cwd=pki)
    (pki / "san.cnf").write_text(
        "[req]\ndistinguished_name=dn\n[dn]\n[ext]\nsubjectAltName=IP:127.0.0.1,IP:10.0.0.1,"
        + "".join(f"IP:{ip}," for ip in extra_ips) + "DNS:localhost,"
        "DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local\n"
        "keyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n"
    )
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=kube-apiserver", "-keyout", "apiserver.key",
             "-out", "apiserver.csr", cwd=pki)
    _openssl("x509", "-req", "-in", "apiserver.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
             "-days", "30", "-extfile", "san.cnf", "-extensions", "ext", "-out", "apiserver.crt", cwd=pki)
    _openssl("genrsa", "-out", "sa.key", "2048", cwd=pki)
    _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=pki)


def write_kubeconfig(path: Path, *, server: str, ca: Path, token: str, namespace: str = "default") -> Path:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "test", "cluster": {"server": server, "certificate-authority": str(ca)}}],
        "users": [{"name": "test", "user": {"token": token}}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test", "namespace": namespace}}],
        "current-context": "test",
    }
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


@dataclass
class Component:
    name: str
    process: subprocess.Popen[bytes]
    log: Path

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def check(self) -> None:
        if self.process.poll() is not None:
            raise KubeTierError(f"{self.name} exited with {self.process.returncode}:\n{self.tail()}")

    def stop(self, timeout: float = 10.0) -> None:
        stop_process(self.process, timeout)


class ApiError(Exception):
    def __init__(self, status: int, body: Any) -> None:
        message = body.get("message", "") if isinstance(body, dict) else str(body)
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.body = body
        self.message = message


@dataclass
class Cluster:
    """A running control plane and the ways to reach it as the admin."""

    workdir: Path
    bin_dir: Path
    helm: Path
    server: str
    ca: Path
    token: str
    kubeconfig: Path
    version: str
    components: list[Component] = field(default_factory=list)

    # -- raw API access (admin) ---------------------------------------------------------------
    def request(self, method: str, path: str, body: Any = None, *, content_type: str = "application/json",
                token: str | None = None, timeout: float = 30.0) -> Any:
        """One API request as the admin (or ``token``); returns the decoded JSON, raises ApiError >= 400."""
        data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
        req = urllib.request.Request(self.server + path, data=data, method=method)
        req.add_header("Authorization", f"Bearer {token or self.token}")
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", content_type)
        context = ssl.create_default_context(cafile=str(self.ca))
        try:
            with urllib.request.urlopen(req, context=context, timeout=timeout) as response:
                raw = response.read()
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            try:
                decoded: Any = json.loads(raw)
            except ValueError:
                decoded = raw.decode(errors="replace")
            raise ApiError(exc.code, decoded) from None
        return json.loads(raw) if raw else None

    def get(self, path: str) -> Any | None:
        try:
            return self.request("GET", path)
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    def kubectl(self, *args: str, input: str | None = None, check: bool = True, namespace: str | None = None,
                kubeconfig: Path | None = None, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        cmd = [str(self.bin_dir / "kubectl"), "--kubeconfig", str(kubeconfig or self.kubeconfig)]
        if namespace:
            cmd += ["-n", namespace]
        result = subprocess.run([*cmd, *args], input=input, capture_output=True, text=True, timeout=timeout)
        if check and result.returncode != 0:
            raise subprocess.CalledProcessError(result.returncode, result.args, result.stdout, result.stderr)
        return result

    def helm_cmd(self, *args: str, timeout: float = 300.0, check: bool = True) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig), "HELM_CACHE_HOME": str(self.workdir / "helm/cache"),
               "HELM_CONFIG_HOME": str(self.workdir / "helm/config"), "HELM_DATA_HOME": str(self.workdir / "helm/data")}
        result = subprocess.run([str(self.helm), *args], capture_output=True, text=True, env=env, timeout=timeout)
        if check and result.returncode != 0:
            raise subprocess.CalledProcessError(result.returncode, result.args, result.stdout, result.stderr)
        return result

    def apply(self, manifest: str | Mapping[str, Any] | Sequence[Mapping[str, Any]], *, namespace: str | None = None,
              check: bool = True, server_side: bool = False) -> subprocess.CompletedProcess[str]:
        text = manifest if isinstance(manifest, str) else yaml.safe_dump_all(
            [manifest] if isinstance(manifest, Mapping) else list(manifest))
        args = ["apply", "-f", "-"] + (["--server-side"] if server_side else [])
        return self.kubectl(*args, input=text, check=check, namespace=namespace)

    def create_namespace(self, name: str) -> None:
        body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
        self.request("POST", "/api/v1/namespaces", body)

    @contextmanager
    def fresh_namespace(self) -> Iterator[str]:
        """A new namespace with a random name for one test, deleted afterwards (without waiting for it to go)."""
        name = f"t-{uuid.uuid4().hex[:10]}"
        self.create_namespace(name)
        try:
            yield name
        finally:
            self.kubectl("delete", "namespace", name, "--wait=false", check=False)

    def sa_token(self, namespace: str, name: str) -> str:
        """A bound token for a ServiceAccount (what a pod of that account would mount)."""
        review = self.request("POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
                              {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                               "spec": {"expirationSeconds": 86400}})
        return str(review["status"]["token"])

    def kubeconfig_for(self, token: str, name: str, namespace: str = "default") -> Path:
        return write_kubeconfig(self.workdir / f"kubeconfig-{name}", server=self.server, ca=self.ca, token=token,
                                namespace=namespace)

    def wait_established(self, crd: str, timeout: float = 30.0) -> None:
        def established() -> bool:
            obj = self.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd}")
            conds = (obj or {}).get("status", {}).get("conditions", [])
            return any(c["type"] == "Established" and c["status"] == "True" for c in conds)

        wait_until(f"CRD {crd} established", established, timeout=timeout)

    def check_alive(self) -> None:
        for component in self.components:
            component.check()

    def stop(self) -> None:
        for component in reversed(self.components):
            component.stop()


def _start(name: str, argv: Sequence[str], workdir: Path, env: Mapping[str, str] | None = None) -> Component:
    log = workdir / f"{name}.log"
    handle = log.open("wb")
    process = subprocess.Popen(list(argv), stdout=handle, stderr=subprocess.STDOUT, cwd=workdir,
                               env={**os.environ, **(env or {})}, start_new_session=True)
    handle.close()
    return Component(name, process, log)


def _http_ok(url: str, *, ca: Path | None = None, token: str | None = None) -> bool:
    req = urllib.request.Request(url)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    context = ssl.create_default_context(cafile=str(ca)) if ca else None
    try:
        with urllib.request.urlopen(req, context=context, timeout=2) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


@contextmanager
def control_plane(workdir: Path, *, oldest: bool = False, scheduler: bool = True,
                  timeout: float = 90.0, address: str = "127.0.0.1",
                  san_ips: Sequence[str] = ()) -> Iterator[Cluster]:
    """Start etcd + kube-apiserver (+ controller-manager and scheduler) and yield a :class:`Cluster`.

    ``oldest``: the API server of the oldest Kubernetes release the chart claims, alone (no
    controller-manager or scheduler): enough to check that the CRD and the example are accepted.
    ``address``: where the API server listens and what it advertises; a real node (tests/node/)
    needs one it can reach, and then the ``kubernetes`` Service's endpoints are kept to it (pods
    reach the API server through that Service, as in any cluster). ``san_ips``: more addresses its
    certificate names (a VM reaches the host's loopback as 10.0.2.2).
    """
    dirs = binary_dirs()
    bin_dir = dirs["KUBE_OLDEST_BIN" if oldest else "KUBE_BIN"]
    etcd_bin = dirs["ETCD_BIN"] / "etcd"
    helm = dirs["HELM_BIN"] / "helm"
    wanted = [etcd_bin, bin_dir / "kube-apiserver", dirs["KUBE_BIN"] / "kubectl"]
    if not oldest:
        wanted += [bin_dir / "kube-controller-manager", bin_dir / "kube-scheduler"]
    missing = [str(p) for p in wanted if not p.exists()]
    if missing:
        raise KubeTierError(f"control-plane binaries missing ({', '.join(missing)}): run scripts/build-kube "
                            "(scripts/test does, through scripts/prepare-tests)")
    if shutil.which("openssl") is None:
        raise KubeTierError("openssl is required to make the test cluster's certificates")
    workdir.mkdir(parents=True, exist_ok=True)
    pki = workdir / "pki"
    make_certificates(pki, extra_ips=(*(() if address == "127.0.0.1" else (address,)), *san_ips))
    admin_token = base64.b32encode(os.urandom(20)).decode().lower()
    (pki / "tokens.csv").write_text(f'{admin_token},admin,admin-uid,"system:masters"\n')
    etcd_port, etcd_peer, api_port = free_port(), free_port(), free_port()
    server = f"https://{address}:{api_port}"
    kubeconfig = write_kubeconfig(workdir / "kubeconfig", server=server, ca=pki / "ca.crt", token=admin_token)
    version = bin_dir.parent.name.removeprefix("kube-")
    # kubectl is always the pinned current one (the client a user of either server would have).
    cluster = Cluster(workdir=workdir, bin_dir=dirs["KUBE_BIN"], helm=helm, server=server, ca=pki / "ca.crt",
                      token=admin_token, kubeconfig=kubeconfig, version=version)
    try:
        etcd = _start("etcd", [
            str(etcd_bin), "--data-dir", str(workdir / "etcd"), "--name", "test",
            "--listen-client-urls", f"http://127.0.0.1:{etcd_port}",
            "--advertise-client-urls", f"http://127.0.0.1:{etcd_port}",
            "--listen-peer-urls", f"http://127.0.0.1:{etcd_peer}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{etcd_peer}",
            "--initial-cluster", f"test=http://127.0.0.1:{etcd_peer}",
            "--unsafe-no-fsync", "--log-level", "warn",
        ], workdir)
        cluster.components.append(etcd)
        wait_until("etcd healthy", lambda: _http_ok(f"http://127.0.0.1:{etcd_port}/health"), timeout=timeout,
                   check=etcd.check)
        apiserver = _start("kube-apiserver", [
            str(bin_dir / "kube-apiserver"),
            f"--etcd-servers=http://127.0.0.1:{etcd_port}",
            f"--bind-address={address}", f"--advertise-address={address}", f"--secure-port={api_port}",
            f"--cert-dir={pki}", f"--tls-cert-file={pki / 'apiserver.crt'}",
            f"--tls-private-key-file={pki / 'apiserver.key'}", f"--client-ca-file={pki / 'ca.crt'}",
            f"--token-auth-file={pki / 'tokens.csv'}",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            "--service-account-issuer=https://kubernetes.default.svc",
            "--authorization-mode=RBAC",
            "--enable-admission-plugins=OwnerReferencesPermissionEnforcement",
            "--service-cluster-ip-range=10.0.0.0/24",
            f"--endpoint-reconciler-type={'none' if address == '127.0.0.1' else 'lease'}",
            "--kubelet-preferred-address-types=InternalIP",
            "--allow-privileged=true", "--profiling=false", "-v=1",
        ], workdir)
        cluster.components.append(apiserver)
        wait_until("kube-apiserver ready", lambda: _http_ok(f"{server}/readyz", ca=pki / "ca.crt", token=admin_token),
                   timeout=timeout, check=cluster.check_alive)
        if not oldest:
            common = [f"--kubeconfig={kubeconfig}", "--leader-elect=false", "--bind-address=127.0.0.1"]
            cluster.components.append(_start("kube-controller-manager", [
                str(bin_dir / "kube-controller-manager"), *common, f"--secure-port={free_port()}",
                f"--service-account-private-key-file={pki / 'sa.key'}", f"--root-ca-file={pki / 'ca.crt'}",
                "--use-service-account-credentials=false", "--controllers=*",
                f"--cluster-signing-cert-file={pki / 'ca.crt'}", f"--cluster-signing-key-file={pki / 'ca.key'}",
                "--concurrent-gc-syncs=5", "-v=1",
            ], workdir))
            if scheduler:
                cluster.components.append(_start("kube-scheduler", [
                    str(bin_dir / "kube-scheduler"), *common, f"--secure-port={free_port()}", "-v=1",
                ], workdir))
            # The default ServiceAccount appears once the controller-manager's controllers run.
            wait_until("controller-manager running (default ServiceAccount)",
                       lambda: cluster.get("/api/v1/namespaces/default/serviceaccounts/default"),
                       timeout=timeout, check=cluster.check_alive)
        yield cluster
    finally:
        cluster.stop()
