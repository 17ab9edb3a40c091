"""Per-test results of a stored verdict as text for people (pure): ``judgequeue submit --wait``,
``judgequeue status --submission`` and ``judgequeue local --demo`` print the same lines."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

_COLUMNS = ("test", "verdict", "cpu ms", "wall ms", "mem KiB", "exit", "message")
_MESSAGE = 60  # characters of a checker message on a line


def _exit_of(test: Mapping[str, Any]) -> str:
    if test.get("signal") is not None:
        return f"sig {test['signal']}"
    code = test.get("exit_code")
    return "-" if code is None else str(code)


def summary_line(status: str, details: Mapping[str, Any]) -> str:
    """``WRONG_ANSWER on test 3, score 40/100 (mean v1)``: the verdict, where, the score, the problem."""
    parts = [status]
    if details.get("failed_test") is not None:
        parts.append(f"on test {details['failed_test']}")
    line = " ".join(parts)
    if details.get("score") is not None:
        line += f", score {details['score']:g}/{details.get('max_score', 0):g}"
    problem = details.get("problem")
    if isinstance(problem, Mapping):
        line += f" ({problem.get('id')} v{problem.get('version')})"
    return line


def render_verdict(status: str, details: Mapping[str, Any] | None, indent: str = "  ") -> list[str]:
    """The summary line, a table of the tests that ran, the groups' points and the reason."""
    details = details or {}
    lines = [summary_line(status, details)]
    tests = [t for t in details.get("tests") or [] if isinstance(t, Mapping)]
    if tests:
        rows = [_COLUMNS] + [
            (
                str(t.get("test", "?")), str(t.get("verdict", "?")), str(t.get("cpu_ms", "-")),
                str(t.get("wall_ms", "-")), str(t.get("memory_kb", "-")), _exit_of(t),
                str(t.get("message", ""))[:_MESSAGE].replace("\n", " "),
            )
            for t in tests
        ]  # fmt: skip
        widths = [max(len(r[i]) for r in rows) for i in range(len(_COLUMNS) - 1)]
        for r in rows:
            cells = [
                c.rjust(w) if i not in (1,) else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=False))
            ]
            lines.append(indent + "  ".join(cells) + ("  " + r[-1] if r[-1] else ""))
    for g in details.get("groups") or []:
        tests_of = ", ".join(str(t) for t in g.get("tests", []))
        lines.append(f"{indent}group {g.get('name')}: {g.get('earned', 0):g}/{g.get('points', 0):g} (tests {tests_of})")
    if details.get("reason") and not tests:
        lines.append(f"{indent}reason: {details['reason']}")
    if details.get("output"):
        lines.append(f"{indent}compiler output:")
        lines += [indent * 2 + line for line in str(details["output"]).splitlines()[-20:]]
    return lines
