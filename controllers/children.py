"""The operator owns its children whole: each is compared with what the API server would make of the
rendered one, and replaced when anything differs (docs/runbook.md, "Changes to the children").

A merge patch of the rendered fields leaves alone whatever someone else added: a capability, a
``hostNetwork: true``, a ``nodeSelector``, a NetworkPolicy selector that matches no pod (which turns
the workers' egress policy off). So the operator asks the API server for a dry run of the rendered
object (a ``PUT`` with ``dryRun=All``: defaults filled in, admission run, nothing stored), compares
it with the live object field by field (:func:`judgequeue.controllers.diff.differences`), and replaces
the live object when they differ, naming every difference in its log and, when the spec did not
change, in a Warning Event (``DriftReverted``). Metadata the API server or other controllers keep
(annotations such as the Deployment's revision, foreign labels) is carried over; the pod template is
the operator's, except ``kubectl rollout restart``'s annotation.

A verified child is remembered by its uid and generation (resourceVersion for kinds without one) and
the digest of what was rendered, so a tick that finds nothing changed costs one GET per child, and a
child deleted and created again by someone else is compared whole on the next pass.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .diff import Difference, differences
from .kube import KIND_REFS, KubeApi
from .render import Child

#: Pod-template annotations someone else may set without the operator undoing it.
KEPT_TEMPLATE_ANNOTATIONS = ("kubectl.kubernetes.io/restartedAt",)
#: Metadata fields never sent back (the API server keeps or derives them).
DROPPED_METADATA = ("managedFields", "resourceVersion", "generation", "creationTimestamp", "uid", "selfLink")


@dataclass
class Verified:
    """What the operator last saw of one child: its version and the digest of the rendered body."""

    version: str
    digest: str


@dataclass
class Synced:
    """The result of :func:`sync_child`: the live object afterwards, what was done, the differences
    reverted and whether they were drift (the spec did not change since the child was last verified)."""

    live: dict[str, Any]
    action: str = ""  # "", "create" or "replace"
    diffs: list[Difference] = field(default_factory=list)
    drift: bool = False


def version_of(obj: Mapping[str, Any]) -> str:
    """What identifies one state of a live child: its uid (an object deleted and created again under
    the same name, ``kubectl replace --force``, is another object, whose generation starts again at
    1) with its generation and the metadata the operator owns, or its resourceVersion."""
    meta = obj.get("metadata") or {}
    generation = meta.get("generation")
    uid = meta.get("uid", "")
    if generation:
        return f"{uid}:g{generation}:{_digest({k: meta.get(k) for k in ('labels', 'ownerReferences')})}"
    return f"{uid}:r{meta.get('resourceVersion', '')}"


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:32]


def replacement(desired: Mapping[str, Any], live: Mapping[str, Any]) -> dict[str, Any]:
    """The body that replaces ``live`` with ``desired`` (pure): the rendered spec and the operator's
    labels and owner reference, over the live metadata others keep (annotations, other labels,
    finalizers). A Deployment rendered without ``replicas`` (someone else scales it) keeps the live
    count, and the pod template keeps ``kubectl rollout restart``'s annotation."""
    live_meta = dict(live.get("metadata") or {})
    meta = {k: v for k, v in live_meta.items() if k not in DROPPED_METADATA}
    want_meta = desired.get("metadata") or {}
    meta["labels"] = {**(live_meta.get("labels") or {}), **(want_meta.get("labels") or {})}
    meta["ownerReferences"] = copy.deepcopy(want_meta.get("ownerReferences") or [])
    spec = copy.deepcopy(dict(desired.get("spec") or {}))
    live_spec = live.get("spec") or {}
    if desired.get("kind") == "Deployment":
        if "replicas" not in spec and "replicas" in live_spec:
            spec["replicas"] = live_spec["replicas"]
        live_annotations = ((live_spec.get("template") or {}).get("metadata") or {}).get("annotations") or {}
        kept = {k: v for k, v in live_annotations.items() if k in KEPT_TEMPLATE_ANNOTATIONS}
        if kept:
            template_meta = spec.setdefault("template", {}).setdefault("metadata", {})
            template_meta["annotations"] = {**kept, **(template_meta.get("annotations") or {})}
    return {"apiVersion": desired.get("apiVersion"), "kind": desired.get("kind"), "metadata": meta, "spec": spec}


def compared(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The parts of a child the operator owns: its spec, labels and owner references."""
    meta = obj.get("metadata") or {}
    return {"metadata": {"labels": meta.get("labels") or {}, "ownerReferences": meta.get("ownerReferences") or []},
            "spec": obj.get("spec") or {}}


async def sync_child(
    api: KubeApi, namespace: str, child: Child, live: dict[str, Any] | None, verified: dict[str, Verified],
) -> Synced:
    """Create ``child`` if missing, else replace it if the live object differs from a dry run of the
    rendered one; ``verified`` (by child name) remembers what was last found equal. Raises
    :class:`~judgequeue.controllers.kube.KubeError` when the API server refuses."""
    ref = KIND_REFS[child.kind]
    digest = _digest(child.body)
    if live is None:
        created = await api.create(ref, namespace, child.body)
        verified[child.name] = Verified(version_of(created), digest)
        return Synced(created, "create")
    known = verified.get(child.name)
    if known is not None and known.version == version_of(live) and known.digest == digest:
        return Synced(live)
    body = replacement(child.body, live)
    dry = await api.replace(ref, namespace, child.name, body, dry_run=True)
    diffs = differences(compared(live), compared(dry))
    if not diffs:
        verified[child.name] = Verified(version_of(live), digest)
        return Synced(live)
    replaced = await api.replace(ref, namespace, child.name, body)
    verified[child.name] = Verified(version_of(replaced), digest)
    return Synced(replaced, "replace", diffs, drift=known is None or known.digest == digest)
