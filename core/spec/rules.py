"""The spec's cross-field rules (:data:`RULES`: the check and the CRD's CEL rule with the same
message), and every object path the spec may hold."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..config import (
    format_duration,
)
from ..settings_table import ROW_BY_SPEC
from .fields import CLASSES, ENDPOINTS, FIELDS, RESOURCES, WEBHOOKS


@dataclass(frozen=True)
class Rule:
    """A cross-field rule of one object: ``check(values of that object)`` must hold, and so must ``cel``,
    the CRD's rule saying the same.

    ``message`` and ``field`` are the CRD rule's ``message`` and ``fieldPath``; the error reads
    ``spec.<object>.<field>: <message>``. A transition rule (``check`` None: it compares the object
    with its previous version, ``oldSelf``) is the API server's alone.
    """

    obj: tuple[str, ...]
    field: str
    uses: tuple[str, ...]
    message: str
    check: Callable[[Mapping[str, Any]], bool] | None
    cel: str


def _under_rules() -> tuple[Rule, ...]:
    """A rule for each role setting whose row bounds a duration from above (``under``): the roles
    refuse the same values (core/settings_table.py)."""

    def below(name: str, under: float) -> Callable[[Mapping[str, Any]], bool]:
        return lambda values: bool(values[name] < under)

    return tuple(
        Rule(path[:-1], path[-1], (path[-1],), f"{'.'.join(path)} must be under {format_duration(row.under)}",
             below(path[-1], row.under), f"duration(self.{path[-1]}) < duration('{format_duration(row.under)}')")
        for path, row in ROW_BY_SPEC.items() if row.under is not None
    )


def _at_most(obj: tuple[str, ...], name: str, bound: str, *, duration: bool = True, why: str = "") -> Rule:
    """``obj.name`` must not exceed ``obj.bound`` (two durations, or two integers)."""

    def check(values: Mapping[str, Any]) -> bool:
        return bool(values[name] <= values[bound])

    def cel(field: str) -> str:
        return f"duration(self.{field})" if duration else f"self.{field}"

    at = ".".join(obj)
    return Rule(obj, name, (name, bound), f"{at}.{name} must not exceed {at}.{bound}{why}", check,
                f"{cel(name)} <= {cel(bound)}")


RULES: tuple[Rule, ...] = (
    _at_most(("dispatcher", "backoff"), "base", "max"),
    _at_most(("worker",), "minReplicas", "maxReplicas", duration=False),
    *_under_rules(),
    _at_most(("reaper",), "interval", "visibilityTimeout", why=" (sweeps would miss idle entries)"),
    _at_most(("reaper",), "leaseTtl", "visibilityTimeout"),
    Rule(("cutover",), "watermark", ("watermark",),
         "cutover.watermark may only move forward (roll back with mode shadow)", None,
         "!has(oldSelf.watermark) || (has(self.watermark) && "
         "timestamp(self.watermark) >= timestamp(oldSelf.watermark))"),
)


def object_paths() -> dict[tuple[str, ...], set[str]]:
    """Every object of the spec (``()`` is the spec) and the names of its properties."""
    objects: dict[tuple[str, ...], set[str]] = {(): set()}
    for f in FIELDS:
        for i in range(len(f.path)):
            objects.setdefault(f.path[:i], set()).add(f.path[i])
    for path in RESOURCES:
        objects[path].add("resources")
    objects[ENDPOINTS[:-1]].add(ENDPOINTS[-1])
    objects[()].add(WEBHOOKS[0])
    objects.setdefault(WEBHOOKS[:-1], set()).add(WEBHOOKS[-1])
    objects[()].add(CLASSES[0])
    return objects


