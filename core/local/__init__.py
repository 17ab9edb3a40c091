"""``judgequeue local``: run a JudgeQueue manifest on this machine, roles as child processes.

Steps: read the manifest, migrate, create the queue, apply the cutover flags (a flip to live held
back by ``spec.cutover.gate`` until shadow judging's figures meet it, exactly as the operator holds
it: re-judged every ten seconds, written on the first check that meets it, ``cutover.force`` lets it
through), start the dispatchers, workers and reapers (``judgequeue <role>`` with the environment
rendered from the manifest), then show progress until Ctrl-C, or with ``--demo`` submit the demo
programs and exit once each has a verdict. Children run in their own session so a terminal's Ctrl-C
reaches only this process, which stops them in order with SIGTERM (SIGKILL after their grace period).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import asyncpg
import redis.asyncio as aioredis

from ..base.agreement import GateCheck, gate_on_flip
from ..base.errors import ConfigError, Failure
from ..config import (
    PREFIX,
    ArchiveSettings,
    IntakeChoice,
    Settings,
    load_archive_settings,
    load_settings,
    redact_url,
    variable_for,
)
from ..judges.http_call import load_call_settings
from ..manifest import Manifest, load_manifest
from ..roles.reaper.webhooks import load_webhooks
from ..spec import ENDPOINTS_VARIABLE, FIELD_BY_PATH, INTAKE_PATH, ROLES, WEBHOOKS_VARIABLE, Role, fleet_intake
from ..store import submissions
from ..store.migrate import migrate
from ..store.outbox import submit
from ..store.problems import upload
from ..store.queues import create_queue, get_queue, set_classes, set_cutover
from ..store.shadow import agreement
from ..transport.connect import connect_postgres, redis_client
from .children import SHADOW_WORKER, Child, start_children, stop_children, stopped_summary
from .demo import DemoProgram, format_table, load_demo, verdict_table
from .display import Display, progress_line, read_progress


@dataclass(frozen=True)
class LocalOptions:
    manifest: str
    postgres_dsn: str
    redis_url: str
    demo: bool = False
    demo_dir: str | None = None
    timeout: float = 120.0
    workers: int | None = None
    log_dir: str | None = None
    metrics_port: int = 0
    json_output: bool = False


def role_env(
    base: Mapping[str, str], manifest: Manifest, role: str, options: LocalOptions, port: int
) -> dict[str, str]:
    """One ``role`` child's environment: the caller's, then the settings the manifest gives that role
    (as its Deployment would get them; a shadow worker: the workers' and ``JUDGEQUEUE_SHADOW=judge``),
    then the connections. Pure."""
    as_role = "worker" if role == SHADOW_WORKER else cast(Role, role)
    rendered = manifest.env(as_role)
    if role == SHADOW_WORKER:
        rendered[PREFIX + "SHADOW"] = "judge"
    if as_role in FIELD_BY_PATH[INTAKE_PATH].roles:
        rendered[INTAKE_VARIABLE] = local_intake(base, manifest, local_workers(manifest, options)).intake
    env = {k: v for k, v in base.items() if not k.startswith(PREFIX)}
    env.update({k: v for k, v in base.items() if k.startswith(PREFIX) and k not in rendered})
    env.update(rendered)
    for variable in (ENDPOINTS_VARIABLE, WEBHOOKS_VARIABLE):
        if variable in base and variable in rendered:
            # No Kubernetes here to mount a Secret's URL or key: the caller's own stand in for the manifest's.
            env[variable] = base[variable]
    own = component_connections(base, as_role)
    for variable in component_variables():  # never another component's credentials
        env.pop(variable, None)
    env[PREFIX + "POSTGRES_DSN"] = own.get("POSTGRES_DSN", options.postgres_dsn)
    env[PREFIX + "REDIS_URL"] = own.get("REDIS_URL", options.redis_url)
    env[PREFIX + "METRICS_PORT"] = str(port)
    return env


#: The components ``local`` runs that may connect with credentials of their own.
LOCAL_COMPONENTS = ("dispatcher", "worker", "reaper")


def component_variables() -> list[str]:
    """``JUDGEQUEUE_<COMPONENT>_POSTGRES_DSN`` and ``..._REDIS_URL`` of every component ``local`` runs:
    a component's own connections, as ``spec.credentials`` gives them on Kubernetes."""
    return [f"{PREFIX}{c.upper()}_{what}" for c in LOCAL_COMPONENTS for what in ("POSTGRES_DSN", "REDIS_URL")]


def component_connections(base: Mapping[str, str], role: str) -> dict[str, str]:
    """``role``'s own connections from the caller's environment (``POSTGRES_DSN``/``REDIS_URL`` to
    value), each only if given. Pure."""
    return {what: base[f"{PREFIX}{role.upper()}_{what}"] for what in ("POSTGRES_DSN", "REDIS_URL")
            if base.get(f"{PREFIX}{role.upper()}_{what}")}


def shared_components(base: Mapping[str, str]) -> list[str]:
    """The components ``local`` runs on the one shared URL (no own Postgres DSN): said at start."""
    return [c for c in LOCAL_COMPONENTS if "POSTGRES_DSN" not in component_connections(base, c)]


INTAKE_VARIABLE = variable_for("worker", "intake")


def local_workers(manifest: Manifest, options: LocalOptions) -> int:
    """How many workers ``local`` runs: ``--workers``, else the manifest's floor (:func:`plan_children`)."""
    return manifest.replicas.worker if options.workers is None else options.workers


def local_intake(base: Mapping[str, str], manifest: Manifest, workers: int) -> IntakeChoice:
    """The intake ``local``'s workers and dispatchers run, and why (pure).

    The manifest's ``spec.worker.intake``, ``auto`` decided on the ``workers`` it runs (a fixed count,
    so the fleet's bound); when the manifest writes no intake, the caller's ``JUDGEQUEUE_INTAKE`` wins
    as any setting the manifest is silent on does (load_settings checks its value).
    """
    if INTAKE_PATH not in manifest.spec.given and INTAKE_VARIABLE in base:
        value = base[INTAKE_VARIABLE]
        return IntakeChoice(value, f"{value}: {INTAKE_VARIABLE} from the environment")
    return fleet_intake(manifest.spec, workers)


def check_endpoints(worker_env: Mapping[str, str]) -> None:
    """Stop before anything runs if the workers' http-call endpoints cannot be read: an endpoint
    whose URL is a Kubernetes Secret's has no file here unless the caller gives its own endpoints."""
    if ENDPOINTS_VARIABLE not in worker_env:
        return
    try:
        load_call_settings(worker_env)
    except ConfigError as exc:
        hint = ""
        if "urlFile" in str(exc):
            hint = (
                f" (judgequeue local cannot read Kubernetes Secrets: give the endpoint a url, or set"
                f" {ENDPOINTS_VARIABLE} in the environment, which stands in for the manifest's endpoints)"
            )
        raise Failure(f"{exc}{hint}") from None


def check_webhooks(reaper_env: Mapping[str, str]) -> None:
    """Stop before anything runs if the reapers' webhooks cannot work here: the manifest's signing
    keys (and URLs kept in Secrets) are Kubernetes Secrets' files, absent unless the caller gives
    its own webhooks."""
    endpoints, problem = load_webhooks(reaper_env)
    problems = [problem] if problem else [e.problem for e in endpoints if e.problem]
    if problems:
        hint = ""
        if any("File" in p for p in problems):
            hint = (
                f" (judgequeue local cannot read Kubernetes Secrets: set {WEBHOOKS_VARIABLE} in the environment,"
                " which stands in for the manifest's webhooks)"
            )
        raise Failure(f"{problems[0]}{hint}")


def plan_children(manifest: Manifest, workers: int | None, *, shadow_mode: bool | None = None) -> list[str]:
    """Which role processes to start, in start order (shadow workers last, while the queue is in
    shadow mode: the manifest's, or ``shadow_mode``, the row's, when a gate holds a flip to live
    back). Pure."""
    counts = {
        "dispatcher": manifest.replicas.dispatcher,
        "worker": manifest.replicas.worker if workers is None else workers,
        "reaper": manifest.replicas.reaper,
    }
    plan: list[str] = [role for role in ROLES for _ in range(counts[role])]
    shadow = manifest.spec.worker.shadow
    shadow_workers = (
        manifest.replicas.shadow_worker
        if shadow_mode is None
        else (shadow.replicas if shadow.enabled and shadow_mode else 0)
    )
    return plan + [SHADOW_WORKER] * shadow_workers


#: Seconds between two looks at shadow judging's figures while a gate holds a flip to live back
#: (the operator's default timer).
GATE_RECHECK = 10.0


async def held_back(conn: asyncpg.Connection, manifest: Manifest, row_mode: str) -> GateCheck | None:
    """The gate's verdict when it holds the manifest's flip to live back (the queue row is in shadow
    mode and shadow judging's figures do not meet ``spec.cutover.gate``), else None: no gate, no flip
    to live to judge, the gate met, or ``cutover.force``."""
    cutover = manifest.spec.cutover
    if cutover.force or cutover.gate is None or manifest.cutover.mode != "live" or row_mode != "shadow":
        return None
    check = gate_on_flip(cutover.gate, "live", row_mode, await agreement(conn, manifest.queue))
    return check if check is not None and not check.met else None


async def _prepare(conn: asyncpg.Connection, manifest: Manifest) -> GateCheck | None:
    """Migrate, create the queue and write the manifest's flags, the mode kept in shadow when the
    gate holds the flip to live back (returned then)."""
    await migrate(conn)
    row = await create_queue(conn, manifest.queue, mode=manifest.cutover.mode)  # type: ignore[arg-type]
    await set_classes(conn, manifest.queue, manifest.spec.classes)
    held = await held_back(conn, manifest, row.mode)
    changes: dict[str, Any] = {"mode": row.mode if held else manifest.cutover.mode, "paused": manifest.cutover.paused}
    if manifest.cutover.watermark is not None:
        changes["watermark"] = manifest.cutover.watermark
    await set_cutover(conn, manifest.queue, **changes)
    return held


def _files(options: LocalOptions, manifest: Manifest) -> tuple[list[DemoProgram], Path | None, Path]:
    """The demo set (with --demo), its package directory if any, and the log directory, created."""
    programs: list[DemoProgram] = []
    package: Path | None = None
    if options.demo:
        if manifest.cutover.paused or manifest.cutover.mode != "live":
            raise Failure("--demo needs a live, unpaused queue (spec.cutover.mode: live, spec.paused: false)")
        demo_dir = Path(options.demo_dir) if options.demo_dir else Path(options.manifest).resolve().parent / "demo"
        programs, package = load_demo(demo_dir)
    log_dir = Path(options.log_dir or tempfile.mkdtemp(prefix="judgequeue-local-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    return programs, package, log_dir


@dataclass
class _Run:
    """One ``judgequeue local`` run: what it was given, its connections, and what it started."""

    options: LocalOptions
    manifest: Manifest
    base_env: Mapping[str, str]
    display: Display
    conn: asyncpg.Connection
    client: aioredis.Redis
    plan: list[str]
    programs: list[DemoProgram]
    children: list[Child] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)
    held: GateCheck | None = None
    next_gate_look: float = 0.0

    def env_for(self, i: int) -> dict[str, str]:
        port = self.options.metrics_port + i if self.options.metrics_port else 0
        return role_env(self.base_env, self.manifest, self.plan[i], self.options, port)

    async def start(self, package: Path | None, bounds: ArchiveSettings, intake: IntakeChoice, log_dir: Path) -> None:
        """Ready the database and the queue, start the roles, submit the demo programs."""
        options, manifest, display, conn = self.options, self.manifest, self.display, self.conn
        try:
            await asyncio.wait_for(self.client.ping(), 5)
        except Exception as exc:
            raise Failure(f"cannot reach Redis at {redact_url(options.redis_url)}: {type(exc).__name__}") from None
        self.held = held = await _prepare(conn, manifest)
        if package is not None:
            # A checker is built with the workers' judge settings (their sandbox directory, trusted or not).
            worker_env = role_env(self.base_env, manifest, "worker", options, 0)
            uploaded = await upload(conn, package, bounds=bounds, judge_env=worker_env)
            display.say(f"problem {uploaded.id} version {uploaded.version}: {uploaded.tests} tests uploaded")
        display.say(
            f"queue {manifest.queue}: mode={'shadow' if held else manifest.cutover.mode}"
            f" paused={manifest.cutover.paused}; "
            f"postgres {redact_url(options.postgres_dsn)}, redis {redact_url(options.redis_url)}"
        )
        if held is not None:
            display.say(
                f"the flip to live is held back by spec.cutover.gate: {held.message}; the queue stays in"
                f" shadow mode and flips on the first look (every {GATE_RECHECK:g}s) whose figures meet it"
            )
            self.plan[:] = plan_children(manifest, options.workers, shadow_mode=True)
        self.next_gate_look = asyncio.get_running_loop().time() + GATE_RECHECK
        shared = shared_components(self.base_env)
        display.say("credentials: " + (
            f"{', '.join(shared)} share the one URL above (give each its own with "
            f"{PREFIX}<COMPONENT>_POSTGRES_DSN and _REDIS_URL, docs/security.md)" if shared
            else "each component connects with its own (" + ", ".join(
                f"{c}: {redact_url(component_connections(self.base_env, c)['POSTGRES_DSN'])}"
                for c in LOCAL_COMPONENTS) + ")"))
        display.say(f"intake {intake.intake} ({intake.reason})")
        self.children = start_children(self.plan, self.env_for, log_dir)
        display.say(f"started {', '.join(c.label for c in self.children)} (logs in {log_dir}); Ctrl-C stops")
        for program in self.programs:
            async with conn.transaction():
                self.ids.append(await submit(conn, manifest.queue, program.payload))
        if self.ids:
            display.say(f"submitted {len(self.ids)} demo programs: ids {self.ids[0]}..{self.ids[-1]}")

    async def watch(self, stop: asyncio.Event) -> tuple[int, list[dict[str, Any]]]:
        """Show progress until ``stop``, a role's exit, or (with demo programs) their verdicts or the
        timeout; the exit code and the verdict table."""
        loop = asyncio.get_running_loop()
        manifest, display, ids = self.manifest, self.display, self.ids
        deadline = loop.time() + self.options.timeout
        while not stop.is_set():
            dead = [c for c in self.children if c.process.poll() is not None]
            if dead:
                display.end()
                for c in dead:
                    display.say(f"{c.label} exited with code {c.process.returncode}; last log lines:\n{c.tail()}")
                return 1, []
            if self.held is not None and loop.time() >= self.next_gate_look:
                self.next_gate_look = loop.time() + GATE_RECHECK
                await self.look_at_gate()
            progress = await read_progress(self.conn, self.client, manifest.queue)
            alive = sum(1 for c in self.children if c.process.poll() is None)
            display.show(progress_line(progress, alive, len(self.children)))
            if ids:
                rows = await submissions.read(self.conn, ids)
                if all(rows.get(i) is not None and submissions.is_terminal(rows[i]["status"]) for i in ids):
                    results = verdict_table(self.programs, ids, rows)
                    return (0 if all(r["ok"] for r in results) else 1), results
                if loop.time() >= deadline:
                    display.end()
                    display.say(f"timed out after {self.options.timeout:g}s waiting for verdicts")
                    return 1, verdict_table(self.programs, ids, rows)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.5)
        return 0, []

    async def look_at_gate(self) -> None:
        """Flip a queue held back by the gate to live once its figures meet it."""
        queue = self.manifest.queue
        self.held = await held_back(self.conn, self.manifest, (await get_queue(self.conn, queue)).mode)
        if self.held is None:
            await set_cutover(self.conn, queue, mode="live")
            self.display.end()
            self.display.say(f"queue {queue}: the gate is met, flipped to live")

    async def stop_children(self, grace: float) -> bool:
        """Stop the roles started; whether every one exited cleanly."""
        if not self.children:
            return True
        self.display.say("stopping roles...")
        clean, line = stopped_summary(await stop_children(self.children, grace))
        self.display.say(line)
        return clean


async def _local(options: LocalOptions, base_env: Mapping[str, str]) -> int:
    manifest = load_manifest(options.manifest)
    plan = plan_children(manifest, options.workers)
    # A bad value (from the caller's environment) stops here, naming the variable, before anything runs.
    settings: Settings = load_settings(role_env(base_env, manifest, "worker", options, 0))
    for role in ("dispatcher", "reaper"):
        load_settings(role_env(base_env, manifest, role, options, 0))
    check_endpoints(role_env(base_env, manifest, "worker", options, 0))
    check_webhooks(role_env(base_env, manifest, "reaper", options, 0))
    bounds = load_archive_settings(base_env)
    intake = local_intake(base_env, manifest, local_workers(manifest, options))
    programs, package, log_dir = _files(options, manifest)
    display = Display(sys.stderr, enabled=not options.json_output)
    try:
        conn = await connect_postgres(options.postgres_dsn, pooler="transaction", timeout=10)
    except (OSError, TimeoutError, asyncpg.PostgresError) as exc:
        raise Failure(f"cannot connect to Postgres at {redact_url(options.postgres_dsn)}: {exc}") from None
    client = redis_client(options.redis_url, socket_timeout=5, socket_connect_timeout=5)
    run = _Run(options, manifest, base_env, display, conn, client, plan, programs)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    try:
        await run.start(package, bounds, intake, log_dir)
        code, results = await run.watch(stop)
        display.end()
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)
        clean = await run.stop_children(settings.worker.grace_period + 5.0)
        await client.aclose()
        await conn.close()
    if not clean:
        code = 1
    if results:
        if options.json_output:
            print(
                json.dumps(
                    {
                        "queue": manifest.queue,
                        "intake": {"intake": intake.intake, "reason": intake.reason},
                        "results": results,
                    },
                    indent=2,
                    default=str,
                )
            )
        else:
            print(format_table(results))
    return code


def run_local(options: LocalOptions, env: Mapping[str, str] | None = None) -> int:
    """Run ``judgequeue local``; return its exit code."""
    return asyncio.run(_local(options, os.environ if env is None else env))
