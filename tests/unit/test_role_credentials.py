"""``spec.credentials``: each rendered Deployment mounts only its own component's Secret.

The dispatcher, worker and reaper pods get the Postgres DSN and Redis URL of their own Secret (a
login user with only their group role, an ACL user with only their rules), never the shared
``spec.postgres``/``spec.redis`` and never another component's; a component the spec does not name
keeps the shared ones (the quick start), which status reports (``SharedCredentials``).
"""

from __future__ import annotations

import copy
import uuid
from typing import Any

import pytest

from judgequeue.controllers import render
from judgequeue.controllers.reconcile import credentials_condition
from judgequeue.core.spec import CREDENTIAL_COMPONENTS, JudgeQueueSpec, parse_spec

SHARED = {"postgres": {"secretKeyRef": {"name": "jq-superuser", "key": "dsn"}},
          "redis": {"secretKeyRef": {"name": "jq-superuser-redis", "key": "url"}}}
PER_ROLE: dict[str, Any] = {
    "image": "judgequeue:test", "queue": "split", **SHARED,
    "worker": {"judge": "program"},
    "credentials": {c: {"secretName": f"jq-{c}"} for c in CREDENTIAL_COMPONENTS},
}
OWNER = render.Owner("judge", "judges", str(uuid.uuid4()))


def parsed(doc: dict[str, Any]) -> JudgeQueueSpec:
    spec = parse_spec(doc, name="judge")
    assert isinstance(spec, JudgeQueueSpec), spec
    return spec


def secret_items(deployment: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """The file name -> (Secret, key) of every Secret source a Deployment's pods mount."""
    pod = deployment["spec"]["template"]["spec"]
    out: dict[str, tuple[str, str]] = {}
    for volume in pod["volumes"]:
        for source in (volume.get("projected") or {}).get("sources", []):
            for item in source["secret"]["items"]:
                out[item["path"]] = (source["secret"]["name"], item["key"])
        if "secret" in volume:
            out[volume["name"]] = (volume["secret"]["secretName"], "*")
    return out


def env_of(deployment: dict[str, Any]) -> list[dict[str, Any]]:
    return list(deployment["spec"]["template"]["spec"]["containers"][0]["env"])


@pytest.mark.parametrize("role", render.ROLES)
def test_each_deployment_mounts_only_its_own_secret(role: render.Role) -> None:
    children = render.render_children(parsed(PER_ROLE), OWNER, worker_replicas=1)
    deployments = {c.name: c.body for c in children if c.kind == "Deployment"}
    mounted = secret_items(deployments[f"judge-{role}"])
    assert mounted == {"postgres-dsn": (f"jq-{role}", "postgres-dsn"), "redis-url": (f"jq-{role}", "redis-url")}
    # and no credential reaches it any other way: no env value from a Secret, no envFrom
    container = deployments[f"judge-{role}"]["spec"]["template"]["spec"]["containers"][0]
    assert "envFrom" not in container
    assert all("valueFrom" not in e for e in env_of(deployments[f"judge-{role}"]))
    named = {e["value"] for e in env_of(deployments[f"judge-{role}"]) if e["name"].endswith("_FILE")}
    assert named == {f"{render.CREDENTIALS_DIR}/postgres-dsn", f"{render.CREDENTIALS_DIR}/redis-url"}


def test_the_worker_holds_no_shared_migrator_or_other_components_credentials() -> None:
    doc = copy.deepcopy(PER_ROLE)
    doc["postgres"]["listen"] = {"secretKeyRef": {"name": "jq-superuser-listen", "key": "dsn"}}
    doc["worker"]["intake"] = "direct"  # a direct-intake worker reads a LISTEN DSN too
    spec = parsed(doc)
    worker = render.render_deployment(spec, OWNER, "worker", replicas=1).body
    names = {secret for secret, _ in secret_items(worker).values()}
    assert names == {"jq-worker"}, names
    text = repr(worker)
    for other in ("jq-superuser", "jq-dispatcher", "jq-reaper", "jq-operator"):
        assert f"'{other}'" not in text and f"{other}-" not in text.replace("jq-worker", ""), other
    # no listenKey: the shared LISTEN DSN is not handed to a component with credentials of its own
    assert "JUDGEQUEUE_POSTGRES_LISTEN_DSN_FILE" not in {e["name"] for e in env_of(worker)}


def test_a_listen_key_mounts_the_components_own_listen_dsn() -> None:
    doc = copy.deepcopy(PER_ROLE)
    doc["postgres"]["listen"] = {"secretKeyRef": {"name": "jq-superuser-listen", "key": "dsn"}}
    doc["credentials"]["dispatcher"] = {"secretName": "jq-d", "postgresKey": "pg", "redisKey": "rd",
                                        "listenKey": "direct"}
    dispatcher = render.render_deployment(parsed(doc), OWNER, "dispatcher", replicas=1).body
    assert secret_items(dispatcher) == {"postgres-dsn": ("jq-d", "pg"), "redis-url": ("jq-d", "rd"),
                                        "postgres-listen-dsn": ("jq-d", "direct")}


def test_without_credentials_every_component_shares_the_one_url_and_status_says_so() -> None:
    doc = {k: v for k, v in PER_ROLE.items() if k != "credentials"}
    spec = parsed(doc)
    for role in render.ROLES:
        mounted = secret_items(render.render_deployment(spec, OWNER, role, replicas=1).body)
        assert mounted == {"postgres-dsn": ("jq-superuser", "dsn"), "redis-url": ("jq-superuser-redis", "url")}
    shared = credentials_condition(spec)
    assert (shared.type, shared.status, shared.reason) == ("SharedCredentials", "True", "SharedCredentials")
    assert "dispatcher, worker, reaper, operator" in shared.message and "spec.credentials" in shared.message
    own = credentials_condition(parsed(PER_ROLE))
    assert (own.status, own.reason) == ("False", "PerComponentCredentials")


def test_a_partial_split_names_the_components_still_sharing() -> None:
    doc = copy.deepcopy(PER_ROLE)
    doc["credentials"] = {"worker": {"secretName": "jq-worker"}}
    spec = parsed(doc)
    assert spec.shared_components() == ("dispatcher", "reaper", "operator")
    condition = credentials_condition(spec)
    assert condition.status == "True" and condition.message.startswith("dispatcher, reaper, operator connect ")
    worker = secret_items(render.render_deployment(spec, OWNER, "worker", replicas=1).body)
    reaper = secret_items(render.render_deployment(spec, OWNER, "reaper", replicas=1).body)
    assert {s for s, _ in worker.values()} == {"jq-worker"}
    assert {s for s, _ in reaper.values()} == {"jq-superuser", "jq-superuser-redis"}


def test_the_operator_reads_its_own_connections() -> None:
    spec = parsed(PER_ROLE)
    postgres, redis, listen = spec.connections("operator")
    assert (postgres.name, postgres.key, redis.name, redis.key, listen) == (
        "jq-operator", "postgres-dsn", "jq-operator", "redis-url", None)


@pytest.mark.parametrize(("credentials", "error"), [
    ({"worker": {"postgresKey": "pg"}}, "spec.credentials.worker.secretName: is required"),
    ({"worker": {"secretName": "Not_A_Name"}}, "spec.credentials.worker.secretName: 'Not_A_Name' is not a Secret name"),
    ({"worker": {"secretName": "ok", "redisKey": "a/b"}}, "spec.credentials.worker.redisKey: 'a/b' is not"),
    ({"application": {"secretName": "app"}}, "spec.credentials.application: unknown field"),
    ({"worker": "jq-worker"}, "spec.credentials.worker: must be an object"),
])  # fmt: skip
def test_a_bad_credentials_field_is_one_error_naming_it(credentials: dict[str, Any], error: str) -> None:
    doc = {**PER_ROLE, "credentials": credentials}
    errors = parse_spec(doc, name="judge")
    assert isinstance(errors, list) and any(e.startswith(error) for e in errors), errors
