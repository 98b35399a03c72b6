"""Dead letters, pure: where a given-up message goes, and the JSON envelope that can carry it.

A consumer configured with a dead-letter destination does not FIN a message delivered more
than ``max_attempts`` times: the coordinator hands the transport a
:class:`~nsq_sansio.consumer.DeadLetter` action, the transport publishes the message to the
destination and reports the outcome (``dead_letter_published`` / ``dead_letter_failed``);
only a published message is FIN'd, a failed publish is requeued. This module holds what that
needs and does no IO: the destination's checks (:func:`check_dead_letter_topic`,
:class:`DeadLetterFormat`) and the envelope (:class:`DeadLetterEnvelope`,
:func:`encode_envelope`, :func:`decode_envelope`), which the re-drive command reads to find
a message's source topic.

The envelope is one JSON object (UTF-8), version 1::

    {"nsq_dead_letter": 1,          # the format's version: readers check it
     "id": "0a1b...",               # nsqd's message id, 16 ASCII characters (as nsqd shows it)
     "attempts": 6,                 # deliveries when it was given up
     "timestamp": 1700000000123456789,  # nanoseconds since the epoch: when it was published
     "first_seen": "2023-11-14T22:13:20.123456Z",  # the same, as UTC ISO 8601
     "topic": "orders", "channel": "billing",      # where it was consumed from
     "nsqd": "10.0.0.5:4150",       # the nsqd that delivered it the last time
     "error": "ValueError('bad order')",  # the last handler error seen, or null
     "dead_lettered_at": "2023-11-14T22:20:00.000000Z",
     "body": "eyJvcmRlciI6IDQyfQ=="}  # the original body, base64 (any bytes survive)
"""

from __future__ import annotations

import base64
import binascii
import enum
import json
import re
from dataclasses import dataclass

from .errors import ConfigError, InvalidName, NSQError
from .names import validate_channel, validate_topic

__all__ = [
    "ENVELOPE_VERSION",
    "DeadLetterEnvelope",
    "DeadLetterFormat",
    "EnvelopeError",
    "check_dead_letter_format",
    "check_dead_letter_topic",
    "decode_envelope",
    "encode_envelope",
]

#: The envelope's version, the value of its ``nsq_dead_letter`` field.
ENVELOPE_VERSION = 1

_ISO = re.compile(r"(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})\.(\d{6})Z\Z")


class DeadLetterFormat(enum.Enum):
    """What is published to the dead-letter topic."""

    #: The message's body, unchanged (a consumer of the dead-letter topic sees what the
    #: original consumer saw).
    BODY = "body"
    #: A JSON :class:`DeadLetterEnvelope` around the body (id, attempts, source, last error).
    ENVELOPE = "envelope"


class EnvelopeError(NSQError, ValueError):
    """Bytes that are not a dead-letter envelope this version of the library can read."""


def check_dead_letter_topic(topic: object) -> str:
    """``topic`` if it can be a dead-letter topic, else :class:`~nsq_sansio.errors.ConfigError`
    (an empty or invalid name, or not a string)."""
    if not isinstance(topic, str) or not topic:
        raise ConfigError(f"dead_letter_topic must be a non-empty topic name, got {topic!r}")
    try:
        return validate_topic(topic)
    except InvalidName as exc:
        raise ConfigError(f"dead_letter_topic: {exc}") from None


def check_dead_letter_format(value: object) -> DeadLetterFormat:
    """``"body"`` or ``"envelope"`` (or the enum) as a :class:`DeadLetterFormat`, else
    :class:`~nsq_sansio.errors.ConfigError`."""
    if isinstance(value, DeadLetterFormat):
        return value
    for member in DeadLetterFormat:
        if value == member.value:
            return member
    allowed = ", ".join(repr(m.value) for m in DeadLetterFormat)
    raise ConfigError(f"dead_letter_format must be one of {allowed}, got {value!r}")


@dataclass(frozen=True, slots=True)
class DeadLetterEnvelope:
    """A given-up message as the ``envelope`` format publishes it (see the module docstring)."""

    id: str
    attempts: int
    timestamp: int
    topic: str
    channel: str
    nsqd: str
    error: str | None
    dead_lettered_at: float
    body: bytes

    @property
    def first_seen(self) -> str:
        """When the message was first published (nsqd's timestamp), UTC ISO 8601."""
        return _iso(self.timestamp // 1000)


def _days_from_civil(year: int, month: int, day: int) -> int:
    """Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm: the
    core reads no clock and imports no datetime)."""
    year -= month <= 2
    era = year // 400
    yoe = year - era * 400
    doy = (153 * (month + (-3 if month > 2 else 9)) + 2) // 5 + day - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146097 + doe - 719468


def _civil_from_days(days: int) -> tuple[int, int, int]:
    """The inverse of :func:`_days_from_civil`."""
    days += 719468
    era = days // 146097
    doe = days - era * 146097
    yoe = (doe - doe // 1460 + doe // 36524 - doe // 146096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    day = doy - (153 * mp + 2) // 5 + 1
    month = mp + (3 if mp < 10 else -9)
    return yoe + era * 400 + (month <= 2), month, day


def _iso(micros: int) -> str:
    """``micros`` microseconds since the epoch as ``YYYY-MM-DDTHH:MM:SS.ffffffZ`` (an integer:
    a float of seconds cannot hold every microsecond of dates this far from 1970)."""
    days, rest = divmod(micros, 86_400_000_000)
    year, month, day = _civil_from_days(days)
    second, fraction = divmod(rest, 1_000_000)
    hour, second = divmod(second, 3600)
    minute, second = divmod(second, 60)
    return f"{year:04d}-{month:02d}-{day:02d}T{hour:02d}:{minute:02d}:{second:02d}.{fraction:06d}Z"


def encode_envelope(envelope: DeadLetterEnvelope) -> bytes:
    """The envelope's JSON bytes (keys in the documented order)."""
    document = {
        "nsq_dead_letter": ENVELOPE_VERSION,
        "id": envelope.id,
        "attempts": envelope.attempts,
        "timestamp": envelope.timestamp,
        "first_seen": _iso(envelope.timestamp // 1000),
        "topic": envelope.topic,
        "channel": envelope.channel,
        "nsqd": envelope.nsqd,
        "error": envelope.error,
        "dead_lettered_at": _iso(round(envelope.dead_lettered_at * 1_000_000)),
        "body": base64.b64encode(envelope.body).decode("ascii"),
    }
    return json.dumps(document, separators=(",", ":")).encode()


def _parse_iso(text: object) -> float:
    """The inverse of :func:`_iso`; EnvelopeError for anything else."""
    found = _ISO.match(text) if isinstance(text, str) else None
    if found is None:
        raise EnvelopeError(f"dead_lettered_at must be a UTC ISO 8601 time, got {text!r}")
    year, month, day, hour, minute, second, fraction = map(int, found.groups())
    if not (1 <= month <= 12 and 1 <= day <= 31 and hour < 24 and minute < 60 and second < 60):
        raise EnvelopeError(f"dead_lettered_at is not a valid time: {text!r}")
    days = _days_from_civil(year, month, day)
    return days * 86400 + hour * 3600 + minute * 60 + second + fraction / 1e6


def _text(document: dict[str, object], name: str) -> str:
    value = document.get(name)
    if not isinstance(value, str):
        raise EnvelopeError(f"dead-letter envelope field {name!r} is missing or not a string")
    return value


def _number(document: dict[str, object], name: str) -> int:
    value = document.get(name)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise EnvelopeError(f"dead-letter envelope field {name!r} is missing or not an int >= 0")
    return value


def decode_envelope(data: bytes) -> DeadLetterEnvelope:
    """Read an envelope; :class:`EnvelopeError` when ``data`` is not one (not JSON, another
    version, a field missing or of the wrong type, a source topic/channel that is not a valid
    name, a body that is not base64)."""
    try:
        document = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        raise EnvelopeError("not a dead-letter envelope: not JSON") from None
    if not isinstance(document, dict):
        raise EnvelopeError("not a dead-letter envelope: not a JSON object")
    version = document.get("nsq_dead_letter")
    if version != ENVELOPE_VERSION or isinstance(version, bool):
        raise EnvelopeError(f"not a version {ENVELOPE_VERSION} dead-letter envelope: {version!r}")

    topic = _text(document, "topic")
    channel = _text(document, "channel")
    try:
        validate_topic(topic)
        validate_channel(channel)
    except InvalidName as exc:
        raise EnvelopeError(f"dead-letter envelope: {exc}") from None
    error = document.get("error")
    if error is not None and not isinstance(error, str):
        raise EnvelopeError("dead-letter envelope field 'error' must be a string or null")
    try:
        body = base64.b64decode(_text(document, "body"), validate=True)
    except (binascii.Error, ValueError):
        raise EnvelopeError("dead-letter envelope field 'body' is not base64") from None
    return DeadLetterEnvelope(
        id=_text(document, "id"),
        attempts=_number(document, "attempts"),
        timestamp=_number(document, "timestamp"),
        topic=topic,
        channel=channel,
        nsqd=_text(document, "nsqd"),
        error=error,
        dead_lettered_at=_parse_iso(document.get("dead_lettered_at")),
        body=body,
    )
