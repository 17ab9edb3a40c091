"""Judges: the plugin interface and registry, and the judges this distribution ships.

A judge is any object with ``async def judge(self, payload) -> Verdict``; plugins are entry points
of the group ``judgequeue.judges`` naming a zero-argument factory (usually the class).
:func:`load_judge` resolves the configured name at worker start-up so a typo fails at once,
listing what is installed.

- :mod:`.interface`: :class:`Judge`, :class:`Verdict` and the optional protocols;
  :mod:`.registry`: loading plugins and calling them the way the worker does;
- :mod:`.progress`: the live progress a judge reports while it works;
- :mod:`.builtin`: ``noop`` and ``sleep``; :mod:`.http_call`: ``http-call``;
- :mod:`.program`: ``program``, submitted programs judged test by test (its languages, builds,
  checkers, scoring, a grader per grading mode, and the problem archive readers);
- :mod:`.sandbox`: the boxes the program judge runs untrusted code in;
- :mod:`.report`: a stored verdict's per-test results as text for people.
"""

from __future__ import annotations

from .interface import (
    STATUSES,
    BuildsHelpers,
    CallLater,
    Job,
    Judge,
    KnowsJob,
    PackageSource,
    PackageView,
    SelfChecking,
    Status,
    UsesPackages,
    UsesRedis,
    Verdict,
)
from .progress import NO_PROGRESS, NoProgress, Progress, current_progress, reporting
from .registry import (
    ENTRY_POINT_GROUP,
    UnknownJudge,
    attach_redis,
    available_judges,
    judge_failure,
    judge_fault,
    judge_job,
    load_judge,
)

__all__ = [
    "ENTRY_POINT_GROUP",
    "NO_PROGRESS",
    "STATUSES",
    "BuildsHelpers",
    "CallLater",
    "Job",
    "Judge",
    "KnowsJob",
    "NoProgress",
    "PackageSource",
    "PackageView",
    "Progress",
    "SelfChecking",
    "Status",
    "UnknownJudge",
    "UsesPackages",
    "UsesRedis",
    "Verdict",
    "attach_redis",
    "available_judges",
    "current_progress",
    "judge_failure",
    "judge_fault",
    "judge_job",
    "load_judge",
    "reporting",
]
