"""Connections as files (a mounted Secret), not environment variables.

The operator renders every role with ``JUDGEQUEUE_<connection>_FILE`` paths into one read-only
projected volume of the referenced Secret keys (never a ``secretKeyRef`` variable, which any process
of the pod's uid reads from ``/proc/<pid>/environ``); core/config.py reads those files with one
error naming the variable when a file is missing or empty, and the plain variables keep working.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from judgequeue.controllers import render
from judgequeue.core.base.errors import ConfigError
from judgequeue.core.config import load_settings
from judgequeue.core.spec import JudgeQueueSpec, parse_spec

DSN = "postgresql://judge:s3cr3t@db.example:5432/judge"
URL = "redis://:r3d1s@redis.example:6379/0"
BASE = {"JUDGEQUEUE_QUEUE": "files"}


def write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def test_connections_are_read_from_files(tmp_path: Path) -> None:
    env = {**BASE, "JUDGEQUEUE_POSTGRES_DSN_FILE": write(tmp_path / "dsn", DSN + "\n"),
           "JUDGEQUEUE_REDIS_URL_FILE": write(tmp_path / "url", URL),
           "JUDGEQUEUE_POSTGRES_LISTEN_DSN_FILE": write(tmp_path / "listen", "postgresql://direct/judge\n")}
    settings = load_settings(env)
    assert (settings.postgres_dsn, settings.redis_url) == (DSN, URL)  # a trailing newline is dropped
    assert settings.postgres_listen_dsn == "postgresql://direct/judge"


def test_plain_variables_still_work() -> None:
    settings = load_settings({**BASE, "JUDGEQUEUE_POSTGRES_DSN": DSN, "JUDGEQUEUE_REDIS_URL": URL})
    assert (settings.postgres_dsn, settings.redis_url) == (DSN, URL)


@pytest.mark.parametrize(("content", "expected"), [
    (None, "JUDGEQUEUE_POSTGRES_DSN_FILE='{path}': cannot read the file (No such file or directory)"),
    ("", "JUDGEQUEUE_POSTGRES_DSN_FILE='{path}': the file is empty"),
    (" \n", "JUDGEQUEUE_POSTGRES_DSN_FILE='{path}': the file is empty"),
    ("x" * (64 * 1024 + 1), "JUDGEQUEUE_POSTGRES_DSN_FILE='{path}': the file is over 65536 bytes"),
])
def test_a_missing_or_empty_file_is_one_error_naming_the_variable(
    tmp_path: Path, content: str | None, expected: str
) -> None:
    path = tmp_path / "dsn"
    if content is not None:
        path.write_text(content)
    env = {**BASE, "JUDGEQUEUE_POSTGRES_DSN_FILE": str(path), "JUDGEQUEUE_REDIS_URL": URL}
    with pytest.raises(ConfigError) as caught:
        load_settings(env)
    assert str(caught.value) == expected.format(path=path)


def test_a_bad_value_in_a_file_is_named_without_its_password(tmp_path: Path) -> None:
    env = {**BASE, "JUDGEQUEUE_POSTGRES_DSN_FILE": write(tmp_path / "dsn", "mysql://u:s3cr3t@h/d"),
           "JUDGEQUEUE_REDIS_URL": URL}
    with pytest.raises(ConfigError) as caught:
        load_settings(env)
    assert "JUDGEQUEUE_POSTGRES_DSN=" in str(caught.value) and "s3cr3t" not in str(caught.value)


def test_both_the_variable_and_its_file_is_a_mistake_but_a_flag_wins(tmp_path: Path) -> None:
    path = write(tmp_path / "dsn", DSN)
    env = {**BASE, "JUDGEQUEUE_POSTGRES_DSN_FILE": path, "JUDGEQUEUE_POSTGRES_DSN": DSN, "JUDGEQUEUE_REDIS_URL": URL}
    with pytest.raises(ConfigError, match="JUDGEQUEUE_POSTGRES_DSN and JUDGEQUEUE_POSTGRES_DSN_FILE are both set"):
        load_settings(env)
    flagged = load_settings({**BASE, "JUDGEQUEUE_POSTGRES_DSN_FILE": str(tmp_path / "absent"),
                             "JUDGEQUEUE_REDIS_URL": URL},
                            overrides={"JUDGEQUEUE_POSTGRES_DSN": "postgresql://flag/db"})
    assert flagged.postgres_dsn == "postgresql://flag/db"


def test_the_cli_stops_with_one_line_naming_the_file_variable(tmp_path: Path) -> None:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **BASE,
           "JUDGEQUEUE_POSTGRES_DSN_FILE": str(tmp_path / "absent"), "JUDGEQUEUE_REDIS_URL": URL}
    done = subprocess.run([sys.executable, "-m", "judgequeue.core.cli", "dispatcher"], capture_output=True,
                          text=True, timeout=60, env=env)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"judgequeue: error: JUDGEQUEUE_POSTGRES_DSN_FILE='{tmp_path / 'absent'}': cannot read the file "
        "(No such file or directory)"]


# --- what the operator renders -------------------------------------------------------------------

SPEC: dict[str, Any] = {
    "image": "ghcr.io/example/judgequeue:1.0",
    "postgres": {"secretKeyRef": {"name": "db", "key": "dsn"}, "listen": {"secretKeyRef": {"name": "direct"}}},
    "redis": {"secretKeyRef": {"name": "rd", "key": "url"}},
}


def pod(role: render.Role, **worker: Any) -> dict[str, Any]:
    parsed = parse_spec({**SPEC, "worker": worker}, name="judge")
    assert isinstance(parsed, JudgeQueueSpec), parsed
    body: dict[str, Any] = render.render_deployment(parsed, render.Owner("judge", "ns", "u"), role, replicas=1).body
    return dict(body["spec"]["template"]["spec"])


@pytest.mark.parametrize(("role", "worker"), [
    ("dispatcher", {}), ("reaper", {}), ("worker", {}), ("worker", {"sandbox": "trusted"}),
])
def test_every_role_mounts_its_secrets_read_only_and_gets_no_credential_in_env(
    role: render.Role, worker: dict[str, Any]
) -> None:
    spec = pod(role, **worker)
    container = spec["containers"][0]
    env = {e["name"]: e for e in container["env"]}
    assert all("valueFrom" not in e for e in env.values())  # no secretKeyRef, no value from anywhere
    wanted = {"JUDGEQUEUE_POSTGRES_DSN": ("db", "dsn"), "JUDGEQUEUE_REDIS_URL": ("rd", "url")}
    if role in ("dispatcher", "worker"):  # a worker listens with direct intake
        wanted["JUDGEQUEUE_POSTGRES_LISTEN_DSN"] = ("direct", "dsn")
    assert {k: v["value"] for k, v in env.items() if k.endswith("_FILE")} == {
        f"{k}_FILE": render.credential_file(k) for k in wanted}
    mount = next(m for m in container["volumeMounts"] if m["name"] == "credentials")
    assert mount == {"name": "credentials", "mountPath": "/var/run/secrets/judgequeue", "readOnly": True}
    volume = next(v for v in spec["volumes"] if v["name"] == "credentials")
    assert volume["projected"]["defaultMode"] == 0o440
    assert not volume["projected"]["defaultMode"] & (stat.S_IROTH | stat.S_IWOTH | stat.S_IWGRP | stat.S_IWUSR)
    files = {item["path"]: (source["secret"]["name"], item["key"])
             for source in volume["projected"]["sources"] for item in source["secret"]["items"]}
    assert files == {render.credential_file(k).rsplit("/", 1)[1]: ref for k, ref in wanted.items()}
    user = container["securityContext"].get("runAsUser", spec["securityContext"].get("runAsUser"))
    if user != 0:  # a non-root role reads the 0440 files through its pod's fsGroup
        assert spec["securityContext"]["fsGroup"] == spec["securityContext"]["runAsGroup"] == user
