"""The trace context envelope: how a message body carries a trace context (NSQ has no headers).

Needs nothing but Python, so a consumer without OpenTelemetry can take the envelope off too::

    from transports.otel.envelope import unwrap

    fields, body = unwrap(msg.body)   # fields: None when the body had no envelope

Layout (version 1), all of it in front of the original body, which follows unchanged::

    offset 0   4 bytes   MARKER: 0x1E 'T' 'C' '1' (ASCII record separator, "TC", version 1)
    offset 4   2 bytes   N: the header's length in bytes, unsigned big-endian
    offset 6   N bytes   the header: ASCII lines "name: value\\n", one per trace context
                         field (W3C: "traceparent", and "tracestate" when there is one)
    offset 6+N           the original body

The marker cannot start a JSON text (nor a JSON text sequence record, whose 0x1E is followed
by JSON) and is an invalid first byte for protobuf (field 3, wire type 6), so bodies of
those formats never look enveloped. :func:`unwrap` takes an envelope off only when all of it
is well formed (marker, a length within the body, header lines of printable ASCII); anything
else, and every body that does not start with the marker, is returned as it was.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["HEADER_MAX", "MARKER", "prefix", "unwrap", "wrap"]

#: The four bytes every envelope starts with.
MARKER = b"\x1eTC1"

#: The longest header the two length bytes can say.
HEADER_MAX = 0xFFFF

_FIXED = len(MARKER) + 2


def prefix(fields: Mapping[str, str]) -> bytes:
    """The bytes put in front of a body to carry ``fields`` (marker, length, header): the
    same for every body of one publish, so an MPUB builds it once. ValueError for a field
    name or value that a header line cannot hold (not printable ASCII, a ``:`` in the name,
    a line break) or a header over :data:`HEADER_MAX` bytes."""
    lines = []
    for name, value in fields.items():
        if not _printable(name) or ":" in name or not name or not _printable(value):
            raise ValueError(f"trace context field {name!r}: {value!r} is not a header line")
        lines.append(f"{name}: {value}\n")
    header = "".join(lines).encode("ascii")
    if len(header) > HEADER_MAX:
        raise ValueError(f"trace context header of {len(header)} bytes (at most {HEADER_MAX})")
    return MARKER + len(header).to_bytes(2, "big") + header


def wrap(body: bytes, fields: Mapping[str, str]) -> bytes:
    """``body`` with an envelope carrying ``fields`` in front of it (see :func:`prefix`)."""
    return prefix(fields) + body


def unwrap(body: bytes) -> tuple[dict[str, str] | None, bytes]:
    """``(fields, original body)`` of an enveloped body; ``(None, body)`` (the same object)
    for a body without an envelope or with one that is not well formed."""
    if not body.startswith(MARKER) or len(body) < _FIXED:
        return None, body
    end = _FIXED + int.from_bytes(body[len(MARKER) : _FIXED], "big")
    if end > len(body):
        return None, body
    try:
        text = body[_FIXED:end].decode("ascii")
    except UnicodeDecodeError:
        return None, body
    if text and not text.endswith("\n"):
        return None, body
    fields: dict[str, str] = {}
    for line in text.split("\n")[:-1]:
        name, sep, value = line.partition(": ")
        if not sep or not name or ":" in name or not _printable(line):
            return None, body
        fields[name] = value
    return fields, body[end:]


def _printable(text: str) -> bool:
    """Printable ASCII only (space to ``~``): no line break, no control character."""
    return text.isascii() and text.isprintable()
