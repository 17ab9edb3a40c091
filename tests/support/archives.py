"""Problem archives written in their own formats for the tests (ICPC/Kattis packages, Polygon
packages), problemtools' ``verifyproblem`` as the reference for what a Kattis package means, and
judging a stored package's own solutions through the worker's cache."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg

from judgequeue.core.judges import Verdict
from judgequeue.core.judges.program import ProgramJudge
from judgequeue.core.store.problems import ProblemCache, upload

#: problemtools' verdicts as judgequeue names them.
KATTIS_VERDICTS = {
    "AC": "ACCEPTED", "WA": "WRONG_ANSWER", "TLE": "TIME_LIMIT", "RTE": "RUNTIME_ERROR", "MLE": "MEMORY_LIMIT",
    "OLE": "OUTPUT_LIMIT", "JE": "SYSTEM_ERROR", "PE": "PRESENTATION_ERROR",
}  # fmt: skip
VERIFYPROBLEM = Path(sys.executable).with_name("verifyproblem")


def polygon_xml(
    name: str, tests: str, *, title: str | None = None, revision: int = 7, groups: str = "", executables: str = "",
    assets: str = "",
) -> str:
    """problem.xml as Polygon writes it: one testset (1 s, 256 MiB, inputs ``tests/%02d``, answers
    ``tests/%02d.a``) and testlib.h among the resources; ``tests``, ``groups``, ``executables`` and
    ``assets`` are XML put in their places as they are (``title``: the English name, else ``name``)."""
    return f"""<?xml version="1.0" encoding="utf-8" standalone="no"?>
<problem revision="{revision}" short-name="{name}" url="https://polygon.example/p/{name}">
  <names><name language="english" value="{title or name}"/></names>
  <judging cpu-name="Intel(R) Core(TM) i3-8100 CPU @ 3.60GHz" cpu-speed="3600" input-file="" output-file="">
    <testset name="tests">
      <time-limit>1000</time-limit>
      <memory-limit>268435456</memory-limit>
      <test-count>{tests.count("<test ")}</test-count>
      <input-path-pattern>tests/%02d</input-path-pattern>
      <answer-path-pattern>tests/%02d.a</answer-path-pattern>
      <tests>{tests}</tests>
      {groups}
    </testset>
  </judging>
  <files>
    <resources><file path="files/testlib.h" type="h.g++"/></resources>{executables}
  </files>
  <assets>{assets}</assets>
</problem>
"""


def write_tree(root: Path, files: Mapping[str, str | bytes]) -> Path:
    """Files under ``root`` by relative path (directories made as needed)."""
    for name, content in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
    return root


@dataclass(frozen=True)
class Reference:
    """What problemtools said about one submission of a package."""

    name: str  # e.g. "accepted/sum.py"
    verdict: str  # judgequeue's name for it
    score: float | None


def verifyproblem(root: Path, config_home: Path, *, timeout: float = 300) -> dict[str, Reference]:
    """Run problemtools on a package's submissions; what it judged each to be, by name.

    problemtools runs Python with PyPy by default, which cannot start under a small address-space
    limit here: a configuration of its own (``XDG_CONFIG_HOME``) makes it CPython."""
    config = config_home / "problemtools" / "languages.yaml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text("python3:\n  name: Python 3\n  compile: '/usr/bin/python3 -m py_compile {files}'\n"
                      "  run: '/usr/bin/python3 \"{mainfile}\"'\n")  # fmt: skip
    env = {**os.environ, "XDG_CONFIG_HOME": str(config_home)}
    done = subprocess.run(
        [str(VERIFYPROBLEM), str(root), "-p", "submissions", "-l", "info"],
        capture_output=True, text=True, timeout=timeout, env=env, check=False,
    )  # fmt: skip
    text = done.stdout + done.stderr
    found: dict[str, Reference] = {}
    line = re.compile(
        r"^(?:ERROR )?\s*(?P<name>[\w.-]+/[\w.-]+) \([^)]*\) (?:OK: |got )(?P<verdict>[A-Z]+)"
        r"(?: \((?P<score>-?[0-9.]+)\))?"
    )
    for text_line in text.splitlines():
        m = line.match(text_line.strip() if text_line.startswith("ERROR") else text_line.lstrip())
        if m:
            score = float(m["score"]) if m["score"] else None
            found[m["name"]] = Reference(m["name"], KATTIS_VERDICTS[m["verdict"]], score)
    assert found, f"verifyproblem judged nothing:\n{text}"
    return found


async def put(pool: asyncpg.Pool, root: Path, **options: Any) -> int:
    async with pool.acquire() as conn:
        return (await upload(conn, root, **options)).version


async def judge_solutions(judge: ProgramJudge, problem: str, version: int) -> dict[str, Verdict]:
    """Judge every solution a stored package recorded, its source read back from the worker's cache."""
    cache = judge.packages
    assert isinstance(cache, ProblemCache)
    async with cache.package(problem, version) as package:
        solutions = package.manifest.get("solutions", [])
        payloads = {}
        for s in solutions:
            payload: dict[str, Any] = {"problem": problem, "version": version, "language": s["language"],
                                       "source": package.path(s["file"]).read_text()}  # fmt: skip
            if s.get("std"):
                payload["std"] = s["std"]
            if s.get("files"):
                payload["files"] = {n: package.path(d).read_text() for n, d in s["files"].items()}
            payloads[s["name"]] = payload
    verdicts = {}
    for name, payload in payloads.items():
        verdicts[name] = await judge.judge(payload)
    return verdicts
