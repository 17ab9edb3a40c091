"""Compute the patch that makes a live object match its desired form (pure; no I/O).

Only the fields the operator renders are compared: anything the API server or another controller
adds (defaults, status, annotations of its own) is left alone. Dicts are compared key by key; a list
or scalar that differs is replaced whole, which is what a JSON merge patch (RFC 7386) does.
"""

from __future__ import annotations

from collections.abc import Mapping
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
