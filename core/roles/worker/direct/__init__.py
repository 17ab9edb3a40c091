"""Direct intake (``JUDGEQUEUE_INTAKE=direct``, docs/design.md §1): a worker with free slots takes
ready outbox rows itself, and an idle one offers slots that the submits fill.

Everything particular to it lives here, and a worker reaches it through one object,
:class:`DirectIntake` (one turn of its loop, what it does when full, when a job ends, at close):

* :mod:`.intake`: the worker's turn: the stream's overflow first, then a take, then the wait;
* :mod:`.takes`: the take statement (claim, mark sent, lease, in one) and the pacing of busy takes;
* :mod:`.offers`: the offers table's door (one sync statement, the fill notification's format,
  the top-up rule) and :mod:`.offer_keeper`: one worker's offers kept in line, their fills turned
  into leases exactly once;
* :mod:`.tuning`: every tuning value of the above, with why it is what it is.

The wake-up (register as a waiter, LISTEN, the rule for when to) is not here: the dispatcher runs
the same one, so it is :mod:`judgequeue.core.runtime.wakeup`. A stream-intake worker never makes a
:class:`DirectIntake`, and so issues none of these statements (``tests/integration/test_worker.py``
pins it).
"""

from __future__ import annotations

from .intake import DirectIntake

__all__ = ["DirectIntake"]
