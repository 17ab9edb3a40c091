"""One box's runs one after another, each next run's process started while the current one runs.

Most of what a boxed run costs before its program starts is not the program's: placing the first
process in its cgroups (the kernel may wait for an RCU grace period, up to ~12 ms on a 2-CPU VM)
and bubblewrap's namespaces and mounts (~4 ms). A submission's tests run the same command in the
same box with the same limits, so while test *n* runs, test *n + 1*'s process is started in a
second set of groups and left waiting on bubblewrap's ``--block-fd``; test *n + 1* then only fills
its stdin and lets it go. The work is the same, but it is no longer on every test's critical path.

What is armed must fit exactly (:func:`~.run.run_fit`: command, box, uid, limits the command
line holds); anything else runs cold. The armed process is in its own groups, so nothing of it is
accounted to the run in progress, and :meth:`Lane.close` kills an unused one.

Cheaper still, when the lane has a ``python`` for the box runner: a submission with more than one
test gets one box for all of them (:mod:`.session`), and each test costs a message and the
program's own start. Arming is then the fallback, for a session that cannot start or broke.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Sequence

from .cgroups import BoxGroup
from .command import Isolation, Limits, RunFacts
from .run import Armed, arm, discard, run, run_fit
from .session import Session, SessionBroken, start

log = logging.getLogger(__name__)


class Lane:
    """The runs of one box (a submission's tests), at most one of them armed ahead.

    ``groups`` are two group sets the runs alternate between (None in trusted mode, which arms
    nothing: without bubblewrap there is nothing to start ahead).
    """

    def __init__(
        self,
        *,
        box: str,
        uid: int,
        isolation: Isolation,
        groups: tuple[BoxGroup, BoxGroup] | None,
        python: str | None = None,
    ) -> None:
        self.box = box
        self.uid = uid
        self.isolation = isolation
        self.groups = groups
        self._next: asyncio.Task[Armed] | None = None
        self._last: BoxGroup | None = None
        self.ahead_used = 0  # runs that found their process armed
        self.cold = 0  # runs that started their process themselves
        # The box runner's interpreter (None: no sessions; trusted mode never has them).
        self.python = python if isolation.mode == "full" and groups is not None else None
        self._session: Session | None = None
        self.in_session = 0  # runs done by a session's runner
        self.sessions = 0  # sessions started

    async def _session_for(
        self, argv: Sequence[str], limits: Limits, fit: tuple[object, ...], ahead: bool
    ) -> Session | None:
        """The session this run may use: the current one if it fits and is sound, else a new one
        when more tests follow (one test alone is cheaper cold)."""
        if self._session is not None and (self._session.broken or self._session.fit != fit):
            await self._end_session()
        if self._session is None and ahead and self.python is not None and self.groups is not None:
            group = self._other_than(self._last)
            assert group is not None
            try:
                self._session = await start(
                    self.python, argv, box=self.box, uid=self.uid, limits=limits, isolation=self.isolation, group=group
                )
            except SessionBroken as exc:
                log.warning("box runner unavailable, tests run one box each: %s", exc)
                self.python = None
                return None
            self.sessions += 1
            self._last = group
        return self._session

    async def _end_session(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await asyncio.shield(session.close())

    async def run(self, argv: Sequence[str], *, stdin: bytes, limits: Limits, ahead: bool) -> RunFacts:
        """Run ``argv`` in the box. ``ahead`` says another run of the same command follows: start a
        session for them, or (without one) arm the next run while this one runs."""
        fit = run_fit(argv, box=self.box, uid=self.uid, limits=limits, writable_box=False)
        session = await self._session_for(argv, limits, fit, ahead)
        if session is not None:
            try:
                facts = await session.run(stdin, limits, os.cpu_count() or 1)
            except SessionBroken:
                await self._end_session()  # nothing of this test ran: it runs cold below
            else:
                self.in_session += 1
                if session.broken:  # nothing of it may be left when the next test starts
                    await self._end_session()
                return facts
        armed = await self._take(fit)
        if armed is None:
            self.cold += 1
            group = self._other_than(self._last)
        else:
            self.ahead_used += 1
            group = armed.group
        self._last = group

        def start_next() -> None:
            if ahead and self.groups is not None:
                self._next = asyncio.create_task(self._arm(argv, limits, self._other_than(group)))

        return await run(
            argv, box=self.box, uid=self.uid, stdin=stdin, limits=limits, isolation=self.isolation, group=group,
            armed=armed, on_start=start_next,
        )  # fmt: skip

    async def close(self) -> None:
        """Kill the run armed for nothing (the submission ended, or its next test was not run) and
        the session's box."""
        await self._end_session()
        armed = await self._take(None)
        if armed is not None:
            await discard(armed)

    def _other_than(self, group: BoxGroup | None) -> BoxGroup | None:
        if self.groups is None:
            return None
        return self.groups[1] if group is self.groups[0] else self.groups[0]

    async def _arm(self, argv: Sequence[str], limits: Limits, group: BoxGroup | None) -> Armed:
        return await arm(argv, box=self.box, uid=self.uid, limits=limits, isolation=self.isolation, group=group)

    async def _take(self, fit: tuple[object, ...] | None) -> Armed | None:
        """The armed run if it fits ``fit``; one that does not is killed. An arming that failed
        leaves nothing: the run starts cold and meets the same error itself."""
        task, self._next = self._next, None
        if task is None:
            return None
        armed = None
        try:
            armed = await asyncio.shield(task)
        except asyncio.CancelledError:
            task.add_done_callback(_discard_later)  # whatever it arms is killed, not leaked
            raise
        except Exception:
            armed = None  # the run starts cold and meets the same error itself
        if armed is not None and armed.fit != fit:
            await discard(armed)
            armed = None
        return armed


_discarding: set[asyncio.Task[None]] = set()


def _discard_later(task: asyncio.Task[Armed]) -> None:
    """Kill what an arming finished with after its lane stopped waiting for it."""
    if task.cancelled() or task.exception() is not None:
        return
    killing = asyncio.ensure_future(discard(task.result()))
    _discarding.add(killing)  # the loop keeps only weak references to tasks
    killing.add_done_callback(_discarding.discard)
