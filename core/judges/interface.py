"""The judge plugin interface: what a judge is (:class:`Judge`), what it returns (:class:`Verdict`),
and the optional protocols through which it gets more than the payload (the job's identity, the
problem packages, a self-check, building a package's helpers before it is stored)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from ..base.states import VERDICTS
from ..base.states import Verdict as StateVerdict

#: The verdict set is defined once, in judgequeue.core.base.states (the tables' CHECK is tested against it).
Status = StateVerdict


STATUSES: tuple[Status, ...] = VERDICTS


@dataclass(frozen=True)
class Verdict:
    """A judge's result: one terminal status and JSON-serialisable details."""

    status: Status
    details: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"unknown verdict status {self.status!r} (one of {', '.join(STATUSES)})")


@runtime_checkable
class Judge(Protocol):
    """What the worker calls per job. It may be cancelled at any await (lost lease, shutdown)."""

    async def judge(self, payload: Any) -> Verdict: ...


@runtime_checkable
class SelfChecking(Protocol):
    """A judge that can tell when the worker it runs in can no longer judge (its sandbox directory
    removed under it, say): the worker asks after every verdict, and on a fault gives the job back
    instead of storing a verdict the submission did not earn, and stops with that fault."""

    def fault(self) -> str | None:
        """Why this worker cannot judge any more, or None when it can."""
        ...


@dataclass(frozen=True)
class Job:
    """Which job a judge is judging: the lease's identity, for judges that act on the world.

    ``request_generation`` is the generation the submit or rejudge created; retries of that request
    (a rescued or released lease, a deferred try) run at later generations but keep it, so
    :attr:`idempotency_key` is the same for every try of one request and new for a rejudge.
    ``failures`` counts the request's failed tries so far (:class:`CallLater` with ``failed``).
    """

    queue: str
    submission: int
    generation: int
    request_generation: int
    failures: int = 0

    @property
    def idempotency_key(self) -> str:
        """``judgequeue:<queue>:<submission>:<request generation>``: one key per request."""
        return f"judgequeue:{self.queue}:{self.submission}:{self.request_generation}"


@runtime_checkable
class KnowsJob(Protocol):
    """A judge that needs the job's identity (an idempotency key for a remote call): the worker
    calls :meth:`judge_job` instead of ``judge``."""

    async def judge_job(self, job: Job, payload: Any) -> Verdict: ...


@runtime_checkable
class UsesRedis(Protocol):
    """A judge that coordinates with the other workers of its queue through Redis (the http-call
    judge's fleet-wide endpoint slots): the worker attaches its client, whose user reaches only its
    queue's keys, and its slot count, before the first job."""

    def attach_redis(self, redis: Any, worker_slots: int) -> None: ...


class CallLater(Exception):
    """Raised by a judge to be tried again no sooner than ``delay`` seconds from now, without
    holding a worker slot meanwhile: the worker gives the lease back with that not-before time (a
    new generation of the same request). ``failed``: the try failed (it counts towards the
    judge's bound, :attr:`Job.failures`) rather than waited for capacity."""

    def __init__(self, delay: float, reason: str, *, failed: bool = True) -> None:
        super().__init__(reason)
        self.delay = delay
        self.reason = reason
        self.failed = failed


class PackageView(Protocol):
    """A problem package on this worker's disk, as a judge sees it (``problems.LocalPackage`` is one)."""

    @property
    def id(self) -> str: ...
    @property
    def version(self) -> int: ...
    @property
    def sha256(self) -> str: ...
    @property
    def manifest(self) -> dict[str, Any]: ...
    def path(self, sha256: str) -> Path: ...


class PackageSource(Protocol):
    """Where a judge gets packages from: the worker's ``problems.ProblemCache``. Judges are layer 1
    and never talk to Postgres themselves; the worker injects this (:class:`UsesPackages`)."""

    def package(self, problem: str, version: int) -> AbstractAsyncContextManager[PackageView]: ...


@runtime_checkable
class UsesPackages(Protocol):
    """A judge that judges problem packages by reference: the worker asks where it wants its cache
    (directory, bytes) and attaches one before the first job."""

    def package_cache(self) -> tuple[str, int]: ...

    def attach_packages(self, source: PackageSource) -> None: ...


@runtime_checkable
class BuildsHelpers(Protocol):
    """A judge that can build a package's checker, interactor and input validators before the
    package is stored, the way it builds them to judge (the program judge): an upload refuses a
    package whose helpers do not build, instead of storing one every submission of would be SYSTEM_ERROR."""

    async def build_helpers(self, manifest: dict[str, Any], path_of: Callable[[str], Path]) -> dict[str, str]: ...
