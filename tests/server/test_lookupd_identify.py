"""The lookupd role's IDENTIFY: undecodable bodies are an E_BAD_BODY answer, never a crash."""

from __future__ import annotations

import struct

import pytest

from nsq_sansio.server.lookupd import ClientClosed, ClientError, LookupConnState, Lookupd


def _answers(data: bytes) -> list[bytes]:
    out = []
    while data:
        (size,) = struct.unpack(">i", data[:4])
        out.append(data[4 : 4 + size])
        data = data[4 + size :]
    return out


@pytest.mark.parametrize(
    "body",
    [
        b"[" * 30_000 + b"]" * 30_000,  # deeper than the interpreter's stack: RecursionError
        b'{"a":' * 8_000 + b"1" + b"}" * 8_000,  # 48 KiB, under the 64 KiB body limit
        b"\xff\xfe{",  # not UTF-8
    ],
    ids=["nested-arrays", "nested-objects", "not-utf8"],
)
def test_undecodable_identify_body_is_e_bad_body_and_others_are_served(body: bytes) -> None:
    lookupd = Lookupd()
    h = lookupd.connect("10.0.0.9:1", 0.0)
    events = lookupd.receive_data(h, b"  V1IDENTIFY\n" + struct.pack(">i", len(body)) + body, 0.0)
    assert [e.code for e in events if isinstance(e, ClientError)] == ["E_BAD_BODY"]
    assert isinstance(events[-1], ClientClosed)
    assert lookupd.connection_state(h) is LookupConnState.CLOSED
    assert _answers(lookupd.data_to_send(h))[-1].startswith(b"E_BAD_BODY IDENTIFY failed")
    # the role keeps serving other connections
    other = lookupd.connect("10.0.0.9:2", 0.0)
    lookupd.receive_data(other, b"  V1PING\n", 0.0)
    assert _answers(lookupd.data_to_send(other)) == [b"OK"]
