"""Every row of the program judge's languages table, judged for real in the sandbox: a program that
reads two numbers and prints their sum (ACCEPTED), one that does not build (COMPILE_ERROR with the
compiler's message), one that crashes (RUNTIME_ERROR) and one that spins (TIME_LIMIT). A language
whose toolchain this machine lacks is skipped with the reason only then (``scripts/install
--languages`` installs them all). Also: Java's any-public-class rule, the C/C++ standard a payload
chooses, the build cache, and the languages that are refused with their reason. Needs root."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from judgequeue.core.judges import Verdict
from judgequeue.core.judges.isolation import JudgeSettings
from judgequeue.core.judges.languages import LANGUAGES, missing_toolchain
from judgequeue.core.judges.program import ProgramJudge
from tests.support.language_programs import DEFAULT_INPUT, OK_INPUT, OK_OUTPUT, PROGRAMS
from tests.support.sandbox_host import assert_host_clean

pytestmark = pytest.mark.usefixtures("as_root")

CASES = ("ok", "compile_error", "runtime_error", "time_limit")


@pytest.fixture
def judge(sandbox_dir: str) -> Iterator[ProgramJudge]:
    j = ProgramJudge(settings=JudgeSettings(sandbox_dir=sandbox_dir), slots=4)
    assert j.isolation.mode == "full"
    yield j
    j.close()


def payload(language: str, source: str, **extra: Any) -> dict[str, Any]:
    given = OK_INPUT.get(language, DEFAULT_INPUT)
    return {
        "language": language, "source": source, "tests": [{"input": given, "output": OK_OUTPUT}],
        "limits": {"time": 1, "memory_mb": 256}, **extra,
    }  # fmt: skip


def require(judge: ProgramJudge, language: str) -> None:
    """Skip when (and only when) this machine lacks the language's toolchain, saying which."""
    missing = missing_toolchain(LANGUAGES[language], judge.tools)
    if missing:
        pytest.skip(missing)


def test_every_language_has_its_four_programs() -> None:
    assert set(PROGRAMS) == set(LANGUAGES)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("language", list(LANGUAGES))
async def test_language(judge: ProgramJudge, language: str, case: str) -> None:
    require(judge, language)
    programs = PROGRAMS[language]
    verdict = await judge.judge(payload(language, getattr(programs, case)))
    assert isinstance(verdict, Verdict)
    details = verdict.details
    expected = {"ok": "ACCEPTED", "compile_error": "COMPILE_ERROR", "runtime_error": "RUNTIME_ERROR",
                "time_limit": "TIME_LIMIT"}[case]  # fmt: skip
    assert verdict.status == expected, details
    assert details["language"] == language
    if case == "compile_error":
        assert details["reason"] == "compilation failed", details
        assert programs.message.lower() in details["output"].lower(), details["output"]
    elif case == "time_limit":
        assert details["tests"][0]["cpu_ms"] >= 1000, details
    await assert_host_clean(judge)
