"""Connection settings parsed in one place: Sentinel URLs, the pooler setting, the LISTEN DSN."""

from __future__ import annotations

import socket
from urllib.parse import urlsplit

import asyncpg
import pytest

from judgequeue.core.base.errors import ConfigError
from judgequeue.core.config import load_settings, redact_url
from judgequeue.core.transport.connect import connect_postgres, postgres_options, redis_client, split_hosts
from judgequeue.core.transport.redis_url import SentinelTarget, parse_sentinel_url

BASE = {"JUDGEQUEUE_POSTGRES_DSN": "postgresql://h/db", "JUDGEQUEUE_REDIS_URL": "redis://h/0", "JUDGEQUEUE_QUEUE": "q"}


@pytest.mark.parametrize(
    ("url", "target"),
    [
        (
            "redis+sentinel://10.0.0.1:26379,10.0.0.2:26380,sentinel-3/jq-master",
            SentinelTarget((("10.0.0.1", 26379), ("10.0.0.2", 26380), ("sentinel-3", 26379)), "jq-master"),
        ),
        (
            "redis+sentinel://app:p%40ss@[::1]:26379/mymaster/3?sentinel_password=s",
            SentinelTarget((("::1", 26379),), "mymaster", 3, "app", "p@ss", "s"),
        ),
        ("redis+sentinel://:pw@h:1/m/", SentinelTarget((("h", 1),), "m", 0, None, "pw", None)),
    ],
)
def test_sentinel_urls(url: str, target: SentinelTarget) -> None:
    assert parse_sentinel_url(url) == target


@pytest.mark.parametrize(
    ("url", "complaint"),
    [
        ("redis+sentinel:///m", "at least one sentinel"),
        ("redis+sentinel://h:26379", "names its master"),
        ("redis+sentinel://h:26379/m/x", "database number"),
        ("redis+sentinel://h:26379/m/0/extra", "database number"),
        ("redis+sentinel://h:99999/m", "bad port"),
        ("redis+sentinel://h/m?password=x", "unknown Sentinel URL option"),
    ],
)
def test_bad_sentinel_urls_say_what_is_wrong(url: str, complaint: str) -> None:
    with pytest.raises(ValueError, match=complaint):
        parse_sentinel_url(url)


def test_a_bad_sentinel_url_is_a_config_error_naming_the_variable_without_the_password() -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings({**BASE, "JUDGEQUEUE_REDIS_URL": "redis+sentinel://:hunter2@h:26379"})
    assert str(caught.value).startswith("JUDGEQUEUE_REDIS_URL=") and "hunter2" not in str(caught.value)


def test_redaction_covers_sentinel_urls() -> None:
    shown = redact_url("redis+sentinel://u:hunter2@a:1,b:2/m/0?sentinel_password=hunter3")
    assert "hunter" not in shown and "a:1,b:2/m/0" in shown


def test_listen_dsn_follows_the_pooler_setting() -> None:
    assert load_settings(BASE).listen_dsn == "postgresql://h/db"  # direct: LISTEN on the same DSN
    behind = load_settings({**BASE, "JUDGEQUEUE_POSTGRES_POOLER": "transaction"})
    assert behind.listen_dsn is None  # behind a transaction pooler: poll
    direct = load_settings(
        {**BASE, "JUDGEQUEUE_POSTGRES_POOLER": "Transaction", "JUDGEQUEUE_POSTGRES_LISTEN_DSN": "postgresql://pg/db"}
    )
    assert direct.postgres_pooler == "transaction" and direct.listen_dsn == "postgresql://pg/db"
    assert load_settings({**BASE, "JUDGEQUEUE_POSTGRES_POOLER": "session"}).listen_dsn == "postgresql://h/db"
    assert postgres_options("transaction") == {"statement_cache_size": 0}
    assert postgres_options("none") == postgres_options("session") == {}


async def test_sentinel_client_is_lazy_and_plain_urls_stay_plain() -> None:
    client = redis_client("redis+sentinel://127.0.0.1:1/m/2", socket_timeout=1)
    try:
        assert client.connection_pool.connection_kwargs["db"] == 2  # nothing dialled yet
    finally:
        await client.aclose()
    plain = redis_client("redis://127.0.0.1:1/4")
    try:
        assert plain.connection_pool.connection_kwargs["db"] == 4
    finally:
        await plain.aclose()


def test_split_hosts() -> None:
    assert split_hosts("postgresql://u:p@a:1,b,[::1]:3/db?target_session_attrs=read-write") == [
        "postgresql://u:p@a:1/db?target_session_attrs=read-write",
        "postgresql://u:p@b/db?target_session_attrs=read-write",
        "postgresql://u:p@[::1]:3/db?target_session_attrs=read-write",
    ]
    assert split_hosts("postgresql://h:5432/db") == ["postgresql://h:5432/db"]


async def test_a_host_that_swallows_connections_does_not_starve_the_next(pg_dsn: str) -> None:
    """A frozen first host (it completes TCP handshakes, then says nothing) gets its own time only."""
    real = urlsplit(pg_dsn)
    with socket.socket() as black:
        black.bind(("127.0.0.1", 0))
        black.listen(16)  # never accepted: the kernel answers the handshake, nobody the protocol
        hosts = f"127.0.0.1:{black.getsockname()[1]},{real.hostname}:{real.port}"
        dsn = f"postgresql://postgres@{hosts}{real.path}?target_session_attrs=read-write"
        with pytest.raises(TimeoutError):
            await asyncpg.connect(dsn, timeout=2)  # asyncpg alone: the first host eats the whole timeout
        conn = await connect_postgres(dsn, host_timeout=1, timeout=30)
        try:
            assert await conn.fetchval("SELECT current_database()") == real.path.lstrip("/")
        finally:
            await conn.close()
