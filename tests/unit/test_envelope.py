"""The envelope codec is total: any field map a client can write parses or is MalformedEnvelope."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from judgequeue.core.transport.envelope import BIGINT_MAX, Envelope, MalformedEnvelope

NAMES = ["submission", "generation", "attempt", "outbox", "enqueued_at", "deliveries"]

raw_bytes = st.binary(max_size=30)
names = st.one_of(st.sampled_from([n.encode() for n in NAMES]), raw_bytes)
numbers = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70).map(lambda n: str(n).encode()),
    st.floats(allow_nan=True, allow_infinity=True).map(lambda f: repr(f).encode()),
    raw_bytes,
)


@given(st.dictionaries(names, st.one_of(numbers, raw_bytes), max_size=10))
def test_any_field_map_parses_or_is_malformed(fields: dict[bytes, bytes]) -> None:
    try:
        env = Envelope.parse(fields)
    except MalformedEnvelope as exc:
        assert str(exc)
        return
    for value in (env.submission, env.generation, env.attempt, env.outbox, env.deliveries):
        assert 0 <= value <= BIGINT_MAX
    assert env.submission >= 1 and env.deliveries >= 1
    assert math.isfinite(env.enqueued_at)
    assert Envelope.parse(env.fields()) == env  # what parses re-encodes to itself


@given(
    st.integers(min_value=1, max_value=BIGINT_MAX),
    st.integers(min_value=0, max_value=BIGINT_MAX),
    st.integers(min_value=1, max_value=10**6),
)
def test_every_valid_envelope_round_trips(submission: int, generation: int, deliveries: int) -> None:
    env = Envelope(submission, generation, 1, 1, 1764745200.123456, deliveries)
    assert Envelope.parse(env.fields()) == env
    assert Envelope.parse({k.encode(): v.encode() for k, v in env.fields().items()}) == env


GOOD = {"submission": "1", "generation": "1", "attempt": "1", "outbox": "1", "enqueued_at": "1.5", "deliveries": "1"}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"submission": b"\xff\xfe\x01"}, "field 'submission' is not ASCII text"),
        ({"submission": "99999999999999999999999"}, "at most 19 digits"),
        ({"submission": "9223372036854775808"}, "out of range"),
        ({"submission": "0"}, "out of range"),
        ({"generation": "-1"}, "not a decimal number"),
        ({"generation": " 1"}, "not a decimal number"),
        ({"generation": "1_0"}, "not a decimal number"),
        ({"generation": "\u0661"}, "not ASCII"),  # an Arabic-Indic digit int() would accept
        ({"enqueued_at": "nan"}, "not unix seconds"),
        ({"enqueued_at": "1e999"}, "not unix seconds"),
        ({"deliveries": "0"}, "out of range"),
    ],
)
def test_what_is_refused_and_why(change: dict[str, object], message: str) -> None:
    with pytest.raises(MalformedEnvelope, match=message):
        Envelope.parse({**GOOD, **change})


def test_a_non_ascii_field_name_is_malformed_and_unknown_names_are_ignored() -> None:
    with pytest.raises(MalformedEnvelope, match="a field name is not ASCII"):
        Envelope.parse({**{k.encode(): v.encode() for k, v in GOOD.items()}, b"\xff": b"1"})
    assert Envelope.parse({**GOOD, "trace": "x"}).submission == 1
    with pytest.raises(MalformedEnvelope, match="not a field map"):
        Envelope.parse([("submission", "1")])
