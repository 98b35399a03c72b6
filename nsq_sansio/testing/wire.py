"""Protocol V2 as seen on a simulated wire: what a client wrote, what nsqd wrote.

The observer parses both pipes of one client<->nsqd connection independently of the state
machines that produced the bytes, so invariants check what really went over the wire (a bug in
a client's bookkeeping cannot hide itself). Compressed connections become opaque after the
IDENTIFY answer turns compression on; the simulator runs without compression by default.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["ClientCommand", "CommandParser", "FrameParser", "ServerFrame"]

_I32 = struct.Struct(">i")
_MSG = struct.Struct(">qH")
_BODY_VERBS = frozenset({b"IDENTIFY", b"PUB", b"MPUB", b"DPUB", b"AUTH"})


@dataclass(frozen=True, slots=True)
class ClientCommand:
    """One command a client wrote: the verb, its arguments and the body (if it has one)."""

    verb: bytes
    args: tuple[bytes, ...]
    body: bytes = b""


@dataclass(frozen=True, slots=True)
class ServerFrame:
    """One frame nsqd wrote; for messages, ``message`` is ``(id, attempts, body)``."""

    frame_type: int
    data: bytes
    message: tuple[bytes, int, bytes] | None = None


class CommandParser:
    """Incremental parser of a client's command stream (after the 4-byte magic)."""

    __slots__ = ("_buf", "_magic")

    def __init__(self) -> None:
        self._buf = bytearray()
        self._magic = False

    def feed(self, data: bytes) -> list[ClientCommand]:
        buf = self._buf
        buf += data
        out: list[ClientCommand] = []
        pos = 0
        if not self._magic:
            if len(buf) < 4:
                return out
            self._magic = True
            pos = 4
        end = len(buf)
        while pos < end:
            nl = buf.find(b"\n", pos)
            if nl < 0:
                break
            parts = bytes(buf[pos:nl]).rstrip(b"\r").split(b" ")
            verb = parts[0]
            if verb in _BODY_VERBS:
                if end - (nl + 1) < 4:
                    break
                (size,) = _I32.unpack_from(buf, nl + 1)
                stop = nl + 5 + size
                if stop > end:
                    break
                out.append(ClientCommand(verb, tuple(parts[1:]), bytes(buf[nl + 5 : stop])))
                pos = stop
            else:
                out.append(ClientCommand(verb, tuple(parts[1:])))
                pos = nl + 1
        del buf[:pos]
        return out


class FrameParser:
    """Incremental parser of nsqd's frame stream."""

    __slots__ = ("_buf", "consumed")

    def __init__(self) -> None:
        self._buf = bytearray()
        #: Bytes of the stream parsed into frames so far (during ``on_frame``: up to the end
        #: of that frame).
        self.consumed = 0

    def feed(self, data: bytes, on_frame: Callable[[ServerFrame], None]) -> None:
        buf = self._buf
        buf += data
        pos = 0
        end = len(buf)
        while end - pos >= 8:
            (size,) = _I32.unpack_from(buf, pos)
            stop = pos + 4 + size
            if stop > end:
                break
            (frame_type,) = _I32.unpack_from(buf, pos + 4)
            self.consumed += stop - pos
            if frame_type == 2:
                _, attempts = _MSG.unpack_from(buf, pos + 8)
                message = (bytes(buf[pos + 18 : pos + 34]), attempts, bytes(buf[pos + 34 : stop]))
                on_frame(ServerFrame(2, b"", message))
            else:
                on_frame(ServerFrame(frame_type, bytes(buf[pos + 8 : stop])))
            pos = stop
        del buf[:pos]


def identify_answer(data: bytes) -> dict[str, object] | None:
    """The JSON object of an IDENTIFY answer, or None for anything else."""
    if not data.startswith(b"{"):
        return None
    try:
        parsed = json.loads(data)
    except ValueError:
        return None
    return parsed if isinstance(parsed, dict) else None
