"""The demo programs ``judgequeue local --demo`` submits, and the table of their verdicts."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..judges.report import render_verdict
from ..store.problems import InvalidPackage, read_package_dir


@dataclass(frozen=True)
class DemoProgram:
    name: str
    expect: str | None
    payload: dict[str, Any]


def load_demo(directory: Path) -> tuple[list[DemoProgram], Path | None]:
    """The demo set in ``directory/demo.yaml``: one problem and the programs to submit for it.

    The problem is either a package directory (``problem: {package: DIR}``, uploaded before the
    programs are submitted, which then name it by id and version) or inline ``tests``/``limits``.
    Returns the programs and the package directory to upload (None for inline tests).
    """
    import yaml

    from ..manifest import ManifestError

    index = directory / "demo.yaml"
    try:
        doc = yaml.safe_load(index.read_text())
    except OSError as exc:
        raise ManifestError(f"{index}: {exc.strerror or exc}") from None
    problem = doc.get("problem") or {}
    package: Path | None = None
    reference: dict[str, Any] = {"tests": problem.get("tests", []), "limits": problem.get("limits", {})}
    if problem.get("package"):
        package = directory / str(problem["package"])
        try:
            found = read_package_dir(package)
        except InvalidPackage as exc:
            raise ManifestError(f"{index}: problem.package: {exc}") from None
        if found.version is None:
            raise ManifestError(f"{index}: problem.package: {package}/problem.yaml needs a version (reruns reuse it)")
        reference = {"problem": found.id, "version": found.version}
    programs = []
    for entry in doc.get("programs") or []:
        source = (directory / entry["file"]).read_text()
        payload = {"language": entry.get("language", "python"), "source": source, **reference}
        programs.append(DemoProgram(name=entry["file"], expect=entry.get("expect"), payload=payload))
    return programs, package


def verdict_table(programs: Sequence[DemoProgram], ids: Sequence[int], rows: Mapping[int, Any]) -> list[dict[str, Any]]:
    """The demo's result, one dict per program. Pure."""
    out = []
    for program, submission_id in zip(programs, ids, strict=True):
        row = rows.get(submission_id)
        status = row["status"] if row is not None else "UNKNOWN"
        verdict = row["verdict"] if row is not None else None  # decoded by submissions.read
        out.append(
            {
                "program": program.name,
                "id": submission_id,
                "expected": program.expect,
                "verdict": status,
                "ok": program.expect is None or program.expect == status,
                "detail": verdict,
            }
        )
    return out


def format_table(results: Sequence[Mapping[str, Any]]) -> str:
    """One line per program, then (after a blank line) each program's per-test results. Pure."""
    width = max([len("program"), *(len(r["program"]) for r in results)])
    lines = [f"{'program':<{width}}  {'id':>6}  {'verdict':<18}  expected"]
    for r in results:
        mark = "" if r["ok"] else "   <-- unexpected"
        lines.append(f"{r['program']:<{width}}  {r['id']:>6}  {r['verdict']:<18}  {r['expected'] or '-'}{mark}")
    for r in results:
        detail = r.get("detail")
        details = detail.get("details") if isinstance(detail, Mapping) else None
        shown = render_verdict(r["verdict"], details if isinstance(details, Mapping) else {})
        lines += ["", f"{r['program']} (id {r['id']}): {shown[0]}", *shown[1:]]
    return "\n".join(lines)
