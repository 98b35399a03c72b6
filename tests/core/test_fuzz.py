"""Hypothesis: chunking invariance, round trips, garbage gives typed errors, compression."""

from __future__ import annotations

import itertools
import os
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nsq_sansio import (
    ClientConnection,
    ConnectionClosed,
    ConnectionState,
    NSQError,
    ProtocolError,
    frames,
)
from nsq_sansio.compression import DeflateCodec, SnappyCodec
from nsq_sansio.errors import CompressionError
from nsq_sansio.events import Event, Heartbeat, Message

from ._helpers import HEARTBEAT, OK, error, identify_answer, subscribed_conn
from ._servers import ServerStream

#: 200 examples keeps the core suite well under a minute; NSQ_FUZZ_EXAMPLES=100000 for a long
#: hunt (docs/simulator.md records the last one). Immune to a loaded machine: no deadline per
#: example, no too_slow health check (generation slows with the machine, not with the input),
#: and a long hunt has no per-test timeout either: one cutting a hypothesis run short surfaces
#: as a hypothesis error ("Inconsistent data generation!"), not as a timeout or a bad input.
EXAMPLES = int(os.environ.get("NSQ_FUZZ_EXAMPLES", "200"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
if EXAMPLES > 200:
    pytestmark = pytest.mark.timeout(0)

ids = st.binary(min_size=16, max_size=16)
bodies = st.binary(max_size=300)
message_frames = st.builds(
    frames.encode_message_frame,
    ids,
    st.integers(-(2**63), 2**63 - 1),
    st.integers(0, 65535),
    bodies,
)
late_errors = st.builds(
    lambda code, mid: error(b"%s %s failed" % (code, mid)),
    st.sampled_from([b"E_FIN_FAILED FIN", b"E_REQ_FAILED REQ", b"E_TOUCH_FAILED TOUCH"]),
    st.text("0123456789abcdef", min_size=16, max_size=16).map(str.encode),
)
fatal_errors = st.sampled_from([b"E_INVALID x", b"E_BAD_BODY y", b"E_SOMETHING"]).map(error)
# what nsqd may send to a subscribed consumer; a fatal error may only end the stream
server_stream = st.tuples(
    st.lists(st.one_of(message_frames, st.just(HEARTBEAT), late_errors), max_size=25),
    st.one_of(st.just(b""), fatal_errors),
).map(lambda parts: b"".join(parts[0]) + parts[1])


def split(data: st.DataObject, stream: bytes) -> list[bytes]:
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=30), label="cuts"))
    bounds = [0, *cuts, len(stream)]
    return [stream[a:b] for a, b in itertools.pairwise(bounds) if b > a]  # b"" would mean EOF


def normalize(events: list[Event]) -> list[object]:
    """Exceptions compare by identity: compare errors by type, code/text and message."""
    out: list[object] = []
    for event in events:
        error = getattr(event, "error", None)
        if error is None:
            out.append(event)
        else:
            fields = {k: getattr(event, k) for k in event.__slots__ if k != "error"}  # type: ignore[union-attr]
            out.append((type(event).__name__, type(error), str(error), fields))
    return out


def drive(conn: ClientConnection, chunks: list[bytes]) -> tuple[list[Event], bytes]:
    events: list[Event] = []
    for chunk in chunks:
        events.extend(conn.receive_data(chunk))
    return normalize(events), conn.data_to_send()  # type: ignore[return-value]


def check_close_invariants(events: list[Event]) -> None:
    closes = [e for e in events if isinstance(e, ConnectionClosed)]
    assert len(closes) <= 1
    if closes:
        assert events[-1] is closes[0]
        assert closes[0].error is None or isinstance(closes[0].error, NSQError)


# --- chunking ---------------------------------------------------------------------------------


@FUZZ
@given(stream=server_stream, data=st.data())
def test_any_chunking_gives_the_same_events_and_output(stream: bytes, data: st.DataObject) -> None:
    whole = drive(subscribed_conn(rdy=25), [stream] if stream else [])
    chunked = drive(subscribed_conn(rdy=25), split(data, stream))
    assert chunked == whole
    closes = sum(isinstance(e, tuple) and e[0] == "ConnectionClosed" for e in whole[0])
    assert closes <= 1
    # the connection's hot path and the plain codec agree on every message
    decoded = [frames.decode_message(p) for t, p in frames.FrameDecoder().feed(stream) if t == 2]
    assert [e for e in whole[0] if isinstance(e, Message)] == decoded
    if not closes:  # every heartbeat answered (a fatal error drops what was queued)
        assert whole[1] == b"NOP\n" * sum(isinstance(e, Heartbeat) for e in whole[0])


@FUZZ
@given(stream=server_stream, data=st.data())
def test_frame_decoder_any_chunking(stream: bytes, data: st.DataObject) -> None:
    expected = frames.FrameDecoder().feed(stream)
    decoder = frames.FrameDecoder()
    got = [frame for chunk in split(data, stream) for frame in decoder.feed(chunk)]
    assert got == expected
    assert decoder.buffered == 0


@FUZZ
@given(
    kind=st.sampled_from(["snappy", "deflate"]),
    stream=server_stream,
    data=st.data(),
)
def test_compressed_stream_gives_the_same_events(
    kind: str, stream: bytes, data: st.DataObject
) -> None:
    plain_events, plain_out = drive(subscribed_conn(rdy=25), [stream] if stream else [])

    conn = ClientConnection({kind: True})
    conn.data_to_send()
    server = ServerStream(kind)
    handshake = identify_answer(**{kind: True}) + server.compress(OK)
    drive(conn, split(data, handshake))
    assert conn.state is ConnectionState.READY
    conn.subscribe("topic", "channel")
    assert server.decompress(conn.data_to_send()) == b"SUB topic channel\n"
    drive(conn, [server.compress(OK)])
    assert conn.state is ConnectionState.SUBSCRIBED
    conn.send_ready(25)  # a stream holds 25 frames at most: nsqd keeps to RDY
    assert server.decompress(conn.data_to_send()) == b"RDY 25\n"
    # nsqd flushes its writer at arbitrary points: compress in several writes, then re-chunk
    wire = b"".join(server.compress(part) for part in split(data, stream) if part)
    events, out = drive(conn, split(data, wire))
    assert events == plain_events
    assert server.decompress(out) == plain_out


# --- round trips ------------------------------------------------------------------------------


@FUZZ
@given(mid=ids, ts=st.integers(-(2**63), 2**63 - 1), attempts=st.integers(0, 65535), body=bodies)
def test_message_round_trip(mid: bytes, ts: int, attempts: int, body: bytes) -> None:
    raw = frames.encode_message_frame(mid, ts, attempts, body)
    [(frame_type, payload)] = frames.FrameDecoder().feed(raw)
    assert frame_type == frames.FrameType.MESSAGE
    assert frames.decode_message(payload) == Message(mid, body, ts, attempts)
    conn = subscribed_conn()
    assert conn.receive_data(raw) == [Message(mid, body, ts, attempts)]


@FUZZ
@given(frame_type=st.sampled_from([0, 1, 2]), payload=st.binary(max_size=500))
def test_frame_round_trip(frame_type: int, payload: bytes) -> None:
    assert frames.FrameDecoder().feed(frames.encode_frame(frame_type, payload)) == [
        (frame_type, payload)
    ]


def parse_command(wire: bytes) -> tuple[list[bytes], bytes | None, bytes]:
    """nsqd's reading of one command: the line's words, the sized body if any, the rest."""
    line, _, rest = wire.partition(b"\n")
    words = line.split(b" ")
    if words[0] in (b"PUB", b"MPUB", b"DPUB", b"IDENTIFY", b"AUTH"):
        (size,) = struct.unpack(">i", rest[:4])
        return words, rest[4 : 4 + size], rest[4 + size :]
    return words, None, rest


names = st.from_regex(r"[.a-zA-Z0-9_-]{1,54}(#ephemeral)?", fullmatch=True)


@FUZZ
@given(
    topic=names,
    channel=names,
    mid=ids.filter(lambda b: b" " not in b and b"\n" not in b),
    body=st.binary(min_size=1, max_size=200),
    many=st.lists(st.binary(min_size=1, max_size=50), min_size=1, max_size=10),
    n=st.integers(0, 2**31 - 1),
    secret=st.binary(max_size=40),
)
def test_command_round_trips(
    topic: str, channel: str, mid: bytes, body: bytes, many: list[bytes], n: int, secret: bytes
) -> None:
    wire = b"".join(
        [
            frames.encode_sub(topic, channel),
            frames.encode_pub(topic, body),
            frames.encode_mpub(topic, many),
            frames.encode_dpub(topic, n, body),
            frames.encode_rdy(n),
            frames.encode_fin(mid),
            frames.encode_req(mid, n),
            frames.encode_touch(mid),
            frames.encode_auth(secret),
            frames.encode_nop(),
            frames.encode_cls(),
        ]
    )
    seen = []
    while wire:
        words, payload, wire = parse_command(wire)
        seen.append((words, payload))
    t, c, num = topic.encode(), channel.encode(), str(n).encode()
    mpub = struct.pack(">i", len(many)) + b"".join(struct.pack(">i", len(m)) + m for m in many)
    assert seen == [
        ([b"SUB", t, c], None),
        ([b"PUB", t], body),
        ([b"MPUB", t], mpub),
        ([b"DPUB", t, num], body),
        ([b"RDY", num], None),
        ([b"FIN", mid], None),
        ([b"REQ", mid, num], None),
        ([b"TOUCH", mid], None),
        ([b"AUTH"], secret),
        ([b"NOP"], None),
        ([b"CLS"], None),
    ]


@FUZZ
@given(
    writes=st.lists(st.binary(max_size=3000) | st.just(b"\x00" * 70_000), max_size=6),
    kind=st.sampled_from([DeflateCodec, SnappyCodec]),
    data=st.data(),
)
def test_codec_round_trip_any_chunking(
    writes: list[bytes], kind: type[DeflateCodec] | type[SnappyCodec], data: st.DataObject
) -> None:
    sender, receiver = kind(), kind()
    wire = b"".join(sender.compress(w) for w in writes)
    got = b"".join(p for chunk in split(data, wire) for p in receiver.decompress_iter(chunk))
    assert got == b"".join(writes)


# --- garbage ----------------------------------------------------------------------------------

garbage = st.one_of(
    st.binary(max_size=400),
    # plausible headers with random sizes and types, then random bytes
    st.tuples(st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1), st.binary(max_size=200)).map(
        lambda t: struct.pack(">II", t[0] % 600 if t[0] % 3 else t[0], t[1] % 4) + t[2]
    ),
)


def garbage_conn(state: str) -> ClientConnection:
    if state == "identifying":
        return ClientConnection(max_frame_size=4096)
    if state == "subscribed":
        return subscribed_conn()
    conn = ClientConnection({state: True})
    server = ServerStream(state)
    conn.receive_data(identify_answer(**{state: True}) + server.compress(OK))
    assert conn.state is ConnectionState.READY
    return conn


@FUZZ
@given(
    state=st.sampled_from(["identifying", "subscribed", "snappy", "deflate"]),
    prefix=server_stream,
    junk=st.lists(garbage, min_size=1, max_size=4),
)
def test_garbage_never_raises_from_receive_data(
    state: str, prefix: bytes, junk: list[bytes]
) -> None:
    conn = garbage_conn(state)
    events: list[Event] = []
    if state == "subscribed":
        events.extend(conn.receive_data(prefix))
    for chunk in junk:
        events.extend(conn.receive_data(chunk))
    events.extend(conn.receive_data(b""))  # EOF always ends it
    check_close_invariants(events)
    assert isinstance(events[-1], ConnectionClosed)
    assert conn.state is ConnectionState.CLOSED


@FUZZ
@given(junk=st.lists(garbage, min_size=1, max_size=4))
def test_garbage_only_raises_protocol_errors_from_the_codec(junk: list[bytes]) -> None:
    decoder = frames.FrameDecoder(max_frame_size=4096)
    try:
        for chunk in junk:
            for frame_type, payload in decoder.feed(chunk):
                if frame_type == frames.FrameType.MESSAGE:
                    frames.decode_message(payload)
    except ProtocolError:
        pass
    for codec in (DeflateCodec(), SnappyCodec()):
        try:
            for chunk in junk:
                list(codec.decompress_iter(chunk))
        except CompressionError:
            pass


@FUZZ
@given(kind=st.sampled_from(["none", "snappy", "deflate"]), data=st.data())
def test_handshake_any_chunking(kind: str, data: st.DataObject) -> None:
    """IDENTIFY answer, compressed OK, AUTH answer and heartbeats, cut anywhere."""
    server = ServerStream(kind)
    fields = {"auth_required": True, "max_rdy_count": 77}
    if kind != "none":
        fields[kind] = True
    auth = b'{"identity":"i","identity_url":"u","permission_count":3}'
    stream = (
        identify_answer(**fields) + server.compress(OK + HEARTBEAT + frames.encode_frame(0, auth))
        if kind != "none"
        else identify_answer(**fields) + HEARTBEAT + frames.encode_frame(0, auth)
    )

    def run(chunks: list[bytes]) -> tuple[list[Event], bytes]:
        conn = ClientConnection({kind: True} if kind != "none" else None, auth_secret=b"s")
        conn.data_to_send()
        events, out = drive(conn, chunks)
        assert conn.state is ConnectionState.READY
        assert conn.auth is not None and conn.auth.permission_count == 3
        return events, out

    whole_events, whole_out = run([stream])
    chunked_events, chunked_out = run(split(data, stream))
    assert chunked_events == whole_events
    assert ServerStream(kind).decompress(chunked_out) == ServerStream(kind).decompress(whole_out)
    assert ServerStream(kind).decompress(whole_out) == b"AUTH\n\x00\x00\x00\x01sNOP\n"
