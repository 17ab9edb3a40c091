"""The import layers of docs/design.md, checked from the source: each folder of core is a layer, a
lower layer never imports a higher one, a role never imports another role, ``core`` never imports
Kubernetes, and nothing forms a cycle. Function-level imports count the same as top-level ones."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: The layers of judgequeue.core, bottom first. A module may import its own layer or lower ones,
#: never a higher one. Each is a folder of core, except ``app``: the modules and packages at core's
#: top (the public API, the command, ``judgequeue local``, status), which stand over all of them.
LAYERS = [
    "base",  # errors, statuses, logs, metrics, failpoints, names: no judgequeue import but each other
    "transport",  # the doors to the two servers: connections, the Redis stream, its envelope and figures
    "settings",  # the typed settings of every role, and the JudgeQueue spec model that produces them
    "judges",  # judge plugins (the program judge reads problem packages)
    "store",  # the tables and records: SQL, migrations, queues, outbox, leases, DLQ, shadow, problems
    "runtime",  # what every role runs on: the process, the lifecycle, the health port, the wake-up
    "roles",  # dispatcher, worker (with both intakes), reaper
    "app",  # core's top: the public API, the CLI, ``judgequeue local``, status
]
#: Modules and folders at core's top that belong to a lower layer than ``app``.
PLACED = {"config": "settings", "settings_table": "settings", "setting_values": "settings", "spec": "settings"}
#: The roles, each a module or a folder of roles/: none imports another.
ROLES_LAYER = "roles"
#: The layers the operator may take from: everything below the runtime. It never runs a role or the
#: runtime, and it does not call the application API or the CLI.
CONTROLLERS_MAY_USE = {"base", "transport", "settings", "store"}

RANK = {layer: rank for rank, layer in enumerate(LAYERS)}


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
TOP = {p.stem for p in (ROOT / "core").glob("*.py")} | {p.name for p in (ROOT / "core").iterdir() if p.is_dir()}


def _layer(module: str) -> str | None:
    """``judgequeue.core.store.outbox`` -> ``store``; ``judgequeue.core.cli`` -> ``app``; None outside
    core or for core's package itself."""
    parts = module.split(".")
    if parts[:2] != ["judgequeue", "core"] or len(parts) < 3 or parts[2] not in TOP - {"__init__"}:
        return None
    head = parts[2]
    if head in RANK:
        return head
    return PLACED.get(head, "app")


def _role(module: str) -> str | None:
    """``judgequeue.core.roles.worker.direct.takes`` -> ``worker``; None outside the roles."""
    parts = module.split(".")
    return parts[3] if parts[2:3] == [ROLES_LAYER] and len(parts) > 3 else None


def test_every_layer_has_its_place() -> None:
    """Each layer but the app is a folder of core, or holds modules placed in it; any other module or
    folder at core's top is the app's, which nothing below may import."""
    folders = {p.name for p in (ROOT / "core").iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert set(LAYERS) - {"app"} <= folders | set(PLACED.values()), "a layer with nothing in it"
    assert set(PLACED) <= TOP, f"placed but not at core's top: {sorted(set(PLACED) - TOP)}"


@pytest.mark.parametrize("module", sorted(CORE))
def test_core_imports_only_downwards(module: str) -> None:
    layer = _layer(module)
    if layer is None:
        return
    for target in _imports(module, CORE[module]):
        assert not target.startswith(("judgequeue.controllers", "kopf", "kubernetes")), (
            f"{module} imports {target}: core never imports Kubernetes or the operator"
        )
        other = _layer(target)
        if other is None:
            continue
        assert RANK[other] <= RANK[layer], (
            f"{module} ({layer}) imports {target} ({other}, a higher layer): move the shared piece down instead"
        )
        mine, theirs = _role(module), _role(target)
        assert not (mine and theirs and mine != theirs), f"role {mine} imports role {theirs}: {module} -> {target}"


@pytest.mark.parametrize("module", sorted(CONTROLLERS))
def test_controllers_use_only_the_lower_layers(module: str) -> None:
    for target in _imports(module, CONTROLLERS[module]):
        other = _layer(target)
        if other is not None:
            allowed = sorted(CONTROLLERS_MAY_USE)
            assert other in CONTROLLERS_MAY_USE, f"{module} imports {target} ({other}); the operator may use {allowed}"


def test_no_cycles() -> None:
    """No cycle between modules, across core and the operator (a cycle inside a layer is one too)."""
    graph: dict[str, set[str]] = {}
    modules = {**CORE, **CONTROLLERS}
    for module, path in modules.items():
        deps = graph.setdefault(module, set())
        for target in _imports(module, path):
            while target and target not in modules:  # ``from .x import name`` names x
                target = target.rpartition(".")[0]
            if target and target != module and not module.startswith(target + "."):
                deps.add(target)
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
