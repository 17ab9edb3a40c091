"""Every SQL statement judgequeue runs, by name: one door to Postgres (docs/design.md §2).

``queries.sql`` holds each statement under ``-- name: <name>`` followed by a one-line ``-- ``
comment. It is read once, at import; modules name each statement where they run it,
``conn.fetch(sql.query("lease_acquire"), ...)`` (a dict lookup), and
``tests/integration/test_sql.py`` checks that every name used exists, every statement is used and
none is written inline elsewhere. Statements are fixed
text: values go in as parameters and state lists as arrays from :mod:`judgequeue.core.base.states`.
The schema (``schema.sql`` beside it: tables and SQL functions as they are now), the migrations and
the migration runner's bookkeeping are the only SQL kept elsewhere.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import fields
from functools import cache
from importlib import resources
from types import MappingProxyType
from typing import Any, Final, TypeVar

from ..privileges import call_text

_NAME = re.compile(r"^-- name: ([a-z][a-z0-9_]*)\s*$")


def parse(text: str) -> dict[str, tuple[str, str]]:
    """``{name: (comment, statement)}`` from the text of a queries file.

    Raises ValueError on a duplicate name, a name without its one-line comment, or an empty
    statement, so a malformed file fails at import rather than at the first call.
    """
    found: dict[str, tuple[str, str]] = {}
    name: str | None = None
    comment = ""
    body: list[str] = []

    def close() -> None:
        if name is None:
            return
        statement = "\n".join(body).strip()
        if not comment or not statement:
            raise ValueError(f"query {name!r} needs a one-line '-- ' comment and a statement")
        found[name] = (comment, statement)

    for line in text.splitlines():
        match = _NAME.match(line)
        if match:
            close()
            name, comment, body = match.group(1), "", []
            if name in found:
                raise ValueError(f"query {name!r} is named twice")
        elif name is not None and not comment and not body and line.startswith("-- "):
            comment = line[3:].strip()
        elif name is not None:
            body.append(line)
    close()
    return found


_PARSED: Final = parse(resources.files(__name__).joinpath("queries.sql").read_text(encoding="utf-8"))

#: Every statement by name (read-only).
QUERIES: Final = MappingProxyType({name: statement for name, (_, statement) in _PARSED.items()})

#: The one-line comment of each statement, for documentation and tests.
COMMENTS: Final = MappingProxyType({name: comment for name, (comment, _) in _PARSED.items()})


#: How each statement is run: a call of its function (``privileges``), or the application's own.
CALLS: Final = MappingProxyType({name: call_text(name, statement) for name, statement in QUERIES.items()})


def query(name: str) -> str:
    """How to run the statement called ``name`` (its function's call); KeyError naming the file if there is none."""
    try:
        return CALLS[name]
    except KeyError:
        raise KeyError(f"no query named {name!r} in judgequeue/core/store/sql/queries.sql") from None


T = TypeVar("T")


async def prune_in_batches(
    conn: Any, statement: str, retention: float, batch: int, queue: str, *more: Any, max_batches: int
) -> int:
    """Run a prune ``statement`` (its function takes the retention in seconds, the batch size, the
    queue and ``more``, and returns the rows it deleted) until a batch comes back short or
    ``max_batches`` ran: small batches keep each transaction short, ``max_batches`` bounds one call's
    work. The rows deleted."""
    total = 0
    for _ in range(max_batches):
        deleted = int(await conn.fetchval(statement, float(retention), batch, queue, *more))
        total += deleted
        if deleted < batch:
            break
    return total


def row_as(cls: type[T], row: Mapping[str, Any], **columns: str) -> T:
    """A dataclass from a result row whose columns carry its field names (``columns`` renames:
    ``field="column"``), so a statement's column list and the class stay the one description."""
    names = _field_names(cls)  # type: ignore[arg-type]  # a class is hashable
    return cls(**{name: row[columns.get(name, name)] for name in names})


@cache
def _field_names(cls: type[Any]) -> tuple[str, ...]:
    # Per class once: claimed rows go through row_as on the dispatcher's hot path.
    return tuple(f.name for f in fields(cls))
