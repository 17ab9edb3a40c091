"""Which databases this version can migrate, and what it does to each: the pure decision behind ``migrate``.

Each record below is one an earlier version of judgequeue left (``migrate`` of some commit, or of
several in turn); ``tests/integration/test_schema.py`` builds the same databases with those commits'
own runners and checks where the plan takes them.
"""

from __future__ import annotations

import pytest

from judgequeue.core.base.errors import JudgeQueueError
from judgequeue.core.store.migrate import (
    OUT_OF_ORDER,
    SUPERSEDED,
    MigrationChecksumMismatch,
    MigrationHistoryGap,
    MigrationRefused,
    MigrationUnknownVersion,
    Plan,
    available_migrations,
    plan,
    statement_from,
)

FILES = available_migrations()
LATEST = FILES[-1].version


def files(*versions: int) -> dict[int, str]:
    """The record of a database that ran these files."""
    return {v: FILES[v - 1].checksum for v in versions}


def upto(last: int, *, but: int | None = None) -> dict[int, str]:
    return files(*(v for v in range(1, last + 1) if v != but))


def superseded(name: str) -> dict[int, str]:
    """The record an earlier version wrote under ``name`` (a file since replaced, or the baseline)."""
    (s,) = [s for s in SUPERSEDED if s.name == name]
    return {s.version: s.checksum}


def versions(steps: Plan) -> tuple[int, list[int], list[int]]:
    return len(steps.restore), [m.version for m in steps.apply], [m.version for m in steps.relabel]


LATER = list(range(1, LATEST + 1))
#: The migrations after 0016, the last of the history the superseded records are about.
AFTER_16 = LATER[16:]

# (record, statements restored, migrations run, migrations held and recorded as their files)
KNOWN = {
    "none (replayed)": ({}, 0, LATER, []),
    "the first version": (files(1), 0, LATER[1:], []),
    "0003 merged before 0002": (files(1, 3), 0, [2, *LATER[3:]], []),
    "0007 merged before 0006": (upto(7, but=6), 0, [6, *LATER[7:]], []),
    "0009 merged before 0008": (upto(9, but=8), 0, [8, *LATER[9:]], []),
    "at 0010": (upto(10), 0, LATER[10:], []),
    "at 0014": (upto(14), 0, [15, 16, *AFTER_16], []),
    "unreleased 0015 (submit statements)": (
        {**upto(14), **superseded("submit_statements")}, 1, [15, 16, *AFTER_16], []),
    "unreleased 0015 (name check)": ({**upto(14), **superseded("submit_name_check")}, 1, [15, 16, *AFTER_16], []),
    "unreleased 0015, fillfactor as 0016": (
        {**upto(14), **superseded("submit_statements"), **superseded("update_room")}, 1, [16, *AFTER_16], [15]),
    "unreleased 0015 (name check), fillfactor as 0016": (
        {**upto(14), **superseded("submit_name_check"), **superseded("update_room")}, 1, [16, *AFTER_16], [15]),
    "fillfactor as 0016 alone": ({**upto(14), **superseded("update_room")}, 0, [16, *AFTER_16], [15]),
    "fillfactor as 0015": (upto(15), 0, [16, *AFTER_16], []),
    "fillfactor as 0015 and as 0016": ({**upto(15), **superseded("update_room")}, 0, [16, *AFTER_16], []),
    "at 0016": (upto(16), 0, AFTER_16, []),
    "the schema file as the baseline 0016": (superseded("baseline"), 0, AFTER_16, LATER[:16]),
}  # fmt: skip


@pytest.mark.parametrize(("record", "restored", "run", "relabelled"), KNOWN.values(), ids=KNOWN.keys())
def test_every_record_an_earlier_version_left_has_a_road_here(
    record: dict[int, str], restored: int, run: list[int], relabelled: list[int]
) -> None:
    assert versions(plan(record, FILES)) == (restored, run, relabelled)


def test_a_superseded_submit_is_taken_back_to_0014s_function() -> None:
    (restore,) = plan({**upto(14), **superseded("submit_statements")}, FILES).restore
    assert restore.startswith("CREATE OR REPLACE FUNCTION judgequeue.submit(p_queue text, p_payload jsonb)")
    assert FILES[13].sql.endswith(restore) and restore.rstrip().endswith("END $$;")


def test_statement_from_matches_a_line_start_only() -> None:
    with pytest.raises(JudgeQueueError, match="no line starting"):
        statement_from(FILES[13], "OR REPLACE FUNCTION judgequeue.submit(")


def test_a_checksum_no_version_shipped_is_refused_naming_the_migration() -> None:
    with pytest.raises(MigrationChecksumMismatch) as refused:
        plan({**upto(15), 16: "0" * 64}, FILES)
    assert "migration 0016_outbox_full_pages with checksum 000000000000" in str(refused.value)
    assert "nothing was changed" in str(refused.value)


def test_a_version_this_judgequeue_does_not_have_is_refused_naming_it() -> None:
    with pytest.raises(MigrationUnknownVersion) as refused:
        plan({**upto(16), LATEST + 1: "a" * 64}, FILES)
    message = str(refused.value)
    assert f"migration {LATEST + 1:04d}" in message and "a later version migrated it" in message
    assert f"0001-{LATEST:04d}" in message and "nothing was changed" in message


@pytest.mark.parametrize(
    ("record", "lacking"),
    [
        (files(1, 2, 4), "0003"),
        (upto(14, but=10), "0010"),
        (upto(16, but=2), "0002"),  # 0003 before 0002 was only ever left at 0003
        ({**upto(13), **superseded("update_room")}, "0014"),
        (superseded("submit_statements"), "0014"),  # a superseded 0015 with nothing under it
    ],
    ids=["a hole", "a hole in the middle", "an out-of-order hole later", "a hole under a renumbered one", "alone"],
)
def test_a_record_with_a_hole_no_version_left_is_refused(record: dict[int, str], lacking: str) -> None:
    with pytest.raises(MigrationHistoryGap) as refused:
        plan(record, FILES)
    assert f"but not {lacking}" in str(refused.value) and "nothing was changed" in str(refused.value)


def test_every_refusal_is_one_kind_of_error() -> None:
    for error in (MigrationChecksumMismatch, MigrationHistoryGap, MigrationUnknownVersion):
        assert issubclass(error, MigrationRefused)


def test_the_shipped_migrations_are_numbered_from_0001_without_a_hole() -> None:
    assert [m.version for m in FILES] == LATER


def test_superseded_records_are_no_file_and_hold_only_what_came_before_them() -> None:
    checksums = {m.checksum for m in FILES}
    for s in SUPERSEDED:
        assert s.checksum not in checksums, s
        assert set(s.holds) <= set(range(1, s.version + 1)), s
        assert s.restore is None or s.restore[0] < s.version, s
    assert all(max(gap) <= LATEST for gap in OUT_OF_ORDER)
