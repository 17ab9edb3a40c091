"""Configuration errors are one line naming the variable (or the flag the value came from)."""

from __future__ import annotations

from pathlib import Path

import pytest

from judgequeue.core.base.errors import ConfigError
from judgequeue.core.config import (
    DIRECT_INTAKE_MAX_WORKERS,
    INTAKES,
    ArchiveSettings,
    IntakeChoice,
    WorkerSettings,
    intake_for_fleet,
    load_archive_settings,
    load_settings,
    parse_variable,
)
from judgequeue.core.judges.sandbox.isolation import CACHE_MB_VAR, JudgeSettings, load_judge_settings

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


N = DIRECT_INTAKE_MAX_WORKERS


@pytest.mark.parametrize(("workers", "expected"), [
    (1, IntakeChoice("direct", f"auto: maxReplicas 1 <= {N}, direct")),
    (N - 1, IntakeChoice("direct", f"auto: maxReplicas {N - 1} <= {N}, direct")),
    (N, IntakeChoice("direct", f"auto: maxReplicas {N} <= {N}, direct")),  # the bound itself is direct's
    (N + 1, IntakeChoice("stream", f"auto: maxReplicas {N + 1} > {N}, stream")),
    (1000, IntakeChoice("stream", f"auto: maxReplicas 1000 > {N}, stream")),
])
def test_auto_intake_is_direct_up_to_the_bound_and_stream_above(workers: int, expected: IntakeChoice) -> None:
    assert intake_for_fleet("auto", workers) == expected


@pytest.mark.parametrize("intake", INTAKES)
@pytest.mark.parametrize("workers", [1, N, N + 1, 1000])
def test_an_explicit_intake_is_kept_whatever_the_fleet(intake: str, workers: int) -> None:
    assert intake_for_fleet(intake, workers) == IntakeChoice(intake, f"{intake}: set in spec.worker.intake")


def test_the_reason_names_the_bound_it_decided_on() -> None:
    """``judgequeue local`` runs a fixed count of workers and says so."""
    assert intake_for_fleet("auto", N + 1, bound="workers").reason == f"auto: workers {N + 1} > {N}, stream"
    with pytest.raises(ValueError, match="intake must be one of auto, stream, direct, got 'fast'"):
        intake_for_fleet("fast", 1)


def test_a_bare_role_keeps_direct_and_never_reads_auto() -> None:
    """A role cannot know its fleet's size: unset, the intake is direct; ``auto`` is the spec's alone."""
    assert WorkerSettings().intake == "direct" and "auto" not in INTAKES
    env = {"JUDGEQUEUE_POSTGRES_DSN": "postgresql://h/d", "JUDGEQUEUE_REDIS_URL": "redis://h", "JUDGEQUEUE_QUEUE": "q"}
    assert load_settings(env).worker.intake == "direct"
    with pytest.raises(ConfigError, match="JUDGEQUEUE_INTAKE"):
        load_settings({**env, "JUDGEQUEUE_INTAKE": "auto"})


def test_tools_read_a_connection_from_its_file_as_the_roles_do(tmp_path: Path) -> None:
    """``judgequeue migrate`` (the chart's migration Job mounts its Secret as a file) and every other
    tool take ``JUDGEQUEUE_POSTGRES_DSN_FILE`` like the roles; a flag still wins, and both forms at
    once is refused as the roles refuse it."""
    from judgequeue.core.cli import build_parser
    from judgequeue.core.cli.common import resolve

    dsn_file = tmp_path / "postgres-dsn"
    dsn_file.write_text("postgresql://u:secret@db/x\n")
    env = {"JUDGEQUEUE_POSTGRES_DSN_FILE": str(dsn_file)}
    args = build_parser().parse_args(["migrate"])
    assert resolve(args, env, "JUDGEQUEUE_POSTGRES_DSN") == "postgresql://u:secret@db/x"
    flagged = build_parser().parse_args(["migrate", "--postgres-dsn", "postgresql://flag@db/y"])
    assert resolve(flagged, env, "JUDGEQUEUE_POSTGRES_DSN") == "postgresql://flag@db/y"
    with pytest.raises(ConfigError, match="are both set"):
        resolve(args, {**env, "JUDGEQUEUE_POSTGRES_DSN": "postgresql://u@db/x"}, "JUDGEQUEUE_POSTGRES_DSN")
    with pytest.raises(ConfigError, match="JUDGEQUEUE_POSTGRES_DSN_FILE='/nonexistent': cannot read"):
        resolve(args, {"JUDGEQUEUE_POSTGRES_DSN_FILE": "/nonexistent"}, "JUDGEQUEUE_POSTGRES_DSN")


def test_archive_bounds_default_to_half_what_a_worker_cache_holds() -> None:
    """Below the cache: a worker's cache holds a new version beside the old one it still judges."""
    assert load_archive_settings({}) == ArchiveSettings(256, 512, 1100)
    # The judge's cache bound and its default agree with the archive bound's.
    assert CACHE_MB_VAR == "JUDGEQUEUE_PROBLEM_CACHE_MB"
    judge = JudgeSettings().problem_cache_mb
    assert judge == load_judge_settings({}).problem_cache_mb == 2 * ArchiveSettings().max_package_mb
    smaller = load_archive_settings({"JUDGEQUEUE_PROBLEM_CACHE_MB": "512"})
    assert (smaller.max_file_mb, smaller.max_package_mb, smaller.max_package_bytes) == (256, 256, 256 << 20)
    tiny = load_archive_settings({"JUDGEQUEUE_PROBLEM_CACHE_MB": "100"})
    assert (tiny.max_file_mb, tiny.max_package_mb) == (50, 50)
    whole = load_archive_settings({"JUDGEQUEUE_PROBLEM_CACHE_MB": "512", "JUDGEQUEUE_ARCHIVE_MAX_PACKAGE_MB": "512"})
    assert whole.max_package_mb == 512  # up to the cache, when asked for
    mine = load_archive_settings({"JUDGEQUEUE_ARCHIVE_MAX_FILE_MB": " 8 ", "JUDGEQUEUE_ARCHIVE_MAX_PACKAGE_MB": "64",
                                  "JUDGEQUEUE_ARCHIVE_MAX_RATIO": "50"})  # fmt: skip
    assert mine == ArchiveSettings(8, 64, 50) and mine.max_file_bytes == 8 << 20


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"JUDGEQUEUE_ARCHIVE_MAX_FILE_MB": "0"}, r"^JUDGEQUEUE_ARCHIVE_MAX_FILE_MB='0' is invalid: must be"),
        ({"JUDGEQUEUE_ARCHIVE_MAX_RATIO": "lots"}, r"^JUDGEQUEUE_ARCHIVE_MAX_RATIO='lots' is invalid"),
        ({"JUDGEQUEUE_ARCHIVE_MAX_PACKAGE_MB": "1.5"}, r"^JUDGEQUEUE_ARCHIVE_MAX_PACKAGE_MB='1.5' is invalid"),
        ({"JUDGEQUEUE_PROBLEM_CACHE_MB": "-1"}, r"^JUDGEQUEUE_PROBLEM_CACHE_MB='-1' is invalid"),
        ({"JUDGEQUEUE_ARCHIVE_MAX_PACKAGE_MB": "2048"},
         r"^JUDGEQUEUE_ARCHIVE_MAX_PACKAGE_MB \(2048 MiB\) is more than JUDGEQUEUE_PROBLEM_CACHE_MB \(1024 MiB, its "
         r"default\): a worker's cache could never hold such a package"),
        ({"JUDGEQUEUE_ARCHIVE_MAX_PACKAGE_MB": "600", "JUDGEQUEUE_PROBLEM_CACHE_MB": "512"},
         r"\(600 MiB\) is more than JUDGEQUEUE_PROBLEM_CACHE_MB \(512 MiB\)"),
        ({"JUDGEQUEUE_ARCHIVE_MAX_FILE_MB": "300", "JUDGEQUEUE_ARCHIVE_MAX_PACKAGE_MB": "200"},
         r"^JUDGEQUEUE_ARCHIVE_MAX_FILE_MB \(300 MiB\) is more than JUDGEQUEUE_ARCHIVE_MAX_PACKAGE_MB \(200 MiB\)$"),
    ],
)
def test_a_bad_archive_bound_is_one_line_naming_it(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as caught:
        load_archive_settings(env)
    assert "\n" not in str(caught.value)


def test_a_bad_archive_bound_given_as_a_flag_is_named_as_the_flag() -> None:
    def flag(variable: str) -> str:
        return "--" + variable.removeprefix("JUDGEQUEUE_").lower().replace("_", "-")

    with pytest.raises(ConfigError, match=r"^--archive-max-file-mb='none' is invalid"):
        load_archive_settings({}, {"JUDGEQUEUE_ARCHIVE_MAX_FILE_MB": "none"}, override_name=flag)
    with pytest.raises(ConfigError, match=r"^--archive-max-package-mb \(4096 MiB\) is more than"):
        load_archive_settings({}, {"JUDGEQUEUE_ARCHIVE_MAX_PACKAGE_MB": "4096"}, override_name=flag)
