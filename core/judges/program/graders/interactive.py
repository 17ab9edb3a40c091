"""Interactive grading: the submission and the problem's interactor run at once, connected by two
pipes; the verdict comes from the interactor by the package format's rules and, for a testlib
interactor whose problem has a checker, from that checker judging what the interactor wrote."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
from dataclasses import replace

from ...sandbox import Limits, RunFacts, read_ready, run
from ..boxes import Box, Boxes, read_bounded, read_data, read_feedback, write_bytes
from ..classify import classify_interactive, helper_outcome, kattis_helper_outcome, result_of
from ..problem import HELPER_LIMITS, Case
from ..scoring import TestResult
from .base import Grader, Grading, run_checker

#: How much longer than the submission an interactor may run: the submission is stopped first, so
#: an interactor waiting on a silent submission sees EOF and answers, and the submission's
#: IDLENESS_LIMIT is what is reported.
INTERACTOR_GRACE = 2.0


class _Drain:
    """A pipe read end the worker holds through an interaction: idle while the side reading the
    pipe lives (it must get every byte), then read and dropped once that side has ended, so its
    partner's writes neither fail nor block."""

    def __init__(self, loop: asyncio.AbstractEventLoop, fd: int) -> None:
        self.loop, self.fd, self.reading = loop, fd, False

    def start(self) -> None:
        if self.fd < 0 or self.reading:
            return
        os.set_blocking(self.fd, False)  # nobody else reads this pipe any more
        self.loop.add_reader(self.fd, self._read)
        self.reading = True

    def _read(self) -> None:
        chunk = read_ready(self.fd)
        if chunk is None:
            return
        if not chunk:  # the writer is gone too
            self.loop.remove_reader(self.fd)
            self.reading = False

    def close(self) -> None:
        if self.fd >= 0:
            if self.reading:
                self.loop.remove_reader(self.fd)
            os.close(self.fd)
            self.fd = -1


class Interactive(Grader):
    """One test of an interactive problem.

    The worker keeps a read end of each pipe until both sides are gone, and drains the one whose
    reader has ended: a side that writes to a partner that already left is never killed by
    SIGPIPE (whether it was depended on how soon the box of the side that left was torn down)."""

    async def grade(
        self, g: Grading, number: int, case: Case, given: bytes, limits: Limits
    ) -> tuple[TestResult, bytes]:
        box, problem = g.box, g.problem
        answer = await read_data(case.answer)
        kattis = problem.interactor is not None and problem.interactor.protocol == "kattis"

        def write() -> None:
            for name, data in (("input", given), ("answer", answer)):
                write_bytes(os.path.join(box.helper_dir, name), data)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(box.helper_dir, "output"))
            if kattis:
                g.boxes.fresh_feedback(box.helper_dir, box.uid)

        await asyncio.to_thread(write)
        sub, inter = await converse(g, interactor_argv(g, case, kattis), limits)
        if kattis:
            feedback = await asyncio.to_thread(read_feedback, os.path.join(box.helper_dir, "feedback"))
            said = kattis_helper_outcome(inter, feedback, score_allowed=problem.custom_score)
        else:
            said = helper_outcome(inter)
        verdict, score, message = classify_interactive(sub, limits, inter, said, problem.format)
        points = said.points if verdict == "ACCEPTED" else None
        if verdict == "ACCEPTED" and g.checker is not None and not kattis:
            # Polygon: the interactor's output file is what the checker judges.
            written = await asyncio.to_thread(read_bounded, os.path.join(box.helper_dir, "output"))
            checked = await run_checker(g, given, written, answer, g.ahead(number))
            verdict, score, message, points = checked.verdict, checked.score, checked.message, checked.points
        return result_of(number, verdict, sub, score, message, points), sub.stderr


def interactor_argv(g: Grading, case: Case, kattis: bool) -> list[str]:
    """The interactor's command line for one test: a Kattis validator's arguments (input, answer,
    feedback directory and the test's flags) or testlib's (input, output, answer)."""
    assert g.interactor is not None
    inside = g.boxes.inside(g.box.helper_dir)
    if kattis:
        return [*g.interactor, f"{inside}/input", f"{inside}/answer", f"{inside}/feedback/", *case.flags]
    return [*g.interactor, f"{inside}/input", f"{inside}/output", f"{inside}/answer"]


async def converse(g: Grading, interactor: list[str], limits: Limits) -> tuple[RunFacts, RunFacts]:
    """Run the submission and the interactor connected by two pipes; the facts of both."""
    return await converse_in(g.box, g.boxes, g.argv, interactor, limits)


async def converse_in(
    box: Box, boxes: Boxes, argv: list[str], interactor: list[str], limits: Limits
) -> tuple[RunFacts, RunFacts]:
    """:func:`converse` for a program ``argv`` built in ``box.dir`` and an interactor in
    ``box.helper_dir`` (a package's main solution making its answers, too)."""
    loop = asyncio.get_running_loop()
    fds: list[int] = []
    drains: list[_Drain] = []
    try:
        to_sub_r, to_sub_w = os.pipe2(os.O_CLOEXEC)
        fds += [to_sub_r, to_sub_w]
        to_int_r, to_int_w = os.pipe2(os.O_CLOEXEC)
        fds += [to_int_r, to_int_w]
        drains = [_Drain(loop, os.dup(to_sub_r)), _Drain(loop, os.dup(to_int_r))]
        helper_limits = replace(HELPER_LIMITS, wall=limits.wall + INTERACTOR_GRACE)
        # Each run owns (and closes) the two ends it is given, so either side sees EOF once the other
        # is gone; a task group cancels (and so kills) one side if the other fails to start.
        fds = []
        async with asyncio.TaskGroup() as both:
            boxed = functools.partial(run, uid=box.uid, stdin=b"", isolation=boxes.isolation)
            sub_run = both.create_task(
                boxed(argv, box=box.dir, limits=limits, group=box.group, stdin_fd=to_sub_r, stdout_fd=to_int_w)
            )
            inter_run = both.create_task(
                boxed(interactor, box=box.helper_dir, limits=helper_limits, group=box.helper_group,
                      writable_box=True, stdin_fd=to_int_r, stdout_fd=to_sub_w)
            )  # fmt: skip
            sub_run.add_done_callback(lambda _: drains[0].start())
            inter_run.add_done_callback(lambda _: drains[1].start())
    finally:
        for fd in fds:
            os.close(fd)
        for drain in drains:
            drain.close()
    return sub_run.result(), inter_run.result()
