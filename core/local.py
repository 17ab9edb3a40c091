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
import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, cast

import asyncpg
import redis.asyncio as aioredis

from .base.agreement import GateCheck, gate_on_flip
from .base.errors import ConfigError, Failure
from .base.states import VERDICTS
from .config import PREFIX, IntakeChoice, Settings, load_archive_settings, load_settings, redact_url, variable_for
from .judges.http_call import load_call_settings
from .judges.report import render_verdict
from .manifest import Manifest, load_manifest
from .spec import ENDPOINTS_VARIABLE, FIELD_BY_PATH, INTAKE_PATH, ROLES, Role, fleet_intake
from .status import Figures, gather
from .store import submissions
from .store.migrate import migrate
from .store.outbox import submit
from .store.problems import InvalidPackage, read_package_dir, upload
from .store.queues import create_queue, get_queue, set_cutover
from .store.shadow import agreement
from .transport.connect import connect_postgres, redis_client


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


@dataclass(frozen=True)
class DemoProgram:
    name: str
    expect: str | None
    payload: dict[str, Any]


def load_demo(directory: Path) -> tuple[list[DemoProgram], Path | None]:
    """The demo set in ``directory/demo.yaml``: one problem and the programs to submit for it.

    The problem is either a package directory (``problem: {package: DIR}``, uploaded before the
    programs are submitted, which then name it by id and version) or inline ``tests``/``limits``.
    Returns the programs and the package directory to upload (None for inline tests).
    """
    import yaml

    from .manifest import ManifestError

    index = directory / "demo.yaml"
    try:
        doc = yaml.safe_load(index.read_text())
    except OSError as exc:
        raise ManifestError(f"{index}: {exc.strerror or exc}") from None
    problem = doc.get("problem") or {}
    package: Path | None = None
    reference: dict[str, Any] = {"tests": problem.get("tests", []), "limits": problem.get("limits", {})}
    if problem.get("package"):
        package = directory / str(problem["package"])
        try:
            found = read_package_dir(package)
        except InvalidPackage as exc:
            raise ManifestError(f"{index}: problem.package: {exc}") from None
        if found.version is None:
            raise ManifestError(f"{index}: problem.package: {package}/problem.yaml needs a version (reruns reuse it)")
        reference = {"problem": found.id, "version": found.version}
    programs = []
    for entry in doc.get("programs") or []:
        source = (directory / entry["file"]).read_text()
        payload = {"language": entry.get("language", "python"), "source": source, **reference}
        programs.append(DemoProgram(name=entry["file"], expect=entry.get("expect"), payload=payload))
    return programs, package


#: A child that runs ``judgequeue worker`` in the shadow lane (``spec.worker.shadow``).
SHADOW_WORKER = "shadow-worker"


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
    if ENDPOINTS_VARIABLE in base and ENDPOINTS_VARIABLE in rendered:
        # No Kubernetes here to mount a Secret's URL: the caller's own endpoints stand in for the manifest's.
        env[ENDPOINTS_VARIABLE] = base[ENDPOINTS_VARIABLE]
    env[PREFIX + "POSTGRES_DSN"] = options.postgres_dsn
    env[PREFIX + "REDIS_URL"] = options.redis_url
    env[PREFIX + "METRICS_PORT"] = str(port)
    return env


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
            hint = (f" (judgequeue local cannot read Kubernetes Secrets: give the endpoint a url, or set"
                    f" {ENDPOINTS_VARIABLE} in the environment, which stands in for the manifest's endpoints)")
        raise Failure(f"{exc}{hint}") from None


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
    shadow_workers = manifest.replicas.shadow_worker if shadow_mode is None else (
        shadow.replicas if shadow.enabled and shadow_mode else 0)
    return plan + [SHADOW_WORKER] * shadow_workers


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Linux: the child gets SIGTERM if ``judgequeue local`` itself dies without cleaning up."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


@dataclass
class Child:
    role: str
    index: int
    process: subprocess.Popen[bytes]
    log_path: Path
    log_file: IO[bytes] = field(repr=False)

    @property
    def label(self) -> str:
        return f"{self.role}-{self.index}"

    def tail(self, lines: int = 5) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join("    " + line for line in text[-lines:])


def start_children(plan: Sequence[str], env_for: Any, log_dir: Path) -> list[Child]:
    children: list[Child] = []
    seen: dict[str, int] = {}
    for role in plan:
        index = seen.get(role, 0)
        seen[role] = index + 1
        log_path = log_dir / f"{role}-{index}.log"
        log_file = log_path.open("wb")
        process = subprocess.Popen(
            [sys.executable, "-m", "judgequeue.core.cli", "worker" if role == SHADOW_WORKER else role],
            env=env_for(len(children)),
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
        )
        children.append(Child(role, index, process, log_path, log_file))
    return children


async def stop_children(children: Sequence[Child], grace: float) -> dict[str, int]:
    """SIGTERM every child (workers first, so they release work while others still run), then wait."""
    order = sorted(children, key=lambda c: {"worker": 0, SHADOW_WORKER: 0, "dispatcher": 1, "reaper": 2}[c.role])
    for child in order:
        if child.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                child.process.send_signal(signal.SIGTERM)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + grace
    for child in order:
        with contextlib.suppress(subprocess.TimeoutExpired):
            await asyncio.to_thread(child.process.wait, max(0.0, deadline - loop.time()))
    for child in children:
        if child.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                child.process.kill()
            child.process.wait()
        child.log_file.close()
    return {c.label: int(c.process.returncode) for c in children}


@dataclass(frozen=True)
class Progress:
    figures: Figures
    verdicts: dict[str, int]
    throughput: float  # verdicts per second over the last few seconds (DB clock)


def progress_line(p: Progress, children_alive: int, children_total: int) -> str:
    """One line of the live display. Pure."""
    f = p.figures
    verdicts = "  ".join(f"{k}={v}" for k, v in sorted(p.verdicts.items()) if k in VERDICTS) or "none yet"
    judging = p.verdicts.get("JUDGING", 0)
    stream = f"lag {f.lag if f.lag is not None else '-'}  pel {f.pel if f.pel is not None else '-'}"
    return (
        f"backlog {f.backlog}  judging {judging}  {stream}  {p.throughput:.1f} verdicts/s  "
        f"roles {children_alive}/{children_total}  | {verdicts}"
    )


async def read_progress(conn: asyncpg.Connection, client: aioredis.Redis, queue: str, window: float = 5.0) -> Progress:
    figures = await gather(conn, client, queue, redis_timeout=2.0)
    counts = await submissions.count_by_status(conn, queue)
    recent = await submissions.finished_since(conn, queue, window)
    return Progress(figures, counts, recent / window)


class Display:
    """A live status line on a terminal; on a pipe, a line whenever the figures change."""

    def __init__(self, stream: IO[str], enabled: bool = True) -> None:
        self._stream = stream
        self._tty = stream.isatty()
        self._enabled = enabled
        self._last = ""

    def show(self, line: str) -> None:
        if not self._enabled or line == self._last:
            return
        self._last = line
        if self._tty:  # one line, never wrapped, so the carriage return redraws it in place
            width = shutil.get_terminal_size().columns - 1
            self._stream.write("\r\x1b[K" + line[:width])
        else:
            self._stream.write(line + "\n")
        self._stream.flush()

    def say(self, text: str) -> None:
        if self._tty and self._last:
            self._stream.write("\r\x1b[K")
            self._last = ""
        self._stream.write(text + "\n")
        self._stream.flush()

    def end(self) -> None:
        if self._tty and self._last:
            self._stream.write("\n")
            self._stream.flush()
        self._last = ""


def verdict_table(programs: Sequence[DemoProgram], ids: Sequence[int], rows: Mapping[int, Any]) -> list[dict[str, Any]]:
    """The demo's result, one dict per program. Pure."""
    out = []
    for program, submission_id in zip(programs, ids, strict=True):
        row = rows.get(submission_id)
        status = row["status"] if row is not None else "UNKNOWN"
        verdict = row["verdict"] if row is not None else None  # decoded by submissions.read
        out.append(
            {
                "program": program.name,
                "id": submission_id,
                "expected": program.expect,
                "verdict": status,
                "ok": program.expect is None or program.expect == status,
                "detail": verdict,
            }
        )
    return out


def format_table(results: Sequence[Mapping[str, Any]]) -> str:
    """One line per program, then (after a blank line) each program's per-test results. Pure."""
    width = max([len("program"), *(len(r["program"]) for r in results)])
    lines = [f"{'program':<{width}}  {'id':>6}  {'verdict':<18}  expected"]
    for r in results:
        mark = "" if r["ok"] else "   <-- unexpected"
        lines.append(f"{r['program']:<{width}}  {r['id']:>6}  {r['verdict']:<18}  {r['expected'] or '-'}{mark}")
    for r in results:
        detail = r.get("detail")
        details = detail.get("details") if isinstance(detail, Mapping) else None
        shown = render_verdict(r["verdict"], details if isinstance(details, Mapping) else {})
        lines += ["", f"{r['program']} (id {r['id']}): {shown[0]}", *shown[1:]]
    return "\n".join(lines)


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


async def _local(options: LocalOptions, base_env: Mapping[str, str]) -> int:
    manifest = load_manifest(options.manifest)
    plan = plan_children(manifest, options.workers)

    def env_for(i: int) -> dict[str, str]:
        return role_env(base_env, manifest, plan[i], options, options.metrics_port + i if options.metrics_port else 0)

    # A bad value (from the caller's environment) stops here, naming the variable, before anything runs.
    settings: Settings = load_settings(role_env(base_env, manifest, "worker", options, 0))
    for role in ("dispatcher", "reaper"):
        load_settings(role_env(base_env, manifest, role, options, 0))
    check_endpoints(role_env(base_env, manifest, "worker", options, 0))
    bounds = load_archive_settings(base_env)
    intake = local_intake(base_env, manifest, local_workers(manifest, options))
    programs, package, log_dir = _files(options, manifest)
    display = Display(sys.stderr, enabled=not options.json_output)
    try:
        conn = await connect_postgres(options.postgres_dsn, pooler="transaction", timeout=10)
    except (OSError, TimeoutError, asyncpg.PostgresError) as exc:
        raise Failure(f"cannot connect to Postgres at {redact_url(options.postgres_dsn)}: {exc}") from None
    client = redis_client(options.redis_url, socket_timeout=5, socket_connect_timeout=5)
    children: list[Child] = []
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    code = 0
    results: list[dict[str, Any]] = []
    try:
        try:
            await asyncio.wait_for(client.ping(), 5)
        except Exception as exc:
            raise Failure(f"cannot reach Redis at {redact_url(options.redis_url)}: {type(exc).__name__}") from None
        held = await _prepare(conn, manifest)
        if package is not None:
            # A checker is built with the workers' judge settings (their sandbox directory, trusted or not).
            worker_env = role_env(base_env, manifest, "worker", options, 0)
            uploaded = await upload(conn, package, bounds=bounds, judge_env=worker_env)
            display.say(f"problem {uploaded.id} version {uploaded.version}: {uploaded.tests} tests uploaded")
        display.say(
            f"queue {manifest.queue}: mode={'shadow' if held else manifest.cutover.mode}"
            f" paused={manifest.cutover.paused}; "
            f"postgres {redact_url(options.postgres_dsn)}, redis {redact_url(options.redis_url)}"
        )
        if held is not None:
            display.say(f"the flip to live is held back by spec.cutover.gate: {held.message}; the queue stays in"
                        f" shadow mode and flips on the first look (every {GATE_RECHECK:g}s) whose figures meet it")
            plan[:] = plan_children(manifest, options.workers, shadow_mode=True)
        next_gate_look = loop.time() + GATE_RECHECK
        display.say(f"intake {intake.intake} ({intake.reason})")
        children = start_children(plan, env_for, log_dir)
        display.say(f"started {', '.join(c.label for c in children)} (logs in {log_dir}); Ctrl-C stops")
        ids: list[int] = []
        for program in programs:
            async with conn.transaction():
                ids.append(await submit(conn, manifest.queue, program.payload))
        if ids:
            display.say(f"submitted {len(ids)} demo programs: ids {ids[0]}..{ids[-1]}")
        deadline = loop.time() + options.timeout
        while not stop.is_set():
            dead = [c for c in children if c.process.poll() is not None]
            if dead:
                display.end()
                for c in dead:
                    display.say(f"{c.label} exited with code {c.process.returncode}; last log lines:\n{c.tail()}")
                code = 1
                break
            if held is not None and loop.time() >= next_gate_look:
                next_gate_look = loop.time() + GATE_RECHECK
                held = await held_back(conn, manifest, (await get_queue(conn, manifest.queue)).mode)
                if held is None:
                    await set_cutover(conn, manifest.queue, mode="live")
                    display.end()
                    display.say(f"queue {manifest.queue}: the gate is met, flipped to live")
            progress = await read_progress(conn, client, manifest.queue)
            alive = sum(1 for c in children if c.process.poll() is None)
            display.show(progress_line(progress, alive, len(children)))
            if ids:
                rows = await submissions.read(conn, ids)
                if all(rows.get(i) is not None and submissions.is_terminal(rows[i]["status"]) for i in ids):
                    results = verdict_table(programs, ids, rows)
                    code = 0 if all(r["ok"] for r in results) else 1
                    break
                if loop.time() >= deadline:
                    results = verdict_table(programs, ids, rows)
                    display.end()
                    display.say(f"timed out after {options.timeout:g}s waiting for verdicts")
                    code = 1
                    break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.5)
        display.end()
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)
        if children:
            display.say("stopping roles...")
            codes = await stop_children(children, settings.worker.grace_period + 5.0)
            bad = {k: v for k, v in codes.items() if v != 0}
            display.say("all roles stopped" + (f"; non-zero exits: {bad}" if bad else " cleanly"))
            if bad:
                code = 1
        await client.aclose()
        await conn.close()
    if results:
        if options.json_output:
            print(json.dumps({"queue": manifest.queue, "intake": {"intake": intake.intake, "reason": intake.reason},
                              "results": results}, indent=2, default=str))
        else:
            print(format_table(results))
    return code


def run_local(options: LocalOptions, env: Mapping[str, str] | None = None) -> int:
    """Run ``judgequeue local``; return its exit code."""
    return asyncio.run(_local(options, os.environ if env is None else env))
