"""Database errors are classified once: transient (retry) or permanent for the values sent."""

from __future__ import annotations

import asyncpg
import pytest

from judgequeue.core.base.errors import DB_ERRORS, describe, is_permanent
from tests.support.databases import connection


async def _error_of(pg: asyncpg.Connection, sql: str) -> BaseException:
    with pytest.raises(DB_ERRORS) as caught:
        await pg.execute(sql)
    return caught.value


@pytest.mark.parametrize(
    ("sql", "permanent"),
    [
        ("SELECT 99999999999999999999999::bigint", True),  # 22003 numeric value out of range
        ("SELECT convert_from('\\xff'::bytea, 'UTF8')", True),  # 22021 bad encoding
        ("SELECT 1/0", True),  # 22012
        ("CREATE TEMP TABLE t (x int NOT NULL); INSERT INTO t VALUES (NULL)", True),  # 23502
        ("SELECT judgequeue.submit('Not A Label', '{}')", True),  # JQ001, our own validation
        ("SELECT * FROM no_such_table", False),  # 42P01: migrations not applied yet
        ("SET statement_timeout = '10ms'; SELECT pg_sleep(1)", False),  # 57014 query canceled
        ("SELECT pg_terminate_backend(pg_backend_pid())", False),  # 57P01 admin shutdown
    ],
)
async def test_classification_against_the_real_server(pg_dsn: str, sql: str, permanent: bool) -> None:
    async with connection(pg_dsn) as conn:
        exc = await _error_of(conn, sql)
    assert is_permanent(exc) is permanent, describe(exc)
    assert len(describe(exc)) <= 500


def test_client_side_errors_are_transient() -> None:
    for exc in (
        asyncpg.InterfaceError("connection has been released back to the pool"),
        asyncpg.exceptions.InternalClientError("cannot switch to state 12; another operation (2) is in progress"),
        ConnectionResetError(),
        TimeoutError(),
    ):
        assert isinstance(exc, DB_ERRORS)
        assert not is_permanent(exc)
