"""The program judge: build a submitted program and judge it test by test, as contest judges do.

Payload, either with its own tests::

    {"language": "python" | "c" | "cpp" | "java" | ..., "source": "...", "std": "c++20",
     "tests": [{"input": "...", "output": "..."}, ...],
     "limits": {"time": 2, "memory_mb": 256, "output_kb": 1024},
     "checker": "lines", "scoring": {"run_all": true}}          # both optional

or naming an uploaded problem package (tests, limits, checker, interactor, scoring come from it)::

    {"problem": "mean", "version": 3, "language": "cpp", "source": "..."}

``language`` is a name of :data:`~.languages.LANGUAGES`; ``std`` (optional, C and C++ only) one of
that language's standards. A submission of several files adds ``"files": {"util.h": "...",
"util.cpp": "..."}`` beside its ``source`` (C and C++ compile the further ``.c``/``.cpp`` files with
it; every language finds them in its directory); an output-only problem's submission is
``"outputs": {"<test name>": "..."}`` instead of a language and a source. A submission's build is
kept by the worker (:mod:`.builds`, :mod:`.building`): the same sources in the same language and standard are built
once per worker.

Each test gives a :class:`~.scoring.TestResult` (verdict, CPU ms, wall ms, peak memory, exit code
or signal, a short checker message). The submission's verdict is the first failing test's, or
ACCEPTED; judging stops at the first failure unless the problem is scored (groups, or
``run_all``), when :func:`~.scoring.should_run` skips only tests that can no longer change the
score. A run's limit verdicts come from facts alone (:func:`classify_facts`); a run that ended
normally is then judged by the checker: a built-in one of :mod:`.checkers`, a custom checker
program, or, for interactive problems, the interactor the submission talked to. Checkers and
interactors run in boxes of their own (the same uid, a separate directory the submission never
sees, their own limits); one that crashes makes the submission SYSTEM_ERROR with its message.
A submission has a wall-time budget for everything it runs and a maximum number of tests.

A package's format (judgequeue, ICPC/Kattis, Polygon) brings its own verdict rules, applied to its
submissions only: how a Kattis output validator is run and read, the order of verdicts of an
interactive test (:func:`classify_interactive`), how tests are grouped and scored.
"""

from __future__ import annotations

from .boxes import untraversable
from .building import UNITS, with_units
from .classify import (
    classify_facts,
    classify_interactive,
    classify_run,
    format_facts,
    helper_outcome,
    kattis_helper_outcome,
    normalise_output,
    outputs_match,
    result_of,
    verdict_details,
)
from .formats import FORMATS, KINDS
from .judge import InputCheck, ProgramJudge
from .payload import (
    MAX_FILES,
    MAX_FILES_BYTES,
    MAX_MEMORY_MB,
    MAX_OUTPUT_KB,
    MAX_TIME,
    InvalidProgramPayload,
    Program,
    own_files,
    parse_limits,
    parse_payload,
)
from .problem import HELPER_LIMITS, Case, Helper, Problem, inline_problem, package_helper, package_problem, run_limits

__all__ = [
    "FORMATS",
    "HELPER_LIMITS",
    "KINDS",
    "MAX_FILES",
    "MAX_FILES_BYTES",
    "MAX_MEMORY_MB",
    "MAX_OUTPUT_KB",
    "MAX_TIME",
    "UNITS",
    "Case",
    "Helper",
    "InputCheck",
    "InvalidProgramPayload",
    "Problem",
    "Program",
    "ProgramJudge",
    "classify_facts",
    "classify_interactive",
    "classify_run",
    "format_facts",
    "helper_outcome",
    "inline_problem",
    "kattis_helper_outcome",
    "normalise_output",
    "outputs_match",
    "own_files",
    "package_helper",
    "package_problem",
    "parse_limits",
    "parse_payload",
    "result_of",
    "run_limits",
    "untraversable",
    "verdict_details",
    "with_units",
]
