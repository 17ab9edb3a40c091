"""The registry of judge plugins (entry-point group ``judgequeue.judges``) and how the worker calls
one: :func:`load_judge` resolves the configured name at worker start-up so a typo fails at once,
listing what is installed; :func:`judge_job`, :func:`judge_failure` and :func:`judge_fault` are
the worker's side of the optional protocols."""

from __future__ import annotations

import functools
from importlib.metadata import entry_points
from typing import Any, cast

from ..base.errors import ConfigError
from .interface import Job, Judge, KnowsJob, SelfChecking, UsesRedis, Verdict
from .progress import NO_PROGRESS, Progress, reporting

ENTRY_POINT_GROUP = "judgequeue.judges"


@functools.cache
def _implements(cls: type, protocol: type) -> bool:
    """Whether a judge's class has ``protocol``'s methods. An ``isinstance`` against a
    runtime-checkable protocol walks the protocol's members on every call: asked twice per job, it
    was a tenth of a busy worker's time with the noop judge. A judge's class answers once."""
    return issubclass(cls, protocol)


async def judge_job(judge: Judge, job: Job, payload: Any, progress: Progress = NO_PROGRESS) -> Verdict:
    """Run ``judge`` on one job: with its identity when it asks for it (:class:`KnowsJob`), and
    ``progress`` as the reporter it finds with :func:`~.progress.current_progress`."""
    if progress is NO_PROGRESS:
        return await _call(judge, job, payload)
    with reporting(progress):
        return await _call(judge, job, payload)


async def _call(judge: Judge, job: Job, payload: Any) -> Verdict:
    if _implements(type(judge), KnowsJob):
        return await cast(KnowsJob, judge).judge_job(job, payload)
    return await judge.judge(payload)


def attach_redis(judge: Judge, redis: Any, worker_slots: int) -> bool:
    """Give a judge that coordinates through Redis (:class:`UsesRedis`) the worker's client; False
    for judges that need none."""
    if not _implements(type(judge), UsesRedis):
        return False
    cast(UsesRedis, judge).attach_redis(redis, worker_slots)
    return True


class UnknownJudge(ConfigError):
    """The configured judge name is not an installed plugin."""


def available_judges() -> list[str]:
    """Names of the installed judge plugins."""
    return sorted({ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)})


def load_judge(name: str) -> Judge:
    """Instantiate the judge plugin ``name``, or raise :class:`UnknownJudge` listing the installed ones."""
    found = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == name]
    if not found:
        names = ", ".join(available_judges()) or "none"
        raise UnknownJudge(f"JUDGEQUEUE_JUDGE={name!r} is not an installed judge plugin (available: {names})")
    factory = found[0].load()
    judge = factory()
    if not isinstance(judge, Judge):
        raise UnknownJudge(f"judge plugin {name!r} ({found[0].value}) has no async judge(payload) method")
    return judge


def judge_failure(exc: BaseException) -> Verdict:
    """The verdict of a judge that raised instead of returning (an explained SYSTEM_ERROR)."""
    return Verdict("SYSTEM_ERROR", {"reason": f"judge raised {type(exc).__name__}: {exc}"[:2000]})


def judge_fault(judge: Judge) -> str | None:
    """Why ``judge`` says this worker cannot judge any more (see :class:`SelfChecking`), or None."""
    if not _implements(type(judge), SelfChecking):
        return None
    try:
        return cast(SelfChecking, judge).fault()
    except Exception as exc:  # a check that cannot run says as much about the worker
        return f"the judge's self-check raised {type(exc).__name__}: {exc}"
