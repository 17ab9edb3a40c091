"""A small structural-schema engine for testing the CRD: defaulting, validation and CEL rules.

kmock validates nothing, so the CRD's schema is exercised here the way the API server would:
defaults applied top-down, then types, ranges, enums, patterns and required fields, then
``x-kubernetes-validations`` evaluated with cel-python (``self`` and, for transition rules on update,
``oldSelf``). It covers the subset of OpenAPI the JudgeQueue CRD uses.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from decimal import Decimal
from pathlib import Path
from typing import Any

import celpy
import yaml
from celpy import celtypes
from celpy.adapter import json_to_cel

from judgequeue.core.spec import parse_quantity

CRD_PATH = Path(__file__).resolve().parents[2] / "crds" / "judgequeue.yaml"


def load_crd() -> dict[str, Any]:
    with CRD_PATH.open() as f:
        data: dict[str, Any] = yaml.safe_load(f)
    return data


def schema_of(crd: Mapping[str, Any]) -> dict[str, Any]:
    schema: dict[str, Any] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def apply_defaults(schema: Mapping[str, Any], value: Any) -> Any:
    """Apply ``default`` values the way the API server does (absent properties only, recursively)."""
    if not isinstance(value, dict) or schema.get("type") != "object":
        return value
    for name, sub in (schema.get("properties") or {}).items():
        if name not in value and "default" in sub:
            value[name] = copy.deepcopy(sub["default"])
        if name in value:
            value[name] = apply_defaults(sub, value[name])
    return value


_ENV = celpy.Environment()


class _Quantity:
    """A value of Kubernetes' CEL ``quantity()`` (k8s.io/apiserver/pkg/cel/library/quantity.go)."""

    def __init__(self, amount: Decimal) -> None:
        self.amount = amount


def _quantity(text: Any) -> _Quantity:
    amount = parse_quantity(str(text))
    if amount is None:
        raise ValueError(f"invalid quantity {text!r}")
    return _Quantity(amount)


def _compare_to(a: _Quantity, b: _Quantity) -> celtypes.IntType:
    return celtypes.IntType((a.amount > b.amount) - (a.amount < b.amount))


#: The parts of Kubernetes' CEL libraries the CRD's rules use, which cel-python lacks: the quantity
#: library and the ``split`` of cel-go's strings extension.
KUBERNETES_FUNCTIONS: dict[str, Any] = {
    "isQuantity": lambda text: celtypes.BoolType(parse_quantity(str(text)) is not None),
    "quantity": _quantity,
    "compareTo": _compare_to,
    "split": lambda text, sep: celtypes.ListType([celtypes.StringType(s) for s in str(text).split(str(sep))]),
}


def cel_program(rule: str) -> Any:
    """A compiled CEL rule with Kubernetes' library functions (:data:`KUBERNETES_FUNCTIONS`)."""
    return _ENV.program(_ENV.compile(rule), functions=KUBERNETES_FUNCTIONS)


def _cel(rule: str, self_value: Any, old_value: Any) -> bool:
    program = cel_program(rule)
    activation: dict[str, Any] = {"self": json_to_cel(self_value)}
    if old_value is not None:
        activation["oldSelf"] = json_to_cel(old_value)
    return bool(program.evaluate(activation))


def validate(schema: Mapping[str, Any], value: Any, old: Any = None, path: str = "") -> list[str]:
    """Every violation as ``path: message`` (empty if valid)."""
    errors: list[str] = []
    kind = schema.get("type")
    if schema.get("x-kubernetes-int-or-string"):
        if isinstance(value, bool) or not isinstance(value, int | str):
            return [f"{path}: must be an integer or a string"]
    elif kind == "object":
        if not isinstance(value, dict):
            return [f"{path}: must be an object"]
        for req in schema.get("required", []):
            if req not in value:
                errors.append(f"{path}.{req}: Required value")
        props = schema.get("properties") or {}
        extra = schema.get("additionalProperties")
        for name, sub_value in value.items():
            sub = props.get(name) or (extra if isinstance(extra, Mapping) else None)
            if sub is None:
                # metadata's schema may restrict name only; its other fields are the API server's
                if not schema.get("x-kubernetes-preserve-unknown-fields") and props and path != ".metadata":
                    errors.append(f"{path}.{name}: unknown field")
                continue
            old_sub = old.get(name) if isinstance(old, dict) else None
            errors += validate(sub, sub_value, old_sub, f"{path}.{name}")
    elif kind == "array":
        if not isinstance(value, list):
            return [f"{path}: must be an array"]
        for i, item in enumerate(value):
            errors += validate(schema.get("items") or {}, item, None, f"{path}[{i}]")
    elif kind == "integer":
        if isinstance(value, bool) or not isinstance(value, int):
            return [f"{path}: must be an integer"]
    elif kind == "string":
        if not isinstance(value, str):
            return [f"{path}: must be a string"]
        if "pattern" in schema and not re.search(schema["pattern"], value):
            errors.append(f"{path}: should match '{schema['pattern']}'")
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            errors.append(f"{path}: too long")
        if "minLength" in schema and len(value) < schema["minLength"]:
            errors.append(f"{path}: too short")
    elif kind == "boolean" and not isinstance(value, bool):
        return [f"{path}: must be a boolean"]
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{path}: Unsupported value {value!r}")
    if "minimum" in schema and isinstance(value, int) and value < schema["minimum"]:
        errors.append(f"{path}: should be greater than or equal to {schema['minimum']}")
    if "maximum" in schema and isinstance(value, int) and value > schema["maximum"]:
        errors.append(f"{path}: should be less than or equal to {schema['maximum']}")
    if errors:
        return errors  # the API server evaluates CEL only on schema-valid values
    for rule in schema.get("x-kubernetes-validations", []):
        transition = "oldSelf" in rule["rule"]
        if transition and old is None:
            continue
        if not _cel(rule["rule"], value, old if transition else None):
            errors.append(f"{path}{rule.get('fieldPath', '')}: Invalid value: {rule['message']}")
    return errors


def admit(obj: dict[str, Any], old: dict[str, Any] | None = None) -> tuple[dict[str, Any], list[str]]:
    """Default then validate ``obj`` (an update when ``old`` is given) as the API server would."""
    schema = schema_of(load_crd())
    defaulted = apply_defaults(schema, copy.deepcopy(obj))
    old_defaulted = apply_defaults(schema, copy.deepcopy(old)) if old is not None else None
    return defaulted, validate(schema, defaulted, old_defaulted)
