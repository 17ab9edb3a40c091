"""Chaos at CI size: roles as real processes, SIGKILLed at random failpoints and times, then every
invariant of docs/design.md §6 checked from Postgres and Redis. ``bench/chaos_run.py`` runs it larger."""

from __future__ import annotations

import json
from pathlib import Path

import redis.asyncio as aioredis

from tests.chaos import Chaos, ChaosConfig
from tests.conftest import REDIS_URL


async def test_chaos_keeps_every_invariant(
    pg_dsn: str, queue_name: str, redis_client: aioredis.Redis, tmp_path: Path
) -> None:
    config = ChaosConfig(submissions=1200, chaos_seconds=25, seed=7)
    report = await Chaos(pg_dsn, REDIS_URL, queue_name, config, tmp_path).run()
    print(json.dumps(report.as_dict(), indent=1))
    assert report.kills > 5, "the run must actually kill processes"
    assert report.violations == [], report.violations
    assert report.lost_submissions == 0 and report.stale_writes_accepted == 0
