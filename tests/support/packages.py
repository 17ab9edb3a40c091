"""Problem packages on disk for the tests: the one writer of a judgequeue-format package directory."""

from __future__ import annotations

from pathlib import Path


def write_package(
    root: Path, yaml_text: str, tests: dict[str, tuple[str, str]], files: dict[str, str] | None = None
) -> Path:
    """A package directory: ``problem.yaml``, ``tests/<name>.in|.ans`` and any extra ``files`` (checker...)."""
    (root / "tests").mkdir(parents=True, exist_ok=True)
    (root / "problem.yaml").write_text(yaml_text)
    for name, (given, answer) in tests.items():
        (root / "tests" / f"{name}.in").write_text(given)
        (root / "tests" / f"{name}.ans").write_text(answer)
    for name, text in (files or {}).items():
        (root / name).write_text(text)
    return root
