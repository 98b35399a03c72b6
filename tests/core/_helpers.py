"""Shared builders for the core tests: server-side frames and connections in a given state."""

from __future__ import annotations

import json
from typing import Any

from nsq_sansio import ClientConnection, ConnectionState
from nsq_sansio.events import Event
from nsq_sansio.frames import FrameType, encode_frame, encode_message_frame

MID = b"0123456789abcdef"
MID2 = b"fedcba9876543210"


def response(data: bytes) -> bytes:
    return encode_frame(FrameType.RESPONSE, data)


def error(data: bytes) -> bytes:
    return encode_frame(FrameType.ERROR, data)


def message(
    message_id: bytes = MID,
    body: bytes = b"hello",
    timestamp: int = 1_700_000_000_000_000_000,
    attempts: int = 1,
) -> bytes:
    return encode_message_frame(message_id, timestamp, attempts, body)


def identify_answer(**fields: Any) -> bytes:
    return response(json.dumps(fields).encode())


OK = response(b"OK")
HEARTBEAT = response(b"_heartbeat_")
CLOSE_WAIT = response(b"CLOSE_WAIT")


def ready_conn(max_frame_size: int | None = None, **identify: Any) -> ClientConnection:
    """A connection past IDENTIFY (old-server plain OK), outbound buffer drained."""
    if max_frame_size is None:
        conn = ClientConnection(identify or None)
    else:
        conn = ClientConnection(identify or None, max_frame_size=max_frame_size)
    events = conn.receive_data(OK, now=0.0)
    assert conn.state is ConnectionState.READY, events
    conn.data_to_send()
    return conn


def subscribed_conn(
    rdy: int = 10, max_frame_size: int | None = None, **identify: Any
) -> ClientConnection:
    conn = ready_conn(max_frame_size, **identify)
    conn.subscribe("topic", "channel")
    conn.receive_data(OK)
    assert conn.state is ConnectionState.SUBSCRIBED
    if rdy:
        conn.send_ready(rdy)
    conn.data_to_send()
    return conn


def feed_all(conn: ClientConnection, chunks: list[bytes]) -> list[Event]:
    events: list[Event] = []
    for chunk in chunks:
        events.extend(conn.receive_data(chunk))
    return events
