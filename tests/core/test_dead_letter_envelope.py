"""The dead-letter envelope and destination checks: what is written reads back the same,
anything else is an EnvelopeError (never another exception), bad settings a ConfigError."""

from __future__ import annotations

import contextlib
import json

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from nsq_sansio.dead_letter import (
    DeadLetterEnvelope,
    DeadLetterFormat,
    EnvelopeError,
    check_dead_letter_format,
    check_dead_letter_topic,
    decode_envelope,
    encode_envelope,
)
from nsq_sansio.errors import ConfigError

names = st.from_regex(r"[.a-zA-Z0-9_-]{1,64}", fullmatch=True)
envelopes = st.builds(
    DeadLetterEnvelope,
    id=st.text("0123456789abcdef", min_size=16, max_size=16),
    attempts=st.integers(1, 65535),
    timestamp=st.integers(0, 2**62),
    topic=names,
    channel=names,
    nsqd=st.just("127.0.0.1:4150"),
    error=st.none() | st.text(max_size=50),
    dead_lettered_at=st.integers(0, 4_000_000_000_000_000).map(lambda us: us / 1e6),
    body=st.binary(max_size=200),
)


@given(envelopes)
def test_an_envelope_reads_back_as_written(envelope: DeadLetterEnvelope) -> None:
    data = encode_envelope(envelope)
    back = decode_envelope(data)
    assert back.body == envelope.body
    assert (back.id, back.attempts, back.timestamp) == (
        envelope.id,
        envelope.attempts,
        envelope.timestamp,
    )
    assert (back.topic, back.channel, back.nsqd, back.error) == (
        envelope.topic,
        envelope.channel,
        envelope.nsqd,
        envelope.error,
    )
    assert back.dead_lettered_at == pytest.approx(envelope.dead_lettered_at, abs=1e-6)
    document = json.loads(data)
    assert document["nsq_dead_letter"] == 1
    assert document["first_seen"].endswith("Z")


@given(st.binary(max_size=300))
def test_garbage_is_an_envelope_error(data: bytes) -> None:
    with contextlib.suppress(EnvelopeError):
        decode_envelope(data)


@given(envelopes, st.sampled_from(["id", "topic", "attempts", "body", "nsq_dead_letter"]))
def test_a_field_missing_or_wrong_is_an_envelope_error(
    envelope: DeadLetterEnvelope, field: str
) -> None:
    document = json.loads(encode_envelope(envelope))
    for broken in (None, True, [1], "not base64!" if field == "body" else 2.5):
        document[field] = broken
        with pytest.raises(EnvelopeError):
            decode_envelope(json.dumps(document).encode())
    del document[field]
    with pytest.raises(EnvelopeError):
        decode_envelope(json.dumps(document).encode())


def test_a_source_that_is_not_a_topic_name_is_refused() -> None:
    envelope = DeadLetterEnvelope("a" * 16, 3, 0, "orders", "c", "h:1", None, 0.0, b"x")
    document = json.loads(encode_envelope(envelope))
    document["topic"] = "no spaces allowed"
    with pytest.raises(EnvelopeError):
        decode_envelope(json.dumps(document).encode())


@pytest.mark.parametrize("bad", ["", "has space", "x" * 65, None, 3, b"orders.dead"])
def test_bad_dead_letter_topics_are_config_errors(bad: object) -> None:
    with pytest.raises(ConfigError):
        check_dead_letter_topic(bad)


def test_formats() -> None:
    assert check_dead_letter_format("body") is DeadLetterFormat.BODY
    assert check_dead_letter_format("envelope") is DeadLetterFormat.ENVELOPE
    assert check_dead_letter_format(DeadLetterFormat.ENVELOPE) is DeadLetterFormat.ENVELOPE
    for bad in ("json", "", None, 1):
        with pytest.raises(ConfigError):
            check_dead_letter_format(bad)


@given(st.integers(0, 253_402_300_799_999_999))  # microseconds up to 9999-12-31
@example(4_381_479_658_827_453)  # a float of seconds rounds it to ...452
def test_times_are_written_as_datetime_writes_them(micros: int) -> None:
    # The core imports no datetime (no clock module): its own calendar arithmetic must agree.
    import datetime

    from nsq_sansio.dead_letter import _iso, _parse_iso

    seconds = micros / 1e6
    moment = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc) + datetime.timedelta(
        microseconds=micros
    )
    assert _iso(micros) == moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    assert _parse_iso(_iso(micros)) == pytest.approx(seconds, abs=2e-6)
