"""Settings presets: the one set of fast timings role processes run with, and in-process Settings.

Production defaults are tuned for real outages (a 60 s visibility timeout, a 30 s lease); recovery
tests would wait minutes with them. :data:`FAST_ROLE_ENV` shortens every timing so that a killed
process's work is rescued within a couple of seconds; a test (or the chaos harness) names only what
it needs different.
"""

from __future__ import annotations

from judgequeue.core.config import Settings, load_settings

FAST_ROLE_ENV = {
    "JUDGEQUEUE_JUDGE": "sleep",
    "JUDGEQUEUE_SCHEDULE": "200ms",
    "JUDGEQUEUE_CLAIM_TTL": "1s",
    "JUDGEQUEUE_BACKOFF_BASE": "100ms",
    "JUDGEQUEUE_BACKOFF_MAX": "1s",
    "JUDGEQUEUE_MAX_ATTEMPTS": "100",
    "JUDGEQUEUE_LEASE_TTL": "1500ms",
    "JUDGEQUEUE_GRACE_PERIOD": "1s",
    "JUDGEQUEUE_REAPER_INTERVAL": "200ms",
    "JUDGEQUEUE_VISIBILITY_TIMEOUT": "1s",
    "JUDGEQUEUE_MAX_DELIVERIES": "50",
    "JUDGEQUEUE_MAX_RETRIES": "50",
    "JUDGEQUEUE_LOG_LEVEL": "WARNING",
}


def make_settings(pg_dsn: str, redis_url: str, queue: str, **env: str) -> Settings:
    """Settings as a role would load them, with JUDGEQUEUE_<KEY> overrides from keyword arguments."""
    base = {
        "JUDGEQUEUE_POSTGRES_DSN": pg_dsn,
        "JUDGEQUEUE_REDIS_URL": redis_url,
        "JUDGEQUEUE_QUEUE": queue,
    }
    base.update({f"JUDGEQUEUE_{k.upper()}": v for k, v in env.items()})
    return load_settings(base)


def stream_settings(pg_dsn: str, redis_url: str, queue: str, **env: str) -> Settings:
    """:func:`make_settings` for a test of the stream intake (every job through the Redis stream).

    The default intake is ``direct``, whose dispatcher leaves a live row to the workers for one
    ``schedule`` before it sends it; tests of the dispatcher's sends, the stream's acks and the
    reaper's stream sweeps name the intake they test.
    """
    env.setdefault("intake", "stream")
    return make_settings(pg_dsn, redis_url, queue, **env)

#: A password the tests put in DSNs and URLs: it must never appear in any output or log.
SECRET = "s3cr3t-pw-do-not-print"
