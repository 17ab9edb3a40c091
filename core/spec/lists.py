"""The list-valued fields parsed item by item (classes, endpoints, webhooks): the CRD's item schema
checked again here, each error naming the item."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

from ..base.classes import (
    DEFAULT_CLASSES,
    DEFAULT_SHARE,  # the CRD's description says it
    JobClass,
    check_classes,
)
from ..base.errors import InvalidClass
from ..config import (
    parse_duration,
)
from .fields import (
    DURATION_PATTERN,
    ENDPOINT_CONCURRENCY,
    ENDPOINT_DEADLINE,
    ENDPOINT_NAME_PATTERN,
    ENDPOINT_RATE_PATTERN,
    ENDPOINT_TRIES,
    ENDPOINT_URL_MAX_LENGTH,
    ENDPOINT_URL_PATTERN,
    ENDPOINTS_MAX,
    SECRET_KEY_PATTERN,
    SECRET_NAME_RE,
    WEBHOOK_CONCURRENCY,
    WEBHOOK_DEADLINE,
    WEBHOOK_DEADLINE_MAX,
    WEBHOOK_MAX_ATTEMPTS,
    WEBHOOKS_MAX,
    rate_per_second,
)
from .model import EndpointSpec, SecretKeyRef, WebhookSpec


def parse_classes(value: Any, errors: list[str]) -> tuple[JobClass, ...]:
    """``spec.classes`` checked item by item (the CRD's item schema and the database's rules): a class
    below the first without a share gets :data:`~judgequeue.core.base.classes.DEFAULT_SHARE`."""
    where = "spec.classes"
    if value is None:
        return DEFAULT_CLASSES
    if not isinstance(value, list):
        errors.append(f"{where}: must be a list")
        return DEFAULT_CLASSES
    out: list[JobClass] = []
    for i, item in enumerate(value):
        if not isinstance(item, Mapping):
            errors.append(f"{where}[{i}]: must be an object")
            return DEFAULT_CLASSES
        unknown = sorted(set(item) - {"name", "share"})
        if unknown:
            errors.append(f"{where}[{i}].{unknown[0]}: unknown field (see crds/judgequeue.yaml for the schema)")
            return DEFAULT_CLASSES
        name: Any = item.get("name")  # checked by check_classes, whatever it is
        out.append(JobClass(name, item.get("share", 0 if i == 0 else DEFAULT_SHARE)))
    try:
        return check_classes(out, where)
    except InvalidClass as exc:
        errors.append(str(exc))
        return DEFAULT_CLASSES


def _secret_ref(value: Any) -> SecretKeyRef | None:
    if (not isinstance(value, Mapping) or not isinstance(value.get("name"), str)
            or not SECRET_NAME_RE.match(value["name"]) or not isinstance(value.get("key"), str)
            or not re.match(SECRET_KEY_PATTERN, value["key"])):
        return None
    return SecretKeyRef(value["name"], value["key"])


def _named_items(value: Any, where: str, kind: str, most: int, fields: set[str],
                 errors: list[str]) -> Iterator[tuple[str, str, Mapping[str, Any]]]:
    """Each item of a list of objects keyed by ``name`` as (its path, its name, the item), after the
    checks every such list shares: a list of at most ``most`` objects, no field outside ``fields``, a
    valid name, given once. An item whose name is unusable is reported and skipped."""
    if value is None:
        return
    if not isinstance(value, list):
        errors.append(f"{where}: must be a list")
        return
    if len(value) > most:
        errors.append(f"{where}: at most {most} {kind}s, got {len(value)}")
    seen: set[str] = set()
    for i, item in enumerate(value):
        at = f"{where}[{i}]"
        if not isinstance(item, Mapping):
            errors.append(f"{at}: must be an object")
            continue
        unknown = sorted(set(item) - fields)
        if unknown:
            errors.append(f"{at}.{unknown[0]}: unknown field (see crds/judgequeue.yaml for the JudgeQueue schema)")
        name = item.get("name")
        if not isinstance(name, str) or len(name) > 63 or not re.match(ENDPOINT_NAME_PATTERN, name):
            an = "an" if kind[0] in "aeiou" else "a"
            errors.append(f"{at}.name: {name!r} is not {an} {kind} name (lowercase letters, digits, - and _)")
            continue
        if name in seen:
            errors.append(f"{at}.name: {name!r} is given twice")
        seen.add(name)
        yield at, name, item


def _url(item: Mapping[str, Any], at: str, ref_field: str,
         errors: list[str]) -> tuple[str | None, SecretKeyRef | None, bool]:
    """The item's URL, given inline (``url``) or by a Secret's key (``ref_field``): exactly one of
    them, well formed. Returns (url, secret, ok)."""
    url, ref = item.get("url"), item.get(ref_field)
    if (url is None) == (ref is None):
        errors.append(f"{at}: give exactly one of url and {ref_field}")
        return None, None, False
    ok = True
    if url is not None and (not isinstance(url, str) or not re.match(ENDPOINT_URL_PATTERN, url)
                            or len(url) > ENDPOINT_URL_MAX_LENGTH):
        errors.append(f"{at}.url: must be an http or https URL (a Secret's key for one with credentials)")
        ok = False
    secret = _secret_ref(ref) if ref is not None else None
    if ref is not None and secret is None:
        errors.append(f"{at}.{ref_field}: must name a Secret and a key ({{name: ..., key: ...}})")
        ok = False
    return (url if isinstance(url, str) else None), secret, ok


def _integers(item: Mapping[str, Any], at: str, bounds: Mapping[str, tuple[int, int, int]],
              errors: list[str]) -> tuple[dict[str, int], bool]:
    """The item's integer fields, each within its (low, high, default) bounds."""
    numbers: dict[str, int] = {}
    ok = True
    for label, (low, high, default) in bounds.items():
        number = item.get(label, default)
        if isinstance(number, bool) or not isinstance(number, int) or not low <= number <= high:
            errors.append(f"{at}.{label}: must be an integer between {low} and {high}, got {number!r}")
            ok = False
        numbers[label] = number
    return numbers, ok


def parse_webhooks(value: Any, errors: list[str]) -> tuple[WebhookSpec, ...]:
    """``spec.events.webhooks`` checked item by item (the CRD's item schema, checked here too)."""
    out: list[WebhookSpec] = []
    fields = {"name", "url", "urlSecretKeyRef", "secretKeyRef", "concurrency", "maxAttempts", "deadline"}
    for at, name, item in _named_items(value, "spec.events.webhooks", "webhook", WEBHOOKS_MAX, fields, errors):
        url, url_secret, ok = _url(item, at, "urlSecretKeyRef", errors)
        secret = _secret_ref(item.get("secretKeyRef"))
        if secret is None:
            errors.append(f"{at}.secretKeyRef: is required: the Secret and key of the signing key "
                          "({name: ..., key: ...})")
            ok = False
        numbers, counted = _integers(item, at, {"concurrency": WEBHOOK_CONCURRENCY,
                                                "maxAttempts": WEBHOOK_MAX_ATTEMPTS}, errors)
        deadline = item.get("deadline", WEBHOOK_DEADLINE)
        if (not isinstance(deadline, str) or not re.match(DURATION_PATTERN, deadline)
                or not 0 < parse_duration(deadline) <= WEBHOOK_DEADLINE_MAX):
            errors.append(f"{at}.deadline: {deadline!r} is not a duration above 0 and at most 5m (e.g. 10s)")
            ok = False
        if ok and counted and secret is not None:
            out.append(WebhookSpec(name, secret, url, url_secret, numbers["concurrency"], numbers["maxAttempts"],
                                   parse_duration(deadline)))
    return tuple(out)


def parse_endpoints(value: Any, errors: list[str]) -> tuple[EndpointSpec, ...]:
    """``spec.worker.endpoints`` checked item by item (the CRD's item schema, checked here too)."""
    out: list[EndpointSpec] = []
    fields = {"name", "url", "secretKeyRef", "concurrency", "deadline", "tries", "rate"}
    for at, name, item in _named_items(value, "spec.worker.endpoints", "endpoint", ENDPOINTS_MAX, fields, errors):
        if (item.get("url") is None) == (item.get("secretKeyRef") is None):
            errors.append(f"{at}: give exactly one of url and secretKeyRef")
            continue
        url, secret, _ = _url(item, at, "secretKeyRef", errors)
        numbers, _ = _integers(item, at, {"concurrency": ENDPOINT_CONCURRENCY, "tries": ENDPOINT_TRIES}, errors)
        deadline = item.get("deadline", ENDPOINT_DEADLINE)
        if not isinstance(deadline, str) or not re.match(DURATION_PATTERN, deadline) or parse_duration(deadline) <= 0:
            errors.append(f"{at}.deadline: {deadline!r} is not a positive duration (e.g. 90s, 5m)")
            continue
        rate = item.get("rate")
        if rate is not None:
            try:
                if not isinstance(rate, str) or not re.match(ENDPOINT_RATE_PATTERN, rate):
                    raise ValueError(f"must be calls per time unit, like 10/s, 600/m or 1000/h, got {rate!r}")
                per_second = rate_per_second(rate)
            except ValueError as exc:
                errors.append(f"{at}.rate: {exc}")
                continue
        out.append(EndpointSpec(name, url, secret, numbers["concurrency"], parse_duration(deadline),
                                numbers["tries"], per_second if rate is not None else 0.0))
    return tuple(out)
