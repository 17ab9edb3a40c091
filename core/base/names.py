"""Queue names: DNS labels (``[a-z0-9]([-a-z0-9]*[a-z0-9])?``, at most 63 characters), like the
Kubernetes objects that declare them (docs/design.md §2). Checked wherever a name comes in: the
settings, the spec, the CLI, the tables' doors."""

from __future__ import annotations

import re

from .errors import InvalidQueueName

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def validate_queue_name(name: object) -> str:
    """Return ``name`` if it is a DNS label (the same rule Kubernetes object names follow)."""
    if not isinstance(name, str) or len(name) > 63 or not _DNS_LABEL.match(name):
        raise InvalidQueueName(
            f"queue name {name!r} is not a DNS label ([a-z0-9]([-a-z0-9]*[a-z0-9])?, at most 63 characters)"
        )
    return name
