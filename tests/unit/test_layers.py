"""The import layers of docs/design.md, checked from the source: a lower layer never imports a
higher one, a role never imports another role, ``core`` never imports Kubernetes, and nothing
forms a cycle. Function-level imports count the same as top-level ones."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: Rank of each module of judgequeue.core (a package counts as one module). A module may import
#: modules of its own rank or lower, never higher.
CORE_LAYERS: dict[str, int] = {
    # foundations: no judgequeue imports but each other
    "errors": 0, "logs": 0, "failpoints": 0, "metrics": 0, "http": 0, "migrations": 0, "envelope": 0,
    "redis_url": 0, "sql": 0, "states": 0, "agreement": 0, "version": 0,
    # one server or one concern each: the Redis door, the tables, the judges
    "streams": 1, "queues": 1, "leases": 1, "submissions": 1, "migrate": 1, "judges": 1, "connect": 1,
    "config": 2, "settings_table": 2, "spec": 2, "outbox": 2, "dlq": 2, "giving_up": 2, "stream_stats": 2,
    "problems": 2, "archives": 2, "shadow": 2,
    # what every role runs on, and read-only views over the queue
    "lifecycle": 3, "api": 3, "backlog": 3, "status": 3, "runtime": 3, "manifest": 3, "wakeup": 3,
    "lanes": 3, "verdicts": 3, "deferral": 3, "intake": 3,
    # direct intake, all of it (the worker's turn, the take, offers); it stands on the shared wake-up
    "direct": 3,
    # the roles
    "dispatcher": 4, "worker": 4, "reaper": 4,
    # tools over everything
    "local": 5,
    "cli": 6,
}
ROLES = {"dispatcher", "worker", "reaper"}
#: What the operator may take from core: types, pure helpers, the queue/backlog API, the log format, and
#: the JudgeQueue spec model (``judgequeue local`` runs the same manifests, so both must parse them alike),
#: and the connection door (``connect``, with ``redis_url`` to check a Secret's URL before using it): the
#: operator's own cutover writes and backlog reads must work behind the same PgBouncer and Sentinel
#: setup as the roles, which only connections made the roles' way do. And shadow judging's figures
#: (``shadow`` reads them, ``agreement`` decides the gate on a flip): the operator shows them in status
#: and holds a flip to live back on them.
CONTROLLERS_MAY_USE = {"errors", "config", "queues", "backlog", "logs", "spec", "connect", "redis_url", "shadow",
                       "agreement"}


def _modules(package: str, folder: Path) -> dict[str, Path]:
    out = {}
    for path in sorted(folder.rglob("*.py")):
        rel = path.relative_to(folder).with_suffix("")
        parts = [p for p in rel.parts if p != "__init__"]
        out[".".join([package, *parts])] = path
    return out


def _imports(name: str, path: Path) -> set[str]:
    """Absolute names of every judgequeue module (or package) ``path`` imports, anywhere in it."""
    tree = ast.parse(path.read_text(), str(path))
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return found


CORE = _modules("judgequeue.core", ROOT / "core")
CONTROLLERS = _modules("judgequeue.controllers", ROOT / "controllers")


def _core_unit(module: str) -> str | None:
    """``judgequeue.core.judges.sandbox`` -> ``judges``; None for anything outside core's units."""
    parts = module.split(".")
    if parts[:2] != ["judgequeue", "core"] or len(parts) < 3:
        return None
    return parts[2] if parts[2] in CORE_LAYERS else None


def test_every_core_module_has_a_layer() -> None:
    units = {_core_unit(m) for m in CORE} - {None}
    missing = {m.split(".")[2] for m in CORE if m.count(".") >= 2 and _core_unit(m) is None}
    assert not missing - {"__init__"}, f"give these modules a layer in CORE_LAYERS: {sorted(missing)}"
    assert units <= set(CORE_LAYERS)


@pytest.mark.parametrize("module", sorted(CORE))
def test_core_imports_only_downwards(module: str) -> None:
    unit = _core_unit(module)
    if unit is None:
        return
    for target in _imports(module, CORE[module]):
        assert not target.startswith(("judgequeue.controllers", "kopf", "kubernetes")), (
            f"{module} imports {target}: core never imports Kubernetes or the operator"
        )
        other = _core_unit(target)
        if other is None or other == unit:
            continue
        assert CORE_LAYERS[other] <= CORE_LAYERS[unit], (
            f"{module} (layer {CORE_LAYERS[unit]}) imports {target} (layer {CORE_LAYERS[other]}): "
            "move the shared piece down instead"
        )
        assert not (unit in ROLES and other in ROLES), f"role {unit} imports role {other}"


@pytest.mark.parametrize("module", sorted(CONTROLLERS))
def test_controllers_use_only_cores_public_pieces(module: str) -> None:
    for target in _imports(module, CONTROLLERS[module]):
        other = _core_unit(target)
        if other is not None:
            allowed = sorted(CONTROLLERS_MAY_USE)
            assert other in CONTROLLERS_MAY_USE, f"{module} imports {target}; the operator may use {allowed}"


def test_no_cycles() -> None:
    graph: dict[str, set[str]] = {}
    for module, path in {**CORE, **CONTROLLERS}.items():
        here = _core_unit(module) or module
        deps = graph.setdefault(here, set())
        for target in _imports(module, path):
            there = _core_unit(target)
            if there is None and target in CONTROLLERS:
                there = target
            if there is not None and there != here:
                deps.add(there)
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                raise AssertionError("import cycle: " + " -> ".join([*path, node, dep]))
            if dep not in state:
                visit(dep, [*path, node])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [])
