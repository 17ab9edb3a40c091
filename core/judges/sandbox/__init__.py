"""The sandbox: untrusted commands run in boxes, each a cgroup (v1 or v2, whole-tree limits and
facts) around bubblewrap's namespaces and a seccomp allow-list.

- :mod:`.command`: the pure part, a run's limits, facts and command line;
- :mod:`.run`: starting, watching and ending one run (:func:`run`, or :func:`arm` ahead);
- :mod:`.watch`: the wall guard and the pipes the worker drains;
- :mod:`.lane`: one box's runs one after another, the next armed ahead; :mod:`.session` and
  :mod:`.box_runner`: one box for all of a submission's tests;
- :mod:`.cgroups`: the group of a box, of the backend the host has (a factory picks v1 or v2);
- :mod:`.isolation`: what the host offers, decided once at start-up; :mod:`.seccomp`: the filter.

What other parts of the judge use is exported here.
"""

from .command import (
    BOX,
    REAP_GRACE,
    Isolation,
    KilledFor,
    Limits,
    Mode,
    RunFacts,
    build_command,
    bwrap_args,
    engine_child_pid,
    engine_exit_code,
    shim_script,
    trusted_shim_script,
)
from .run import Armed, arm, discard, fill_stdin, let_go, reaps_orphans, run, run_fit
from .watch import Pipe, WallGuard, next_check, read_ready, task_delays, wall_left

__all__ = [
    "BOX",
    "REAP_GRACE",
    "Armed",
    "Isolation",
    "KilledFor",
    "Limits",
    "Mode",
    "Pipe",
    "RunFacts",
    "WallGuard",
    "arm",
    "build_command",
    "bwrap_args",
    "discard",
    "engine_child_pid",
    "engine_exit_code",
    "fill_stdin",
    "let_go",
    "next_check",
    "read_ready",
    "reaps_orphans",
    "run",
    "run_fit",
    "shim_script",
    "task_delays",
    "trusted_shim_script",
    "wall_left",
]
