"""Named failpoints: places where a test can make the process die, to prove recovery claims.

Arm them with ``JUDGEQUEUE_FAILPOINTS``, a comma-separated list of ``name`` (die at the first hit),
``name@N`` (die at the N-th hit) or ``name%P`` (die at each hit with probability P, 0-1). The
action is SIGKILL of the process itself: no cleanup handlers run, exactly like an OOM kill or a
node loss. Off by default; when nothing is armed :func:`hit` is one set-membership test.

Names in use (see docs/reliability.md): ``dispatcher.after_claim``, ``dispatcher.after_xadd``,
``dispatcher.after_mark``, ``worker.after_lease``, ``worker.after_ack``, ``worker.after_judge``,
``worker.after_verdict``, ``reaper.after_claim``, ``reaper.dead_letter.after_postgres``,
``reaper.after_lease_rescue``.
"""

from __future__ import annotations

import os
import random
import signal
import sys
from dataclasses import dataclass

ENV = "JUDGEQUEUE_FAILPOINTS"


@dataclass
class _Armed:
    at_hit: int | None = None  # die at this hit number
    probability: float | None = None
    hits: int = 0


def parse(spec: str) -> dict[str, _Armed]:
    """Parse ``JUDGEQUEUE_FAILPOINTS``; raises ValueError naming the bad item."""
    armed: dict[str, _Armed] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        try:
            if "@" in item:
                name, n = item.split("@", 1)
                count = int(n)
                if count < 1:
                    raise ValueError
                armed[name] = _Armed(at_hit=count)
            elif "%" in item:
                name, p = item.split("%", 1)
                probability = float(p)
                if not 0 <= probability <= 1:
                    raise ValueError
                armed[name] = _Armed(probability=probability)
            else:
                armed[item] = _Armed(at_hit=1)
        except ValueError:
            raise ValueError(f"{ENV}: {item!r} is not name, name@N (N >= 1) or name%P (0 <= P <= 1)") from None
    return armed


def _from_environment() -> dict[str, _Armed]:
    try:
        return parse(os.environ.get(ENV, ""))
    except ValueError as exc:
        # Same contract as every other JUDGEQUEUE_* variable: one line naming it, exit 2.
        sys.stderr.write(f"judgequeue: {exc}\n")
        raise SystemExit(2) from None


_ARMED: dict[str, _Armed] = _from_environment()


def hit(name: str) -> None:
    """Mark that execution reached ``name``; SIGKILL this process if the failpoint fires."""
    if not _ARMED:
        return
    armed = _ARMED.get(name)
    if armed is None:
        return
    armed.hits += 1
    fire = armed.hits == armed.at_hit if armed.probability is None else random.random() < armed.probability
    if fire:
        sys.stderr.write(f'{{"event": "failpoint", "name": "{name}", "pid": {os.getpid()}}}\n')
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)


def arm(spec: str) -> None:
    """Re-arm from a spec string (tests running failpoints in-process use this)."""
    _ARMED.clear()
    _ARMED.update(parse(spec))
