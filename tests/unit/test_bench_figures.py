"""Pure figures of the benchmarks (bench/cpu.py, bench/outbox_bench.py): what a round-by-round comparison divides."""

from __future__ import annotations

import pytest

from bench.cpu import pair_ratios, total
from bench.outbox_bench import report_against_ref


def _round(worker: float, postgres: float, app: float) -> dict[str, dict[str, float]]:
    # pg:* parts are already inside "postgres"; the application is reported beside, not in, the total.
    return {"cpu_ms_per_job": {"worker": worker, "postgres": postgres, "pg:worker": postgres / 2, "application": app}}


def test_the_queue_side_total_leaves_out_postgres_parts_and_the_application() -> None:
    assert total(_round(0.3, 0.6, 0.1)["cpu_ms_per_job"]) == pytest.approx(0.9)
    assert total(_round(0.3, 0.6, 0.1)["cpu_ms_per_job"], with_app=True) == pytest.approx(1.0)


def test_rounds_are_compared_with_their_own_neighbour_not_the_best_of_the_other_side() -> None:
    # The machine sped up in round 2: both sides fell together, and each round's ratio stays 0.5
    # where best-of-each (0.4 against 1.0) would have claimed 0.4.
    mine = [_round(0.2, 0.4, 0.1), _round(0.2, 0.2, 0.1)]
    theirs = [_round(0.4, 0.8, 0.1), _round(0.4, 0.4, 0.1)]
    assert pair_ratios(mine, theirs) == pytest.approx([0.5, 0.5])


def test_rounds_of_unequal_count_are_refused() -> None:
    with pytest.raises(ValueError):
        pair_ratios([_round(0.2, 0.4, 0.1)], [])


def test_a_submit_comparison_reads_as_cost_this_tree_over_the_reference_round_by_round() -> None:
    # Throughputs: this tree did 4,000 then 5,000 submits/s beside the reference's 5,000 and 5,000, so
    # a submit cost 1.25x then 1.00x the reference's (time per submit, not rate, over the reference).
    line = report_against_ref({"this tree": [4000.0, 5000.0], "r1": [5000.0, 5000.0]})
    assert "round by round: 1.25, 1.00 (median 1.12x)" in line
    assert "median tx/s: this tree 4,500, r1 5,000" in line
    with pytest.raises(ValueError):
        report_against_ref({"this tree": [4000.0], "r1": []})
