"""A client's input is run in bounded steps, by the nsqd role and the lookupd role.

A few KiB of deflate can stand for millions of commands: each ``receive_data`` (and each
``handle_timer`` after it) runs at most ``STEP_COMMANDS`` commands and decompresses at most
about ``STEP_INPUT_BYTES``; what is left waits (``input_pending``, ``next_deadline`` is "now")
and the clients with input left take turns, a step each, so the transport serves everyone
between steps. The outcome does not depend on where the steps fall.
"""

from __future__ import annotations

import json
import struct
import zlib
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from nsq_sansio import frames
from nsq_sansio.compression import DeflateCodec, SnappyCodec
from nsq_sansio.server import NSQD
from nsq_sansio.server.lookupd import Lookupd, LookupdOptions
from nsq_sansio.server.protocol_v2 import STEP_COMMANDS, STEP_INPUT_BYTES

from ._wire import Client, make_node


def _compressed_client(node: NSQD, *, snappy: bool = False) -> tuple[Client, Any, Any]:
    """A client that negotiated compression: (client, its codec, a codec to read answers)."""
    client = Client(node)
    fields = {"snappy": True} if snappy else {"deflate": True, "deflate_level": 1}
    client.send(frames.encode_identify({"feature_negotiation": True, **fields}))
    raw = client.raw()
    (size,) = struct.unpack_from(">i", raw)
    assert json.loads(raw[8 : 4 + size])["snappy" if snappy else "deflate"] is True
    reader: Any = SnappyCodec() if snappy else DeflateCodec(1)
    assert (
        b"".join(reader.decompress_iter(raw[4 + size :])) == b"\x00\x00\x00\x06\x00\x00\x00\x00OK"
    )
    return client, SnappyCodec() if snappy else DeflateCodec(1), reader


def _drive(node: NSQD, limit: int = 100_000) -> int:
    """handle_timer calls while the node says work is due now (0.0); returns how many."""
    calls = 0
    while node.next_deadline() == 0.0:
        node.handle_timer(0.0)
        calls += 1
        assert calls < limit
    return calls


def test_a_compressed_nop_flood_is_run_a_bounded_step_per_call() -> None:
    node = make_node()
    client, codec, reader = _compressed_client(node)
    nops = 50 * STEP_COMMANDS + 7
    payload = codec.compress(b"NOP\n" * nops) + codec.compress(frames.encode_pub("t", b"x"))
    assert len(payload) < 4096
    client.send(payload)
    conn = node._conns[client.id]
    # one step ran: the rest waits, and the input buffer holds at most one piece
    assert node.input_pending(client.id)
    assert len(conn.inbuf) <= STEP_INPUT_BYTES
    assert node.next_deadline() == 0.0
    assert "t" not in node.topic_names()
    calls = _drive(node)
    assert 45 <= calls <= 60  # about one call per STEP_COMMANDS commands
    assert not node.input_pending(client.id)
    assert node.next_deadline() != 0.0
    # the PUB behind the NOPs ran, once, and was answered
    assert node.stats(0.0)["topics"][0]["message_count"] == 1
    answers = b"".join(reader.decompress_iter(client.raw()))
    assert frames.FrameDecoder().feed(answers) == [(0, b"OK")]


def test_clients_with_pending_input_take_turns() -> None:
    node = make_node()
    flooders = [_compressed_client(node)[:2] for _ in range(3)]
    for client, codec in flooders:
        client.send(codec.compress(b"NOP\n" * (10 * STEP_COMMANDS + 5)))
    order = []
    while any(node.input_pending(c.id) for c, _ in flooders):
        before = {c.id: len(node._conns[c.id].inbuf) for c, _ in flooders}
        node.handle_timer(0.0)
        stepped = [c.id for c, _ in flooders if len(node._conns[c.id].inbuf) != before[c.id]]
        assert len(stepped) == 1  # one client's step per call
        order.append(stepped[0])
    # round robin: nobody gets two steps in a row while another one waits
    assert order[:6] == [c.id for c, _ in flooders] * 2


def test_eof_drops_pending_input_and_a_closed_client_leaves_the_turns() -> None:
    node = make_node()
    client, codec, _ = _compressed_client(node)
    client.send(codec.compress(b"NOP\n" * (5 * STEP_COMMANDS)))
    assert node.input_pending(client.id)
    node.receive_data(client.id, b"", 0.0)
    assert not node.input_pending(client.id)
    node.handle_timer(0.0)
    assert node.next_deadline() != 0.0


def test_a_bomb_in_one_chunk_is_refused_and_the_client_closed() -> None:
    node = make_node()
    client, _, _ = _compressed_client(node)
    compressor = zlib.compressobj(9, zlib.DEFLATED, -15)
    bomb = compressor.compress(bytes(300 * 1024 * 1024)) + compressor.flush(zlib.Z_SYNC_FLUSH)
    client.send(bomb)
    _drive(node)
    assert client.closed


def _pub_script(count: int) -> bytes:
    return b"".join(frames.encode_pub("t", b"m%d" % i) for i in range(count)) + b"NOP\n" * 3000


@settings(max_examples=30, deadline=None)
@given(
    count=st.integers(1, 2500),
    cuts=st.lists(st.integers(1, 40_000), max_size=6),
    snappy=st.booleans(),
)
def test_the_outcome_does_not_depend_on_where_steps_fall(
    count: int, cuts: list[int], snappy: bool
) -> None:
    node = make_node()
    client, codec, reader = _compressed_client(node, snappy=snappy)
    script = _pub_script(count)
    start = 0
    for cut in sorted({*(c for c in cuts if c < len(script)), len(script)}):
        client.send(codec.compress(script[start:cut]))
        start = cut
        _drive(node)  # a transport waits for input_pending before it reads on
    assert start == len(script)
    answers = frames.FrameDecoder().feed(b"".join(reader.decompress_iter(client.raw())))
    assert answers == [(0, b"OK")] * count
    (topic,) = node.stats(0.0)["topics"]
    assert topic["message_count"] == count


def test_lookupd_runs_a_bounded_number_of_commands_per_call() -> None:
    lookupd = Lookupd(LookupdOptions(max_commands_per_step=100))
    handle = lookupd.connect("10.0.0.1:1", 0.0)
    lookupd.receive_data(handle, b"  V1" + b"PING\n" * 250 + b"PI", 0.0)
    assert lookupd.data_to_send(handle) == b"\x00\x00\x00\x02OK" * 100
    assert lookupd.input_pending(handle)
    lookupd.continue_input(handle, 0.0)
    assert lookupd.input_pending(handle)
    lookupd.continue_input(handle, 0.0)
    assert not lookupd.input_pending(handle)
    assert lookupd.data_to_send(handle) == b"\x00\x00\x00\x02OK" * 150
    lookupd.receive_data(handle, b"NG\n", 0.0)
    assert lookupd.data_to_send(handle) == b"\x00\x00\x00\x02OK"


def test_lookupd_without_a_bound_runs_everything() -> None:
    lookupd = Lookupd()
    handle = lookupd.connect("10.0.0.1:1", 0.0)
    lookupd.receive_data(handle, b"  V1" + b"PING\n" * 5000, 0.0)
    assert not lookupd.input_pending(handle)
    assert len(lookupd.data_to_send(handle)) == 6 * 5000
