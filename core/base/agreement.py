"""What "the shadow judge agrees with the legacy judge" means, and the gate on a flip to live (pure).

In shadow mode each submission may get a legacy verdict (the application reports the judge being
replaced, ``report_legacy_verdict``) and a shadow verdict (judgequeue's own judge, run by shadow
workers). A submission is counted once, by the pair of statuses it has:

- **matched**: both verdicts are in and :func:`agree` says they agree;
- **mismatched**: both are in and they do not;
- **legacy only**: the legacy verdict is in and the shadow one is not (not judged yet, or still
  being judged);
- **shadow only**: the shadow verdict is in and the legacy one is not (not reported yet).

Agreement is ``matched / (matched + mismatched)``: only submissions both judges have judged are
*compared* (the samples). Each submission belongs to one verdict class: its legacy verdict's status
(the reference the new judge must reproduce), or its shadow verdict's when there is no legacy one.

Two verdicts **agree when their statuses are equal**, nothing else: scores, per-test verdicts,
times and memory do not count. Legacy judges number, group, time and score tests their own way, so
comparing more would count formatting differences as disagreements; the status is what a user is
told, and ``judgequeue shadow diff`` shows both sides' per-test details of every mismatch so the
cause can be found. ``SYSTEM_ERROR`` is a status like the others: a shadow judge that fails where
the legacy judge gave a verdict disagrees with it.

The gate (``spec.cutover.gate``) holds a flip to live back until at least ``minSamples`` submissions
were compared and at least ``minAgreement`` of them agree; :func:`check_gate` decides it exactly
(rational arithmetic, no rounding), and percentages are shown rounded *down*, so a figure printed as
meeting the gate does.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from decimal import Decimal
from fractions import Fraction
from typing import Literal

Outcome = Literal["matched", "mismatched", "legacy_only", "shadow_only"]
#: Every outcome, in the order figures list them.
OUTCOMES: tuple[Outcome, ...] = ("matched", "mismatched", "legacy_only", "shadow_only")

#: A percentage as ``spec.cutover.gate.minAgreement`` writes it: ``99.5%``, ``100%``, ``90%``.
PERCENT_PATTERN = r"^(100(\.0{1,3})?|[0-9]{1,2}(\.[0-9]{1,3})?)%$"
_PERCENT = re.compile(PERCENT_PATTERN)


def agree(legacy: str, shadow: str) -> bool:
    """Whether a legacy and a shadow verdict status agree: they are the same status."""
    return legacy == shadow


def classify(legacy: str | None, shadow: str | None) -> Outcome | None:
    """The outcome of one submission from its legacy and final shadow statuses (None: absent); None
    when it has neither (nothing to count)."""
    if legacy is None:
        return None if shadow is None else "shadow_only"
    if shadow is None:
        return "legacy_only"
    return "matched" if agree(legacy, shadow) else "mismatched"


def verdict_class(legacy: str | None, shadow: str | None) -> str | None:
    """The verdict class a submission is counted under: the legacy status, else the shadow one."""
    return legacy if legacy is not None else shadow


@dataclass(frozen=True)
class Counts:
    """Submissions by outcome."""

    matched: int = 0
    mismatched: int = 0
    legacy_only: int = 0
    shadow_only: int = 0

    @property
    def samples(self) -> int:
        """Submissions both judges have judged (the denominator of the agreement)."""
        return self.matched + self.mismatched

    @property
    def total(self) -> int:
        return self.matched + self.mismatched + self.legacy_only + self.shadow_only

    @property
    def rate(self) -> Fraction | None:
        """``matched / samples`` exactly; None before anything was compared."""
        return Fraction(self.matched, self.samples) if self.samples else None

    def add(self, outcome: Outcome, n: int = 1) -> Counts:
        return replace(self, **{outcome: getattr(self, outcome) + n})

    def as_dict(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in OUTCOMES}


@dataclass(frozen=True)
class Agreement:
    """A queue's figures: every outcome in all, and per verdict class (classes with no submission
    are absent)."""

    queue: str
    total: Counts = Counts()
    by_verdict: Mapping[str, Counts] = field(default_factory=dict)

    @property
    def samples(self) -> int:
        return self.total.samples

    @property
    def rate(self) -> Fraction | None:
        return self.total.rate

    @property
    def percent(self) -> str | None:
        """The agreement as ``99.52%`` (rounded down), None before anything was compared."""
        return None if self.rate is None else format_percent(self.rate)

    def as_dict(self) -> dict[str, object]:
        """The figures as JSON: every outcome, ``samples``, ``agreement`` (``"97.50%"``, rounded down,
        or None), ``agreement_ratio`` (a float, or None) and ``by_verdict`` (class -> outcomes)."""
        rate = self.rate
        return {**self.total.as_dict(), "samples": self.samples, "agreement": self.percent,
                "agreement_ratio": None if rate is None else float(rate),
                "by_verdict": {v: c.as_dict() for v, c in sorted(self.by_verdict.items())}}

    def describe(self) -> str:
        """One line: ``agreement 97.50% over 400 compared (390 matched, 10 mismatched; 3 legacy only,
        2 shadow only)``."""
        t = self.total
        head = "nothing compared yet" if self.percent is None else f"agreement {self.percent} over {t.samples} compared"
        return (f"{head} ({t.matched} matched, {t.mismatched} mismatched; {t.legacy_only} legacy only,"
                f" {t.shadow_only} shadow only)")


def summarize(queue: str, pairs: Iterable[tuple[str | None, str | None, int]]) -> Agreement:
    """The figures of ``queue`` from ``(legacy status, shadow status, submissions)`` groups, a status
    None where that verdict is absent (what the database counts, grouped by the two statuses)."""
    total = Counts()
    by_verdict: dict[str, Counts] = {}
    for legacy, shadow, n in pairs:
        outcome = classify(legacy, shadow)
        cls = verdict_class(legacy, shadow)
        if outcome is None or cls is None or n <= 0:
            continue
        total = total.add(outcome, n)
        by_verdict[cls] = by_verdict.get(cls, Counts()).add(outcome, n)
    return Agreement(queue, total, by_verdict)


def parse_percent(text: str) -> Decimal:
    """``"99.5%"`` -> ``Decimal("99.5")``; ValueError for anything :data:`PERCENT_PATTERN` refuses."""
    if not isinstance(text, str) or not _PERCENT.match(text):
        raise ValueError(f"{text!r} is not a percentage from 0% to 100% such as 99.5%")
    return Decimal(text[:-1])


def format_percent(rate: Fraction | Decimal, digits: int = 2) -> str:
    """A rate in [0, 1] as a percentage with ``digits`` decimals, rounded down (never overstated)."""
    scaled = Fraction(rate) * 100 * 10**digits
    whole = scaled.numerator // scaled.denominator
    text = str(whole).rjust(digits + 1, "0")
    return f"{text[:-digits]}.{text[-digits:]}%" if digits else f"{text}%"


@dataclass(frozen=True)
class Gate:
    """``spec.cutover.gate``: the least agreement (a percentage) over the least number of compared
    submissions a flip to live needs."""

    min_agreement: Decimal
    min_samples: int

    def describe(self) -> str:
        return f"at least {self.min_agreement.normalize():f}% over at least {self.min_samples} compared"


@dataclass(frozen=True)
class GateCheck:
    """Whether the figures meet the gate, and one line saying so with the figures."""

    met: bool
    message: str


def check_gate(gate: Gate, figures: Agreement) -> GateCheck:
    """Met when at least ``min_samples`` submissions were compared (at least one) and the agreement,
    exactly, is at least ``min_agreement``."""
    rate = figures.rate
    enough = figures.samples >= max(1, gate.min_samples)
    high = rate is not None and rate * 100 >= Fraction(gate.min_agreement)
    met = enough and high
    if met:
        return GateCheck(True, f"{figures.describe()} meets the gate ({gate.describe()})")
    short = []
    if not enough:
        short.append(f"{figures.samples} compared, {max(1, gate.min_samples)} needed")
    if rate is not None and not high:
        short.append(f"{figures.percent} agree, {gate.min_agreement.normalize():f}% needed")
    return GateCheck(False, f"{figures.describe()} does not meet the gate ({gate.describe()}: {'; '.join(short)})")


def gate_on_flip(gate: Gate | None, wanted_mode: str, row_mode: str, figures: Agreement | None) -> GateCheck | None:
    """The gate's verdict on a flip to live, wherever the flags are written from (the operator, and
    ``judgequeue local``): None when there is no flip to live to judge (the row is live already, the
    spec asks for shadow) or no gate; else whether ``figures`` meet it (None: they could not be read,
    which never meets it). ``cutover.force`` is the caller's to honour."""
    if gate is None or wanted_mode != "live" or row_mode != "shadow":
        return None
    if figures is None:
        return GateCheck(False, "shadow judging's figures could not be read (is the schema migrated?)")
    return check_gate(gate, figures)
