"""Output checkers: does a program's output answer the test? (pure functions, no I/O).

The built-in checkers compare the program's output with the test's answer:

- ``exact``: byte for byte.
- ``lines`` (the default): line by line, ignoring trailing whitespace on each line and trailing blank
  lines at the end (what most contest problems mean by "print exactly").
- ``tokens``: the same whitespace-separated tokens in the same order, however they are spaced.
- ``floats``: token by token, numbers equal within an absolute *or* relative tolerance
  (``|out - ans| <= abs`` or ``|out - ans| <= rel * |ans|``), other tokens compared exactly.

A custom checker is a program run in the sandbox (testlib's convention: arguments input, output,
answer; exit code 0 accepted, 1 wrong answer, 2 presentation error, 7 partial points with the
score in the first line of its message, anything else a checker failure); :func:`custom_outcome`
maps its facts to a result, so a crashing checker becomes a ``SYSTEM_ERROR`` with its message and
never a wrong answer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

CheckVerdict = Literal["ACCEPTED", "WRONG_ANSWER", "PRESENTATION_ERROR", "SYSTEM_ERROR"]

#: Longest message kept from a checker (the verdict carries it per test).
MAX_MESSAGE = 300
#: Tokens a mismatch message quotes at most this many characters of.
_QUOTE = 40


class InvalidChecker(ValueError):
    """A checker specification that names no known checker or has bad parameters."""


@dataclass(frozen=True)
class CheckResult:
    """What a checker says about one test: verdict, score in [0, 1] and a short message."""

    verdict: CheckVerdict
    score: float
    message: str = ""

    @classmethod
    def accepted(cls, message: str = "ok") -> CheckResult:
        return cls("ACCEPTED", 1.0, message)

    @classmethod
    def wrong(cls, message: str) -> CheckResult:
        return cls("WRONG_ANSWER", 0.0, message[:MAX_MESSAGE])


@dataclass(frozen=True)
class CheckerSpec:
    """A validated checker specification (from a payload or a problem package)."""

    kind: Literal["exact", "lines", "tokens", "floats", "custom"]
    abs_tol: float = 0.0
    rel_tol: float = 0.0


BUILTIN = ("exact", "lines", "tokens", "floats")


def parse_spec(spec: Any) -> CheckerSpec:
    """``"lines"``, ``{"type": "floats", "abs": 1e-6, "rel": 1e-9}``, ``{"type": "custom", ...}`` (pure)."""
    if spec is None:
        return CheckerSpec("lines")
    if isinstance(spec, str):
        spec = {"type": spec}
    if not isinstance(spec, dict):
        raise InvalidChecker("checker must be a name or an object with a 'type'")
    kind = spec.get("type")
    if kind in ("exact", "lines", "tokens"):
        return CheckerSpec(kind)
    if kind == "custom":
        return CheckerSpec("custom")
    if kind == "floats":
        abs_tol, rel_tol = spec.get("abs", 1e-6), spec.get("rel", 1e-6)
        for name, value in (("abs", abs_tol), ("rel", rel_tol)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
                raise InvalidChecker(f"checker.{name} must be a number in [0, 1), got {value!r}")
        return CheckerSpec("floats", float(abs_tol), float(rel_tol))
    raise InvalidChecker(f"checker type must be one of {', '.join((*BUILTIN, 'custom'))}, got {kind!r}")


def check(spec: CheckerSpec, output: bytes, answer: bytes) -> CheckResult:
    """Run a built-in checker (pure)."""
    if spec.kind == "exact":
        return _exact(output, answer)
    if spec.kind == "lines":
        return _lines(output, answer)
    if spec.kind == "tokens":
        return _tokens(output, answer, None)
    if spec.kind == "floats":
        return _tokens(output, answer, (spec.abs_tol, spec.rel_tol))
    raise InvalidChecker(f"{spec.kind!r} is not a built-in checker")


def _quote(token: bytes) -> str:
    text = token.decode("utf-8", "replace")
    return repr(text if len(text) <= _QUOTE else text[:_QUOTE] + "...")


def _exact(output: bytes, answer: bytes) -> CheckResult:
    if output == answer:
        return CheckResult.accepted()
    shorter = min(len(output), len(answer))
    at = next((i for i, (a, b) in enumerate(zip(output, answer, strict=False)) if a != b), shorter)
    return CheckResult.wrong(f"differs at byte {at} (output {len(output)} bytes, answer {len(answer)} bytes)")


def _normal_lines(data: bytes) -> list[bytes]:
    lines = [line.rstrip() for line in data.split(b"\n")]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def _lines(output: bytes, answer: bytes) -> CheckResult:
    got, want = _normal_lines(output), _normal_lines(answer)
    for i, (a, b) in enumerate(zip(got, want, strict=False)):
        if a != b:
            return CheckResult.wrong(f"line {i + 1}: expected {_quote(b)}, got {_quote(a)}")
    if len(got) != len(want):
        return CheckResult.wrong(f"expected {len(want)} lines, got {len(got)}")
    return CheckResult.accepted(_count(len(want), "line"))


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _number(token: bytes) -> float | None:
    try:
        value = float(token)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _tokens(output: bytes, answer: bytes, floats: tuple[float, float] | None) -> CheckResult:
    """Token comparison; with ``floats`` (absolute, relative tolerance) numbers may differ within it."""
    got, want = output.split(), answer.split()
    worst = 0.0
    for i, (a, b) in enumerate(zip(got, want, strict=False)):
        if a == b:
            continue
        expected = _number(b) if floats is not None else None
        if floats is not None and expected is not None:
            value = _number(a)
            if value is None:
                return CheckResult.wrong(f"token {i + 1}: expected a number near {_quote(b)}, got {_quote(a)}")
            error = abs(value - expected)
            abs_tol, rel_tol = floats
            if error <= abs_tol or error <= rel_tol * abs(expected):
                worst = max(worst, error)
                continue
            return CheckResult.wrong(f"token {i + 1}: expected {_quote(b)}, got {_quote(a)} (error {error:.3g})")
        return CheckResult.wrong(f"token {i + 1}: expected {_quote(b)}, got {_quote(a)}")
    if len(got) != len(want):
        return CheckResult.wrong(f"expected {len(want)} tokens, got {len(got)}")
    message = _count(len(want), "token") + (f", max error {worst:.3g}" if floats is not None and worst else "")
    return CheckResult.accepted(message)


#: testlib's exit codes.
EXIT_OK, EXIT_WA, EXIT_PE, EXIT_FAIL, EXIT_POINTS = 0, 1, 2, 3, 7


def custom_outcome(exit_code: int | None, signal: int | None, message: bytes, *, timed_out: bool) -> CheckResult:
    """The result a custom checker's facts give (pure). A checker that cannot judge is SYSTEM_ERROR."""
    text = message.decode("utf-8", "replace").strip()[:MAX_MESSAGE]
    if timed_out:
        return CheckResult("SYSTEM_ERROR", 0.0, f"checker exceeded its limits: {text}"[:MAX_MESSAGE])
    if signal is not None or exit_code is None:
        return CheckResult("SYSTEM_ERROR", 0.0, f"checker killed by signal {signal}: {text}"[:MAX_MESSAGE])
    if exit_code == EXIT_OK:
        return CheckResult("ACCEPTED", 1.0, text or "ok")
    if exit_code == EXIT_WA:
        return CheckResult("WRONG_ANSWER", 0.0, text or "wrong answer")
    if exit_code == EXIT_PE:
        return CheckResult("PRESENTATION_ERROR", 0.0, text or "presentation error")
    if exit_code == EXIT_POINTS:
        first, _, rest = text.partition("\n")
        score = _number(first.strip().encode())
        if score is None or not 0 <= score <= 1:
            return CheckResult("SYSTEM_ERROR", 0.0, f"checker gave partial points without a score in [0, 1]: {text}")
        verdict: CheckVerdict = "ACCEPTED" if score == 1 else "WRONG_ANSWER"
        return CheckResult(verdict, score, (rest.strip() or f"{score:g} of the points")[:MAX_MESSAGE])
    return CheckResult("SYSTEM_ERROR", 0.0, f"checker failed (exit {exit_code}): {text}"[:MAX_MESSAGE])
