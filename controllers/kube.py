"""A small async Kubernetes client for the operator's own reads and writes (children, Secrets, the CR).

Credentials come from the ``kubernetes`` package's loaders (in-cluster service account, else a
kubeconfig file), and the same values log Kopf in (:func:`connection_info`), so both clients always
talk to the same cluster as the same identity. Requests go through aiohttp (already Kopf's transport)
so nothing blocks the event loop.
"""

from __future__ import annotations

import base64
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import aiohttp
import kopf
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config

from . import redact

MERGE_PATCH = "application/merge-patch+json"
#: The operator's name in the children's ``managedFields`` (who wrote what).
FIELD_MANAGER = "judgequeue-operator"


class KubeError(Exception):
    """The API server refused a request or could not be reached.

    ``api_message`` is the API server's own message (``Deployment.apps "x" is invalid: ...``), what
    status conditions quote; ``reason`` its machine reason (``Invalid``, ``Forbidden``, ``Conflict``).
    """

    def __init__(self, status: int, message: str, *, api_message: str = "", reason: str = "") -> None:
        super().__init__(f"HTTP {status}: {message}" if status else message)
        self.status = status
        self.api_message = api_message or message
        self.reason = reason

    @property
    def refused(self) -> bool:
        """The API server answered and refused this request for what it is (validation, admission,
        RBAC, quota): retrying the same request cannot help, a change elsewhere may."""
        return self.status in (400, 403, 405, 413, 415, 422) or (self.status == 404 and self.reason != "NotFound")


class SecretNotFound(Exception):
    """A referenced Secret or key does not exist."""


def load_configuration(kubeconfig: str | None = None) -> k8s_client.Configuration:
    """In-cluster configuration when running in a pod (and no kubeconfig given), else the kubeconfig."""
    configuration = k8s_client.Configuration()
    if kubeconfig is None:
        try:
            k8s_config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
            return configuration
        except k8s_config.ConfigException:
            pass
    k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
        config_file=kubeconfig, client_configuration=configuration
    )
    return configuration


def _token(configuration: k8s_client.Configuration) -> tuple[str | None, str | None]:
    header = configuration.get_api_key_with_prefix("authorization") or configuration.get_api_key_with_prefix(
        "BearerToken"
    )
    if not header:
        return None, None
    scheme, _, token = str(header).partition(" ")
    return (scheme, token) if token else ("Bearer", scheme)


def connection_info(configuration: k8s_client.Configuration) -> kopf.ConnectionInfo:
    """Kopf's login credentials from a ``kubernetes`` configuration."""
    scheme, token = _token(configuration)
    return kopf.ConnectionInfo(
        server=str(configuration.host),
        ca_path=configuration.ssl_ca_cert or None,
        insecure=not configuration.verify_ssl,
        scheme=scheme,
        token=token,
        certificate_path=configuration.cert_file or None,
        private_key_path=configuration.key_file or None,
    )


@dataclass(frozen=True)
class Ref:
    """API coordinates of one object kind."""

    api_version: str
    plural: str

    def path(self, namespace: str, name: str | None = None) -> str:
        base = "/api/v1" if self.api_version == "v1" else f"/apis/{self.api_version}"
        path = f"{base}/namespaces/{namespace}/{self.plural}"
        return f"{path}/{name}" if name else path


DEPLOYMENTS = Ref("apps/v1", "deployments")
SERVICES = Ref("v1", "services")
SECRETS = Ref("v1", "secrets")
JUDGEQUEUES = Ref("judgequeue.dev/v1alpha1", "judgequeues")
PODS = Ref("v1", "pods")
NETWORK_POLICIES = Ref("networking.k8s.io/v1", "networkpolicies")

KIND_REFS = {"Deployment": DEPLOYMENTS, "Service": SERVICES, "Secret": SECRETS, "JudgeQueue": JUDGEQUEUES,
             "NetworkPolicy": NETWORK_POLICIES}


class KubeApi:
    """GET/POST/PATCH of namespaced objects as plain dicts."""

    def __init__(self, configuration: k8s_client.Configuration, *, timeout: float = 10.0) -> None:
        self._configuration = configuration
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._session: aiohttp.ClientSession | None = None

    async def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            c = self._configuration
            ssl_context: ssl.SSLContext | bool
            if str(c.host).startswith("https"):
                ssl_context = ssl.create_default_context(cafile=c.ssl_ca_cert or None)
                if c.cert_file:
                    ssl_context.load_cert_chain(c.cert_file, c.key_file)
                if not c.verify_ssl:
                    ssl_context.check_hostname = False
                    ssl_context.verify_mode = ssl.CERT_NONE
            else:
                ssl_context = False
            self._session = aiohttp.ClientSession(
                base_url=str(c.host).rstrip("/") + "/",
                timeout=self._timeout,
                connector=aiohttp.TCPConnector(ssl=ssl_context),
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def _request(
        self, method: str, path: str, body: Mapping[str, Any] | None = None, content_type: str = "application/json"
    ) -> dict[str, Any] | None:
        session = await self._client()
        headers = {"Accept": "application/json"}
        scheme, token = _token(self._configuration)
        if token:
            headers["Authorization"] = f"{scheme} {token}"
        if body is not None:
            headers["Content-Type"] = content_type
        try:
            async with session.request(method, path.lstrip("/"), json=body, headers=headers) as response:
                if response.status == 404 and method == "GET":
                    return None
                data = await response.json(content_type=None)
                if response.status >= 400:
                    message = data.get("message", "") if isinstance(data, dict) else str(data)
                    reason = str(data.get("reason", "")) if isinstance(data, dict) else ""
                    raise KubeError(response.status, f"{method} {path.split('?')[0]}: {message}",
                                    api_message=message, reason=reason)
                return data if isinstance(data, dict) else None
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise KubeError(0, f"{method} {path}: {exc!r}") from exc

    async def get(self, ref: Ref, namespace: str, name: str) -> dict[str, Any] | None:
        return await self._request("GET", ref.path(namespace, name))

    async def list_objects(self, ref: Ref, namespace: str, *, label_selector: str) -> list[dict[str, Any]]:
        """The objects of one kind in ``namespace`` matching ``label_selector`` (one page: a role's pods)."""
        data = await self._request("GET", f"{ref.path(namespace)}?labelSelector={quote(label_selector)}")
        return list((data or {}).get("items") or [])

    async def create(self, ref: Ref, namespace: str, body: Mapping[str, Any]) -> dict[str, Any]:
        return await self._request("POST", f"{ref.path(namespace)}?fieldManager={FIELD_MANAGER}", body) or {}

    async def replace(
        self, ref: Ref, namespace: str, name: str, body: Mapping[str, Any], *, dry_run: bool = False
    ) -> dict[str, Any]:
        """PUT the whole object (``body`` carries the ``resourceVersion`` it replaces: a concurrent
        change fails with 409). ``dry_run``: what the API server would store (defaults filled in,
        admission run), storing nothing."""
        query = f"?fieldManager={FIELD_MANAGER}" + ("&dryRun=All" if dry_run else "")
        return await self._request("PUT", ref.path(namespace, name) + query, body) or {}

    async def patch(
        self, ref: Ref, namespace: str, name: str, patch: Mapping[str, Any], *, subresource: str | None = None
    ) -> dict[str, Any]:
        path = ref.path(namespace, name) + (f"/{subresource}" if subresource else "") + f"?fieldManager={FIELD_MANAGER}"
        return await self._request("PATCH", path, patch, MERGE_PATCH) or {}

    async def delete(self, ref: Ref, namespace: str, name: str, *, uid: str | None = None) -> bool:
        """Delete one object (only if its uid is still ``uid``, when given); False if it was gone."""
        body: dict[str, Any] | None = None
        if uid is not None:
            body = {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": uid}}
        try:
            await self._request("DELETE", ref.path(namespace, name), body)
        except KubeError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    async def secret_value(self, namespace: str, name: str, key: str) -> str:
        """The decoded value of ``key`` in Secret ``name``; raises SecretNotFound naming what is missing."""
        secret = await self.get(SECRETS, namespace, name)
        if secret is None:
            raise SecretNotFound(f"Secret {namespace}/{name} not found")
        data = secret.get("data") or {}
        string_data = secret.get("stringData") or {}
        if key in data:
            value = base64.b64decode(data[key]).decode()
        elif key in string_data:
            value = str(string_data[key])
        else:
            raise SecretNotFound(f"Secret {namespace}/{name} has no key {key!r}")
        redact.remember(value)  # never quoted in an Event, a log line or status from now on
        return value
