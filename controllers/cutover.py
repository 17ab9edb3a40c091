"""The queue's cutover flags held to the spec: claim the queue, compare its row, write, restore or
report (docs/gitops.md, "Git is the truth").

Each reconcile reads the queue row (and which other queues the JudgeQueue still holds) and compares it with
``spec.cutover`` and ``spec.paused``. A difference is either a spec change the operator has not
written yet (written now) or drift, a change made outside the spec (``judgequeue cutover set``, SQL):
restored, or only reported with ``cutover.driftPolicy: report``. Which one it is comes from
``status.cutover.applied``, the flags the operator last wrote or confirmed. ``CutoverApplied`` is True
only while the row holds the spec's flags, and ``status.cutover`` always says what the row holds.

A queue belongs to one JudgeQueue: the first to reconcile it claims it; any other is refused and
writes nothing (its handler scales its fleet to zero). Ownership changes hands only through a release
(the owner deleted, or its ``spec.queue`` renamed away once none of its pods runs on the old queue)
and a claim: an owner set to another by hand is taken back by the JudgeQueue that held the queue, and
one that no longer exists (deleted while no operator ran: nothing released its queue) is released by
the next JudgeQueue that wants the queue, once none of its pods runs on it.
:func:`decide` is pure; :func:`sync_queue` does the I/O through :mod:`judgequeue.core.store.queues` and
:mod:`judgequeue.core.store.shadow` (the operator never talks SQL itself).

While the row is in shadow mode every pass reads shadow judging's figures (legacy and shadow verdicts
compared, :mod:`judgequeue.core.base.agreement`) into ``status.shadow``. ``spec.cutover.gate`` holds a
flip to live back until they meet it: :func:`decide` says ``gated``, the other flags are written with
the row's mode kept, and ``CutoverApplied`` is False with reason ``GateNotMet`` and the figures; each
pass decides again, so the flip happens on the first pass whose figures meet the gate, with no new
commit. ``cutover.force`` lets it through; a rollback to shadow is never gated.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

import asyncpg

from judgequeue.core.base.agreement import Agreement, Gate, GateCheck, check_gate, gate_on_flip
from judgequeue.core.base.classes import DEFAULT_CLASSES
from judgequeue.core.base.errors import CutoverBlocked, JudgeQueueError, QueueOwned, WatermarkMovedBack
from judgequeue.core.spec import JudgeQueueSpec
from judgequeue.core.store import shadow
from judgequeue.core.store.queues import (
    QueueFlags,
    claim_queue,
    owned_queues,
    release_queue,
    set_classes,
    set_cutover,
    take_back_queue,
)
from judgequeue.core.transport.connect import connect_postgres

from .conditions import Condition, Problem, rfc3339

Decision = Literal["applied", "write", "restore", "report", "gated"]

#: ``owner_gone(owner, queue)``: whether a queue's recorded owner (``JudgeQueue NS/NAME``) no longer
#: exists and runs nothing on ``queue`` (the handler's part: it sees the API server).
OwnerGone = Callable[[str, str], Awaitable[bool]]


@dataclass(frozen=True)
class Wanted:
    """The flags a spec asks for. ``watermark`` None: the spec names none (the row may hold one,
    which cannot be removed: a watermark only moves forward)."""

    queue: str
    mode: str
    paused: bool
    watermark: datetime | None
    policy: str = "restore"
    gate: Gate | None = None
    force: bool = False

    def canonical(self) -> str:
        """The flags as one line, as ``status.cutover.applied`` records them."""
        mark = rfc3339(self.watermark) if self.watermark is not None else "none"
        return f"mode={self.mode} paused={str(self.paused).lower()} watermark={mark}"


def wanted(spec: JudgeQueueSpec) -> Wanted:
    c = spec.cutover
    return Wanted(spec.queue, c.mode, spec.paused, c.watermark, c.drift_policy, c.gate, c.force)


def describe(flags: QueueFlags) -> str:
    """What a row holds, for messages: ``mode=live paused=false watermark=none (config version 7)``."""
    mark = rfc3339(flags.watermark) if flags.watermark is not None else "none"
    return (f"mode={flags.mode} paused={str(flags.paused).lower()} watermark={mark}"
            f" (config version {flags.config_version})")


def differences(want: Wanted, row: QueueFlags) -> list[str]:
    """The flags where ``row`` differs from ``want``: ``mode``, ``paused``, ``watermark``."""
    out = []
    if row.mode != want.mode:
        out.append("mode")
    if row.paused != want.paused:
        out.append("paused")
    if want.watermark is not None and (row.watermark is None or row.watermark != want.watermark):
        out.append("watermark")
    if want.watermark is None and row.watermark is not None:
        out.append("watermark")  # not restorable: see decide()
    return out


def restorable(want: Wanted, row: QueueFlags) -> list[str]:
    """The differing flags a write can bring back (a watermark the spec does not name cannot go)."""
    return [d for d in differences(want, row) if not (d == "watermark" and want.watermark is None)]


def gate_check(want: Wanted, row: QueueFlags, figures: Agreement | None) -> GateCheck | None:
    """The gate's verdict on a flip to live (pure; :func:`judgequeue.core.base.agreement.gate_on_flip`)."""
    return gate_on_flip(want.gate, want.mode, row.mode, figures)


def decide(
    want: Wanted, row: QueueFlags, *, last_applied: str | None, figures: Agreement | None = None
) -> Decision:
    """What to do with the row: nothing (``applied``: it holds the spec's flags), ``write`` the spec's
    flags (the spec changed since they were last written: ``last_applied`` is not ``want``'s),
    ``restore`` them (drift, and the policy restores) or ``report`` the drift (the policy says so, or
    no write could remove it); ``gated`` where the write or restore would flip the row to live and
    ``figures`` (shadow judging's) do not meet ``spec.cutover.gate``, unless ``force``."""
    if not differences(want, row):
        return "applied"
    if not restorable(want, row):
        return "report"
    if last_applied != want.canonical():
        decision: Decision = "write"
    else:
        decision = "restore" if want.policy == "restore" else "report"
    if decision != "report" and not want.force:
        check = gate_check(want, row, figures)
        if check is not None and not check.met:
            return "gated"
    return decision


def held_back(want: Wanted, row: QueueFlags) -> Wanted:
    """What a gated pass writes: the spec's flags with the row's mode (pure)."""
    return Wanted(want.queue, row.mode, want.paused, want.watermark, want.policy, want.gate, want.force)


def shadow_status(figures: Agreement, check: GateCheck | None, now: datetime) -> dict[str, Any]:
    """``status.shadow`` from the figures (pure): each outcome, the agreement and the gate's verdict."""
    t = figures.total
    out: dict[str, Any] = {
        "samples": figures.samples, "matched": t.matched, "mismatched": t.mismatched,
        "legacyOnly": t.legacy_only, "shadowOnly": t.shadow_only,
        "byVerdict": [{"verdict": v, "matched": c.matched, "mismatched": c.mismatched,
                       "legacyOnly": c.legacy_only, "shadowOnly": c.shadow_only}
                      for v, c in sorted(figures.by_verdict.items())],
        "readAt": rfc3339(now),
    }  # fmt: skip
    if figures.percent is not None:
        out["agreement"] = figures.percent
    if check is not None:
        out["gate"] = ("met: " if check.met else "not met: ") + check.message
    return out


@dataclass
class QueueSync:
    """The outcome of one :func:`sync_queue`: the ``CutoverApplied`` condition, the fields of
    ``status.cutover`` (empty: keep the previous), a problem for ``Degraded``, whether another owner
    holds the queue, and what was written (for the action log and a Warning Event)."""

    condition: Condition
    status: dict[str, Any] = field(default_factory=dict)
    problem: Problem | None = None
    owned_by: str | None = None
    wrote: Decision | None = None
    before: QueueFlags | None = None
    claimed: bool = False
    #: Other queues this owner still holds (a ``spec.queue`` renamed away from them): released once
    #: no pod of the JudgeQueue runs on them (the handler's part: it sees the pods).
    also_owned: list[str] = field(default_factory=list)
    #: Who held the queue after someone set its owner by hand, when this pass took it back.
    took_back: str | None = None
    #: The recorded owner this pass released because it no longer exists (then claimed the queue).
    released_from: str | None = None
    #: ``status.shadow`` (empty: not read on this pass; the previous stays).
    shadow: dict[str, Any] = field(default_factory=dict)
    #: The gate's verdict on a flip to live this pass wrote or held back (None: no gated flip).
    gate: GateCheck | None = None


def _status(row: QueueFlags, *, generation: int | None, applied: str | None) -> dict[str, Any]:
    status: dict[str, Any] = {"queue": row.name, "mode": row.mode, "paused": row.paused,
                              "configVersion": row.config_version, "owner": row.owner or ""}
    if row.watermark is not None:
        status["watermark"] = rfc3339(row.watermark)
    if generation is not None:
        status["generation"] = generation
    if applied is not None:
        status["applied"] = applied
    return status


def _drifted(want: Wanted, row: QueueFlags) -> str:
    message = f"queue {want.queue!r} holds {describe(row)}, not the spec's {want.canonical()}"
    if not restorable(want, row):
        return (f"{message}: its watermark was set outside the spec and cannot be removed (a watermark only"
                " moves forward); name it in spec.cutover.watermark")
    return f"{message}: changed outside the spec; cutover.driftPolicy is report, so it is left as it is"


async def sync_queue(
    dsn: str, spec: JudgeQueueSpec, *, owner: str, previous: Mapping[str, Any], generation: int,
    connect_timeout: float, pooler: str = "none", previous_message: str = "", previous_reason: str = "",
    owner_gone: OwnerGone | None = None,
) -> QueueSync:
    """Claim the queue for ``owner``, compare its row with the spec and write, restore or report.

    ``previous`` is the JudgeQueue's ``status.cutover``; ``previous_message`` its ``CutoverApplied``
    message, kept while the row stays at the flags it describes (see :func:`applied_message`), and
    ``previous_reason`` its reason (a queue handed to a JudgeQueue refused on its last pass is not
    taken at once). ``owner_gone(owner, queue)`` says whether another recorded owner no longer
    exists and runs nothing on the queue: then its hold is released and the queue claimed (a
    JudgeQueue deleted, its finalizer released by hand, while no operator ran). Never raises for what
    the database says: every outcome is a :class:`QueueSync`
    (connection failures too: ``DatabaseUnavailable``)."""
    want = wanted(spec)
    try:
        conn = await connect_postgres(dsn, pooler=pooler, timeout=connect_timeout)
    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError, JudgeQueueError) as exc:
        return _unavailable(want, exc)
    try:
        claimed = await _claim(conn, want, owner=owner, previous=previous, previous_reason=previous_reason,
                               owner_gone=owner_gone)
        if isinstance(claimed, QueueSync):
            return claimed
        row, sync = claimed
        # The spec's priority classes: a plain write (only when they differ), never gated or drifted. A
        # database of a release before classes has none to write, which is what a spec without them asks.
        try:
            await set_classes(conn, want.queue, spec.classes)
        except asyncpg.UndefinedColumnError:
            if spec.classes != DEFAULT_CLASSES:
                raise
        figures = await _figures(conn, want, row)
        decision = decide(want, row, last_applied=previous.get("applied"), figures=figures)
        sync.gate = gate_check(want, row, figures)
        if figures is not None:
            # The gate's verdict on these figures whether or not a flip is asked for yet: commit the
            # flip once it says "met" (docs/gitops.md, "A gate and the watermark").
            preview = check_gate(want.gate, figures) if want.gate is not None and row.mode == "shadow" else None
            sync.shadow = shadow_status(figures, sync.gate or preview, datetime.now(UTC))
        target = held_back(want, row) if decision == "gated" else want
        if decision in ("write", "restore") or (decision == "gated" and differences(target, row)):
            sync.before = row
            kwargs: dict[str, Any] = {"mode": target.mode, "paused": target.paused, "owner": owner}
            if target.watermark is not None:
                kwargs["watermark"] = target.watermark
            row = await set_cutover(conn, want.queue, **kwargs)
            sync.wrote = decision
        return _outcome(sync, want, row, decision, previous, generation, previous_message)
    except WatermarkMovedBack as exc:
        message = str(exc)
        return QueueSync(Condition("CutoverApplied", "False", "WatermarkMovedBack", message),
                         problem=Problem("WatermarkMovedBack", message))
    except CutoverBlocked as exc:  # transient: retried on the next pass, not a failure
        return QueueSync(Condition("CutoverApplied", "False", "WaitingForSubmits", str(exc)))
    except QueueOwned as exc:  # taken between the claim and the write
        message = f"queue {want.queue!r} belongs to {exc.owner}: this JudgeQueue runs and writes nothing"
        return QueueSync(Condition("CutoverApplied", "False", "QueueOwned", message),
                         problem=Problem("QueueOwned", message), owned_by=exc.owner)
    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError, JudgeQueueError) as exc:
        return _unavailable(want, exc)
    finally:
        await conn.close()


async def _claim(
    conn: asyncpg.Connection, want: Wanted, *, owner: str, previous: Mapping[str, Any], previous_reason: str,
    owner_gone: OwnerGone | None,
) -> tuple[QueueFlags, QueueSync] | QueueSync:
    """The queue row claimed for ``owner`` with the sync to fill in, or the refusal when the queue is
    another's (or was handed to this one by hand: see :func:`sync_queue`)."""
    mine = await owned_queues(conn, owner)
    also_owned = [q for q in mine if q != want.queue]
    held = previous.get("owner") == owner and previous.get("queue") == want.queue
    took_back = None
    if not held and previous_reason == "QueueOwned" and want.queue in mine:
        # Refused on the last pass, and the row names this JudgeQueue now though it claimed
        # nothing: the owner column was set by hand. The JudgeQueue that held the queue hears it
        # and takes it back; this one starts nothing until a later pass still finds it here.
        message = (f"queue {want.queue!r} was handed to this JudgeQueue outside the operator (its owner"
                   " column was set by hand): nothing runs until a later pass still finds it here, so the"
                   " JudgeQueue that held it can take it back first")
        return QueueSync(Condition("CutoverApplied", "False", "QueueHandedOver", message),
                         problem=Problem("QueueHandedOver", message), owned_by="", also_owned=also_owned)
    released_from = None
    try:
        row = await claim_queue(conn, want.queue, owner, mode=want.mode)  # type: ignore[arg-type]
    except QueueOwned as exc:
        # Ownership changes hands only through a release (a JudgeQueue deleted, or renamed away)
        # and a claim: an owner this JudgeQueue held set to another by hand is taken back, and a
        # recorded owner that no longer exists (deleted while no operator ran) is released here.
        if held and exc.owner and await take_back_queue(conn, want.queue, owner, exc.owner):
            took_back = exc.owner
        elif (exc.owner and owner_gone is not None and await owner_gone(exc.owner, want.queue)
              and await release_queue(conn, want.queue, exc.owner)):
            released_from = exc.owner
        else:
            message = (f"queue {want.queue!r} belongs to {exc.owner}: this JudgeQueue runs nothing (its"
                       f" Deployments are scaled to zero) and writes nothing (delete one of the two, or give"
                       f" this one another spec.queue)")
            return QueueSync(Condition("CutoverApplied", "False", "QueueOwned", message),
                             problem=Problem("QueueOwned", message), owned_by=exc.owner, also_owned=also_owned)
        row = await claim_queue(conn, want.queue, owner, mode=want.mode)  # type: ignore[arg-type]
    sync = QueueSync(Condition("CutoverApplied", "Unknown", "", ""), also_owned=also_owned, took_back=took_back,
                     released_from=released_from)
    sync.claimed = not held
    return row, sync


async def _figures(conn: asyncpg.Connection, want: Wanted, row: QueueFlags) -> Agreement | None:
    """Shadow judging's figures while the row is in shadow mode (or the spec asks for it); None
    otherwise, or when they cannot be read: a database not migrated to shadow judging yet has no
    figures, which holds a gated flip back and nothing else."""
    if row.mode != "shadow" and want.mode != "shadow":
        return None
    try:
        return await shadow.agreement(conn, want.queue)
    except asyncpg.UndefinedTableError:
        return None


def _unavailable(want: Wanted, exc: BaseException) -> QueueSync:
    message = f"cannot read or write queue {want.queue!r}: {exc}" if str(exc) else (
        f"cannot read or write queue {want.queue!r}: {type(exc).__name__}")
    return QueueSync(Condition("CutoverApplied", "False", "DatabaseUnavailable", message),
                     problem=Problem("DatabaseUnavailable", message))


def applied_message(current: str, previous: str, *, wrote: bool) -> str:
    """``CutoverApplied``'s message when the row holds what the spec asks: ``current`` (the row's flags
    and config version, and how this pass got there), unless this pass wrote nothing and ``previous``
    is about these very flags: then ``previous``, which says how they came to be (a gate met, a flip
    forced past it, a restore) until the next write. A later pass must not erase that account."""
    if not wrote and previous.startswith(current + "; "):
        return previous
    return current


def _outcome(sync: QueueSync, want: Wanted, row: QueueFlags, decision: Decision, previous: Mapping[str, Any],
             generation: int, previous_message: str = "") -> QueueSync:
    if decision == "gated":
        assert sync.gate is not None
        message = (f"flip to live held back by cutover.gate: {sync.gate.message}; queue {want.queue!r} stays in"
                   f" shadow mode and the flip is written on the first pass whose figures meet the gate"
                   f" (cutover.force: true lets it through now)")
        sync.condition = Condition("CutoverApplied", "False", "GateNotMet", message)
        applied = held_back(want, row).canonical() if sync.wrote else previous.get("applied")
        sync.status = _status(row, generation=previous.get("generation"), applied=applied)
        return sync
    if not differences(want, row):
        text = f"queue {want.queue!r}: {describe(row)}"
        if decision == "restore" and sync.before is not None:
            text += f"; restored: the row held {describe(sync.before)}, changed outside the spec"
        if sync.released_from is not None:
            text += f"; taken over from {sync.released_from}, which no longer exists"
        if sync.gate is not None and sync.before is not None:
            text += ("; the gate was met: " if sync.gate.met else "; forced past the gate (cutover.force): ")
            text += sync.gate.message
        text = applied_message(text, previous_message, wrote=sync.before is not None)
        sync.condition = Condition("CutoverApplied", "True", "Applied", text)
        sync.status = _status(row, generation=generation, applied=want.canonical())
        return sync
    message = _drifted(want, row)
    sync.condition = Condition("CutoverApplied", "False", "Drifted", message)
    sync.problem = Problem("Drifted", message)
    sync.status = _status(row, generation=previous.get("generation"), applied=previous.get("applied"))
    return sync
