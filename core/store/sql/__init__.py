"""Every SQL statement judgequeue runs, by name: one door to Postgres (docs/design.md §2).

``queries.sql`` holds each statement under ``-- name: <name>`` followed by a one-line ``-- ``
comment. It is read once, at import; modules name each statement where they run it,
``conn.fetch(sql.query("lease_acquire"), ...)`` (a dict lookup), and
``tests/integration/test_sql.py`` checks that every name used exists, every statement is used and
none is written inline elsewhere. Statements are fixed
text: values go in as parameters and state lists as arrays from :mod:`judgequeue.core.base.states`.
The schema (``schema.sql`` beside it: tables and SQL functions as they are now), the migrations and
the migration runner's bookkeeping are the only SQL kept elsewhere.

Text that several statements share is written once, as a fragment, and pasted into them when the
file is read, so the statements Postgres runs (and the functions named after their text,
:mod:`judgequeue.core.store.privileges`) are what they would be written out in full, with no call
added (a shared SQL function would cost one on every run, and ``FOR UPDATE`` keeps it from being
inlined)::

    -- fragment: claim_walk
    -- One line on what it is.
         WHERE o.queue = {{queue}}
    {{ready}}
         LIMIT {{rows}}

    -- name: lease_direct
    -- ...
    -- include: claim_walk queue=$1 rows=$3 ready:
               AND o.next_attempt_at <= now()
    -- end: claim_walk

A fragment is a ``-- fragment: <name>`` line, a one-line ``-- `` comment and its text, whose
``{{<placeholder>}}`` marks each include fills. An ``-- include: <fragment>`` line of a statement
(at the start of the line) stands for the fragment's text, its blank first and last lines dropped;
``<placeholder>=<text>`` pairs on the line fill placeholders with text without spaces, and a last
``<placeholder>:`` fills one with the lines that follow, as written, up to ``-- end: <fragment>``.
What fills a placeholder is text written in this file, never a value: values stay parameters.
Fragments do not include fragments. An unknown fragment, a placeholder left unfilled or filled
that the fragment does not have, a fragment defined twice or never included raise ValueError
naming it, at import.
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

_HEADER = re.compile(r"^-- (name|fragment): ([a-z][a-z0-9_]*)\s*$")
_DIRECTIVE = re.compile(r"^-- (?:include|end):")
_INCLUDE = re.compile(r"^-- include: ([a-z][a-z0-9_]*)((?: [a-z][a-z0-9_]*=\S+)*)(?: ([a-z][a-z0-9_]*):)?\s*$")
_PLACEHOLDER = re.compile(r"\{\{([a-z][a-z0-9_]*)\}\}")

_Sections = dict[str, tuple[str, list[str]]]


def parse(text: str) -> dict[str, tuple[str, str]]:
    """``{name: (comment, statement)}`` from the text of a queries file, fragments included.

    Raises ValueError on a duplicate name, a name without its one-line comment, an empty
    statement or a fragment that does not fit (see the module's docstring), so a malformed file
    fails at import rather than at the first call.
    """
    statements, fragments = _sections(text)
    texts = {name: _fragment_text(name, lines) for name, (_, lines) in fragments.items()}
    used: set[str] = set()
    found = {name: (comment, _expand(name, lines, texts, used)) for name, (comment, lines) in statements.items()}
    if unused := sorted(texts.keys() - used):
        raise ValueError(f"fragment {unused[0]!r} is never included")
    return found


def _sections(text: str) -> tuple[_Sections, _Sections]:
    """The file's statements and fragments, each ``{name: (comment, lines as written)}``."""
    statements: _Sections = {}
    fragments: _Sections = {}
    kind, found = "query", statements
    name: str | None = None
    comment = ""
    body: list[str] = []

    def close() -> None:
        if name is None:
            return
        if not comment or not "".join(body).strip():
            raise ValueError(f"{kind} {name!r} needs a one-line '-- ' comment and a statement")
        found[name] = (comment, body)

    for line in text.splitlines():
        match = _HEADER.match(line)
        if match:
            close()
            kind, found = ("query", statements) if match.group(1) == "name" else ("fragment", fragments)
            name, comment, body = match.group(2), "", []
            if name in found:
                raise ValueError(f"{kind} {name!r} is named twice")
        elif name is not None and not comment and not body and line.startswith("-- ") and not _DIRECTIVE.match(line):
            comment = line[3:].strip()
        elif name is not None:
            body.append(line)
    close()
    return statements, fragments


def _fragment_text(name: str, lines: list[str]) -> str:
    """A fragment's text: its lines but the blank ones around them (indentation kept: it is pasted)."""
    for line in lines:
        if _DIRECTIVE.match(line):
            raise ValueError(f"fragment {name!r} has {line!r}: fragments do not include fragments")
    first = next(i for i, line in enumerate(lines) if line.strip())
    last = max(i for i, line in enumerate(lines) if line.strip())
    return "\n".join(lines[first : last + 1])


def _expand(query: str, lines: list[str], fragments: Mapping[str, str], used: set[str]) -> str:
    """A statement's text with its includes replaced by their fragments, filled; adds them to ``used``."""
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        match = _INCLUDE.match(line)
        if match is None:
            if _DIRECTIVE.match(line):
                raise ValueError(
                    f"query {query!r}: {line!r} is neither '-- include: <fragment> [<placeholder>=<text> ...]"
                    " [<placeholder>:]' nor the end of one"
                )
            out.append(line)
            continue
        fragment, pairs, block = match.groups()
        if fragment not in fragments:
            raise ValueError(f"query {query!r} includes fragment {fragment!r}, which is not defined")
        values: dict[str, str] = {}
        for key, value in (pair.split("=", 1) for pair in pairs.split()):
            _put(query, fragment, values, key, value)
        if block is not None:
            end = next((j for j in range(i, len(lines)) if _DIRECTIVE.match(lines[j])), len(lines))
            if end == len(lines) or lines[end].rstrip() != f"-- end: {fragment}":
                raise ValueError(
                    f"query {query!r}: the {block!r} lines of fragment {fragment!r} end at '-- end: {fragment}'"
                )
            if not "".join(lines[i:end]).strip():
                raise ValueError(f"query {query!r} fills placeholder {block!r} of fragment {fragment!r} with no lines")
            _put(query, fragment, values, block, "\n".join(lines[i:end]))
            i = end + 1
        out.append(_fill(query, fragment, fragments[fragment], values))
        used.add(fragment)
    statement = "\n".join(out).strip()
    stray = _PLACEHOLDER.search(statement)
    if stray:
        raise ValueError(f"query {query!r} has placeholder {stray.group(1)!r} outside a fragment's text")
    return statement


def _fill(query: str, fragment: str, text: str, values: Mapping[str, str]) -> str:
    """A fragment's ``text`` with every placeholder replaced by its value, all of them given."""
    wanted = set(_PLACEHOLDER.findall(text))
    if unknown := sorted(values.keys() - wanted):
        raise ValueError(f"query {query!r} fills placeholder {unknown[0]!r}, which fragment {fragment!r} does not have")
    if unfilled := sorted(wanted - values.keys()):
        raise ValueError(f"query {query!r} leaves placeholder {unfilled[0]!r} of fragment {fragment!r} unfilled")
    return _PLACEHOLDER.sub(lambda m: values[m.group(1)], text)


def _put(query: str, fragment: str, values: dict[str, str], key: str, value: str) -> None:
    """Fill placeholder ``key`` in ``values``, once: a second value would silently win."""
    if key in values:
        raise ValueError(f"query {query!r} fills placeholder {key!r} of fragment {fragment!r} twice")
    values[key] = value


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
