"""What each component may do, as declared: the Postgres roles' statements, queue roles, Redis ACL rules."""

from __future__ import annotations

import json
import re

import pytest

from judgequeue.core.base.errors import InvalidQueueName
from judgequeue.core.cli import main
from judgequeue.core.store import sql
from judgequeue.core.store.privileges import DIRECT, QUEUE_PARAMS, ROLES, call_text, queue_role, unknown_statements
from judgequeue.core.transport.acl import COMMANDS, acl_rules


def test_every_statement_a_role_names_exists() -> None:
    assert unknown_statements(list(sql.QUERIES)) == []


def test_each_queue_parameter_is_a_parameter_its_statement_compares_with_a_queue() -> None:
    granted = {name for role in ROLES.values() for name in role.statements}
    for name, position in QUEUE_PARAMS.items():
        assert name in granted, name
        statement = sql.QUERIES[name]
        compared = rf"(queue|name)\s*=\s*\${position}\b|VALUES \(\${position},"
        # functions whose first parameter is the queue (p_queue)
        functions = "rescue_expired_leases|cancel|rejudging_preview|rejudging_apply|rejudging_cancel"
        passed_as_queue = rf"judgequeue\.({functions})\(\${position}(::text)?,"
        assert re.search(compared, statement) or re.search(passed_as_queue, statement), name


def test_statements_run_as_their_functions_but_the_applications_entry_points() -> None:
    assert sql.query("lease_verdict").startswith("SELECT * FROM judgequeue.q_lease_verdict_")
    assert sql.query("lease_verdict").endswith("($1, $2, $3, $4, $5)")
    assert sql.query("ping") == call_text("ping", sql.QUERIES["ping"]) and sql.query("ping").endswith("()")
    for name in DIRECT:
        assert sql.query(name) == sql.QUERIES[name]


def test_a_queue_role_fits_postgres_names_and_long_names_stay_distinct() -> None:
    assert queue_role("judge") == "judgequeue_queue_judge"
    long_a, long_b = "a" * 62 + "b", "a" * 62 + "c"
    assert len(queue_role(long_a)) == 63 and queue_role(long_a) != queue_role(long_b)
    with pytest.raises(InvalidQueueName):
        queue_role("Not_A_Label")


@pytest.mark.parametrize("component", sorted(COMMANDS))
def test_no_redis_user_gets_a_dangerous_command(component: str) -> None:
    rules = acl_rules(component, ["judge", "contest"])
    assert rules[:3] == ["resetkeys", "resetchannels", "-@all"]
    assert [r for r in rules if r.startswith("~")] == ["~jq:{judge}:*", "~jq:{contest}:*"]
    granted = {r[1:].split("|")[0] for r in rules if r.startswith("+")}
    assert not granted & {"eval", "evalsha", "function", "flushall", "flushdb", "config", "keys", "script", "acl"}
    assert not any(r.startswith("+@") or r == "allkeys" or r == "~*" for r in rules)


def test_acl_rules_refuse_a_bad_component_or_queue() -> None:
    with pytest.raises(ValueError, match="component must be one of"):
        acl_rules("application", ["judge"])
    with pytest.raises(InvalidQueueName):
        acl_rules("worker", ["*"])


def test_roles_command_prints_every_component(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["roles", "--queue", "judge", "--json"], env={}) == 0
    out = json.loads(capsys.readouterr().out)
    assert {r["role"] for r in out["postgres"]} == {"judgequeue_owner", *(r.name for r in ROLES.values())}
    assert out["queue_roles"] == {"judge": "judgequeue_queue_judge"}
    assert set(out["redis"]) == set(COMMANDS) and "~jq:{judge}:*" in out["redis"]["worker"]
