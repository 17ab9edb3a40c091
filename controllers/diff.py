"""Compare a live child with its desired form (pure; no I/O).

:func:`differences` compares whole objects: the live child against what the API server makes of the
rendered one (a server-side dry run fills in the same defaults), so a field someone added
(``hostNetwork: true``, a capability, a ``nodeSelector``) differs as surely as one they changed.
The operator replaces a child that differs and names the differences in its logs and Events.

:func:`merge_patch` and :func:`covers` compare only the fields a desired object has (dicts key by
key; a list or scalar that differs is replaced whole, as a JSON merge patch, RFC 7386, does): the
smallest patch for a scale or a status.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


def covers(live: Any, desired: Any) -> bool:
    """True if ``live`` already has every field of ``desired`` with the same value.

    Dicts may carry extra keys on the live side; lists must match element by element (same length,
    each live element covering the desired one), because list order matters for env and containers.
    """
    if isinstance(desired, Mapping):
        return isinstance(live, Mapping) and all(k in live and covers(live[k], v) for k, v in desired.items())
    if isinstance(desired, list):
        if not isinstance(live, list) or len(live) != len(desired):
            return False
        return all(covers(a, b) for a, b in zip(live, desired, strict=True))
    if isinstance(desired, bool) or isinstance(live, bool):
        return live is desired
    return bool(live == desired)


def merge_patch(live: Mapping[str, Any], desired: Mapping[str, Any]) -> dict[str, Any]:
    """The smallest merge patch after which ``live`` covers ``desired``; ``{}`` when nothing differs."""
    patch: dict[str, Any] = {}
    for key, want in desired.items():
        have = live.get(key) if isinstance(live, Mapping) else None
        if covers(have, want):
            continue
        if isinstance(want, Mapping) and isinstance(have, Mapping):
            patch[key] = merge_patch(have, want)
        else:
            patch[key] = want
    return patch


def child_patch(live: Mapping[str, Any], desired: Mapping[str, Any]) -> dict[str, Any]:
    """The patch for a rendered child: its labels, owner references and spec (never its status)."""
    scoped = {
        "metadata": {k: v for k, v in desired.get("metadata", {}).items() if k in ("labels", "ownerReferences")},
        "spec": desired.get("spec", {}),
    }
    return merge_patch(live, scoped)


@dataclass(frozen=True)
class Difference:
    """One field where the live object differs from the desired one: ``live`` is ``MISSING`` when
    the field is absent from the live object, ``desired`` when the desired object has no such field
    (someone added it)."""

    path: str
    live: Any
    desired: Any

    def describe(self, limit: int = 120) -> str:
        """``path: live -> desired`` for a log line or an Event, each value shortened to ``limit``."""
        if self.desired is MISSING:
            return f"{self.path}={_short(self.live, limit)} (not in the spec)"
        if self.live is MISSING:
            return f"{self.path} missing (spec: {_short(self.desired, limit)})"
        return f"{self.path}={_short(self.live, limit)} (spec: {_short(self.desired, limit)})"


class _Missing:
    def __repr__(self) -> str:
        return "<missing>"


MISSING: Any = _Missing()


def _short(value: Any, limit: int) -> str:
    text = json.dumps(value, separators=(",", ":"), sort_keys=True, default=str)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _keyed(items: list[Any]) -> dict[str, Any] | None:
    """A list of objects each with a unique ``name`` (containers, env, volumes, ports) by name."""
    if not all(isinstance(i, Mapping) and isinstance(i.get("name"), str) for i in items):
        return None
    keyed = {str(i["name"]): i for i in items}
    return keyed if len(keyed) == len(items) else None


def differences(live: Any, desired: Any, path: str = "") -> list[Difference]:
    """Every field where ``live`` and ``desired`` differ, each at the deepest path where they part,
    such as ``spec.template.spec.containers[worker].securityContext.capabilities.add`` (lists of named
    objects, containers or env, are matched by name). Unlike :func:`covers`, fields only ``live`` has
    count: this compares a whole object with what the API server would make of the desired one."""
    if isinstance(live, Mapping) and isinstance(desired, Mapping):
        out: list[Difference] = []
        for key in sorted(set(live) | set(desired), key=str):
            sub = f"{path}.{key}" if path else str(key)
            out += differences(live.get(key, MISSING), desired.get(key, MISSING), sub)
        return out
    if isinstance(live, list) and isinstance(desired, list):
        live_named, desired_named = _keyed(live), _keyed(desired)
        if live_named is not None and desired_named is not None and [*live_named] == [*desired_named]:
            out = []
            for name, item in desired_named.items():
                out += differences(live_named[name], item, f"{path}[{name}]")
            return out
        if live_named is not None and desired_named is not None:
            added = [n for n in live_named if n not in desired_named]
            if added and [n for n in live_named if n in desired_named] == [*desired_named]:
                out = [Difference(f"{path}[{n}]", live_named[n], MISSING) for n in added]
                for name, item in desired_named.items():
                    out += differences(live_named[name], item, f"{path}[{name}]")
                return out
        if len(live) == len(desired):
            out = []
            for i, (a, b) in enumerate(zip(live, desired, strict=True)):
                out += differences(a, b, f"{path}[{i}]")
            return out
    if live is MISSING and desired is MISSING:
        return []
    if type(live) is type(desired) and live == desired:
        return []
    return [Difference(path, live, desired)]
