"""Fragments of ``queries.sql``: pasted in when the file is read, so what runs is unchanged.

A statement built from fragments must be the very text it was when written out in full: its
function's name (``privileges.function_name``) is a digest of the text, and a new name is a new
function the roles step must install. The digests below are the statements' as they were before
they were folded; change one only with the statement itself.
"""

from __future__ import annotations

import hashlib
import re

import pytest

from judgequeue.core.store import sql
from judgequeue.core.store.privileges import function_name

#: sha256 of each statement that includes a fragment, as written out in full before the fold.
PINNED = {
    "outbox_mark_claim": "58b902e4a5987a76baabededda2232418332089913aea3e28503e338a01934b3",
    "lease_direct": "04d485e15b402007d2ba464c1dd99547e62249efcadb5f5121cf27f40669dc30",
    "events_read": "08b0e77b14b4919116422c6b1ba78223daaf5fb2bf60cf01fc5ee77da48399f6",
    "webhook_ingest": "ffda0f5a90ff2f74b7a473f693c9ab60318a0ca3f41e758abb67eed5a54f2bdd",
    "events_prune": "50c25834d94616a936a713d5a5ee05515251191a4b58b143d18a4c6e0d13849a",
    "history_prune": "0f81cef2ee417cb57c05f67528f33640c8aedea77037133e0b367c4d9a8b1572",
    "rejudgings_prune": "f3eedc3c770a3a53b259d196d42d885713368cab07f5ffcbd3c5e69a32758458",
    "submissions_prune": "1459d2eb94a1ba007afa8a17394a5ee22989012de6a926fba0a15bbd03745676",
    "shadow_verdicts_prune": "1eb9140e8312b23f6828039477dfe95f4905e23882be0ac7dda839c9b265e68a",
}


@pytest.mark.parametrize("name", sorted(PINNED))
def test_a_folded_statement_is_the_text_it_was(name: str) -> None:
    statement = sql.QUERIES[name]
    assert hashlib.sha256(statement.encode()).hexdigest() == PINNED[name]
    assert f"judgequeue.{function_name(name, statement)}(" in sql.query(name)
    assert function_name(name, statement) == f"q_{name}_{PINNED[name][:8]}"


def test_the_claimers_walk_the_outbox_one_way() -> None:
    walk = "ORDER BY o.fair_seq, o.next_attempt_at, o.id\n         LIMIT r.quota OFFSET r.skip\n"
    assert walk in sql.QUERIES["outbox_mark_claim"] and walk in sql.QUERIES["lease_direct"]
    for statement in sql.QUERIES.values():
        assert "-- include:" not in statement and "-- end:" not in statement and "{{" not in statement


FILE = """\
-- fragment: pick
-- Rows of a table, limited.
SELECT id FROM {{table}}
{{where}}
 LIMIT $1

-- name: a
-- Uses pick.
WITH p AS (
-- include: pick table=t where:
 WHERE x = 1
   AND y = 2
-- end: pick
)
SELECT * FROM p

-- name: b
-- Uses pick too.
-- include: pick table=u where=WHERE
"""


def test_an_include_is_replaced_by_its_fragment_filled() -> None:
    parsed = sql.parse(FILE)
    assert parsed["a"] == (
        "Uses pick.",
        "WITH p AS (\nSELECT id FROM t\n WHERE x = 1\n   AND y = 2\n LIMIT $1\n)\nSELECT * FROM p",
    )
    assert parsed["b"] == ("Uses pick too.", "SELECT id FROM u\nWHERE\n LIMIT $1")
    assert set(parsed) == {"a", "b"}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (FILE.replace("-- include: pick table=u", "-- include: pack table=u"), "fragment 'pack', which is not defined"),
        (FILE.replace("table=u where=WHERE", "table=u"), "placeholder 'where' of fragment 'pick' unfilled"),
        (
            FILE.replace("table=u where=WHERE", "table=u where=WHERE order=id"),
            "placeholder 'order', which fragment 'pick'",
        ),
        (
            FILE.replace("table=u where=WHERE", "table=u table=v where=WHERE"),
            "placeholder 'table' of fragment 'pick' twice",
        ),
        (FILE + "\n-- fragment: pick\n-- Again.\nSELECT 1\n", "fragment 'pick' is named twice"),
        (FILE + "\n-- fragment: spare\n-- Nobody's.\nSELECT 1\n", "fragment 'spare' is never included"),
        (FILE.replace("-- end: pick\n", ""), "end at '-- end: pick'"),
        (FILE.replace("-- end: pick\n", "-- end: pack\n"), "end at '-- end: pick'"),
        (FILE.replace("-- Uses pick too.\n", "-- Uses pick too.\n-- end: pick\n"), "'-- end: pick' is neither"),
        (FILE.replace(" WHERE x = 1\n   AND y = 2\n", ""), "placeholder 'where' of fragment 'pick' with no lines"),
        (FILE.replace("SELECT * FROM p", "SELECT * FROM {{p}}"), "placeholder 'p' outside a fragment's text"),
        (
            FILE.replace(" LIMIT $1\n", " LIMIT $1\n-- include: pick table=v where=w\n"),
            "fragments do not include fragments",
        ),
        (FILE.replace("-- Rows of a table, limited.\n", ""), "fragment 'pick' needs a one-line '-- ' comment"),
    ],
)
def test_a_fragment_that_does_not_fit_fails_to_load_naming_it(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        sql.parse(text)
