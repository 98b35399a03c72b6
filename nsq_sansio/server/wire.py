"""nsqd's protocol V2 vocabulary on the server side: frame types and headers, the ``E_*`` answer
a command can fail with, and the Go formatting nsqd's texts use (``%q``, ``ByteToBase10``,
``time.Duration`` in JSON).

Parsing the commands themselves is :mod:`nsq_sansio.server.protocol_v2`; this module only
holds what that module, the channels (which frame the messages they deliver) and the HTTP
answers share.
"""

from __future__ import annotations

import json
import struct

__all__ = [
    "BODY_COMMANDS",
    "CLOSE_WAIT",
    "FRAME_ERROR",
    "FRAME_HEADER",
    "FRAME_MESSAGE",
    "FRAME_RESPONSE",
    "HEARTBEAT",
    "I32",
    "MAGIC_V2",
    "MESSAGE_FRAME_HEADER",
    "OK",
    "ClientError",
    "base10",
    "frame",
    "go_quote",
    "nanoseconds",
    "text",
]

MAGIC_V2 = b"  V2"
HEARTBEAT = b"_heartbeat_"
OK = b"OK"
CLOSE_WAIT = b"CLOSE_WAIT"
FRAME_RESPONSE = 0
FRAME_ERROR = 1
FRAME_MESSAGE = 2
#: size, frame type
FRAME_HEADER = struct.Struct(">ii")
#: size, frame type, timestamp, attempts (the 16-byte id and the body follow)
MESSAGE_FRAME_HEADER = struct.Struct(">iiqH")
I32 = struct.Struct(">i")
#: The commands whose line is followed by a 4-byte size and a body.
BODY_COMMANDS = frozenset({b"IDENTIFY", b"AUTH", b"PUB", b"MPUB", b"DPUB"})


def frame(frame_type: int, data: bytes) -> bytes:
    """One frame: size, type, data."""
    return FRAME_HEADER.pack(len(data) + 4, frame_type) + data


class ClientError(Exception):
    """An ``E_*`` answer to a command (internal control flow, never escapes the node)."""

    __slots__ = ("code", "fatal", "text")

    def __init__(self, code: str, text: str, *, fatal: bool = True) -> None:
        super().__init__(code, text)
        self.code = code
        self.text = text
        self.fatal = fatal


def go_quote(value: bytes | str) -> str:
    """Approximate Go's ``%q``: a double-quoted string with escapes."""
    if isinstance(value, bytes):
        value = value.decode("utf-8", "backslashreplace")
    return json.dumps(value, ensure_ascii=False)


def nanoseconds(seconds: float) -> int:
    """A duration as Go's ``time.Duration`` (integer nanoseconds) for JSON answers."""
    return round(seconds * 1_000_000_000)


def text(value: bytes) -> str:
    """Bytes from the wire, for an error text."""
    return value.decode("utf-8", "replace")


def base10(value: bytes) -> int | None:
    """nsqd's ``ByteToBase10``: digits only (empty is 0), anything else is an error."""
    if not value:
        return 0
    if not value.isdigit():
        return None
    if len(value) > 19:
        return 1 << 63
    return int(value)
