"""Wire codec: frame decoding (any chunking, size limit), messages, every command encoder."""

from __future__ import annotations

import array
import json
import struct

import pytest

from nsq_sansio import frames
from nsq_sansio.errors import FrameTooLarge, LocalProtocolError, ProtocolError
from nsq_sansio.events import Message
from nsq_sansio.frames import FrameDecoder, FrameType

from ._helpers import MID, error, message, response

# --- server frames -------------------------------------------------------------------------


def test_encode_frame_layout_is_size_type_data_big_endian() -> None:
    assert frames.encode_frame(FrameType.RESPONSE, b"OK") == b"\x00\x00\x00\x06\x00\x00\x00\x00OK"
    assert frames.encode_frame(FrameType.ERROR, b"E_X") == b"\x00\x00\x00\x07\x00\x00\x00\x01E_X"


def test_message_frame_layout_matches_spec() -> None:
    raw = frames.encode_message_frame(MID, 0x0102030405060708, 0x0A0B, b"body")
    assert raw == (
        struct.pack(">ii", 4 + 26 + 4, 2)
        + b"\x01\x02\x03\x04\x05\x06\x07\x08"
        + b"\x0a\x0b"
        + MID
        + b"body"
    )


def test_decode_message_reads_timestamp_attempts_id_body() -> None:
    data = struct.pack(">qH", 1_700_000_000_123_456_789, 3) + MID + b"\x00payload\xff"
    msg = frames.decode_message(data)
    assert msg == Message(MID, b"\x00payload\xff", 1_700_000_000_123_456_789, 3)
    assert type(msg.id) is bytes and type(msg.body) is bytes


def test_decode_message_allows_empty_body_but_not_short_header() -> None:
    assert frames.decode_message(struct.pack(">qH", 5, 1) + MID).body == b""
    with pytest.raises(ProtocolError, match="26"):
        frames.decode_message(b"\x00" * 25)


@pytest.mark.parametrize(
    ("message_id", "attempts"), [(b"short", 1), (MID + b"x", 1), (MID, -1), (MID, 65536)]
)
def test_encode_message_frame_validates(message_id: bytes, attempts: int) -> None:
    with pytest.raises(LocalProtocolError):
        frames.encode_message_frame(message_id, 0, attempts, b"x")


def test_decoder_returns_each_frame_type_with_payload() -> None:
    stream = response(b"OK") + error(b"E_INVALID nope") + message(body=b"abc")
    got = FrameDecoder().feed(stream)
    assert got[0] == (FrameType.RESPONSE, b"OK")
    assert got[1] == (FrameType.ERROR, b"E_INVALID nope")
    assert got[2][0] == FrameType.MESSAGE
    assert frames.decode_message(got[2][1]) == Message(MID, b"abc", 1_700_000_000_000_000_000, 1)


def test_decoder_byte_by_byte_gives_same_frames_and_holds_only_the_partial_frame() -> None:
    stream = response(b"OK") + message(body=b"x" * 100) + response(b"_heartbeat_")
    decoder = FrameDecoder()
    got: list[tuple[int, bytes]] = []
    for index in range(len(stream)):
        got.extend(decoder.feed(stream[index : index + 1]))
        assert decoder.buffered <= 4 + 4 + 26 + 100
    assert got == FrameDecoder().feed(stream)
    assert decoder.buffered == 0


def test_decoder_accepts_empty_feed_and_zero_length_payload() -> None:
    decoder = FrameDecoder()
    assert decoder.feed(b"") == []
    assert decoder.feed(frames.encode_frame(0, b"")) == [(0, b"")]


def test_frame_size_below_four_is_a_protocol_error() -> None:
    with pytest.raises(ProtocolError):
        FrameDecoder().feed(b"\x00\x00\x00\x03\x00\x00\x00\x00")


def test_oversized_frame_refused_from_its_size_field_alone() -> None:
    decoder = FrameDecoder(max_frame_size=1024)
    with pytest.raises(FrameTooLarge) as info:
        decoder.feed(struct.pack(">i", 1025))  # only the 4 size bytes have arrived
    assert info.value.size == 1025 and info.value.limit == 1024
    assert isinstance(info.value, ProtocolError)


def test_frame_exactly_at_the_limit_is_accepted() -> None:
    decoder = FrameDecoder(max_frame_size=1024)
    assert decoder.feed(frames.encode_frame(0, b"a" * 1020)) == [(0, b"a" * 1020)]


def test_two_gib_frame_is_a_protocol_error_without_buffering() -> None:
    decoder = FrameDecoder()
    with pytest.raises(ProtocolError):
        decoder.feed(b"\x80\x00\x00\x00\x00\x00\x00\x00" + b"x" * 100)
    with pytest.raises(ProtocolError):
        FrameDecoder().feed(b"\x7f\xff\xff\xff")


def test_two_gib_frame_is_reported_as_frame_too_large() -> None:
    with pytest.raises(FrameTooLarge) as info:
        FrameDecoder().feed(b"\x80\x00\x00\x00\x00\x00\x00\x00")
    assert info.value.size == 2**31


def test_decoder_memory_is_bounded_by_max_frame_size() -> None:
    limit = 64 * 1024
    decoder = FrameDecoder(max_frame_size=limit)
    # a legal frame at the limit, fed in small chunks: never more than one frame held
    stream = frames.encode_frame(0, b"z" * (limit - 4)) * 3
    peak = 0
    for start in range(0, len(stream), 1000):
        decoder.feed(stream[start : start + 1000])
        peak = max(peak, decoder.buffered)
    assert peak <= limit + 4
    # a peer streaming a frame above the limit is stopped at its header
    bad = FrameDecoder(max_frame_size=limit)
    with pytest.raises(FrameTooLarge):
        bad.feed(struct.pack(">ii", limit + 1, 0) + b"\x00" * 1000)


def test_max_frame_size_must_fit_a_message_header() -> None:
    with pytest.raises(LocalProtocolError):
        FrameDecoder(max_frame_size=29)
    FrameDecoder(max_frame_size=30)


def test_decoder_does_not_lose_frames_that_precede_a_bad_header() -> None:
    decoder = FrameDecoder(max_frame_size=1024)
    # the completed frame comes first; the error is raised by the next call
    assert decoder.feed(response(b"OK") + struct.pack(">i", 5000)) == [(0, b"OK")]
    with pytest.raises(FrameTooLarge):  # the error is not forgotten either
        decoder.feed(b"")


# --- commands ------------------------------------------------------------------------------


def _sized_body(command: bytes, line: bytes) -> bytes:
    assert command.startswith(line + b"\n")
    rest = command[len(line) + 1 :]
    (size,) = struct.unpack(">I", rest[:4])
    assert size == len(rest) - 4
    return rest[4:]


def test_identify_sends_compact_json_body() -> None:
    cmd = frames.encode_identify({"client_id": "c", "heartbeat_interval": 1000, "snappy": True})
    body = _sized_body(cmd, b"IDENTIFY")
    assert json.loads(body) == {"client_id": "c", "heartbeat_interval": 1000, "snappy": True}


@pytest.mark.parametrize("secret", [b"s3cr3t", "s3cr3t"])
def test_auth(secret: bytes | str) -> None:
    assert frames.encode_auth(secret) == b"AUTH\n\x00\x00\x00\x06s3cr3t"


def test_sub_pub_dpub_exact_bytes() -> None:
    assert frames.encode_sub("t.1", "ch_2#ephemeral") == b"SUB t.1 ch_2#ephemeral\n"
    assert frames.encode_pub("t", b"hey") == b"PUB t\n\x00\x00\x00\x03hey"
    from_bytearray = frames.encode_pub("t", bytearray(b"hey"))  # type: ignore[arg-type]
    assert from_bytearray == b"PUB t\n\x00\x00\x00\x03hey"
    assert frames.encode_dpub("t", 1500, b"hey") == b"DPUB t 1500\n\x00\x00\x00\x03hey"
    assert frames.encode_dpub("t", 0, b"h") == b"DPUB t 0\n\x00\x00\x00\x01h"


def test_mpub_body_is_count_then_sized_messages() -> None:
    cmd = frames.encode_mpub("t", [b"a", b"bcd", bytearray(b"ef")])  # type: ignore[list-item]
    body = _sized_body(cmd, b"MPUB t")
    assert body == (
        b"\x00\x00\x00\x03" + b"\x00\x00\x00\x01a" + b"\x00\x00\x00\x03bcd" + b"\x00\x00\x00\x02ef"
    )


def test_rdy_fin_req_touch_cls_nop_exact_bytes() -> None:
    assert frames.encode_rdy(0) == b"RDY 0\n"
    assert frames.encode_rdy(2500) == b"RDY 2500\n"
    assert frames.encode_fin(MID) == b"FIN " + MID + b"\n"
    assert frames.encode_req(MID, 0) == b"REQ " + MID + b" 0\n"
    assert frames.encode_req(MID, 60_000) == b"REQ " + MID + b" 60000\n"
    assert frames.encode_touch(MID) == b"TOUCH " + MID + b"\n"
    assert frames.encode_cls() == b"CLS\n"
    assert frames.encode_nop() == b"NOP\n"


@pytest.mark.parametrize("body", [b"", bytearray(), memoryview(b"")])
def test_empty_bodies_are_refused(body: bytes) -> None:
    with pytest.raises(LocalProtocolError, match="empty"):
        frames.encode_pub("t", body)
    with pytest.raises(LocalProtocolError, match="empty"):
        frames.encode_dpub("t", 10, body)
    with pytest.raises(LocalProtocolError, match="empty"):
        frames.encode_mpub("t", [b"ok", body])


def test_non_bytes_bodies_are_refused() -> None:
    with pytest.raises(LocalProtocolError, match="bytes"):
        frames.encode_pub("t", "text")  # type: ignore[arg-type]
    with pytest.raises(LocalProtocolError):
        frames.encode_mpub("t", b"one body, not a list")  # type: ignore[arg-type]
    with pytest.raises(LocalProtocolError):
        frames.encode_mpub("t", [])
    with pytest.raises(LocalProtocolError):
        frames.encode_mpub("t", [b"a", 5])  # type: ignore[list-item]


def test_mpub_sizes_memoryview_bodies_in_bytes() -> None:
    body = memoryview(array.array("i", [1, 2]))
    cmd = frames.encode_mpub("t", [body])  # type: ignore[list-item]
    payload = _sized_body(cmd, b"MPUB t")
    assert payload == b"\x00\x00\x00\x01" + struct.pack(">I", body.nbytes) + body.tobytes()


def test_body_larger_than_the_size_field_is_refused() -> None:
    class Huge(bytes):
        def __len__(self) -> int:
            return 2**31

    with pytest.raises(LocalProtocolError, match="cannot be framed"):
        frames.encode_auth(Huge(b"x"))


@pytest.mark.parametrize("count", [-1, 1.5, "3", None])
def test_rdy_bounds(count: object) -> None:
    with pytest.raises(LocalProtocolError, match="RDY"):
        frames.encode_rdy(count)  # type: ignore[arg-type]


@pytest.mark.parametrize("delay", [-1, 1.5, "10", None])
def test_req_and_dpub_delay_bounds(delay: object) -> None:
    with pytest.raises(LocalProtocolError, match="REQ"):
        frames.encode_req(MID, delay)  # type: ignore[arg-type]
    with pytest.raises(LocalProtocolError, match="DPUB"):
        frames.encode_dpub("t", delay, b"x")  # type: ignore[arg-type]


@pytest.mark.parametrize("bad_id", [b"", MID[:15], MID + b"0", MID.decode(), bytearray(MID)])
def test_message_id_length_is_checked(bad_id: object) -> None:
    for encode in (frames.encode_fin, frames.encode_touch):
        with pytest.raises(LocalProtocolError, match="16 bytes"):
            encode(bad_id)  # type: ignore[arg-type]
    with pytest.raises(LocalProtocolError, match="16 bytes"):
        frames.encode_req(bad_id, 0)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["", "a b", "x" * 65, "tópic", "t\n", "a/b", "#ephemeral"])
def test_commands_validate_names(name: str) -> None:
    from nsq_sansio.errors import InvalidName

    with pytest.raises(InvalidName):
        frames.encode_sub(name, "c")
    with pytest.raises(InvalidName):
        frames.encode_sub("t", name)
    with pytest.raises(InvalidName):
        frames.encode_pub(name, b"x")
    with pytest.raises(InvalidName):
        frames.encode_mpub(name, [b"x"])
    with pytest.raises(InvalidName):
        frames.encode_dpub(name, 0, b"x")
