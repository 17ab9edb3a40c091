"""``judgequeue dispatcher|worker|reaper``: run one role as this process."""

from __future__ import annotations

import argparse
import asyncio
import importlib
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

from ..base.errors import Failure
from ..config import (
    judge_refused_mode,
    load_settings,
    variable_names,
)
from .common import CONNECTION, Commands, add_variable_flags, connection_flags, fatal, flag_for, overrides_from

ROLE_MODULES = {
    "dispatcher": "judgequeue.core.roles.dispatcher",
    "worker": "judgequeue.core.roles.worker.role",
    "reaper": "judgequeue.core.roles.reaper",
}


def load_role(role: str) -> Callable[[Any, asyncio.Event], Coroutine[Any, Any, None]]:
    """The ``run`` function of a role module, or Failure when this build does not have it yet."""
    module_name = ROLE_MODULES[role]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name == module_name:
            raise Failure(f"judgequeue {role} is not available in this build yet ({module_name} is missing)") from None
        raise
    run = getattr(module, "run", None)
    if run is None:
        raise Failure(f"judgequeue {role} is not available in this build yet ({module_name} has no run())")
    return run  # type: ignore[no-any-return]


def cmd_role(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    from ..runtime.process import catch_early_signals, run_role

    catch_early_signals()  # a SIGTERM while the role still imports must still stop it cleanly
    settings = load_settings(env, overrides_from(args), override_name=flag_for)
    main = load_role(args.command)
    if args.command == "worker":
        from ..judges import load_judge
        from ..judges.sandbox.isolation import SandboxUnavailable

        refused = judge_refused_mode(env)
        try:
            load_judge(settings.worker.judge)  # an unknown judge is bad configuration: one line, exit 2
        except ImportError as exc:
            raise Failure(f"judge plugin {settings.worker.judge!r} is installed but cannot be loaded: {exc}") from None
        except SandboxUnavailable as exc:
            if refused == "exit":
                raise
            # In a pod (the operator sets "unready"): stay up, unready, naming what is missing.
            fatal(f"judgequeue: error: {exc}")
            from ..runtime.process import run_refused

            return run_refused(args.command, settings, str(exc))

    return run_role(args.command, settings, main, need_group=args.command in ("worker", "reaper"))


def add(commands: Commands) -> None:
    tuning = [v for v in variable_names() if v not in CONNECTION]
    for role, text in (
        ("dispatcher", "run a dispatcher: move committed outbox rows into the Redis stream"),
        ("worker", "run a worker: judge jobs from the stream and write fenced verdicts"),
        ("reaper", "run a reaper: rescue idle entries, expired leases and poison jobs; export queue gauges"),
    ):
        p = commands.add(role, text + " (serves /metrics, /healthz, /readyz on --metrics-port; stops on SIGTERM)")
        connection_flags(p, CONNECTION)
        add_variable_flags(p, tuning, "settings")
        p.set_defaults(handler=cmd_role)
