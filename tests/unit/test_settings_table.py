"""The settings' rows (core/settings_table.py) against everything that describes a setting:

- the README's variable table is what the rows generate (scripts/gen_variable_table.py);
- the CRD, in crds/ and in the chart, says for each row's spec field what the row says (type,
  bounds, default, choices, pattern), and names the Secret of each connection;
- the roles refuse what a JudgeQueue refuses, each with one line naming the variable, and accept
  whatever a JudgeQueue accepts (every value the operator can render loads);
- a row with a spec path is a spec field even when core/spec/ does not place it.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from judgequeue.core import spec as spec_model
from judgequeue.core.base.errors import ConfigError
from judgequeue.core.cli import main
from judgequeue.core.config import load_settings
from judgequeue.core.setting_values import format_duration
from judgequeue.core.settings_table import ROW_BY_SPEC, ROW_BY_SUFFIX, ROWS, Row, variable_table
from judgequeue.core.spec import FIELD_BY_PATH, FIELDS, ROLES, JudgeQueueSpec, parse_spec, role_settings
from judgequeue.core.spec import fields as spec_fields
from tests.support.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
CONNECTIONS = {"JUDGEQUEUE_POSTGRES_DSN": "postgresql://u@db/x", "JUDGEQUEUE_REDIS_URL": "redis://r:6379/0",
               "JUDGEQUEUE_QUEUE": "judge"}
MINIMAL = {"image": "i", "postgres": {"secretKeyRef": {"name": "db"}}, "redis": {"secretKeyRef": {"name": "rd"}}}
SPEC_ROWS = [r for r in ROWS if r.spec is not None]


# --- the README ---------------------------------------------------------------------------------


def test_the_readme_table_is_what_the_rows_generate() -> None:
    readme = (ROOT / "README.md").read_text()
    assert load_script("gen_variable_table").render(readme) == readme, (
        "README.md's variable table differs from core/settings_table.py: run .venv/bin/python "
        "scripts/gen_variable_table.py"
    )


def test_the_table_has_a_line_per_row_with_its_default_range_and_field() -> None:
    lines = {line.split(" | ")[0].strip("| `"): line for line in variable_table().splitlines()}
    assert set(lines) >= {r.variable for r in ROWS}
    assert lines["JUDGEQUEUE_BATCH_SIZE"].startswith("| `JUDGEQUEUE_BATCH_SIZE` | `100` (1-10000) | dispatcher: ")
    assert lines["JUDGEQUEUE_BATCH_SIZE"].endswith("| `spec.dispatcher.batchSize` |")
    assert "| `1m` |" in lines["JUDGEQUEUE_VISIBILITY_TIMEOUT"]
    assert "| required |" in lines["JUDGEQUEUE_QUEUE"] and "| unset |" in lines["JUDGEQUEUE_POSTGRES_LISTEN_DSN"]
    assert lines["JUDGEQUEUE_REDIS_URL"].endswith("| `spec.redis.secretKeyRef` |")


def test_a_stale_readme_is_found() -> None:
    script = load_script("gen_variable_table")
    readme = (ROOT / "README.md").read_text()
    stale = readme.replace("dispatcher: outbox rows claimed per batch", "dispatcher: rows per batch")
    assert stale != readme and script.render(stale) == readme


# --- the CRD ------------------------------------------------------------------------------------


def _chart_crd() -> dict[str, Any]:
    """The chart's CRD template read as YAML: its template lines (``{{ ... }}``) dropped."""
    text = (ROOT / "charts" / "judgequeue" / "templates" / "crd.yaml").read_text()
    text = re.sub(r"\{\{-? /\*.*?\*/ -?\}\}", "", text, flags=re.S)
    body = "\n".join(line for line in text.splitlines() if not line.strip().startswith("{{"))
    data: dict[str, Any] = yaml.safe_load(body)
    return data


def _crd_files() -> dict[str, dict[str, Any]]:
    return {"crds/judgequeue.yaml": yaml.safe_load((ROOT / "crds" / "judgequeue.yaml").read_text()),
            "charts/judgequeue/templates/crd.yaml": _chart_crd()}


def _spec_node(crd: dict[str, Any], path: tuple[str, ...]) -> dict[str, Any]:
    node: dict[str, Any] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    for key in path:
        node = node["properties"][key]
    return node


def _row_says(row: Row) -> dict[str, Any]:
    """What the CRD must say of a row's spec field, as the CRD writes it."""
    minimum, maximum = row.spec_bounds
    default = row.spec_field_default
    if default is not None and row.kind == "duration":
        default = format_duration(default)
    return {
        "type": "integer" if row.kind == "integer" else "string",
        "minimum": minimum if row.kind == "integer" else None,
        "maximum": maximum if row.kind == "integer" else None,
        "enum": list(row.spec_choices or row.choices) or None,
        "default": default,
        "pattern": row.pattern if row.kind == "string" else _spec_node_pattern(row),
    }


def _spec_node_pattern(row: Row) -> str | None:
    if row.kind != "duration":
        return None
    return spec_model.LONG_DURATION_PATTERN if row.long else spec_model.DURATION_PATTERN


@pytest.mark.parametrize("where", ["crds/judgequeue.yaml", "charts/judgequeue/templates/crd.yaml"])
def test_the_crd_says_of_each_setting_what_its_row_says(where: str) -> None:
    crd = _crd_files()[where]
    drift = []
    for row in SPEC_ROWS:
        assert row.spec is not None
        node = _spec_node(crd, row.spec)
        said = {key: node.get(key) for key in ("type", "minimum", "maximum", "enum", "default", "pattern")}
        drift += [f"spec.{'.'.join(row.spec)} ({row.variable}): CRD {k} {said[k]!r}, row {v!r}"
                  for k, v in _row_says(row).items() if said[k] != v]
    for row in ROWS:
        if row.secret is not None:
            assert set(_spec_node(crd, row.secret)["properties"]["secretKeyRef"]["properties"]) == {"name", "key"}
    assert drift == []


def test_the_chart_crd_is_read_whole() -> None:
    """The template's CRD is not vacuous: it reads as the same spec schema as crds/."""
    files = _crd_files()
    chart, plain = files["charts/judgequeue/templates/crd.yaml"], files["crds/judgequeue.yaml"]
    assert _spec_node(chart, ()) == _spec_node(plain, ())


def test_each_spec_field_of_a_setting_is_its_rows() -> None:
    for row in SPEC_ROWS:
        assert row.spec is not None
        f = FIELD_BY_PATH[row.spec]
        assert (f.setting, f.roles, f.default) == ((row.section, row.name), row.roles, row.spec_field_default)
        assert (f.minimum, f.maximum) == (row.spec_bounds if row.kind == "integer" else (None, None))
    settable = {f.path for f in FIELDS if f.setting is not None}
    assert settable == set(ROW_BY_SPEC)


# --- the roles refuse what the spec refuses -----------------------------------------------------


def _spec(**sections: Any) -> JudgeQueueSpec | list[str]:
    doc: dict[str, Any] = {**MINIMAL}
    for key, value in sections.items():
        doc[key] = {**doc.get(key, {}), **value} if isinstance(value, dict) else value
    return parse_spec(doc, name="judge")


def _nested(path: tuple[str, ...], value: Any) -> dict[str, Any]:
    out: dict[str, Any] = {path[-1]: value}
    for key in reversed(path[:-1]):
        out = {key: out}
    return out


def _deep_merge(into: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    for key, value in extra.items():
        into[key] = _deep_merge(dict(into.get(key, {})), value) if isinstance(value, dict) else value
    return into


BOUNDED = [r for r in SPEC_ROWS if r.kind == "integer"]


@pytest.mark.parametrize("row", BOUNDED, ids=[r.variable for r in BOUNDED])
def test_a_number_beyond_the_spec_bound_is_refused_by_both(row: Row) -> None:
    assert row.spec is not None
    minimum, maximum = row.spec_bounds
    assert minimum is not None and maximum is not None
    for bad in (minimum - 1, maximum + 1):
        refused = parse_spec(_deep_merge(dict(MINIMAL), _nested(row.spec, bad)), name="judge")
        assert isinstance(refused, list), (row.spec, bad)
        if row.maximum is None and bad > maximum:
            continue  # a bound the spec alone sets, declared in the row (concurrency)
        with pytest.raises(ConfigError) as caught:
            load_settings({**CONNECTIONS, row.variable: str(bad)})
        assert str(caught.value).startswith(f"{row.variable}='{bad}' is invalid: must be ")
        assert "\n" not in str(caught.value)


@pytest.mark.parametrize(("variable", "value", "message"), [
    ("JUDGEQUEUE_BATCH_SIZE", "50000",
     "JUDGEQUEUE_BATCH_SIZE='50000' is invalid: must be a positive whole number up to 10000"),
    ("JUDGEQUEUE_MAX_DELIVERIES", "5000", "JUDGEQUEUE_MAX_DELIVERIES='5000' is invalid: must be a positive whole "
                                          "number up to 1000"),
    ("JUDGEQUEUE_GRACE_PERIOD", "1h", "JUDGEQUEUE_GRACE_PERIOD='1h' is invalid: must be a positive duration under 1h"),
])
def test_what_a_judgequeue_refuses_a_role_refuses_in_one_line(
    variable: str, value: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}$"):
        load_settings({**CONNECTIONS, variable: value})
    row = ROW_BY_SUFFIX[variable.removeprefix("JUDGEQUEUE_")]
    assert row.spec is not None
    raw: Any = int(value) if row.kind == "integer" else value
    refused = parse_spec(_deep_merge(dict(MINIMAL), _nested(row.spec, raw)), name="judge")
    assert isinstance(refused, list) and any(e.startswith(f"spec.{'.'.join(row.spec)}: ") for e in refused), refused
    # A role started with it stops at once: exit 2, the one line.
    for role in ROLES:
        assert main([role], env={**CONNECTIONS, variable: value}) == 2
        assert capsys.readouterr().err == f"judgequeue: error: {message}\n"


def test_every_value_a_judgequeue_accepts_at_its_bounds_loads_in_every_role() -> None:
    """What the operator can render from a valid spec, a role accepts: each bounded field at its
    least and its most, and each duration bounded above just under it."""
    for pick in (0, 1):
        doc: dict[str, Any] = dict(MINIMAL)
        for row in SPEC_ROWS:
            assert row.spec is not None
            if row.kind == "integer":
                doc = _deep_merge(doc, _nested(row.spec, row.spec_bounds[pick]))
            elif row.kind == "duration" and row.under is not None:
                doc = _deep_merge(doc, _nested(row.spec, format_duration(row.under - 1)))
        doc = _deep_merge(doc, {"worker": {"minReplicas": 0}})
        parsed = parse_spec(doc, name="judge")
        assert isinstance(parsed, JudgeQueueSpec), parsed
        for role in ROLES:
            settings = load_settings({**CONNECTIONS, **role_settings(parsed, role)})
            for row in SPEC_ROWS:
                if role in row.roles and row.spec != ("worker", "intake"):  # the intake is resolved, not copied
                    assert row.spec is not None
                    section = settings if row.section is None else getattr(settings, row.section)
                    assert getattr(section, row.name) == parsed.values[row.spec], (role, row.variable)


# --- the roles column ---------------------------------------------------------------------------


def test_each_row_names_the_roles_whose_modules_read_it() -> None:
    """Every sectioned setting (with a spec field or not) is read by exactly the roles its row names,
    found from the role modules' source as tests/unit/test_spec_model.py finds them."""
    from tests.unit.test_spec_model import _sources, settings_read_by

    found = {role: set().union(*(settings_read_by(path) for path in _sources(role))) for role in ROLES}
    wrong = {row.variable: (sorted(row.roles), sorted(r for r in ROLES if (row.section, row.name) in found[r]))
             for row in ROWS if row.section is not None}
    assert {v: roles for v, roles in wrong.items() if roles[0] != roles[1]} == {}


# --- a row is enough ----------------------------------------------------------------------------


def test_a_row_not_placed_in_the_spec_is_added_after_its_objects_fields(monkeypatch: pytest.MonkeyPatch) -> None:
    placed = tuple(f for f in FIELDS if f.path != ("dispatcher", "maxAttempts"))
    new = replace(ROW_BY_SUFFIX["SWEEP_BATCH"], spec=("reaper", "sweepBatch"), maximum=100000)
    monkeypatch.setitem(ROW_BY_SPEC, ("reaper", "sweepBatch"), new)
    fields = spec_fields._with_every_setting(placed)
    paths = [f.path for f in fields]
    for path in (("dispatcher", "maxAttempts"), ("reaper", "sweepBatch")):
        # after every field placed in its object, and before the next object's
        siblings = [i for i, p in enumerate(paths) if p[:-1] == path[:-1] and p != path]
        assert paths.index(path) > max(siblings) and paths[paths.index(path) + 1][:1] != path[:1], paths
    added = fields[paths.index(("reaper", "sweepBatch"))]
    assert (added.kind, added.minimum, added.maximum, added.default) == ("integer", 1, 100000, 1000)
    assert added.roles == ("reaper",) and added.setting == ("reaper", "sweep_batch")
