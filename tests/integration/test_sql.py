"""Named SQL, one door (docs/design.md §2): every statement lives in ``core/store/sql/queries.sql``.

Checks that the file parses, that every name in it is used and every name used exists, that no
Python module of core or the operator writes SQL inline (the migration runner's bookkeeping
excepted), and that the state lists of ``core/base/states.py`` match the CHECK constraints of a
migrated database, so a migration that adds a status cannot be silently ignored by prune, stats
or the tools' "is it finished" checks.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import asyncpg
import pytest

from judgequeue.core.base import states
from judgequeue.core.store import sql

ROOT = Path(__file__).resolve().parents[2]

#: Modules allowed to hold SQL text: the loader's package and the migration runner (its own
#: bookkeeping table must exist before any named query could be trusted).
#: The migration runner's bookkeeping, and the grants step it runs (the statements' functions, the
#: roles and their grants: catalog statements over names it builds, never over input).
SQL_ALLOWED = {ROOT / "core" / "store" / "migrate.py", ROOT / "core" / "store" / "privileges.py"}

#: How a statement starts (a string starting so is SQL, not prose).
_SQL_START = re.compile(
    r"\s*(SELECT\s|INSERT\s+INTO\s|UPDATE\s+\S+(?:\s+\w+)?\s+SET\s|DELETE\s+FROM\s|WITH\s+\w+\s+AS\b)"
)
_QUERY_CALL = re.compile(r"""sql\.query\(\s*["']([a-z0-9_]+)["']\s*\)""")


def _python_files() -> list[Path]:
    files = sorted((ROOT / "core").rglob("*.py")) + sorted((ROOT / "controllers").rglob("*.py"))
    return [f for f in files if not f.is_relative_to(ROOT / "core" / "store" / "sql")]


def inline_sql(path: Path) -> list[tuple[int, str]]:
    """(line, first line) of every string in ``path`` that reads as a SQL statement, docstrings aside."""
    tree = ast.parse(path.read_text(), str(path))
    docstrings: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docstrings.add(id(first.value))
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):  # judged as a whole, not part by part
            docstrings.update(id(v) for v in node.values)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            text = node.value
        elif isinstance(node, ast.JoinedStr):
            text = "".join(v.value for v in node.values if isinstance(v, ast.Constant) and isinstance(v.value, str))
        else:
            continue
        if _SQL_START.match(text):
            found.append((node.lineno, text.strip().splitlines()[0]))
    return found


def test_queries_file_parses_with_a_comment_per_statement() -> None:
    assert len(sql.QUERIES) >= 40
    for name, comment in sql.COMMENTS.items():
        assert comment and "\n" not in comment, name
        assert sql.QUERIES[name].strip(), name
        # Fragments are pasted in at load (tests/unit/test_sql_fragments.py): none is left to Postgres.
        assert "-- include:" not in sql.QUERIES[name] and "{{" not in sql.QUERIES[name], name


def test_a_malformed_file_fails_to_load() -> None:
    with pytest.raises(ValueError, match="named twice"):
        sql.parse("-- name: a\n-- one\nSELECT 1\n-- name: a\n-- two\nSELECT 2\n")
    with pytest.raises(ValueError, match="comment"):
        sql.parse("-- name: a\nSELECT 1\n")
    with pytest.raises(ValueError, match="comment"):
        sql.parse("-- name: a\n-- a comment but no statement\n")


def test_an_unknown_name_fails_loudly() -> None:
    with pytest.raises(KeyError, match="no query named 'outbox_clam'"):
        sql.query("outbox_clam")


def test_every_query_is_used_and_every_used_name_exists() -> None:
    used: set[str] = set()
    for path in _python_files():
        used.update(_QUERY_CALL.findall(path.read_text()))
    assert used - set(sql.QUERIES) == set(), "misspelt query names"
    assert set(sql.QUERIES) - used == set(), "queries nobody runs: delete them"


#: The modules that own the writes to each table (statements that write it are run only there), by
#: their names under core/ (``roles.worker.direct.takes`` is core/roles/worker/direct/takes.py). The
#: dispatcher's mark also ends a DEAD delivery's submission, in the same statement, so the outbox
#: shares ``submissions`` with the lease fence; direct intake's take claims, marks and leases in one
#: statement, with the worker's waiter registration riding along, so the take writes the outbox,
#: submissions and waiters too; the offers sync keeps ``queues.offers_until`` (not a flag: whether the
#: submits look for offers) in the statement that moves the offers' expiry; the wake-up forgets the
#: waiters and the offers of crashed processes (the reaper runs it); the SQL functions (submit,
#: rejudge, bump, dead letters) write from inside Postgres.
TAKES, OFFERS = "roles.worker.direct.takes", "roles.worker.direct.offers"
OWNERS = {
    "outbox": {"store.outbox", TAKES},
    "dispatch_waiters": {"runtime.wakeup", TAKES},
    "worker_offers": {OFFERS, "runtime.wakeup"},
    "submissions": {"store.leases", "store.outbox", TAKES},
    "queues": {"store.queues", OFFERS},
    "problems": {"store.problems"},
    "problem_files": {"store.problems"},
    "problem_chunks": {"store.problems"},
    "shadow_verdicts": {"store.shadow"},
    "legacy_verdicts": {"store.shadow"},
    "verdict_events": {"store.events"},
    "verdict_history": {"store.submissions"},
    "rejudgings": {"store.rejudgings"},
    "webhook_endpoints": {"store.events"},
    "webhook_deliveries": {"store.events"},
}
_WRITE = re.compile(r"\b(?:INSERT\s+INTO|UPDATE|DELETE\s+FROM)\s+judgequeue\.(\w+)")


def _module(path: Path) -> str:
    """``path``'s module name under core/ or controllers/: ``roles.worker.direct.takes`` for
    core/roles/worker/direct/takes.py."""
    base = ROOT / "core" if path.is_relative_to(ROOT / "core") else ROOT / "controllers"
    return ".".join(path.relative_to(base).with_suffix("").parts)


def test_each_query_has_one_module_and_each_table_one_writer() -> None:
    users: dict[str, set[str]] = {}
    for path in _python_files():
        for name in _QUERY_CALL.findall(path.read_text()):
            users.setdefault(name, set()).add(_module(path))
    assert {n: u for n, u in users.items() if len(u) > 1} == {}, "a statement is run through one module"
    for name, statement in sql.QUERIES.items():
        for table in _WRITE.findall(statement):
            assert table in OWNERS, f"{name} writes judgequeue.{table}: give the table an owner"
            assert users[name] <= OWNERS[table], f"{name} writes judgequeue.{table} from {users[name]}"


def test_no_sql_outside_the_queries_file() -> None:
    offenders = {
        str(path.relative_to(ROOT)): found
        for path in _python_files()
        if path not in SQL_ALLOWED and (found := inline_sql(path))
    }
    assert offenders == {}, "move these statements to core/store/sql/queries.sql under a name"


def test_the_scanner_sees_inline_sql(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        '"""SELECT in a docstring is prose."""\n'
        'A = "SELECT 1 FROM judgequeue.outbox"\n'
        'B = f"UPDATE judgequeue.queues SET mode = {1}"\n'
        'C = "WITH no SQL here"\n'
        'D = "SELECT 1"\n'
    )
    assert [line for line, _ in inline_sql(sample)] == [2, 3, 5]


def test_waiting_outbox_literals_match_the_states() -> None:
    """Two statements keep the waiting states literal: the planner matches them to the partial
    index ``outbox_claim`` (``WHERE state IN ('PENDING', 'CLAIMED')``), which a parameter cannot."""
    literal = "state IN (" + ", ".join(f"'{s}'" for s in states.WAITING_OUTBOX_STATES) + ")"
    assert literal in sql.QUERIES["outbox_mark_claim"]
    assert literal in sql.QUERIES["outbox_waiting_stats"]


async def _check_values(conn: asyncpg.Connection, table: str, column: str) -> set[str]:
    rows = await conn.fetch(
        """
        SELECT pg_get_constraintdef(c.oid) AS def
          FROM pg_constraint c
          JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = ANY(c.conkey)
         WHERE c.contype = 'c' AND c.conrelid = $1::regclass AND a.attname = $2
        """,
        f"judgequeue.{table}",
        column,
    )
    assert len(rows) == 1, f"expected one CHECK constraint on {table}.{column}, found {len(rows)}"
    return set(re.findall(r"'([^']*)'::text", rows[0]["def"]))


async def test_state_lists_match_the_check_constraints(pg: asyncpg.Connection) -> None:
    assert await _check_values(pg, "submissions", "status") == set(states.SUBMISSION_STATUSES)
    assert await _check_values(pg, "outbox", "state") == set(states.OUTBOX_STATES)
    assert await _check_values(pg, "queues", "mode") == set(states.MODES)
    assert await _check_values(pg, "shadow_verdicts", "status") == {"JUDGING", *states.VERDICTS}
    assert await _check_values(pg, "legacy_verdicts", "status") == set(states.VERDICTS)
    # report_legacy_verdict() checks names against this list before the CHECK would.
    assert await pg.fetchval("SELECT judgequeue.verdict_names()") == list(states.VERDICTS)


def test_the_verdict_list_is_the_one_documented_and_counted() -> None:
    """docs/judges.md has one verdict table; it, the metrics' zero series and states.VERDICTS agree
    (the CHECK is compared above), PRESENTATION_ERROR included."""
    from judgequeue.core.base.metrics import shadow_series, verdict_series

    section = (ROOT / "docs" / "judges.md").read_text().split("## Verdicts", 1)[1].split("\n## ", 1)[0]
    documented = re.findall(r"^\| `([A-Z_]+)` \|", section, re.M)
    assert documented == list(states.VERDICTS)
    assert "PRESENTATION_ERROR" in states.VERDICTS
    assert set(verdict_series("q")) == set(states.VERDICTS)
    assert {v for v, _ in shadow_series("q")} == set(states.VERDICTS)


def test_state_lists_partition_cleanly() -> None:
    assert not set(states.WAITING_STATUSES) & set(states.VERDICTS)
    assert not set(states.WAITING_OUTBOX_STATES) & set(states.TERMINAL_OUTBOX_STATES)
    for values in (states.SUBMISSION_STATUSES, states.OUTBOX_STATES, states.MODES):
        assert len(values) == len(set(values))
