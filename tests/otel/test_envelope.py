"""The trace context envelope (``transports.otel.envelope``): any body round-trips, and a body
that is not a well-formed envelope comes back as it was, whatever its bytes."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from transports.otel.envelope import HEADER_MAX, MARKER, prefix, unwrap, wrap

# Header field names and values as a propagator writes them: printable ASCII, no ":" in a
# name (W3C traceparent/tracestate, baggage, B3...).
names = st.text(
    alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E, exclude_characters=":"),
    min_size=1,
    max_size=20,
)
values = st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=60)
fields = st.dictionaries(names, values, max_size=5)


@given(st.binary(), fields)
def test_wrap_then_unwrap_gives_back_the_body_and_the_fields(body: bytes, carried: dict) -> None:
    enveloped = wrap(body, carried)
    assert enveloped.startswith(MARKER)
    assert unwrap(enveloped) == (carried, body)


@given(st.binary(), fields, fields)
def test_only_one_envelope_comes_off(body: bytes, outer: dict, inner: dict) -> None:
    """A body that is itself enveloped (a message forwarded as it was read) keeps its own."""
    twice = wrap(wrap(body, inner), outer)
    assert unwrap(twice) == (outer, wrap(body, inner))


@given(st.binary().filter(lambda b: not b.startswith(MARKER)))
def test_a_body_without_the_marker_is_returned_unchanged(body: bytes) -> None:
    found, same = unwrap(body)
    assert found is None and same is body


@given(st.binary(max_size=200))
def test_whatever_follows_the_marker_unwrap_never_raises_and_loses_nothing(rest: bytes) -> None:
    body = MARKER + rest
    found, inner = unwrap(body)
    if found is None:
        assert inner is body
    else:  # well formed: exactly an envelope of these fields around the rest
        assert wrap(inner, found) == body


def test_the_documented_layout() -> None:
    """What a plain NSQ client sees: marker, two length bytes, header lines, the body."""
    traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    body = wrap(b'{"order": 1}', {"traceparent": traceparent})
    header = f"traceparent: {traceparent}\n".encode()
    assert body == b"\x1eTC1" + len(header).to_bytes(2, "big") + header + b'{"order": 1}'
    assert len(header) == 69  # 75 bytes in front of the body in all


@pytest.mark.parametrize(
    "body",
    [
        MARKER,  # too short for the length
        MARKER + b"\x00",
        MARKER + b"\x00\x10short",  # a length past the end
        MARKER + b"\x00\x05a: b",  # no line end
        MARKER + b"\x00\x06a\x01: b\n",  # a control character
        MARKER + b"\x00\x05ab c\n",  # no ": "
        MARKER + b"\x00\x06\xff: b\n\n",  # not ASCII
    ],
)
def test_a_malformed_envelope_is_left_on(body: bytes) -> None:
    found, same = unwrap(body)
    assert found is None and same is body


@pytest.mark.parametrize(
    "bad",
    [{"a:b": "c"}, {"": "c"}, {"a": "line\nbreak"}, {"é": "x"}, {"a": "x" * (HEADER_MAX + 1)}],
)
def test_fields_a_header_cannot_hold_are_refused(bad: dict) -> None:
    with pytest.raises(ValueError):
        prefix(bad)
