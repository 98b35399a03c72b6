"""The error hierarchy: ``ProtocolError`` covers both who broke the protocol, as in h11."""

from __future__ import annotations

import pytest

from nsq_sansio import ClientConnection, ConnectionClosed
from nsq_sansio.errors import (
    CompressionError,
    FrameTooLarge,
    InvalidName,
    LocalProtocolError,
    ProtocolError,
    RemoteProtocolError,
)


def test_a_frame_the_peer_broke_is_a_remote_protocol_error() -> None:
    conn = ClientConnection()
    conn.data_to_send()
    # a frame that announces 2 bytes: shorter than its 4-byte frame type
    events = conn.receive_data(b"\x00\x00\x00\x02\x00\x00", now=0.0)
    closed = [e for e in events if isinstance(e, ConnectionClosed)]
    assert closed, events
    error = closed[0].error
    assert isinstance(error, RemoteProtocolError)
    assert isinstance(error, ProtocolError)
    assert not isinstance(error, LocalProtocolError)


def test_misuse_is_a_local_protocol_error_caught_by_protocol_error() -> None:
    conn = ClientConnection()
    with pytest.raises(ProtocolError) as info:
        conn.finish(b"0123456789abcdef")  # not subscribed, nothing in flight
    assert isinstance(info.value, LocalProtocolError)
    assert not isinstance(info.value, RemoteProtocolError)


def test_the_families_do_not_overlap() -> None:
    assert issubclass(FrameTooLarge, RemoteProtocolError)
    assert issubclass(CompressionError, RemoteProtocolError)
    assert issubclass(InvalidName, LocalProtocolError)
    assert not issubclass(LocalProtocolError, RemoteProtocolError)
    assert not issubclass(RemoteProtocolError, LocalProtocolError)
