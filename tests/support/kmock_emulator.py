"""A stricter Kubernetes emulator on top of kmock, and helpers to run the operator against it.

kmock 0.8's emulator lacks what Kopf relies on (see shared/notes/testing.md): metadata stamping,
resourceVersion/generation rules, a status subresource, JSON patch with ``test``, and a watch that
resumes from a resourceVersion without losing events. This subclass serves every namespaced resource
request itself, keeping objects in ``kmock.objects`` (so tests can read them) and an append-only
event log that watches replay from the client's resourceVersion and then follow.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import json
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp.web
import attrs
import kmock
import yaml
from kmock._internal import apps, enums, references, rendering

from judgequeue.controllers.operator import OperatorOptions, operate
from judgequeue.controllers.state import OperatorConfig, OperatorState
from tests.support.waiting import eventually as eventually  # re-exported: bench/reconcile_bench.py uses it

JQ = kmock.resource("judgequeue.dev/v1alpha1/judgequeues")
DEPLOYMENTS = kmock.resource("apps/v1/deployments")
SERVICES = kmock.resource("v1/services")
SECRETS = kmock.resource("v1/secrets")
EVENTS = kmock.resource("v1/events")


def _merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = _merge_patch(result.get(key), value)
    return result


class _PatchTestFailed(Exception):
    pass


def _pointer(path: str) -> list[str]:
    return [p.replace("~1", "/").replace("~0", "~") for p in path.lstrip("/").split("/")] if path else []


def _json_patch(obj: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    """RFC 6902 (add, replace, remove, test) on a copy of ``obj``."""
    doc = copy.deepcopy(obj)
    for op in ops:
        parts = _pointer(op["path"])
        parent: Any = doc
        for part in parts[:-1]:
            parent = parent[int(part)] if isinstance(parent, list) else parent.setdefault(part, {})
        last = parts[-1] if parts else ""
        kind = op["op"]
        if kind == "test":
            current = parent[int(last)] if isinstance(parent, list) else parent.get(last)
            if current != op.get("value"):
                raise _PatchTestFailed(f"test failed at {op['path']}")
        elif kind in ("add", "replace"):
            if isinstance(parent, list):
                if last == "-":
                    parent.append(op["value"])
                elif kind == "add":
                    parent.insert(int(last), op["value"])
                else:
                    parent[int(last)] = op["value"]
            else:
                parent[last] = op["value"]
        elif kind == "remove":
            if isinstance(parent, list):
                del parent[int(last)]
            else:
                parent.pop(last, None)
    return doc


def _k8s_error(status: int, reason: str, message: str) -> aiohttp.web.Response:
    return aiohttp.web.json_response(
        {"apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Failure", "code": status,
         "reason": reason, "message": message},
        status=status,
    )


@attrs.define(kw_only=True)
class StrictEmulator(kmock.KubernetesEmulator):
    """kmock's emulator with the API-server semantics Kopf and the operator depend on."""

    _rv: int = attrs.field(default=0, init=False)
    _log: list[tuple[int, Any, str | None, dict[str, Any]]] = attrs.field(factory=list, init=False)
    _changed: asyncio.Event | None = attrs.field(default=None, init=False)
    _closing: bool = attrs.field(default=False, init=False)
    _write_waiters: list[asyncio.Future[None]] = attrs.field(factory=list, init=False)

    def _info(self, resource: Any) -> references.ResourceInfo | None:
        for known in self.resources:
            if known == resource:
                info: references.ResourceInfo = self.resources[known]
                return info
        return None

    def _kind(self, resource: Any) -> str:
        info = self._info(resource)
        return (info.kind if info and info.kind else str(resource.plural).capitalize().rstrip("s")) or "Object"

    def _api_version(self, resource: Any) -> str:
        return f"{resource.group}/{resource.version}" if resource.group else str(resource.version)

    def _has_status(self, resource: Any) -> bool:
        info = self._info(resource)
        return bool(info and "status" in info.subresources)

    def _emit(self, resource: Any, namespace: str | None, event_type: str, obj: dict[str, Any]) -> None:
        self._log.append((self._rv, resource, namespace, {"type": event_type, "object": copy.deepcopy(obj)}))
        if self._changed is not None:
            self._changed.set()
        waiters, self._write_waiters = self._write_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def next_write(self) -> None:
        """Return after the next write of any object (for latency measurements, no polling)."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._write_waiters.append(waiter)
        await waiter

    def _get(self, resource: Any, namespace: str | None, name: str) -> dict[str, Any] | None:
        key = (resource, namespace, name)
        if key not in self.objects or self.objects[key].deleted:
            return None
        raw: dict[str, Any] = copy.deepcopy(self.objects[key].raw)
        return raw

    def _store(self, resource: Any, namespace: str | None, name: str, obj: dict[str, Any]) -> None:
        key = (resource, namespace, name)
        if key in self.objects:
            self.objects[key].create(copy.deepcopy(obj))
        else:
            self.objects[key] = copy.deepcopy(obj)

    def _items(self, resource: Any, namespace: str | None) -> list[dict[str, Any]]:
        items = []
        for (res, ns, _), obj in self.objects.items():
            if res == resource and (namespace is None or ns == namespace) and not obj.deleted:
                items.append(copy.deepcopy(obj.raw))
        return items

    # --- writes ---------------------------------------------------------------------------------

    def _create(self, request: rendering.Request) -> aiohttp.web.Response:
        resource: Any = request.resource
        body = copy.deepcopy(request.data or {})
        meta = body.setdefault("metadata", {})
        namespace = request.namespace or meta.get("namespace")
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        name = meta.get("name")
        if not name:
            return _k8s_error(422, "Invalid", "metadata.name is required")
        if self._get(resource, namespace, name) is not None:
            return _k8s_error(409, "AlreadyExists", f"{getattr(resource, 'plural', '')} {name!r} already exists")
        self._rv += 1
        if namespace is not None:
            meta["namespace"] = namespace
        meta.update(uid=str(uuid.uuid4()), resourceVersion=str(self._rv), generation=1,
                    creationTimestamp=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
        body.setdefault("apiVersion", self._api_version(resource))
        body.setdefault("kind", self._kind(resource))
        if self._has_status(resource):
            body.pop("status", None)
        self._store(resource, namespace, name, body)
        self._emit(resource, namespace, "ADDED", body)
        return aiohttp.web.json_response(body, status=201)

    def _write(self, request: rendering.Request, new: dict[str, Any], old: dict[str, Any]) -> aiohttp.web.Response:
        resource: Any = request.resource
        namespace, name = request.namespace, str(request.name)
        if request.subresource == "status":
            new = {**old, "status": new.get("status")} if new.get("status") is not None else {
                k: v for k, v in old.items() if k != "status"}
        elif self._has_status(resource):
            new = {**new, "status": old["status"]} if "status" in old else {
                k: v for k, v in new.items() if k != "status"}
        meta = new.setdefault("metadata", {})
        for fixed in ("uid", "creationTimestamp", "name", "namespace"):
            if fixed in old["metadata"]:
                meta[fixed] = old["metadata"][fixed]
        ignored = ("metadata", "status")
        changed = {k: v for k, v in new.items() if k not in ignored} != {
            k: v for k, v in old.items() if k not in ignored}
        meta["generation"] = int(old["metadata"].get("generation", 1)) + (1 if changed else 0)
        if new == {**old, "metadata": {**old["metadata"], "generation": meta["generation"]}}:
            return aiohttp.web.json_response(old)  # a no-op write changes nothing, not even resourceVersion
        self._rv += 1
        meta["resourceVersion"] = str(self._rv)
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            key = (resource, namespace, name)
            self.objects[key].delete()
            self._emit(resource, namespace, "DELETED", new)
            return aiohttp.web.json_response(new)
        self._store(resource, namespace, name, new)
        self._emit(resource, namespace, "MODIFIED", new)
        return aiohttp.web.json_response(new)

    def _patch(self, request: rendering.Request) -> aiohttp.web.Response:
        old = self._get(request.resource, request.namespace, str(request.name))
        if old is None:
            return _k8s_error(404, "NotFound", f"{getattr(request.resource, 'plural', '')} {request.name!r} not found")
        content_type = (request.headers.get("Content-Type") or request.headers.get("content-type") or "").lower()
        data = json.loads(request.body or b"null")
        if "json-patch" in content_type:
            try:
                new = _json_patch(old, data)
            except (_PatchTestFailed, KeyError, IndexError, ValueError) as exc:
                return _k8s_error(422, "Invalid", str(exc))
        else:
            new = _merge_patch(old, data)
        return self._write(request, new, old)

    def _put(self, request: rendering.Request) -> aiohttp.web.Response:
        old = self._get(request.resource, request.namespace, str(request.name))
        if old is None:
            return _k8s_error(404, "NotFound", f"{getattr(request.resource, 'plural', '')} {request.name!r} not found")
        new = copy.deepcopy(request.data or {})
        want_rv = new.get("metadata", {}).get("resourceVersion")
        if want_rv and want_rv != old["metadata"]["resourceVersion"]:
            return _k8s_error(409, "Conflict", "the object has been modified")
        if (request.params or {}).get("dryRun"):  # what would be stored (no defaulting here), nothing stored
            kept = ("uid", "creationTimestamp", "name", "namespace", "resourceVersion", "generation")
            fixed = {k: old["metadata"][k] for k in kept if k in old["metadata"]}
            dry = {**new, "metadata": {**new.get("metadata", {}), **fixed}}
            if "status" in old:
                dry["status"] = old["status"]
            return aiohttp.web.json_response(dry)
        return self._write(request, new, old)

    def _delete(self, request: rendering.Request) -> aiohttp.web.Response:
        resource: Any = request.resource
        namespace, name = request.namespace, str(request.name)
        old = self._get(resource, namespace, name)
        if old is None:
            return _k8s_error(404, "NotFound", f"{getattr(resource, 'plural', '')} {name!r} not found")
        self._rv += 1
        old["metadata"]["resourceVersion"] = str(self._rv)
        if old["metadata"].get("finalizers"):
            old["metadata"]["deletionTimestamp"] = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            self._store(resource, namespace, name, old)
            self._emit(resource, namespace, "MODIFIED", old)
            return aiohttp.web.json_response(old)
        self.objects[(resource, namespace, name)].delete()
        self._emit(resource, namespace, "DELETED", old)
        return aiohttp.web.json_response(old)

    # --- reads ----------------------------------------------------------------------------------

    def _list(self, request: rendering.Request) -> aiohttp.web.Response:
        items = self._items(request.resource, request.namespace)
        selector = request.params.get("labelSelector")
        if selector:
            wanted = dict(part.split("=", 1) for part in selector.split(",") if "=" in part)
            items = [i for i in items if all((i["metadata"].get("labels") or {}).get(k) == v
                                             for k, v in wanted.items())]
        return aiohttp.web.json_response({
            "apiVersion": self._api_version(request.resource),
            "kind": f"{self._kind(request.resource)}List",
            "metadata": {"resourceVersion": str(self._rv)},
            "items": items,
        })

    async def _watch(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        raw = request._raw_request
        assert raw is not None
        response = aiohttp.web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(raw)
        since_text = request.params.get("resourceVersion") or ""
        timeout = float(request.params.get("timeoutSeconds") or 0) or None
        deadline = time.monotonic() + timeout if timeout else None
        if self._changed is None:
            self._changed = asyncio.Event()
        if since_text and since_text != "0":
            since = int(since_text)
            position = next((i for i, entry in enumerate(self._log) if entry[0] > since), len(self._log))
        else:
            position = len(self._log)
            for item in self._items(request.resource, request.namespace):
                await response.write(json.dumps({"type": "ADDED", "object": item}).encode() + b"\n")
        try:
            while not self._closing and (deadline is None or time.monotonic() < deadline):
                while position < len(self._log):
                    _, resource, namespace, event = self._log[position]
                    position += 1
                    if resource == request.resource and (request.namespace is None or namespace == request.namespace):
                        await response.write(json.dumps(event).encode() + b"\n")
                if raw.transport is None or raw.transport.is_closing():
                    break
                self._changed.clear()
                if position < len(self._log):
                    continue
                with suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), timeout=0.5)
        except (ConnectionResetError, RuntimeError):
            pass
        return response

    async def _handle(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        resource = request.resource
        if resource is None or not resource.plural:
            return await apps.RawHandler._handle(self, request)
        method = str(request.method.value if isinstance(request.method, enums.method) else request.method).upper()
        if request.action == enums.action.WATCH:
            return await self._watch(request)
        async with self._lock:
            if request.name is None:
                if method == "GET":
                    return self._list(request)
                if method == "POST":
                    return self._create(request)
            elif method == "GET":
                obj = self._get(resource, request.namespace, request.name)
                if obj is None:
                    return _k8s_error(404, "NotFound", f"{resource.plural} {request.name!r} not found")
                if request.subresource == "status":
                    return aiohttp.web.json_response(obj)
                return aiohttp.web.json_response(obj)
            elif method == "PATCH":
                return self._patch(request)
            elif method == "PUT":
                return self._put(request)
            elif method == "DELETE":
                return self._delete(request)
        return _k8s_error(405, "MethodNotAllowed", f"{method} {request.url}")

    def close_watches(self) -> None:
        self._closing = True
        if self._changed is not None:
            self._changed.set()

    # --- test conveniences ----------------------------------------------------------------------

    def declare(self) -> None:
        """Declare the resources the operator and Kopf use (discovery)."""
        self.resources.load_bundled()  # core and apps discovery from a K3s dump (namespaces, CRDs, ...)
        info = kmock.ResourceInfo
        self.resources[JQ] = info(kind="JudgeQueue", singular="judgequeue", namespaced=True,
                                  verbs=["get", "list", "watch", "create", "patch", "update", "delete"],
                                  shortnames=["jq"], subresources=["status", "scale"])
        self.resources[DEPLOYMENTS] = info(kind="Deployment", singular="deployment", namespaced=True,
                                           verbs=["get", "list", "watch", "create", "patch", "delete"],
                                           subresources=["status", "scale"])
        self.resources[SERVICES] = info(kind="Service", singular="service", namespaced=True,
                                        verbs=["get", "list", "create", "patch", "delete"], subresources=["status"])
        self.resources[SECRETS] = info(kind="Secret", singular="secret", namespaced=True,
                                       verbs=["get", "list", "create", "patch", "delete"])
        self.resources[EVENTS] = info(kind="Event", singular="event", namespaced=True, verbs=["create", "list"])

    def put_object(self, resource: Any, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        """Create an object directly (as ``kubectl apply`` would), stamping metadata like the API does."""
        meta = body.setdefault("metadata", {})
        self._rv += 1
        meta.update(namespace=namespace, uid=str(uuid.uuid4()), resourceVersion=str(self._rv), generation=1,
                    creationTimestamp=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
        body.setdefault("apiVersion", self._api_version(resource))
        body.setdefault("kind", self._kind(resource))
        self._store(resource, namespace, meta["name"], body)
        self._emit(resource, namespace, "ADDED", body)
        return body

    def current(self, resource: Any, namespace: str, name: str) -> dict[str, Any] | None:
        return self._get(resource, namespace, name)

    def versions(self, resource: Any, namespace: str, name: str) -> int:
        """How many times the object was written (create + every real change)."""
        key = (resource, namespace, name)
        return len([v for v in self.objects[key].history if v is not None]) if key in self.objects else 0


def secret(name: str, **values: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "type": "Opaque",
            "data": {k: base64.b64encode(v.encode()).decode() for k, v in values.items()}}


def write_kubeconfig(path: Path, url: str) -> Path:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "kmock",
        "clusters": [{"name": "kmock", "cluster": {"server": url}}],
        "users": [{"name": "kmock", "user": {"token": "test-token"}}],
        "contexts": [{"name": "kmock", "context": {"cluster": "kmock", "user": "kmock", "namespace": "default"}}],
    }))
    return path


class OperatorThread:
    """The operator in its own thread and event loop (Kopf must not share the test's loop)."""

    def __init__(self, kubeconfig: Path, namespaces: list[str], config: OperatorConfig) -> None:
        self.state = OperatorState(config=config)
        self.stop_flag = threading.Event()
        self.ready_flag = threading.Event()
        self.error: BaseException | None = None
        self._kubeconfig = kubeconfig
        self._namespaces = namespaces
        self._thread = threading.Thread(target=self._run, name="kopf-operator", daemon=True)

    def _run(self) -> None:
        try:
            options = OperatorOptions(self._namespaces, kubeconfig=str(self._kubeconfig), standalone=True)
            asyncio.run(operate(options, stop_flag=self.stop_flag, ready_flag=self.ready_flag, state=self.state))
        except BaseException as exc:  # reported by the test
            self.error = exc

    def start(self) -> None:
        self._thread.start()

    async def wait_ready(self, deadline: float = 10.0) -> None:
        await eventually(
            lambda: self.ready_flag.is_set() or self.error is not None, within=deadline, what="operator ready"
        )
        if self.error is not None:
            raise self.error

    async def stop(self, deadline: float = 15.0) -> None:
        self.stop_flag.set()
        await eventually(lambda: not self._thread.is_alive(), within=deadline, what="operator stopped")


@contextmanager
def no_writes(emulator: StrictEmulator, namespace: str, names: list[tuple[Any, str]]) -> Iterator[None]:
    """Assert that none of ``names`` is written within the block."""
    before = {n: emulator.versions(r, namespace, n) for r, n in names}
    yield
    after = {n: emulator.versions(r, namespace, n) for r, n in names}
    assert before == after, f"children changed: {before} -> {after}"
