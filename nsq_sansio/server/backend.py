"""Overflow storage for topics and channels (nsqd's "backend queue"), and its record format.

A topic or channel keeps at most ``mem_queue_size`` messages in memory; the rest go to its
backend, a FIFO of opaque records. The record is nsqd's on-disk message layout
(``[8-byte ns timestamp][2-byte attempts][16-byte id][body]``), so one format serves the
in-memory backend here and the durable file backend in ``transports/embedded``.
"""

from __future__ import annotations

import struct
from collections import deque
from collections.abc import Callable
from typing import NamedTuple, Protocol, runtime_checkable

from ..errors import NSQError

__all__ = [
    "RECORD_HEADER_SIZE",
    "Backend",
    "BackendError",
    "BackendFactory",
    "BackendRecord",
    "DiscardBackend",
    "MemoryBackend",
    "backend_name",
    "decode_record",
    "encode_record",
    "memory_backend_factory",
]

_RECORD_HEADER = struct.Struct(">qH")
#: The shortest record: timestamp, attempts and id, with an empty body.
RECORD_HEADER_SIZE = _RECORD_HEADER.size + 16


class BackendError(NSQError):
    """A backend could not store a record (full, or its storage failed); the text says why."""


class BackendRecord(NamedTuple):
    """One decoded backend record."""

    message_id: bytes
    timestamp_ns: int
    attempts: int
    body: bytes


def encode_record(message_id: bytes, timestamp_ns: int, attempts: int, body: bytes) -> bytes:
    """Serialise a message for a backend (nsqd's message layout, as written to its disk queue)."""
    return _RECORD_HEADER.pack(timestamp_ns, attempts) + message_id + body


def decode_record(data: bytes) -> BackendRecord | None:
    """Parse a record written by :func:`encode_record`; ``None`` if it is too short to be one."""
    if len(data) < RECORD_HEADER_SIZE:
        return None
    timestamp_ns, attempts = _RECORD_HEADER.unpack_from(data, 0)
    return BackendRecord(bytes(data[10:26]), timestamp_ns, attempts, bytes(data[26:]))


def backend_name(topic: str, channel: str | None = None) -> str:
    """The queue name nsqd gives a backend: ``topic``, or ``topic:channel`` for a channel."""
    return topic if channel is None else f"{topic}:{channel}"


@runtime_checkable
class Backend(Protocol):
    """A FIFO of records beyond the in-memory queue. ``put`` raises :class:`BackendError`."""

    @property
    def depth(self) -> int:
        """Records stored and not yet taken by ``get``."""
        ...

    def put(self, data: bytes) -> None:
        """Append a record; raise :class:`BackendError` if it cannot be kept."""
        ...

    def get(self) -> bytes | None:
        """Remove and return the oldest record, or ``None`` when there is none."""
        ...

    def empty(self) -> None:
        """Drop every record."""
        ...

    def close(self) -> None:
        """Release resources; records stay (a durable backend finds them again on reopen)."""
        ...

    def delete(self) -> None:
        """Drop every record and the storage itself (the topic or channel was deleted)."""
        ...


#: Makes the backend of a topic or channel from its :func:`backend_name`.
BackendFactory = Callable[[str], Backend]


class MemoryBackend:
    """The default backend: records in a deque, optionally bounded by count and bytes.

    Unbounded by default, like nsqd's disk queue (which only disk space bounds); set
    ``max_depth`` / ``max_bytes`` to make overflowing publishes fail with ``E_PUB_FAILED``
    instead of growing memory.
    """

    __slots__ = ("_bytes", "_records", "max_bytes", "max_depth")

    def __init__(self, max_depth: int | None = None, max_bytes: int | None = None) -> None:
        self.max_depth = max_depth
        self.max_bytes = max_bytes
        self._records: deque[bytes] = deque()
        self._bytes = 0

    @property
    def depth(self) -> int:
        """Records held now."""
        return len(self._records)

    @property
    def size_bytes(self) -> int:
        """Bytes held in records."""
        return self._bytes

    def put(self, data: bytes) -> None:
        """Append one record (dropped, counted, when the bounds are reached)."""
        if self.max_depth is not None and len(self._records) >= self.max_depth:
            raise BackendError(f"memory backend is full ({self.max_depth} records)")
        if self.max_bytes is not None and self._bytes + len(data) > self.max_bytes:
            raise BackendError(f"memory backend is full ({self.max_bytes} bytes)")
        self._records.append(data)
        self._bytes += len(data)

    def get(self) -> bytes | None:
        """The oldest record, removed; None when empty."""
        if not self._records:
            return None
        data = self._records.popleft()
        self._bytes -= len(data)
        return data

    def empty(self) -> None:
        """Drop every record (nsqd's empty topic/channel)."""
        self._records.clear()
        self._bytes = 0

    def close(self) -> None:
        """Nothing to release; records stay until the object is dropped."""

    def delete(self) -> None:
        """Drop every record for good (the topic or channel was deleted)."""
        self.empty()


class DiscardBackend:
    """nsqd's backend for ``#ephemeral`` topics and channels: overflow is dropped, silently."""

    __slots__ = ("discarded",)

    def __init__(self) -> None:
        self.discarded = 0

    @property
    def depth(self) -> int:
        """Always 0: nothing is kept."""
        return 0

    def put(self, data: bytes) -> None:
        """Drop the record, counting it in ``discarded``."""
        self.discarded += 1

    def get(self) -> bytes | None:
        """Always None: nothing is kept."""
        return None

    def empty(self) -> None:
        """Nothing is kept."""

    def close(self) -> None:
        """Nothing to release."""

    def delete(self) -> None:
        """Nothing is kept."""


def memory_backend_factory(name: str) -> Backend:
    """The default :data:`BackendFactory`: an unbounded :class:`MemoryBackend` per queue."""
    return MemoryBackend()
