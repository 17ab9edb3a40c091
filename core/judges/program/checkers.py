"""Output checkers: does a program's output answer the test? (pure functions, no I/O).

The built-in checkers compare the program's output with the test's answer:

- ``exact``: byte for byte.
- ``lines`` (the default): line by line, ignoring trailing whitespace on each line and trailing blank
  lines at the end (what most contest problems mean by "print exactly").
- ``tokens``: the same whitespace-separated tokens in the same order, however they are spaced.
- ``floats``: token by token, numbers equal within an absolute *or* relative tolerance
  (``|out - ans| <= abs`` or ``|out - ans| <= rel * |ans|``), other tokens compared exactly. A
  number is what a contest judge reads as one (C's decimal syntax, as testlib and Kattis read it):
  Python's own extensions (``1_0``, ``infinity``, ``nan``) are not numbers.
- ``kattis``: the ICPC/Kattis default output validator, with its flags (``case_sensitive``,
  ``space_change_sensitive``, ``float_absolute_tolerance E``, ``float_relative_tolerance E``,
  ``float_tolerance E``): tokens compared case-insensitively unless told otherwise, floats within
  either tolerance once one is given.

A custom checker is a program run in the sandbox, speaking one of two protocols:

- ``testlib`` (Polygon, Codeforces, judgequeue's own packages): arguments input, output, answer;
  exit code 0 accepted, 1 wrong answer, 2 presentation error (testlib's unexpected end of file,
  8, too), 7 points (testlib's ``quitp``: ``points 0.25 message`` on stderr; the older
  judgequeue form, the score alone on the first line, is read too), anything else (3 is
  testlib's "fail") a checker failure. :func:`custom_outcome` maps its facts to a result.
- ``kattis`` (ICPC/Kattis output validators): arguments input, answer, feedback directory and the
  test's flags, the output on stdin; exit code 42 accepted, 43 wrong answer, anything else a
  judge error; ``judgemessage.txt`` in the feedback directory is the message and ``score.txt``
  the test's score (scoring problems). :func:`kattis_outcome` maps its facts to a result.

Either way a crashing checker becomes a ``SYSTEM_ERROR`` with its message, never a wrong answer.
"""

from __future__ import annotations

import math
import re
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
    #: Points the checker gave as a number of its own (testlib's ``quitp``, Kattis' ``score.txt``),
    #: for formats that count them absolutely; ``score`` is the same as a share in [0, 1] when it is one.
    points: float | None = None

    @classmethod
    def accepted(cls, message: str = "ok") -> CheckResult:
        return cls("ACCEPTED", 1.0, message)

    @classmethod
    def wrong(cls, message: str) -> CheckResult:
        return cls("WRONG_ANSWER", 0.0, message[:MAX_MESSAGE])


@dataclass(frozen=True)
class CheckerSpec:
    """A validated checker specification (from a payload or a problem package)."""

    kind: Literal["exact", "lines", "tokens", "floats", "kattis", "custom"]
    abs_tol: float = 0.0
    rel_tol: float = 0.0
    #: ``kattis``: the validator flags every test gets (a test may add its own, see :func:`kattis_flags`).
    flags: tuple[str, ...] = ()


BUILTIN = ("exact", "lines", "tokens", "floats", "kattis")


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
    if kind == "kattis":
        flags = spec.get("flags", [])
        if not isinstance(flags, list) or not all(isinstance(f, str) for f in flags):
            raise InvalidChecker("checker.flags must be a list of strings")
        kattis_flags(flags)  # refuse a flag the default validator does not know, now rather than per test
        return CheckerSpec("kattis", flags=tuple(flags))
    if kind == "floats":
        abs_tol, rel_tol = spec.get("abs", 1e-6), spec.get("rel", 1e-6)
        for name, value in (("abs", abs_tol), ("rel", rel_tol)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
                raise InvalidChecker(f"checker.{name} must be a number in [0, 1), got {value!r}")
        return CheckerSpec("floats", float(abs_tol), float(rel_tol))
    raise InvalidChecker(f"checker type must be one of {', '.join((*BUILTIN, 'custom'))}, got {kind!r}")


def check(spec: CheckerSpec, output: bytes, answer: bytes, flags: tuple[str, ...] = ()) -> CheckResult:
    """Run a built-in checker (pure). ``flags``: a test's own Kattis validator flags (``kattis`` only)."""
    if spec.kind == "exact":
        return _exact(output, answer)
    if spec.kind == "lines":
        return _lines(output, answer)
    if spec.kind == "tokens":
        return _tokens(output, answer, None)
    if spec.kind == "floats":
        return _tokens(output, answer, (spec.abs_tol, spec.rel_tol))
    if spec.kind == "kattis":
        return kattis_default(output, answer, kattis_flags([*spec.flags, *flags]))
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


#: A number as C's ``strtod`` reads a decimal one (testlib and the Kattis default validator use it):
#: no digit separators, no ``inf``/``nan`` words, no surrounding spaces.
_DECIMAL = re.compile(rb"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_HEX = re.compile(rb"[+-]?0[xX](?:[0-9a-fA-F]+\.?[0-9a-fA-F]*|\.[0-9a-fA-F]+)(?:[pP][+-]?[0-9]+)?")


def _number(token: bytes, *, hex_floats: bool = False) -> float | None:
    """The finite number ``token`` spells in C's syntax, or None (pure). Python's ``float`` alone
    would take ``1_0`` for 10 and ``infinity``, which no contest checker does."""
    if _DECIMAL.fullmatch(token):
        value = float(token)
    elif hex_floats and _HEX.fullmatch(token):
        value = float.fromhex(token.decode("ascii"))
    else:
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


#: testlib's exit codes (its default build; 8 only with ENABLE_UNEXPECTED_EOF, else it exits 2).
EXIT_OK, EXIT_WA, EXIT_PE, EXIT_FAIL, EXIT_POINTS, EXIT_UNEXPECTED_EOF = 0, 1, 2, 3, 7, 8
#: The Kattis output validator's exit codes.
KATTIS_AC, KATTIS_WA = 42, 43


def parse_testlib_points(text: str) -> tuple[float | None, str]:
    """The points of a testlib ``points`` outcome and the rest of its message (pure).

    testlib's ``quitp(0.25, "msg")`` writes ``points 0.25 msg`` on stderr; judgequeue's older form
    puts the score alone on the first line (``0.25\nmsg``). None when no number leads it."""
    body = text.strip()
    if body.startswith("points "):
        body = body[len("points ") :].lstrip()
    head, _, rest = body.partition("\n")
    first, _, tail = head.strip().partition(" ")
    value = _number(first.encode())
    if value is None:
        return None, text
    return value, "\n".join(part for part in (tail.strip(), rest.strip()) if part)


def _unfinished(
    who: str, text: str, exit_code: int | None, signal: int | None, *, timed_out: bool
) -> CheckResult | None:
    """SYSTEM_ERROR when ``who`` (a checker, an output validator) did not end on its own, past its
    limits or killed: it never judged the answer. None when it exited."""
    if timed_out:
        return CheckResult("SYSTEM_ERROR", 0.0, f"{who} exceeded its limits: {text}"[:MAX_MESSAGE])
    if signal is not None or exit_code is None:
        return CheckResult("SYSTEM_ERROR", 0.0, f"{who} killed by signal {signal}: {text}"[:MAX_MESSAGE])
    return None


def custom_outcome(
    exit_code: int | None, signal: int | None, message: bytes, *, timed_out: bool, absolute_points: bool = False
) -> CheckResult:
    """The result a testlib-protocol checker's facts give (pure). A checker that cannot judge is
    SYSTEM_ERROR. ``absolute_points``: the format counts testlib points as a test's points (Polygon),
    so any non-negative number is taken and kept in ``points``; otherwise a points outcome must be a
    share in [0, 1]."""
    text = message.decode("utf-8", "replace").strip()[:MAX_MESSAGE]
    if (unfinished := _unfinished("checker", text, exit_code, signal, timed_out=timed_out)) is not None:
        return unfinished
    if exit_code == EXIT_OK:
        return CheckResult("ACCEPTED", 1.0, text or "ok")
    if exit_code == EXIT_WA:
        return CheckResult("WRONG_ANSWER", 0.0, text or "wrong answer")
    if exit_code in (EXIT_PE, EXIT_UNEXPECTED_EOF):
        return CheckResult("PRESENTATION_ERROR", 0.0, text or "presentation error")
    if exit_code == EXIT_POINTS:
        points, rest = parse_testlib_points(text)
        if points is None or points < 0 or (not absolute_points and points > 1):
            bound = "a number of points" if absolute_points else "a score in [0, 1]"
            return CheckResult(
                "SYSTEM_ERROR", 0.0, f"checker gave partial points without {bound}: {text}"[:MAX_MESSAGE]
            )
        score = min(points, 1.0)
        verdict: CheckVerdict = "ACCEPTED" if score == 1 and not absolute_points else "WRONG_ANSWER"
        if absolute_points:
            verdict = "ACCEPTED" if points > 0 else "WRONG_ANSWER"
        return CheckResult(verdict, score, (rest or f"{points:g} points")[:MAX_MESSAGE], points)
    return CheckResult("SYSTEM_ERROR", 0.0, f"checker failed (exit {exit_code}): {text}"[:MAX_MESSAGE])


def kattis_outcome(
    exit_code: int | None,
    signal: int | None,
    feedback: dict[str, bytes],
    stderr: bytes,
    *,
    timed_out: bool,
    score_allowed: bool,
) -> CheckResult:
    """The result a Kattis output validator's facts give (pure), as problemtools reads them: exit 42
    accepted (with ``score.txt`` as its score when the problem allows custom scores), 43 wrong
    answer (a ``score.txt`` with it is a judge error), anything else, a signal or its limits a
    judge error. The message is ``judgemessage.txt`` (else ``teammessage.txt``, else stderr)."""
    said = feedback.get("judgemessage.txt") or feedback.get("teammessage.txt") or stderr
    text = said.decode("utf-8", "replace").strip()[:MAX_MESSAGE]
    if (unfinished := _unfinished("output validator", text, exit_code, signal, timed_out=timed_out)) is not None:
        return unfinished
    if exit_code == KATTIS_WA:
        if "score.txt" in feedback:
            return CheckResult("SYSTEM_ERROR", 0.0, 'output validator wrote "score.txt" with a wrong answer')
        return CheckResult("WRONG_ANSWER", 0.0, text or "wrong answer")
    if exit_code != KATTIS_AC:
        return CheckResult("SYSTEM_ERROR", 0.0, f"output validator failed (exit {exit_code}): {text}"[:MAX_MESSAGE])
    if "score.txt" not in feedback:
        return CheckResult("ACCEPTED", 1.0, text or "accepted")
    if not score_allowed:
        return CheckResult(
            "SYSTEM_ERROR", 0.0, 'output validator wrote "score.txt" but the problem has no custom scores'
        )
    score = _number(feedback["score.txt"].strip(), hex_floats=True)
    if score is None:
        return CheckResult(
            "SYSTEM_ERROR", 0.0, f"output validator's score.txt is not a number: {feedback['score.txt'][:40]!r}"
        )
    return CheckResult("ACCEPTED", 1.0, text or f"score {score:g}", score)


@dataclass(frozen=True)
class KattisFlags:
    """The default validator's options (pure data)."""

    case_sensitive: bool = False
    space_change_sensitive: bool = False
    abs_tol: float = -1.0  # negative: not given
    rel_tol: float = -1.0

    @property
    def floats(self) -> bool:
        return self.abs_tol >= 0 or self.rel_tol >= 0


def kattis_flags(flags: list[str] | tuple[str, ...]) -> KattisFlags:
    """Parse the default validator's flags as it does (pure); InvalidChecker names a bad one."""
    out = KattisFlags()
    i = 0
    while i < len(flags):
        flag = flags[i]
        if flag in ("case_sensitive", "space_change_sensitive"):
            out = KattisFlags(**{**out.__dict__, flag: True})
        elif flag in ("float_absolute_tolerance", "float_relative_tolerance", "float_tolerance"):
            value = _number(flags[i + 1].encode(), hex_floats=True) if i + 1 < len(flags) else None
            if value is None:
                raise InvalidChecker(f"validator flag {flag} needs a number after it")
            if flag == "float_absolute_tolerance":
                out = KattisFlags(out.case_sensitive, out.space_change_sensitive, value, out.rel_tol)
            elif flag == "float_relative_tolerance":
                out = KattisFlags(out.case_sensitive, out.space_change_sensitive, out.abs_tol, value)
            else:
                out = KattisFlags(out.case_sensitive, out.space_change_sensitive, value, value)
            i += 1
        else:
            raise InvalidChecker(f"validator flag {flag!r} is not one the default validator knows")
        i += 1
    return out


def _spaces(data: bytes) -> list[bytes]:
    """The whitespace runs of ``data`` in order, with an empty first one when it starts with a token."""
    parts = re.split(rb"([ \t\n\v\f\r]+)", data)
    return [b"" if parts[0] else b"^", *parts[1::2]]


def kattis_default(output: bytes, answer: bytes, flags: KattisFlags) -> CheckResult:
    """The ICPC/Kattis default output validator (pure): token by token, as problemtools' own."""
    if flags.space_change_sensitive and _spaces(output) != _spaces(answer):
        return CheckResult.wrong("space change error")  # whitespace must match exactly, leading and trailing too
    got, want = output.split(), answer.split()
    for i, expected in enumerate(want):
        if i >= len(got):
            return CheckResult.wrong(f"user EOF while judge had more output (next judge token: {_quote(expected)})")
        token = got[i]
        if flags.floats and (judge := _number(expected, hex_floats=True)) is not None:
            team = _number(token, hex_floats=True)
            if team is None:
                return CheckResult.wrong(f"token {i + 1}: expected float, got {_quote(token)}")
            error = abs(judge - team)
            if not (error <= flags.abs_tol) and not (error <= flags.rel_tol * abs(judge)):
                return CheckResult.wrong(
                    f"token {i + 1}: too large difference: judge {_quote(expected)}, user {_quote(token)}"
                )
            continue
        same = token == expected if flags.case_sensitive else token.lower() == expected.lower()
        if not same:
            return CheckResult.wrong(
                f"token {i + 1}: string tokens mismatch: judge {_quote(expected)}, user {_quote(token)}"
            )
    if len(got) > len(want):
        return CheckResult.wrong(f"trailing output: {_quote(got[len(want)])}")
    return CheckResult.accepted(_count(len(want), "token"))
