"""Which databases this version can migrate: the pure decision behind ``migrate``'s refusal."""

from __future__ import annotations

import pytest

from judgequeue.core.migrate import BASELINE, HISTORY_COMMIT, available_migrations, history_gap


@pytest.mark.parametrize(
    "applied",
    [set(), {BASELINE}, set(range(1, BASELINE + 1)), {BASELINE, BASELINE + 1}, set(range(1, BASELINE + 3))],
    ids=["new", "made from the schema file", "lived through the history", "later, from the file", "later, lived"],
)
def test_databases_this_version_can_migrate(applied: set[int]) -> None:
    assert history_gap(applied) is None


def test_a_database_partway_through_the_folded_history_is_told_what_to_run_first() -> None:
    reason = history_gap(set(range(1, 10)))
    assert reason is not None
    assert "migration 0009" in reason and f"{BASELINE:04d}" in reason and HISTORY_COMMIT[:12] in reason


def test_the_shipped_migrations_all_come_after_the_baseline() -> None:
    assert all(m.version > BASELINE for m in available_migrations())
