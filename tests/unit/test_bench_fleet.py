"""Pure parts of the fleet benchmark (bench/fleet.py): the matrix, one cell's figures, the table."""

from __future__ import annotations

from typing import Any

import pytest

from bench.cpu import ConnectionPeaks
from bench.fleet import Cell, cells, failed, offered_rate, summarise, table


def test_a_busy_sleep_cell_offers_half_the_slots_and_never_more_than_the_busy_rate() -> None:
    # 1 worker x 4 slots / 0.05 s = 80 jobs/s of capacity: half of it is offered.
    assert offered_rate("sleep", "busy", 1, busy=1000, idle=20, sleep_s=0.05) == pytest.approx(40)
    assert offered_rate("sleep", "busy", 64, busy=1000, idle=20, sleep_s=0.05) == pytest.approx(1000)
    assert offered_rate("noop", "busy", 1, busy=1000, idle=20, sleep_s=0.05) == 1000
    assert offered_rate("sleep", "idle", 64, busy=1000, idle=20, sleep_s=0.05) == 20


def test_the_matrix_has_every_combination_then_the_dispatcher_sweep_at_the_largest_fleet() -> None:
    matrix = cells(
        [4, 1], ["stream", "direct"], ["noop"], ["busy", "idle"], [1, 2, 4], busy=1000, idle=20, sleep_s=0.05
    )
    assert len(matrix) == 2 * 2 * 2 + 2
    assert [c.workers for c in matrix[:4]] == [1, 1, 1, 1]  # smallest fleet first
    assert {c.dispatchers for c in matrix[:8]} == {1}
    assert matrix[8:] == [Cell("stream", "noop", "busy", 4, d, 1000) for d in (2, 4)]


def test_no_dispatcher_sweep_without_the_stream_intake() -> None:
    matrix = cells([1, 64], ["direct"], ["noop", "sleep"], ["busy"], [1, 2, 3, 4], busy=1000, idle=20, sleep_s=0.05)
    assert all(c.dispatchers == 1 for c in matrix) and len(matrix) == 4


def _result(**over: Any) -> dict[str, Any]:
    r: dict[str, Any] = {
        "jobs": 1000,
        "achieved_per_s": 990.0,
        "wall_s": 2.0,
        "cpu_ms_per_job": {
            "worker": 0.3,
            "dispatcher": 0.2,
            "reaper": 0.01,
            "postgres": 1.0,
            "pg:worker": 0.3,
            "pg:dispatcher": 0.2,
            "pg:reaper": 0.0,
            "pg:other": 0.4,
            "pg:walwriter": 0.1,
            "redis": 0.05,
            "application": 0.12,
        },
        "commit_to_start_p50_ms": 2.0,
        "commit_to_start_p99_ms": 9.0,
        "statements": [
            {"name": "submit", "toplevel": True, "calls_per_job": 1.0},
            {"name": "  (in function) SELECT pg_notify($1, $2)", "toplevel": False, "calls_per_job": 0.5},
            {"name": "  (in function) INSERT INTO judgequeue.outbox", "toplevel": False, "calls_per_job": 1.0},
            {"name": "lease_many", "toplevel": True, "calls_per_job": 0.25},
        ],
        "peak_connections": {"total": 20, "worker": 8, "dispatcher": 2, "other": 10, "max_connections": 100},
    }
    r.update(over)
    return r


def test_a_cell_splits_the_queue_side_from_the_application_and_postgres_shared_part() -> None:
    row = summarise(Cell("stream", "noop", "busy", 4, 1, 1000), _result())
    c = row["cpu_ms_per_job"]
    assert c["queue_backends"] == pytest.approx(0.5)
    assert c["queue"] == pytest.approx(0.3 + 0.2 + 0.01 + 0.5 + 0.05)
    assert c["postgres_shared"] == pytest.approx(0.5)  # the application's backends and walwriter
    assert c["application"] == pytest.approx(0.12)
    assert row["queue_cores"] == pytest.approx(1.06 * 1000 / 1000 / 2.0)


def test_notifies_count_nested_pg_notify_calls_and_statements_are_counted_both_ways() -> None:
    row = summarise(Cell("direct", "noop", "idle", 4, 1, 20), _result())
    assert row["notifies_per_job"] == pytest.approx(0.5)
    assert row["statements_per_job"] == pytest.approx(1.25)
    assert row["statements_per_job_nested"] == pytest.approx(2.75)
    assert row["connections_per_worker"] == pytest.approx(2.0)


def test_the_table_marks_a_full_cluster_and_shows_a_failed_cell_with_its_connections() -> None:
    ok = summarise(Cell("stream", "noop", "busy", 4, 1, 1000), _result())
    peaks = ConnectionPeaks()
    peaks.total, peaks.by_role, peaks.max_connections = 100, {"worker": 90, "other": 10}, 100
    bad = failed(Cell("direct", "noop", "busy", 64, 1, 1000), RuntimeError("too many clients already"), peaks)
    text = table([ok, bad])
    lines = text.splitlines()
    assert "990" in lines[2] and "20" in lines[2]
    assert "failed: RuntimeError: too many clients already" in lines[3]
    assert lines[3].split()[-2] == "100!" and lines[3].split()[-1] == "1.4"
