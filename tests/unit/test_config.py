"""Configuration errors are one line naming the variable (or the flag the value came from)."""

from __future__ import annotations

import pytest

from judgequeue.core.config import load_settings, parse_variable
from judgequeue.core.errors import ConfigError

BASE = {
    "JUDGEQUEUE_POSTGRES_DSN": "postgresql://u:secret@db/x",
    "JUDGEQUEUE_REDIS_URL": "redis://r:6379/0",
    "JUDGEQUEUE_QUEUE": "judge",
}


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("JUDGEQUEUE_BATCH_SIZE", "abc", "JUDGEQUEUE_BATCH_SIZE='abc' is invalid: must be a positive whole number"),
        ("JUDGEQUEUE_BATCH_SIZE", "1.5", "must be a positive whole number"),
        ("JUDGEQUEUE_BATCH_SIZE", "0", "must be a positive whole number"),
        ("JUDGEQUEUE_METRICS_PORT", "http", "JUDGEQUEUE_METRICS_PORT='http' is invalid: must be a port number"),
        ("JUDGEQUEUE_METRICS_PORT", "70000", "must be a port number 0-65535"),
        ("JUDGEQUEUE_METRICS_ADDRESS", "example.com", "must be an IP address to listen on"),
    ],
)
def test_bad_numbers_say_what_the_variable_accepts(variable: str, value: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as caught:
        load_settings({**BASE, variable: value})
    assert "invalid literal" not in str(caught.value)


def test_a_bad_flag_is_named_as_the_flag() -> None:
    with pytest.raises(ConfigError, match=r"^--batch-size='-3' is invalid"):
        load_settings(BASE, {"JUDGEQUEUE_BATCH_SIZE": "-3"}, override_name=lambda v: "--batch-size")
    with pytest.raises(ConfigError, match=r"^--batch-size='-3' is invalid"):
        parse_variable("JUDGEQUEUE_BATCH_SIZE", "-3", shown_as="--batch-size")
    # From the environment, the variable is named.
    with pytest.raises(ConfigError, match=r"^JUDGEQUEUE_BATCH_SIZE='-3' is invalid"):
        load_settings({**BASE, "JUDGEQUEUE_BATCH_SIZE": "-3"}, {}, override_name=lambda v: "--batch-size")


def test_metrics_address_defaults_to_every_ipv4_interface_and_accepts_ipv6() -> None:
    assert load_settings(BASE).metrics_address == "0.0.0.0"
    assert load_settings({**BASE, "JUDGEQUEUE_METRICS_ADDRESS": "::"}).metrics_address == "::"
