"""The thin envelope a stream entry carries (ids only; the payload stays in Postgres), and its codec.

Both directions live here: :meth:`Envelope.fields` and :meth:`Envelope.values` write it (the
dispatcher's enqueue script and the reaper's requeue take the values in :data:`ENVELOPE_FIELDS`
order); :meth:`Envelope.parse` reads it back, and is total: whatever bytes a foreign client wrote,
the result is an envelope whose every id fits Postgres's ``bigint``, or :class:`MalformedEnvelope`
naming what is wrong.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: The fields of an envelope, in the order the Lua scripts take their values.
ENVELOPE_FIELDS = ("submission", "generation", "attempt", "outbox", "enqueued_at", "deliveries")


class MalformedEnvelope(ValueError):
    """A stream entry that is not a judgequeue envelope (foreign writer or corruption)."""


@dataclass(frozen=True)
class Envelope:
    """What a stream entry carries: ids only."""

    submission: int
    generation: int
    attempt: int  # the outbox row's dispatch attempt that appended it
    outbox: int
    enqueued_at: float  # unix seconds, informational
    deliveries: int = 1

    def fields(self) -> dict[str, str]:
        return {
            "submission": str(self.submission),
            "generation": str(self.generation),
            "attempt": str(self.attempt),
            "outbox": str(self.outbox),
            "enqueued_at": f"{self.enqueued_at:.6f}",
            "deliveries": str(self.deliveries),
        }

    def packed(self) -> str:
        """The values of :meth:`fields`, in ``ENVELOPE_FIELDS`` order, joined by commas (requeue script)."""
        return ",".join(str(v) for v in self.values())

    def values(self) -> list[str | int]:
        """The values of :meth:`fields`, in ``ENVELOPE_FIELDS`` order (the enqueue script's arguments)."""
        return [self.submission, self.generation, self.attempt, self.outbox, f"{self.enqueued_at:.6f}", self.deliveries]

    @classmethod
    def parse(cls, raw: object) -> Envelope:
        """Decode a stream entry, or raise MalformedEnvelope naming what is wrong.

        Total: whatever a foreign client wrote (any bytes, missing or extra fields, numbers past
        bigint), the result is an envelope whose every id fits Postgres's ``bigint`` or a
        :class:`MalformedEnvelope`, never another exception. Field names other than the six are
        ignored (room for later versions).
        """
        if not isinstance(raw, dict):
            raise MalformedEnvelope(f"entry is a {type(raw).__name__}, not a field map")
        fields: dict[str, object] = {}
        for key, value in raw.items():
            fields[_ascii(key, "a field name")] = value

        def field(name: str) -> str:
            if name not in fields:
                raise MalformedEnvelope(f"entry has no {name!r} field")
            return _ascii(fields[name], f"field {name!r}")

        return cls(
            submission=parse_id(field("submission"), "submission", minimum=1),
            generation=parse_id(field("generation"), "generation"),
            attempt=parse_id(field("attempt"), "attempt"),
            outbox=parse_id(field("outbox"), "outbox"),
            enqueued_at=_parse_time(field("enqueued_at")),
            deliveries=parse_id(field("deliveries"), "deliveries", minimum=1),
        )


#: The largest value of Postgres's ``bigint``, which every id of an envelope must fit.
BIGINT_MAX = 2**63 - 1
_DIGITS = re.compile(r"[0-9]{1,19}")
_SECONDS = re.compile(r"[0-9]{1,12}(\.[0-9]{1,9})?")


def _ascii(value: object, what: str) -> str:
    """Text of an envelope name or value; envelopes are ASCII throughout."""
    if isinstance(value, bytes):
        try:
            return value.decode("ascii")
        except UnicodeDecodeError:
            raise MalformedEnvelope(f"{what} is not ASCII text: {value[:40]!r}") from None
    if isinstance(value, str) and value.isascii():
        return value
    raise MalformedEnvelope(f"{what} is not ASCII text: {value!r:.60}")


def parse_id(text: str, name: str, *, minimum: int = 0) -> int:
    """A decimal id in ``[minimum, BIGINT_MAX]``, or MalformedEnvelope naming the field (pure)."""
    if _DIGITS.fullmatch(text) is None:
        raise MalformedEnvelope(f"field {name!r} is not a decimal number of at most 19 digits: {text[:40]!r}")
    value = int(text)
    if not minimum <= value <= BIGINT_MAX:
        raise MalformedEnvelope(f"field {name!r} is out of range [{minimum}, 2^63-1]: {text}")
    return value


def _parse_time(text: str) -> float:
    if _SECONDS.fullmatch(text) is None:
        raise MalformedEnvelope(f"field 'enqueued_at' is not unix seconds: {text[:40]!r}")
    return float(text)
