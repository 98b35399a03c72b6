"""Protocol V2 wire codec: server frames (decode and encode) and client commands (encode).

A server frame is ``[4-byte size][4-byte type][data]`` (big endian, size counts type + data).
A message frame's data is ``[8-byte ns timestamp][2-byte attempts][16-byte id][body]``.
Commands are a line (``VERB args\\n``), some followed by ``[4-byte size][body]``.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping, Sequence
from enum import IntEnum

from .errors import FrameTooLarge, LocalProtocolError, RemoteProtocolError
from .events import Message
from .names import validate_channel, validate_topic

__all__ = [
    "CLOSE_WAIT",
    "DEFAULT_MAX_FRAME_SIZE",
    "HEARTBEAT",
    "MAGIC_V1",
    "MAGIC_V2",
    "MESSAGE_HEADER_SIZE",
    "MESSAGE_ID_SIZE",
    "OK",
    "FrameDecoder",
    "FrameType",
    "decode_message",
    "encode_auth",
    "encode_checked_mpub",
    "encode_cls",
    "encode_dpub",
    "encode_fin",
    "encode_frame",
    "encode_identify",
    "encode_message_frame",
    "encode_mpub",
    "encode_nop",
    "encode_pub",
    "encode_rdy",
    "encode_req",
    "encode_sub",
    "encode_touch",
]

MAGIC_V1 = b"  V1"
MAGIC_V2 = b"  V2"
HEARTBEAT = b"_heartbeat_"
OK = b"OK"
CLOSE_WAIT = b"CLOSE_WAIT"

MESSAGE_ID_SIZE = 16
MESSAGE_HEADER_SIZE = 8 + 2 + MESSAGE_ID_SIZE
#: Largest frame accepted by default: nsqd's default --max-msg-size (1 MiB) with ample room for
#: servers configured higher. A frame announcing more is refused before anything is buffered.
DEFAULT_MAX_FRAME_SIZE = 16 * 1024 * 1024
#: The largest value a 4-byte signed size field can carry; bodies above it cannot be framed.
_MAX_SIZE_FIELD = 0x7FFFFFFF


class FrameType(IntEnum):
    """The three kinds of frame nsqd sends."""

    RESPONSE = 0
    ERROR = 1
    MESSAGE = 2


_U32 = struct.Struct(">I")
_HEADER = struct.Struct(">II")
_MESSAGE_HEADER = struct.Struct(">qH")
_FRAME_AND_MESSAGE_HEADER = struct.Struct(">iiqH")


# --- server frames -------------------------------------------------------------------------


def encode_frame(frame_type: int, data: bytes) -> bytes:
    """Frame ``data`` as a server frame of ``frame_type``."""
    return _HEADER.pack(len(data) + 4, frame_type) + data


def encode_message_frame(message_id: bytes, timestamp_ns: int, attempts: int, body: bytes) -> bytes:
    """Build a complete message frame (what nsqd pushes to a subscribed client)."""
    if len(message_id) != MESSAGE_ID_SIZE:
        raise LocalProtocolError(
            f"message id must be {MESSAGE_ID_SIZE} bytes, got {len(message_id)}"
        )
    if not 0 <= attempts <= 0xFFFF:
        raise LocalProtocolError(f"attempts must be within 0..65535, got {attempts}")
    return (
        _FRAME_AND_MESSAGE_HEADER.pack(
            4 + MESSAGE_HEADER_SIZE + len(body), FrameType.MESSAGE, timestamp_ns, attempts
        )
        + message_id
        + body
    )


def decode_message(data: bytes) -> Message:
    """Decode a message frame's data (timestamp, attempts, id, body)."""
    if len(data) < MESSAGE_HEADER_SIZE:
        raise RemoteProtocolError(
            f"message frame of {len(data)} bytes is shorter than its "
            f"{MESSAGE_HEADER_SIZE}-byte header"
        )
    timestamp, attempts = _MESSAGE_HEADER.unpack_from(data, 0)
    return Message(bytes(data[10:26]), bytes(data[26:]), timestamp, attempts)


def check_frame_size(size: int, max_frame_size: int) -> None:
    """Refuse a frame size before buffering anything for it."""
    if size < 4:
        raise RemoteProtocolError(f"frame size {size} is smaller than the 4-byte frame type")
    if size > max_frame_size:
        raise FrameTooLarge(size, max_frame_size)


class FrameDecoder:
    """Incremental decoder of server frames; accepts the stream in chunks of any size.

    What it holds between calls is at most one incomplete frame, and a frame is refused as soon as
    its size field announces more than ``max_frame_size``, so memory stays bounded.
    """

    __slots__ = ("_buffer", "_error", "max_frame_size")

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        if max_frame_size < 4 + MESSAGE_HEADER_SIZE:
            raise LocalProtocolError(f"max_frame_size must be at least 30, got {max_frame_size}")
        self.max_frame_size = max_frame_size
        self._buffer = bytearray()
        self._error: RemoteProtocolError | None = None

    @property
    def buffered(self) -> int:
        """Bytes held for a frame that is not complete yet."""
        return len(self._buffer)

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        """Add ``data``; return every frame it completes as ``(frame_type, payload)``.

        A broken stream raises :class:`RemoteProtocolError`; frames completed before the break are
        returned first and the error is raised by the next call, so no chunking loses frames.
        """
        if self._error is not None:
            raise self._error
        buffer = self._buffer
        buffer += data
        frames: list[tuple[int, bytes]] = []
        end = len(buffer)
        pos = 0
        limit = self.max_frame_size
        try:
            with memoryview(buffer) as view:
                while end - pos >= 8:
                    size, frame_type = _HEADER.unpack_from(buffer, pos)
                    if size < 4 or size > limit:
                        check_frame_size(size, limit)
                    stop = pos + 4 + size
                    if stop > end:
                        break
                    frames.append((frame_type, bytes(view[pos + 8 : stop])))
                    pos = stop
                if end - pos >= 4:
                    check_frame_size(_U32.unpack_from(buffer, pos)[0], limit)
        except RemoteProtocolError as exc:
            self._error = exc
            buffer.clear()
            pos = 0
            if not frames:
                raise
        finally:
            del buffer[:pos]
        return frames


# --- client commands -----------------------------------------------------------------------


def _sized(body: bytes) -> bytes:
    if len(body) > _MAX_SIZE_FIELD:
        raise LocalProtocolError(
            f"body of {len(body)} bytes cannot be framed (max {_MAX_SIZE_FIELD})"
        )
    return _U32.pack(len(body)) + body


def _check_body(body: bytes) -> bytes:
    """The body as ``bytes`` (a memoryview's length counts items, not bytes), never empty."""
    if type(body) is not bytes:
        if not isinstance(body, (bytearray, memoryview)):
            raise LocalProtocolError(f"message body must be bytes, not {type(body).__name__}")
        body = bytes(body)
    if not body:
        raise LocalProtocolError("message body must not be empty (nsqd rejects empty messages)")
    return body


def check_message_id(message_id: bytes) -> None:
    """Message ids are exactly 16 bytes (nsqd sends them as ASCII hex)."""
    if not isinstance(message_id, bytes) or len(message_id) != MESSAGE_ID_SIZE:
        raise LocalProtocolError(f"message id must be {MESSAGE_ID_SIZE} bytes, got {message_id!r}")


def encode_identify(fields: Mapping[str, object]) -> bytes:
    """``IDENTIFY`` with a JSON body of client metadata and requested features."""
    try:
        body = json.dumps(dict(fields), separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise LocalProtocolError(f"IDENTIFY fields must be plain JSON values: {exc}") from exc
    return b"IDENTIFY\n" + _sized(body.encode())


def encode_auth(secret: bytes | str) -> bytes:
    """``AUTH`` with the secret as body."""
    if isinstance(secret, str):
        secret = secret.encode()
    return b"AUTH\n" + _sized(secret)


def encode_sub(topic: str, channel: str) -> bytes:
    """``SUB <topic> <channel>``."""
    validate_topic(topic)
    validate_channel(channel)
    return f"SUB {topic} {channel}\n".encode()


def encode_pub(topic: str, body: bytes) -> bytes:
    """``PUB <topic>`` with one message body."""
    validate_topic(topic)
    return b"PUB " + topic.encode() + b"\n" + _sized(_check_body(body))


def encode_mpub(topic: str, bodies: Sequence[bytes]) -> bytes:
    """``MPUB <topic>`` with a count and each body size-prefixed (published atomically)."""
    validate_topic(topic)
    if isinstance(bodies, (bytes, bytearray, str)):
        raise LocalProtocolError("multi_publish takes a sequence of bodies, not one body")
    if not bodies:
        raise LocalProtocolError("multi_publish needs at least one message body")
    return encode_checked_mpub(topic, list(map(_check_body, bodies)))


def encode_checked_mpub(topic: str, bodies: Sequence[bytes]) -> bytes:
    """``MPUB`` of bodies already checked (non-empty ``bytes``) to a topic already validated:
    the encoding alone, for a caller that checked each body as it came (coalesced PUBs)."""
    parts: list[bytes] = [b""] * (2 * len(bodies))
    parts[0::2] = map(_U32.pack, map(len, bodies))
    parts[1::2] = bodies
    payload = _U32.pack(len(bodies)) + b"".join(parts)
    return b"MPUB " + topic.encode() + b"\n" + _sized(payload)


def encode_dpub(topic: str, delay_ms: int, body: bytes) -> bytes:
    """``DPUB <topic> <delay ms>``: publish a message held back for ``delay_ms``."""
    validate_topic(topic)
    body = _check_body(body)
    if not isinstance(delay_ms, int) or delay_ms < 0:
        raise LocalProtocolError(f"DPUB delay must be a non-negative int of ms, got {delay_ms!r}")
    return f"DPUB {topic} {delay_ms}\n".encode() + _sized(body)


def encode_rdy(count: int) -> bytes:
    """``RDY <count>``: how many messages may be in flight to this connection."""
    if not isinstance(count, int) or count < 0:
        raise LocalProtocolError(f"RDY count must be a non-negative int, got {count!r}")
    return b"RDY %d\n" % count


def encode_fin(message_id: bytes) -> bytes:
    """``FIN <id>``: the message was handled."""
    check_message_id(message_id)
    return b"FIN " + message_id + b"\n"


def encode_req(message_id: bytes, delay_ms: int) -> bytes:
    """``REQ <id> <delay ms>``: put the message back, deliverable again after ``delay_ms``."""
    check_message_id(message_id)
    if not isinstance(delay_ms, int) or delay_ms < 0:
        raise LocalProtocolError(f"REQ delay must be a non-negative int of ms, got {delay_ms!r}")
    return b"REQ " + message_id + b" %d\n" % delay_ms


def encode_touch(message_id: bytes) -> bytes:
    """``TOUCH <id>``: reset the message's timeout on the server."""
    check_message_id(message_id)
    return b"TOUCH " + message_id + b"\n"


def encode_cls() -> bytes:
    """``CLS``: stop sending messages; the server answers ``CLOSE_WAIT``."""
    return b"CLS\n"


def encode_nop() -> bytes:
    """``NOP``: the answer to a heartbeat."""
    return b"NOP\n"
