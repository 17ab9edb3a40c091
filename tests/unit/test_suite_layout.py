"""The suite's own layout: every test file has a kind, and unit tests need no server.

``tests/unit`` is pure (no Postgres, Redis or child process), ``tests/integration`` uses the real
servers in-process, ``tests/process`` launches judgequeue processes, ``tests/kube`` a real control
plane, ``tests/node`` pods of the image on a real kubelet, ``tests/vm`` a cgroup v2 VM; shared code
lives in ``tests/support``. A new test file at the top of ``tests/`` fails here until it is given
its kind.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
KINDS = {"unit", "integration", "process", "kube", "node", "vm"}
#: Fixtures (tests/conftest.py) that reach a server: a unit test asking for one is not a unit test.
SERVER_FIXTURES = {"pg", "pg_dsn", "pg_pool", "fresh_db", "template_db", "own_pg", "redis_client", "kmock"}
#: Support modules that start servers or processes.
SERVER_SUPPORT = {"pg_servers", "redis_servers", "pgbouncer", "tcp_proxy", "roles", "chaos", "flow", "operator"}


def test_every_test_file_has_a_kind() -> None:
    misplaced = [
        str(path.relative_to(TESTS))
        for path in TESTS.rglob("test_*.py")
        if path.relative_to(TESTS).parts[0] not in KINDS
    ]
    assert misplaced == [], f"move these into one of {sorted(KINDS)}: {misplaced}"


def test_unit_tests_reach_no_server() -> None:
    found: list[str] = []
    for path in sorted((TESTS / "unit").glob("test_*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                found += [f"{path.name}:{node.name}({a.arg})" for a in node.args.args if a.arg in SERVER_FIXTURES]
            elif isinstance(node, ast.ImportFrom) and (node.module or "").rsplit(".", 1)[-1] in SERVER_SUPPORT:
                found.append(f"{path.name}: imports {node.module}")
    assert found == [], found
