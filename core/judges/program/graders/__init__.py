"""The program judge's grading modes, one grader each: :mod:`.batch` (the program runs on each
test's input), :mod:`.interactive` (the program talks to the problem's interactor) and
:mod:`.output_only` (outputs are submitted, nothing of the submission runs). A problem's kind
(:data:`~..formats.KINDS`) picks its grader."""

from __future__ import annotations

from .base import Grader, Grading
from .batch import Batch
from .interactive import Interactive
from .output_only import OutputOnly

#: The grader of each problem kind (:data:`~..formats.KINDS`).
GRADERS: dict[str, Grader] = {"batch": Batch(), "interactive": Interactive(), "output-only": OutputOnly()}

__all__ = ["GRADERS", "Batch", "Grader", "Grading", "Interactive", "OutputOnly"]
