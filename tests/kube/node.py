"""A small node agent for the kube tier: what a kubelet does, for the pods these tests run.

There is no kubelet or container runtime on the test machines, so this agent stands in for one:

- registers a Node (Ready, generous capacity) and renews its Lease and heartbeat, so the scheduler
  binds pods to it and the node lifecycle controller never evicts them;
- runs each container of a pod bound to it as a local process from the container's own ``command``
  and ``args`` (the image's entrypoint, when ``command`` is absent, is the project's installed
  ``judgequeue`` command: every judgequeue image runs it) with the container's ``env``, resolving
  ``secretKeyRef``, ``configMapKeyRef`` and ``fieldRef`` through the API as the kubelet would;
- mounts the pod's service-account token (a TokenRequest bound to the pod) at the in-cluster path
  in a private mount namespace and sets ``KUBERNETES_SERVICE_HOST/PORT``, so an in-cluster client
  (the operator) runs as the pod's ServiceAccount;
- reports phase, container state and readiness from the container's ``readinessProbe`` (httpGet,
  tcpSocket or exec), restarts exited containers (``restartPolicy: Always``; ``OnFailure`` after a
  failed run) and reports the last exit as ``lastState.terminated`` with its termination message; a
  pod that runs to completion (``Never``, or ``OnFailure`` after a clean exit) ends ``Succeeded`` or
  ``Failed`` with its container ``terminated``, so a Job's controller sees it finish; under
  ``terminationMessagePolicy: FallbackToLogsOnError`` a failed run's log tail (its last 80 lines, at
  most 2048 bytes), as the kubelet does when the container wrote no termination-message file (a
  process here has no private /dev, so ``terminationMessagePath`` itself is not mounted);
- on deletion sends SIGTERM, then SIGKILL after the pod's grace period, and removes the pod;
- cannot pull an image from a registry under the reserved ``.invalid`` top-level domain (RFC 2606),
  as a kubelet could not resolve its host: the container waits in ``ErrImagePull``, then
  ``ImagePullBackOff``, with the runtime's kind of message, and never starts (every other image is
  taken as present: the container runs the installed command).

Pods share the host's network (no network namespace), so every declared ``containerPort`` is mapped
to a free host port: the environment values and ``--flag=PORT`` arguments that name the port are
rewritten, and probes use the mapped port. Only the first container of a pod is run (the project's
pods have one); ``secret`` and ``projected`` (Secret sources) volumes are written to the pod's
workdir and bound at their mount paths in the same private mount namespace as the token; init
containers and other volumes (emptyDir, hostPath) are not supported (the process sees the host's).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tests.kube.cluster import ApiError, Cluster, free_port

TOKEN_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
ENTRYPOINT = "judgequeue"


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _b64(value: str) -> str:
    return base64.b64decode(value).decode()


@dataclass
class PodRun:
    """One pod's container process and what the agent knows about it."""

    uid: str
    namespace: str
    name: str
    pod: dict[str, Any]
    ports: dict[str, int]  # containerPort (as string) or port name -> host port
    workdir: Path
    process: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    started_at: str = ""
    ready: bool = False
    last_probe: float = 0.0
    probe_failures: int = 0
    probe_successes: int = 0
    terminating_since: float | None = None
    reported: str = ""
    config_error: str = ""
    exit_codes: list[int] = field(default_factory=list)
    log_offset: int = 0  # where the current run's output starts in container.log
    last_terminated: dict[str, Any] | None = None  # the last exit, as containerStatuses[].lastState.terminated
    finished: bool = False  # ran to completion under its restartPolicy: never started again
    pull_error: str = ""  # why the image cannot be pulled (the container never starts)
    pull_tries: int = 0


def unpullable(image: str) -> bool:
    """An image whose registry host is under ``.invalid``: no resolver knows it (RFC 2606)."""
    host = image.split("/", 1)[0] if "/" in image else ""
    return host.split(":", 1)[0].endswith(".invalid")


class NodeAgent:
    """Runs the pods bound to one Node (see the module docstring); start() then stop()."""

    def __init__(self, kube: Cluster, workdir: Path, name: str = "test-node", *, poll: float = 0.2,
                 entrypoint: str = ENTRYPOINT) -> None:
        self.kube = kube
        self.name = name
        self.workdir = workdir
        self.poll = poll
        self.entrypoint = entrypoint
        self.pods: dict[str, PodRun] = {}
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"node-{name}", daemon=True)
        self._last_heartbeat = 0.0
        self.rounds = 0  # completed sync rounds, for tests that need "a few more rounds"
        self._api_port = int(kube.server.rsplit(":", 1)[1])

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        TOKEN_DIR.mkdir(parents=True, exist_ok=True)
        self._register()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        for run in list(self.pods.values()):
            self._kill(run, grace=2.0)
        with contextlib.suppress(ApiError):
            self.kube.request("DELETE", f"/api/v1/nodes/{self.name}")

    # -- the Node ---------------------------------------------------------------------------------
    def _node_status(self) -> dict[str, Any]:
        now = _now()
        capacity = {"cpu": "64", "memory": "256Gi", "pods": "500", "ephemeral-storage": "100Gi"}
        ready = {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "test node agent",
                 "lastHeartbeatTime": now, "lastTransitionTime": now}
        return {"capacity": capacity, "allocatable": capacity, "conditions": [ready],
                "addresses": [{"type": "InternalIP", "address": "127.0.0.1"},
                              {"type": "Hostname", "address": self.name}],
                "nodeInfo": {"kubeletVersion": self.kube.version, "kubeProxyVersion": "", "architecture": "amd64",
                             "operatingSystem": "linux", "containerRuntimeVersion": "local-process://1",
                             "bootID": "", "machineID": "", "systemUUID": "", "kernelVersion": "",
                             "osImage": "test"}}

    def _register(self) -> None:
        body = {"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": self.name, "labels": {"kubernetes.io/hostname": self.name,
                                                           "kubernetes.io/os": "linux"}}}
        try:
            self.kube.request("POST", "/api/v1/nodes", body)
        except ApiError as exc:
            if exc.status != 409:
                raise
        self._heartbeat()

    def _heartbeat(self) -> None:
        self.kube.request("PATCH", f"/api/v1/nodes/{self.name}/status", {"status": self._node_status()},
                          content_type="application/merge-patch+json")
        lease_path = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{self.name}"
        renew = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        lease = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": self.name},
                 "spec": {"holderIdentity": self.name, "leaseDurationSeconds": 40, "renewTime": renew}}
        try:
            self.kube.request("PATCH", lease_path, {"spec": lease["spec"]},
                              content_type="application/merge-patch+json")
        except ApiError as exc:
            if exc.status != 404:
                raise
            self.kube.request("POST", "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases", lease)
        self._last_heartbeat = time.monotonic()

    # -- the loop ----------------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                if time.monotonic() - self._last_heartbeat > 5:
                    self._heartbeat()
                self._sync()
            except Exception as exc:  # kept for the test to report; the agent keeps going
                self.errors.append(repr(exc))
            self.rounds += 1
            self._stop.wait(self.poll)

    def _sync(self) -> None:
        pods = self.kube.request("GET", f"/api/v1/pods?fieldSelector=spec.nodeName%3D{self.name}")["items"]
        seen = set()
        for pod in pods:
            uid = pod["metadata"]["uid"]
            seen.add(uid)
            run = self.pods.get(uid)
            if run is None:
                if pod["metadata"].get("deletionTimestamp"):
                    self._finalize(pod)
                    continue
                run = self._admit(pod)
            run.pod = pod
            if pod["metadata"].get("deletionTimestamp"):
                self._terminate(run)
                continue
            try:
                self._keep_running(run)
            except LookupError as exc:  # as a kubelet: CreateContainerConfigError, retried next round
                run.config_error = str(exc)
            else:
                run.config_error = ""
            self._probe(run)
            self._report(run)
        for uid in list(self.pods):
            if uid not in seen:  # force-deleted
                self._kill(self.pods.pop(uid), grace=0.0)

    # -- one pod ----------------------------------------------------------------------------------
    def _admit(self, pod: dict[str, Any]) -> PodRun:
        meta = pod["metadata"]
        container = pod["spec"]["containers"][0]
        ports: dict[str, int] = {}
        for port in container.get("ports") or []:
            host = free_port()
            ports[str(port["containerPort"])] = host
            if port.get("name"):
                ports[port["name"]] = host
        run = PodRun(uid=meta["uid"], namespace=meta["namespace"], name=meta["name"], pod=pod, ports=ports,
                     workdir=self.workdir / f"{meta['namespace']}_{meta['name']}_{meta['uid'][:8]}")
        run.workdir.mkdir(parents=True, exist_ok=True)
        self.pods[run.uid] = run
        return run

    def _value_from(self, namespace: str, pod: dict[str, Any], source: dict[str, Any]) -> str | None:
        for key, plural, decode in (("secretKeyRef", "secrets", _b64), ("configMapKeyRef", "configmaps", str)):
            if key in source:
                ref = source[key]
                obj = self.kube.get(f"/api/v1/namespaces/{namespace}/{plural}/{ref['name']}")
                data = (obj or {}).get("data") or {}
                if ref["key"] not in data:
                    if ref.get("optional"):
                        return None
                    raise LookupError(f"{plural[:-1]} {namespace}/{ref['name']} has no key {ref['key']!r}")
                return decode(data[ref["key"]])
        if "fieldRef" in source:
            path = source["fieldRef"]["fieldPath"]
            values = {"metadata.name": pod["metadata"]["name"], "metadata.namespace": pod["metadata"]["namespace"],
                      "metadata.uid": pod["metadata"]["uid"], "spec.nodeName": self.name,
                      "spec.serviceAccountName": pod["spec"].get("serviceAccountName", "default"),
                      "status.podIP": "127.0.0.1", "status.hostIP": "127.0.0.1"}
            return values.get(path)
        raise LookupError(f"unsupported valueFrom {sorted(source)}")

    def _map_port(self, run: PodRun, value: str) -> str:
        if value in run.ports:
            return str(run.ports[value])
        if value.startswith("--") and "=" in value:
            flag, _, rest = value.partition("=")
            if rest in run.ports:
                return f"{flag}={run.ports[rest]}"
        return value

    def _command(self, run: PodRun) -> tuple[list[str], dict[str, str]]:
        pod = run.pod
        container = pod["spec"]["containers"][0]
        command = list(container.get("command") or [self.entrypoint])
        args = [self._map_port(run, a) for a in container.get("args") or []]
        env: dict[str, str] = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(run.workdir),
                               "HOSTNAME": run.name, "KUBERNETES_SERVICE_HOST": "127.0.0.1",
                               "KUBERNETES_SERVICE_PORT": str(self._api_port)}
        for var in container.get("env") or []:
            if "valueFrom" in var:
                value = self._value_from(run.namespace, pod, var["valueFrom"])
                if value is not None:
                    env[var["name"]] = value
            else:
                env[var["name"]] = self._map_port(run, str(var.get("value", "")))
        if command[0] == ENTRYPOINT:
            command[0] = self.entrypoint
        argv = command + args
        binds = self._secret_volumes(run, container)  # (host dir, mount path)
        if pod["spec"].get("automountServiceAccountToken", True) is not False:
            token_dir = run.workdir / "serviceaccount"
            token_dir.mkdir(exist_ok=True)
            account = pod["spec"].get("serviceAccountName", "default")
            review = self.kube.request(
                "POST", f"/api/v1/namespaces/{run.namespace}/serviceaccounts/{account}/token",
                {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                 "spec": {"expirationSeconds": 86400,
                          "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": run.name, "uid": run.uid}}})
            (token_dir / "token").write_text(review["status"]["token"])
            (token_dir / "ca.crt").write_bytes(self.kube.ca.read_bytes())
            (token_dir / "namespace").write_text(run.namespace)
            binds.append((token_dir, TOKEN_DIR))
        if binds:
            # Each volume bound at its path in a private mount namespace: the pod sees it, the host not.
            script = 'while [ "$1" != -- ]; do mount --bind "$1" "$2" || exit 1; shift 2; done; shift; exec "$@"'
            pairs = [str(p) for host, target in binds for p in (host, target)]
            argv = ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script, "sh", *pairs, "--",
                    *argv]
        return argv, env

    def _secret_volumes(self, run: PodRun, container: dict[str, Any]) -> list[tuple[Path, Path]]:
        """Write the pod's ``secret`` and ``projected`` (Secret sources only) volumes that the container
        mounts into its workdir, with the volume's mode, as the kubelet's atomic writer would; returns
        (host directory, mount path) pairs. A missing Secret or key fails the start, as it holds the
        kubelet's ContainerCreating."""
        volumes = {v["name"]: v for v in run.pod["spec"].get("volumes") or []}
        binds: list[tuple[Path, Path]] = []
        for mount in container.get("volumeMounts") or []:
            volume = volumes.get(mount["name"]) or {}
            if "secret" in volume:
                sources = [{"secret": {"name": volume["secret"]["secretName"], **volume["secret"]}}]
                mode = int(volume["secret"].get("defaultMode", 0o644))
            elif "projected" in volume and all("secret" in source for source in volume["projected"]["sources"]):
                sources = volume["projected"]["sources"]
                mode = int(volume["projected"].get("defaultMode", 0o644))
            else:
                continue  # the injected token volume (mounted above from a TokenRequest), emptyDir, ...
            target = run.workdir / "volumes" / mount["name"]
            target.mkdir(parents=True, exist_ok=True)
            for source in sources:
                ref = source["secret"]
                secret = self.kube.get(f"/api/v1/namespaces/{run.namespace}/secrets/{ref['name']}")
                if secret is None:
                    raise LookupError(f"secret {run.namespace}/{ref['name']} not found")
                data = secret.get("data") or {}
                items = ref.get("items") or [{"key": k, "path": k} for k in data]
                for item in items:
                    if item["key"] not in data:
                        raise LookupError(f"secret {run.namespace}/{ref['name']} has no key {item['key']!r}")
                    path = target / item["path"]
                    path.write_bytes(base64.b64decode(data[item["key"]]))
                    os.chmod(path, int(item.get("mode", mode)))
            Path(mount["mountPath"]).mkdir(parents=True, exist_ok=True)
            binds.append((target, Path(mount["mountPath"])))
        return binds

    def _keep_running(self, run: PodRun) -> None:
        if run.finished or (run.process is not None and run.process.poll() is None):
            return
        image = str(run.pod["spec"]["containers"][0].get("image", ""))
        if unpullable(image):
            host = image.split("/", 1)[0]
            run.pull_tries += 1
            run.pull_error = (f'failed to pull and unpack image "{image}": failed to resolve reference "{image}":'
                              f" dial tcp: lookup {host.split(':', 1)[0]}: no such host")
            return
        if run.process is not None:
            code = int(run.process.returncode)
            run.exit_codes.append(code)
            run.last_terminated = self._terminated(run, code)
            run.ready = False
            policy = run.pod["spec"].get("restartPolicy", "Always")
            if policy == "Never" or (policy == "OnFailure" and code == 0):
                run.finished = True  # the pod's phase is now Succeeded or Failed, as a kubelet reports it
                return
            run.restarts += 1
            run.process = None
        argv, env = self._command(run)
        log = (run.workdir / "container.log").open("ab")
        run.log_offset = log.tell()
        run.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=run.workdir,
                                       start_new_session=True)
        log.close()
        run.started_at = _now()
        run.probe_successes = run.probe_failures = 0

    def _terminated(self, run: PodRun, code: int) -> dict[str, Any]:
        """The kubelet's record of a finished run; its message under FallbackToLogsOnError is the
        run's log tail if the run failed (the kubelet's limits: 80 lines, 2048 bytes)."""
        container = run.pod["spec"]["containers"][0]
        terminated: dict[str, Any] = {"exitCode": code, "reason": "Completed" if code == 0 else "Error",
                                      "startedAt": run.started_at, "finishedAt": _now(),
                                      "containerID": f"local://{run.uid}"}
        if code != 0 and container.get("terminationMessagePolicy") == "FallbackToLogsOnError":
            with (run.workdir / "container.log").open("rb") as log:
                log.seek(run.log_offset)
                tail = b"\n".join(log.read().splitlines()[-80:])[-2048:]
            if tail:
                terminated["message"] = tail.decode(errors="replace")
        return terminated

    def _probe_once(self, run: PodRun, probe: dict[str, Any]) -> bool:
        timeout = float(probe.get("timeoutSeconds", 1))
        if "httpGet" in probe:
            get = probe["httpGet"]
            port = run.ports.get(str(get["port"]), get["port"])
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}{get.get('path', '/')}",
                                            timeout=timeout) as response:
                    return 200 <= int(response.status) < 400
            except (urllib.error.URLError, OSError):
                return False
        if "tcpSocket" in probe:
            port = run.ports.get(str(probe["tcpSocket"]["port"]), probe["tcpSocket"]["port"])
            try:
                with socket.create_connection(("127.0.0.1", int(port)), timeout=timeout):
                    return True
            except OSError:
                return False
        if "exec" in probe:
            try:
                return subprocess.run(probe["exec"]["command"], timeout=timeout, capture_output=True).returncode == 0
            except (OSError, subprocess.TimeoutExpired):
                return False
        return True

    def _probe(self, run: PodRun) -> None:
        if run.process is None or run.process.poll() is not None:
            run.ready = False
            return
        probe = run.pod["spec"]["containers"][0].get("readinessProbe")
        if probe is None:
            run.ready = True
            return
        # Tests want readiness soon: probe at most every second (the pod's period is an upper bound).
        period = min(float(probe.get("periodSeconds", 10)), 1.0)
        if time.monotonic() - run.last_probe < period:
            return
        run.last_probe = time.monotonic()
        if self._probe_once(run, probe):
            run.probe_successes += 1
            run.probe_failures = 0
            if run.probe_successes >= int(probe.get("successThreshold", 1)):
                run.ready = True
        else:
            run.probe_failures += 1
            run.probe_successes = 0
            if run.probe_failures >= int(probe.get("failureThreshold", 3)):
                run.ready = False

    def _report(self, run: PodRun) -> None:
        container = run.pod["spec"]["containers"][0]
        running = run.process is not None and run.process.poll() is None
        ready = "True" if run.ready and running else "False"
        state: dict[str, Any] = {"running": {"startedAt": run.started_at}}
        if not running:
            state = ({"waiting": {"reason": "CreateContainerConfigError", "message": run.config_error}}
                     if run.config_error else {"waiting": {"reason": "CrashLoopBackOff"}})
            if run.pull_error:  # as a kubelet: the pull's error, then its back-off, in turn
                reason = "ErrImagePull" if run.pull_tries % 10 < 5 else "ImagePullBackOff"
                message = run.pull_error if reason == "ErrImagePull" else (
                    f'Back-off pulling image "{container["image"]}": ErrImagePull: {run.pull_error}')
                state = {"waiting": {"reason": reason, "message": message}}
        # A container that never started (its config could not be resolved) has no start time yet.
        since = run.started_at or run.pod["metadata"]["creationTimestamp"]
        phase = "Running" if running or run.restarts else "Pending"
        if run.finished and run.last_terminated is not None:
            phase = "Succeeded" if run.last_terminated["exitCode"] == 0 else "Failed"
            state = {"terminated": run.last_terminated}
        status = {
            "phase": phase,
            "hostIP": "127.0.0.1", "podIP": "127.0.0.1", "podIPs": [{"ip": "127.0.0.1"}],
            "startTime": since,
            "conditions": [{"type": t, "status": s, "lastTransitionTime": since} for t, s in (
                ("PodScheduled", "True"), ("Initialized", "True"), ("ContainersReady", ready), ("Ready", ready))],
            "containerStatuses": [{"name": container["name"], "image": container["image"],
                                   "imageID": f"local://{container['image']}", "containerID": f"local://{run.uid}",
                                   "ready": ready == "True", "started": running, "restartCount": run.restarts,
                                   "state": state,
                                   **({"lastState": {"terminated": run.last_terminated}}
                                      if run.last_terminated and not run.finished else {})}],
        }
        digest = json.dumps(status, sort_keys=True)
        if digest == run.reported:
            return
        try:
            self.kube.request("PATCH", f"/api/v1/namespaces/{run.namespace}/pods/{run.name}/status",
                              {"status": status}, content_type="application/merge-patch+json")
            run.reported = digest
        except ApiError as exc:
            if exc.status != 404:
                raise

    def _terminate(self, run: PodRun) -> None:
        if run.terminating_since is None:
            run.terminating_since = time.monotonic()
            if run.process is not None and run.process.poll() is None:
                os.killpg(run.process.pid, signal.SIGTERM)
        grace = run.pod["metadata"].get("deletionGracePeriodSeconds")
        if grace is None:
            grace = run.pod["spec"].get("terminationGracePeriodSeconds", 30)
        done = run.process is None or run.process.poll() is not None
        if not done and time.monotonic() - run.terminating_since >= float(grace):
            os.killpg(run.process.pid, signal.SIGKILL)  # type: ignore[union-attr]
            run.process.wait(10)  # type: ignore[union-attr]
            done = True
        if done:
            self.pods.pop(run.uid, None)
            self._finalize(run.pod)

    def _finalize(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        try:
            self.kube.request("DELETE", f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}",
                              {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0,
                               "preconditions": {"uid": meta["uid"]}})
        except ApiError as exc:
            if exc.status not in (404, 409):
                raise

    def _kill(self, run: PodRun, *, grace: float) -> None:
        process = run.process
        if process is None or process.poll() is not None:
            return
        try:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(grace)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)
        except ProcessLookupError:
            pass

    # -- for tests ---------------------------------------------------------------------------------
    def logs(self, namespace: str, prefix: str = "") -> str:
        """What ``kubectl logs`` would print for the pods of ``namespace`` whose names start with
        ``prefix`` (their containers' output, every run; there is no kubelet to serve it)."""
        runs = [r for r in list(self.pods.values()) if r.namespace == namespace and r.name.startswith(prefix)]
        return "".join((r.workdir / "container.log").read_text(errors="replace") for r in runs
                       if (r.workdir / "container.log").exists())

    def running(self, prefix: str = "") -> list[PodRun]:
        return [r for r in list(self.pods.values())
                if r.name.startswith(prefix) and r.process is not None and r.process.poll() is None]
