"""The ``judgequeue`` tools as real processes against a database of this test's own."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from judgequeue.core.cli import build_parser
from judgequeue.core.store.migrate import current_versions
from tests.support.databases import REDIS_URL, connection
from tests.support.queries import submission
from tests.support.roles import JUDGEQUEUE, clean_env, run_cli
from tests.support.settings import SECRET


def jq(
    *args: str, dsn: str | None = None, queue: str | None = None, **variables: str
) -> subprocess.CompletedProcess[str]:
    env = clean_env(**variables)
    if dsn:
        env["JUDGEQUEUE_POSTGRES_DSN"] = dsn
    if queue:
        env["JUDGEQUEUE_QUEUE"] = queue
    return run_cli(*args, env=env)


def text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def ok_json(result: subprocess.CompletedProcess[str]) -> Any:
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def subcommand_paths() -> list[list[str]]:
    """Every command and sub-action of the parser."""
    import argparse

    paths: list[list[str]] = [[]]

    def walk(parser: argparse.ArgumentParser, prefix: list[str]) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, child in action.choices.items():
                    paths.append([*prefix, name])
                    walk(child, [*prefix, name])

    walk(build_parser(), [])
    return paths


def test_help_everywhere_documents_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    paths = subcommand_paths()
    assert ["dlq", "replay"] in paths and ["cutover", "set"] in paths and ["queue", "create"] in paths
    top = jq("--help")
    assert top.returncode == 0 and "exit codes: 0 ok, 1 failure" in top.stdout
    for command in ("migrate", "dispatcher", "worker", "reaper", "operator", "local", "status", "submit"):
        assert command in top.stdout
    for path in paths[1:]:  # in-process: one real process above is enough to prove the console script
        with pytest.raises(SystemExit) as exited:
            build_parser().parse_args([*path, "--help"])
        assert exited.value.code == 0
        out = capsys.readouterr().out
        assert out.startswith("usage: judgequeue " + " ".join(path)), path


def test_bad_usage_exits_2() -> None:
    assert jq().returncode == 2
    assert jq("no-such-command").returncode == 2
    result = jq("cutover", "set", "--mode", "dark", dsn="postgresql://127.0.0.1/x", queue="q")
    assert result.returncode == 2 and "invalid choice" in result.stderr


def test_migrate_needs_only_the_dsn(fresh_db: str) -> None:
    first = jq("migrate", "--json", dsn=fresh_db)
    assert ok_json(first)["applied"] == current_versions()
    again = jq("migrate", "--postgres-dsn", fresh_db)  # the flag works as well as the variable
    assert again.returncode == 0 and "up to date" in again.stdout
    missing = jq("migrate")
    assert missing.returncode == 2
    assert (
        missing.stderr.strip()
        == "judgequeue: error: JUDGEQUEUE_POSTGRES_DSN is required (set it or pass --postgres-dsn)"
    )


def test_unreachable_postgres_is_one_line_exit_1_without_the_password() -> None:
    result = jq("queue", "list", dsn=f"postgresql://postgres:{SECRET}@127.0.0.1:1/x")
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot connect to Postgres" in lines[0] and "postgres:***@" in lines[0]
    assert SECRET not in result.stderr + result.stdout


def test_a_short_password_is_hidden_in_the_url_only() -> None:
    """The scrubber hides the URL's password field, not every piece of text that contains it: a
    password ``p`` once turned the message into ``***ostgresql://***ostgres:***@``."""
    result = jq("queue", "list", dsn="postgresql://postgres:p@127.0.0.1:1/x")
    assert result.returncode == 1
    assert "cannot connect to Postgres at postgresql://postgres:***@127.0.0.1:1/x" in result.stderr, result.stderr
    assert "***ostgres" not in result.stderr


def test_queue_create_list_show(pg_dsn: str, queue_name: str) -> None:
    created = ok_json(jq("queue", "create", queue_name, "--json", dsn=pg_dsn))
    assert created["mode"] == "live" and created["watermark"] is None and created["paused"] is False
    again = ok_json(jq("queue", "create", queue_name, "--mode", "shadow", "--json", dsn=pg_dsn))
    assert again["mode"] == "live"  # idempotent: an existing queue keeps its flags
    shadow = ok_json(jq("queue", "create", "--mode", "shadow", "--json", dsn=pg_dsn, queue=queue_name + "-s"))
    assert shadow["name"] == queue_name + "-s" and shadow["mode"] == "shadow"  # name from $JUDGEQUEUE_QUEUE
    listed = ok_json(jq("queue", "list", "--json", dsn=pg_dsn))
    assert [q["name"] for q in listed] == [queue_name, queue_name + "-s"]
    shown = ok_json(jq("queue", "show", queue_name, "--json", dsn=pg_dsn))
    assert shown["outbox"]["PENDING"] == 0
    text = jq("queue", "show", queue_name, dsn=pg_dsn)
    assert text.returncode == 0 and "mode=live" in text.stdout
    bad = jq("queue", "create", "Bad_Name", dsn=pg_dsn)
    assert bad.returncode == 2 and "DNS label" in bad.stderr
    unknown = jq("queue", "show", "nope", dsn=pg_dsn)
    assert unknown.returncode == 1 and "unknown queue 'nope'" in unknown.stderr


def test_submit_rejudge_and_status(pg_dsn: str, queue_name: str, redis_client: aioredis.Redis, tmp_path: Path) -> None:
    assert jq("queue", "create", queue_name, dsn=pg_dsn).returncode == 0
    first = ok_json(
        jq(
            "submit",
            "--payload",
            '{"language": "python", "source": "print(1)"}',
            "--json",
            dsn=pg_dsn,
            queue=queue_name,
        )
    )
    payload_file = tmp_path / "p.json"
    payload_file.write_text('{"n": 2}')
    second = jq("submit", "--file", str(payload_file), dsn=pg_dsn, queue=queue_name)
    assert second.returncode == 0 and int(second.stdout) == first["id"] + 1
    stdin = subprocess.run(
        [JUDGEQUEUE, "submit", "--file", "-"],
        input='{"n": 3}',
        env=clean_env(JUDGEQUEUE_POSTGRES_DSN=pg_dsn, JUDGEQUEUE_QUEUE=queue_name),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert stdin.returncode == 0, stdin.stderr
    bad = jq("submit", "--payload", "{not json", dsn=pg_dsn, queue=queue_name)
    assert bad.returncode == 2 and "not valid JSON" in bad.stderr
    unknown = jq("submit", "--payload", "{}", dsn=pg_dsn, queue="no-such-queue")
    assert unknown.returncode == 1 and "unknown queue" in unknown.stderr
    timed_out = jq("submit", "--payload", "{}", "--wait", "--timeout", "300ms", dsn=pg_dsn, queue=queue_name)
    assert timed_out.returncode == 1 and "no verdict" in timed_out.stderr

    rejudged = ok_json(jq("rejudge", str(first["id"]), "--json", dsn=pg_dsn))
    assert rejudged == [{"id": first["id"], "generation": 2}]
    assert jq("rejudge", "999999", dsn=pg_dsn).returncode == 1

    env = {"JUDGEQUEUE_REDIS_URL": REDIS_URL}
    status = jq("status", "--json", dsn=pg_dsn, queue=queue_name, **env)
    assert status.returncode == 0, status.stdout + status.stderr
    data = json.loads(status.stdout)
    assert data["healthy"] is True and data["outbox"]["PENDING"] == 5 and data["backlog"] == 5
    assert data["mode"] == "live" and data["group_present"] is False
    crossed = jq("status", "--json", "--max-backlog", "4", dsn=pg_dsn, queue=queue_name, **env)
    assert crossed.returncode == 1 and json.loads(crossed.stdout)["problems"] == ["backlog is 5, over the limit of 4"]
    screen = jq("status", "--max-pending-age", "off", dsn=pg_dsn, queue=queue_name, **env)
    assert screen.returncode == 0 and "HEALTHY" in screen.stdout and "PENDING=5" in screen.stdout
    needs_redis = jq("status", dsn=pg_dsn, queue=queue_name)
    assert needs_redis.returncode == 2 and "JUDGEQUEUE_REDIS_URL is required" in needs_redis.stderr
    bad_flag = jq("status", "--max-lag", "-1", dsn=pg_dsn, queue=queue_name, **env)
    assert bad_flag.returncode == 2


def test_cutover_show_set_and_watermark_never_moves_back(pg_dsn: str, queue_name: str) -> None:
    assert jq("queue", "create", queue_name, dsn=pg_dsn).returncode == 0
    shown = ok_json(jq("cutover", "show", "--json", dsn=pg_dsn, queue=queue_name))
    assert (shown["mode"], shown["watermark"], shown["paused"]) == ("live", None, False)
    paused = ok_json(jq("cutover", "set", "--pause", "--mode", "shadow", "--json", dsn=pg_dsn, queue=queue_name))
    assert paused["paused"] is True and paused["mode"] == "shadow"
    assert paused["config_version"] == shown["config_version"] + 1
    marked = ok_json(
        jq(
            "cutover",
            "set",
            "--watermark",
            "2030-01-01T00:00:00Z",
            "--mode",
            "live",
            "--resume",
            "--json",
            dsn=pg_dsn,
            queue=queue_name,
        )
    )
    assert marked["watermark"].startswith("2030-01-01T00:00:00") and marked["paused"] is False
    back = jq("cutover", "set", "--watermark", "now", dsn=pg_dsn, queue=queue_name)
    assert back.returncode == 1 and "may only move forward" in back.stderr
    assert len(back.stderr.strip().splitlines()) == 1
    after = ok_json(jq("cutover", "show", "--json", dsn=pg_dsn, queue=queue_name))
    assert after == marked  # nothing changed
    naive = jq("cutover", "set", "--watermark", "2031-01-01T00:00:00", dsn=pg_dsn, queue=queue_name)
    assert naive.returncode == 2 and "time zone" in naive.stderr
    nothing = jq("cutover", "set", dsn=pg_dsn, queue=queue_name)
    assert nothing.returncode == 2 and "at least one of" in nothing.stderr
    forward = ok_json(
        jq("cutover", "set", "--watermark", "2031-06-01T00:00:00+02:00", "--json", dsn=pg_dsn, queue=queue_name)
    )
    assert forward["watermark"].startswith("2031-05-31T22:00:00")


async def test_dlq_list_show_replay_purge(pg_dsn: str, queue_name: str, redis_client: aioredis.Redis) -> None:

    from judgequeue.core.store.outbox import submit
    from judgequeue.core.store.queues import create_queue
    from judgequeue.core.transport.streams import dlq_key

    async with connection(pg_dsn) as conn:
        await create_queue(conn, queue_name)
        sub = await submit(conn, queue_name, {"n": 1})
    fields: dict[Any, Any] = {
        "source_id": "1-0",
        "reason": "max deliveries",
        "consumer": "w1",
        "deliveries": "5",
        "postgres": "dead",
    }
    poison = await redis_client.xadd(
        dlq_key(queue_name), {**fields, "entry.submission": str(sub), "entry.generation": "1"}
    )
    junk = await redis_client.xadd(dlq_key(queue_name), {**fields, "entry.foo": "bar"})
    poison_id, junk_id = text(poison), text(junk)
    env = {"JUDGEQUEUE_REDIS_URL": REDIS_URL}

    listed = ok_json(jq("dlq", "list", "--json", queue=queue_name, **env))  # no Postgres needed
    assert [(x["id"], x["submission"], x["reason"]) for x in listed] == [
        (poison_id, sub, "max deliveries"),
        (junk_id, None, "max deliveries"),
    ]
    shown = ok_json(jq("dlq", "show", poison_id, "--json", queue=queue_name, **env))
    assert shown["generation"] == 1 and shown["deliveries"] == 5
    assert jq("dlq", "show", "9-9", queue=queue_name, **env).returncode == 1
    assert jq("dlq", "purge", queue=queue_name, **env).returncode == 2  # ids or --all, never by accident

    replayed = jq("dlq", "replay", poison_id, "--json", dsn=pg_dsn, queue=queue_name, **env)
    assert ok_json(replayed) == {"outcomes": {poison_id: "replayed"}, "generations": {poison_id: 2}}
    gone = jq("dlq", "replay", poison_id, "--json", dsn=pg_dsn, queue=queue_name, **env)
    assert gone.returncode == 1 and json.loads(gone.stdout)["outcomes"] == {poison_id: "not_found"}
    # An interrupted replay leaves the entry behind: replaying it again must not bump twice.
    left = text(
        await redis_client.xadd(dlq_key(queue_name), {**fields, "entry.submission": str(sub), "entry.generation": "1"})
    )
    superseded = ok_json(jq("dlq", "replay", left, "--json", dsn=pg_dsn, queue=queue_name, **env))
    assert superseded == {"outcomes": {left: "superseded"}, "generations": {}}
    async with connection(pg_dsn) as conn:
        assert (await submission(conn, sub))["generation"] == 2
    junk_replay = jq("dlq", "replay", "--all", dsn=pg_dsn, queue=queue_name, **env)
    assert junk_replay.returncode == 1 and "not_an_envelope" in junk_replay.stdout
    purged = ok_json(jq("dlq", "purge", "--all", "--json", queue=queue_name, **env))
    assert purged == {"purged": 1}
    assert ok_json(jq("dlq", "list", "--json", queue=queue_name, **env)) == []


def test_unmigrated_database_says_to_migrate(fresh_db: str) -> None:
    result = jq("queue", "list", dsn=fresh_db)
    assert result.returncode == 1
    assert result.stderr.strip().endswith("(is the schema migrated? run: judgequeue migrate)")
    assert len(result.stderr.strip().splitlines()) == 1


def test_operator_without_kubernetes_configuration_is_one_line() -> None:
    result = jq("operator", "--kubeconfig", "/nonexistent/kubeconfig", KUBECONFIG="/nonexistent/kubeconfig")
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and ("Kubernetes configuration" in lines[0] or "not available in this build" in lines[0])


#: ``judgequeue <args>`` with the termination log at argv[1] (in a pod it is /dev/termination-log).
WITH_TERMINATION_LOG = (
    "import sys; import judgequeue.core.cli as cli, judgequeue.core.cli.common as common; "
    "common.TERMINATION_LOG = sys.argv[1]; "
    "sys.exit(cli.main(sys.argv[2:]))"
)


def test_a_worker_with_an_uninstalled_judge_leaves_its_line_in_the_termination_log(tmp_path: Path) -> None:
    """Kubernetes shows the file's content as the container's termination message, and the operator
    quotes it in the JudgeQueue's status; the file is written only if it exists (the kubelet makes it)."""
    import sys

    log = tmp_path / "termination-log"
    log.touch()
    env = clean_env(JUDGEQUEUE_POSTGRES_DSN=f"postgresql://postgres:{SECRET}@127.0.0.1:1/x",
                    JUDGEQUEUE_REDIS_URL=REDIS_URL, JUDGEQUEUE_QUEUE="q", JUDGEQUEUE_JUDGE="gpu")
    result = subprocess.run([sys.executable, "-c", WITH_TERMINATION_LOG, str(log), "worker"], env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    line = result.stderr.strip()
    assert line.startswith("judgequeue: error: JUDGEQUEUE_JUDGE='gpu' is not an installed judge plugin"), line
    assert log.read_text() == line + "\n"
    absent = tmp_path / "none"
    result = subprocess.run([sys.executable, "-c", WITH_TERMINATION_LOG, str(absent), "worker"], env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and not absent.exists()


async def test_shadow_diff_lists_mismatches_and_refuses_a_bad_limit(pg_dsn: str, queue_name: str) -> None:
    """``judgequeue shadow diff``: nothing to show, then a mismatch with both sides' per-test tables,
    scoped by --queue / $JUDGEQUEUE_QUEUE (every queue without either); a bad --limit is a usage error."""
    assert jq("queue", "create", queue_name, "--mode", "shadow", dsn=pg_dsn).returncode == 0
    assert jq("shadow", "diff", dsn=pg_dsn, queue=queue_name).stdout.strip() == f"no mismatches in queue {queue_name}"
    async with connection(pg_dsn) as conn:
        sid = await conn.fetchval("SELECT judgequeue.submit($1, '{}')", queue_name)
        await conn.execute("INSERT INTO judgequeue.shadow_verdicts (submission_id, queue, generation, status, details,"
                           " judged_at) VALUES ($1, $2, 1, 'ACCEPTED', $3::jsonb, now())", sid, queue_name,
                           json.dumps({"tests": [{"test": 1, "verdict": "ACCEPTED", "cpu_ms": 3}]}))
        await conn.execute("SELECT judgequeue.report_legacy_verdict($1, 'WRONG_ANSWER', $2::jsonb)", sid,
                           json.dumps({"tests": [{"test": 1, "verdict": "WRONG_ANSWER", "message": "line 2"}]}))
    shown = jq("shadow", "diff", dsn=pg_dsn, queue=queue_name)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0] == f"submission {sid}  queue {queue_name}  generation 1: legacy WRONG_ANSWER, shadow ACCEPTED"
    assert lines[1].startswith("  legacy  WRONG_ANSWER  (reported ") and "line 2" in lines[3]
    assert any(line.startswith("  shadow  ACCEPTED  (judged ") for line in lines)
    everywhere = ok_json(jq("shadow", "diff", "--json", dsn=pg_dsn))  # no queue named: every queue
    assert [(m["submission"], m["legacy"]["status"], m["shadow"]["status"]) for m in everywhere] == [
        (sid, "WRONG_ANSWER", "ACCEPTED")]
    assert ok_json(jq("shadow", "diff", "--json", "--queue", "another", dsn=pg_dsn)) == []
    bad = jq("shadow", "diff", "--limit", "0", dsn=pg_dsn)
    assert bad.returncode == 2 and "--limit must be 1 or more" in bad.stderr


def test_classes_on_the_command_line(pg_dsn: str, queue_name: str) -> None:
    """`queue classes --set`, `submit --class/--key`, `rejudge --class` and a bulk rejudge; a bad
    class is one line naming the valid ones, exit 2 (bad input), nothing written."""
    assert jq("queue", "create", queue_name, dsn=pg_dsn).returncode == 0
    declare = ("queue", "classes", queue_name, "--set", "contest", "practice:10", "rejudge", "--json")
    shown = ok_json(jq(*declare, dsn=pg_dsn))
    assert [{k: c[k] for k in ("name", "rank", "share", "waiting")} for c in shown] == [
        {"name": "contest", "rank": 0, "share": 0, "waiting": 0},
        {"name": "practice", "rank": 1, "share": 10, "waiting": 0},
        {"name": "rejudge", "rank": 2, "share": 5, "waiting": 0},
    ]
    line = jq("queue", "classes", queue_name, dsn=pg_dsn)
    assert line.stdout.splitlines()[0] == "contest > practice (10% first) > rejudge (5% first)"
    sid = ok_json(jq("submit", "--payload", '{"problem": "p1"}', "--class", "practice", "--key", "c-7", "--json",
                     dsn=pg_dsn, queue=queue_name))["id"]  # fmt: skip
    bad = jq("submit", "--payload", "{}", "--class", "urgent", dsn=pg_dsn, queue=queue_name)
    assert bad.returncode == 2 and "one of contest, practice, rejudge" in bad.stderr
    assert len(bad.stderr.splitlines()) == 1
    again = ok_json(jq("rejudge", str(sid), "--class", "contest", "--json", dsn=pg_dsn))
    assert again == [{"id": sid, "generation": 2}]
    bulk = ok_json(jq("rejudge", "--problem", "p1", "--json", dsn=pg_dsn, queue=queue_name))
    assert bulk == [{"id": sid, "generation": 3}]
    backlog = jq("queue", "classes", queue_name, dsn=pg_dsn).stdout.splitlines()
    # Each generation queued its own delivery (the stale ones are dropped when claimed): one per class.
    waiting = [b.split(",")[0].strip() for b in backlog[1:]]
    assert waiting == ["contest: 1 waiting", "practice: 1 waiting", "rejudge: 1 waiting"]
    assert jq("rejudge", dsn=pg_dsn).returncode == 2  # neither ids nor a bulk filter
    bad_set = jq("queue", "classes", queue_name, "--set", "a", "a", dsn=pg_dsn)
    assert bad_set.returncode == 2 and "declared twice" in bad_set.stderr


async def test_rejudging_preview_show_apply_cancel(pg_dsn: str, queue_name: str) -> None:
    """The rejudging commands as an organiser runs them: no worker here, so the probe's verdict is
    written as its worker would write it; every refusal is one line, exit 1, naming the rejudging."""
    assert ok_json(jq("queue", "create", queue_name, "--json", dsn=pg_dsn))["name"] == queue_name
    tests = [{"test": 1, "verdict": "ACCEPTED", "cpu_ms": 5, "wall_ms": 6, "memory_kb": 900, "message": ""},
             {"test": 2, "verdict": "WRONG_ANSWER", "cpu_ms": 7, "wall_ms": 8, "memory_kb": 950, "message": "2 != 3"}]
    async with connection(pg_dsn) as conn:
        sid = await conn.fetchval("SELECT judgequeue.submit($1, '{\"problem\": \"p\"}'::jsonb)", queue_name)
        await conn.execute(
            "UPDATE judgequeue.submissions SET status = 'WRONG_ANSWER', verdict = $2::jsonb WHERE id = $1",
            sid, json.dumps({"status": "WRONG_ANSWER", "details": {"tests": tests}, "generation": 1}),
        )  # fmt: skip
    opened = ok_json(jq("rejudge", "--preview", "--problem", "p", "--json", dsn=pg_dsn, queue=queue_name))
    n = opened["rejudging"]
    assert (opened["previewed"], opened["left_out"]) == (1, 0)
    missing = jq("rejudging", "apply", str(n), dsn=pg_dsn, queue=queue_name)
    assert missing.returncode == 1
    assert f"rejudging {n} is missing 1 of its 1 proposed verdicts" in missing.stderr
    assert len(missing.stderr.strip().splitlines()) == 1
    async with connection(pg_dsn) as conn:  # the probe judged: the fixed test 2 passes
        fixed = [{**tests[0]}, {**tests[1], "verdict": "ACCEPTED", "message": ""}]
        await conn.execute(
            "UPDATE judgequeue.submissions SET status = 'ACCEPTED', verdict = $2::jsonb WHERE rejudging = $1",
            n, json.dumps({"status": "ACCEPTED", "details": {"tests": fixed}, "generation": 1}),
        )  # fmt: skip
    shown = jq("rejudging", "show", str(n), dsn=pg_dsn, queue=queue_name)
    assert shown.returncode == 0, shown.stderr
    assert f"submission {sid}: WRONG_ANSWER -> ACCEPTED" in shown.stdout
    assert "2 != 3" in shown.stdout  # the old per-test table
    assert shown.stdout.count("WRONG_ANSWER") >= 3 and "ACCEPTED" in shown.stdout
    listed = ok_json(jq("rejudging", "list", "--json", dsn=pg_dsn, queue=queue_name))
    assert [(r["id"], r["state"], r["items"], r["judged"]) for r in listed] == [(n, "OPEN", 1, 1)]
    done = ok_json(jq("rejudging", "apply", str(n), "--json", dsn=pg_dsn, queue=queue_name))
    assert (done["applied"], done["stale"], done["missing"], done["applied_now"]) == (1, 0, 0, True)
    history = ok_json(jq("submission", "history", str(sid), "--json", dsn=pg_dsn, queue=queue_name))
    assert [(e["generation"], e["status"], e["cause"]) for e in history][-1] == (2, "ACCEPTED", "applied")
    refused = jq("rejudging", "cancel", str(n), dsn=pg_dsn, queue=queue_name)
    assert refused.returncode == 1 and f"rejudging {n} was applied" in refused.stderr
    unknown = jq("rejudging", "show", "999999", dsn=pg_dsn, queue=queue_name)
    assert unknown.returncode == 1 and "unknown rejudging 999999" in unknown.stderr
    second = ok_json(jq("rejudge", "--preview", str(sid), "--json", dsn=pg_dsn, queue=queue_name))["rejudging"]
    gone = ok_json(jq("rejudging", "cancel", str(second), "--json", dsn=pg_dsn, queue=queue_name))
    assert (gone["cancelled_now"], gone["stopped"]) == (True, 1)
    again = jq("rejudging", "apply", str(second), dsn=pg_dsn, queue=queue_name)
    assert again.returncode == 1 and f"rejudging {second} was cancelled" in again.stderr
