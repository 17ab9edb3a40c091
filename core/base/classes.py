"""Priority classes of a queue (docs/design.md, "Priority classes and fair share"): declared highest
first, each below the first with a share of the jobs, which it gets while it has ready ones.
Pure: the spec, the store and the CLI validate with the same rules the database's CHECK
(``judgequeue.valid_classes``) enforces.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from .errors import InvalidClass

#: Most classes a queue may declare (the database refuses more).
MAX_CLASSES = 16

#: The share, in percent of claims, a class below the first gets when its declaration names none:
#: what bounds its starvation under a higher class's unbroken backlog.
DEFAULT_SHARE = 5

#: A queue that declares no classes has this one: every job in it, as before classes existed.
DEFAULT_CLASS = "default"

_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


@dataclass(frozen=True)
class JobClass:
    """One class: its name (a DNS label) and its share (whole percent of claims; the first's is 0)."""

    name: str
    share: int = 0


DEFAULT_CLASSES: tuple[JobClass, ...] = (JobClass(DEFAULT_CLASS),)


def check_classes(classes: Sequence[JobClass], where: str = "classes") -> tuple[JobClass, ...]:
    """``classes`` if valid, else :class:`InvalidClass` with one message naming ``where``: 1 to 16
    distinct DNS-label names, shares whole percent 0-100 summing to at most 100, the first's 0."""
    if not 1 <= len(classes) <= MAX_CLASSES:
        raise InvalidClass(f"{where}: declare 1 to {MAX_CLASSES} classes, got {len(classes)}")
    seen: set[str] = set()
    for i, c in enumerate(classes):
        if not isinstance(c.name, str) or len(c.name) > 63 or not _LABEL.match(c.name):
            raise InvalidClass(f"{where}[{i}].name: {c.name!r} is not a DNS label ([a-z0-9]([-a-z0-9]*[a-z0-9])?)")
        if c.name in seen:
            raise InvalidClass(f"{where}[{i}].name: {c.name!r} is declared twice")
        seen.add(c.name)
        if isinstance(c.share, bool) or not isinstance(c.share, int) or not 0 <= c.share <= 100:
            raise InvalidClass(f"{where}[{i}].share: must be a whole percent 0-100, got {c.share!r}")
    if classes[0].share != 0:
        raise InvalidClass(f"{where}[0].share: the first class goes first anyway; its share must be 0")
    total = sum(c.share for c in classes)
    if total > 100:
        raise InvalidClass(f"{where}: the shares sum to {total}%, over 100%")
    return tuple(classes)


def parse_class_list(items: Sequence[str], where: str = "classes") -> tuple[JobClass, ...]:
    """Classes from ``name`` or ``name:share`` words, highest first (the CLI's form); a class below
    the first without a share gets :data:`DEFAULT_SHARE`."""
    out = []
    for i, item in enumerate(items):
        name, sep, share = item.partition(":")
        if sep:
            try:
                value = int(share)
            except ValueError:
                raise InvalidClass(f"{where}[{i}]: share {share!r} is not a whole percent") from None
        else:
            value = 0 if i == 0 else DEFAULT_SHARE
        out.append(JobClass(name, value))
    return check_classes(out, where)


def check_class_name(name: str | None, classes: Sequence[JobClass], queue: str) -> None:
    """Refuse a class ``queue`` does not declare, naming the ones it does (None: the default)."""
    if name is not None and name not in {c.name for c in classes}:
        valid = ", ".join(c.name for c in classes)
        raise InvalidClass(f"class {name!r} is not a class of queue {queue!r} (one of {valid})")
