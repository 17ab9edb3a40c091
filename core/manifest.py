"""A ``JudgeQueue`` manifest (see README's Kubernetes section) read outside Kubernetes for ``judgequeue local``.

The spec is validated by :func:`judgequeue.core.spec.parse_spec`, the model the operator uses too, so
``local`` accepts and refuses exactly the manifests the operator does; each role process gets the
variables :func:`judgequeue.core.spec.role_settings` gives its role, as its Deployment would.
Connections (Postgres, Redis) are not part of the rendering: in a cluster they come from Secrets,
locally from the environment or flags.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from .base.errors import ConfigError
from .spec import JudgeQueueSpec, Role, parse_spec, role_settings

API_VERSION = "judgequeue.dev/v1alpha1"
KIND = "JudgeQueue"


class ManifestError(ConfigError):
    """The manifest is malformed; the message names the field."""


@dataclass(frozen=True)
class Cutover:
    mode: str
    watermark: datetime | None
    paused: bool


@dataclass(frozen=True)
class Replicas:
    dispatcher: int
    worker: int
    reaper: int
    #: Shadow workers (``spec.worker.shadow``), while the queue is in shadow mode, as the operator runs them.
    shadow_worker: int = 0


@dataclass(frozen=True)
class Manifest:
    name: str
    queue: str
    spec: JudgeQueueSpec
    cutover: Cutover
    replicas: Replicas

    def env(self, role: Role) -> dict[str, str]:
        """The ``JUDGEQUEUE_*`` settings the manifest writes for ``role`` (never connections; the
        queue always, as it defaults to the name). Pure."""
        return role_settings(self.spec, role, given_only=True)


def parse_manifest(doc: Any) -> Manifest:
    """Validate a loaded manifest document into a :class:`Manifest`. Pure.

    Raises :class:`ManifestError` listing every error of the spec, each naming its field.
    """
    if not isinstance(doc, Mapping):
        raise ManifestError("manifest: expected a JudgeQueue object")
    if doc.get("apiVersion") != API_VERSION:
        raise ManifestError(f"apiVersion: expected {API_VERSION}, got {doc.get('apiVersion')!r}")
    if doc.get("kind") != KIND:
        raise ManifestError(f"kind: expected {KIND}, got {doc.get('kind')!r}")
    metadata = doc.get("metadata") or {}
    name = str(metadata.get("name", "")) if isinstance(metadata, Mapping) else ""
    parsed = parse_spec(doc.get("spec"), name=name)
    if isinstance(parsed, list):
        raise ManifestError("; ".join(parsed))
    return Manifest(
        name=name or parsed.queue,
        queue=parsed.queue,
        spec=parsed,
        cutover=Cutover(mode=parsed.cutover.mode, watermark=parsed.cutover.watermark, paused=parsed.paused),
        # Locally the worker count is the autoscaler's floor (``--workers`` overrides it).
        replicas=Replicas(
            dispatcher=parsed.dispatcher.replicas,
            worker=parsed.worker.min_replicas,
            reaper=parsed.reaper.replicas,
            shadow_worker=parsed.worker.shadow.replicas
            if parsed.worker.shadow.enabled and parsed.cutover.mode == "shadow" else 0,
        ),
    )


def load_manifest(path: str | Path) -> Manifest:
    """Read a YAML manifest file (the first JudgeQueue document in it)."""
    import yaml

    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ManifestError(f"{path}: {exc.strerror or exc}") from None
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        raise ManifestError(f"{path}: not valid YAML ({str(exc).splitlines()[0]})") from None
    for doc in docs:
        if isinstance(doc, Mapping) and doc.get("kind") == KIND:
            return parse_manifest(doc)
    raise ManifestError(f"{path}: no {KIND} document found")
