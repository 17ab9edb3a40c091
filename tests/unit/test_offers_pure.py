"""Offers' pure pieces, by name: the fill notification's format (``offers.parse_notification``), the
top-up rules (``offers.to_add``, ``offers.reserved_to_add``), the backlog that opens the reserve
(``offers.full_takes``, ``offers.backlog_seen``) and the keeper's rate limit (``offer_keeper.too_fast``)."""

from __future__ import annotations

import json
import uuid

import pytest

from judgequeue.core.roles.worker.direct import offer_keeper, offers, tuning


def test_a_fill_notification_parses_with_and_without_its_payload() -> None:
    attempt = uuid.uuid4()
    filled = offers.parse_notification(f'42 {attempt} 3 1733290000.5 {json.dumps({"a": [1, "b c"]})}')
    assert (filled.submission, filled.attempt, filled.slot, filled.payload) == (42, attempt, 3, {"a": [1, "b c"]})
    bare = offers.parse_notification(f"42 {attempt} 3 1733290000.5")
    assert not bare.has_payload and bare.payload is None


@pytest.mark.parametrize("bad", ["", "42", "x {attempt} 3 1.0", "42 not-a-uuid 3 1.0"])
def test_a_malformed_fill_notification_is_refused(bad: str) -> None:
    with pytest.raises(ValueError):
        offers.parse_notification(bad.format(attempt=uuid.uuid4()))


def test_offers_are_topped_up_once_three_quarters_are_gone_within_the_free_slots_and_the_limit() -> None:
    assert offers.to_add(concurrency=256, busy=0, open_now=0, limit=32) == 32
    assert offers.to_add(concurrency=256, busy=0, open_now=9, limit=32) == 0
    assert offers.to_add(concurrency=256, busy=0, open_now=8, limit=32) == 24
    assert offers.to_add(concurrency=4, busy=0, open_now=1, limit=32) == 3
    assert offers.to_add(concurrency=2, busy=1, open_now=0, limit=32) == 1
    assert offers.to_add(concurrency=2, busy=2, open_now=0, limit=32) == 0


def test_reserved_offers_are_topped_up_once_half_are_gone_within_the_free_slots() -> None:
    assert offers.reserved_to_add(reserve=8, reserved_busy=0, free=64, open_now=0) == 8
    assert offers.reserved_to_add(reserve=8, reserved_busy=0, free=64, open_now=5) == 0  # a fill or three: none yet
    assert offers.reserved_to_add(reserve=8, reserved_busy=0, free=64, open_now=4) == 4
    assert offers.reserved_to_add(reserve=8, reserved_busy=3, free=64, open_now=3) == 0  # jobs hold the rest
    assert offers.reserved_to_add(reserve=8, reserved_busy=3, free=64, open_now=2) == 3
    assert offers.reserved_to_add(reserve=8, reserved_busy=0, free=2, open_now=0) == 2  # only the free slots
    assert offers.reserved_to_add(reserve=1, reserved_busy=0, free=4, open_now=0) == 1  # one kept: at once
    assert offers.reserved_to_add(reserve=1, reserved_busy=1, free=4, open_now=0) == 0
    assert offers.reserved_to_add(reserve=8, reserved_busy=8, free=64, open_now=0) == 0


def test_a_take_that_fills_its_room_adds_to_the_streak_and_one_that_finds_fewer_ends_it() -> None:
    assert offers.full_takes(rows=8, limit=8, streak=0) == 1
    assert offers.full_takes(rows=3, limit=3, streak=2) == 3
    assert offers.full_takes(rows=7, limit=8, streak=5) == 0  # every ready row taken: the worker keeps up
    assert offers.full_takes(rows=0, limit=8, streak=5) == 0
    assert offers.full_takes(rows=0, limit=0, streak=2) == 2  # no room: says nothing


def test_a_backlog_is_seen_after_a_streak_of_full_takes_or_one_that_stood() -> None:
    k, wait = tuning.BACKLOG_TAKES, tuning.BACKLOG_WAIT
    assert not offers.backlog_seen(0, 1000.0)
    assert not offers.backlog_seen(k - 1, wait / 2)  # a flood's occasional full take, followed at once
    assert offers.backlog_seen(k, 0.0)  # a drain: every take full
    assert offers.backlog_seen(1, wait)  # one full take, then no take (slots held by long jobs)


def test_the_keeper_stops_offering_above_its_fill_rate() -> None:
    assert offer_keeper.too_fast(int(tuning.OFFER_MAX_FILL_RATE * tuning.OFFER_RATE_WINDOW) + 1)
    assert not offer_keeper.too_fast(int(tuning.OFFER_MAX_FILL_RATE * tuning.OFFER_RATE_WINDOW))
