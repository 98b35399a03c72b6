"""Compression codecs: snappy framing format and raw deflate, incremental, with a bomb bound."""

from __future__ import annotations

import os
import struct
import zlib

import cramjam
import pytest
import snappy

from nsq_sansio.compression import DeflateCodec, SnappyCodec
from nsq_sansio.errors import CompressionError, ConfigError, ProtocolError

IDENTIFIER = b"\xff\x06\x00\x00sNaPpY"


def _crc32c_table() -> list[int]:
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_TABLE = _crc32c_table()


def masked_crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    crc ^= 0xFFFFFFFF
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def chunk(kind: int, payload: bytes) -> bytes:
    return bytes([kind]) + len(payload).to_bytes(3, "little") + payload


def compressed_chunk(plain: bytes) -> bytes:
    raw = bytes(cramjam.snappy.compress_raw(plain))
    return chunk(0x00, struct.pack("<I", masked_crc32c(plain)) + raw)


def uncompressed_chunk(plain: bytes) -> bytes:
    return chunk(0x01, struct.pack("<I", masked_crc32c(plain)) + plain)


def drain(codec: DeflateCodec | SnappyCodec, data: bytes) -> bytes:
    return b"".join(codec.decompress_iter(data))


def test_crc_helper_matches_python_snappy() -> None:
    produced = bytes(snappy.StreamCompressor().add_chunk(b"hello"))
    assert produced[len(IDENTIFIER) + 4 : len(IDENTIFIER) + 8] == struct.pack(
        "<I", masked_crc32c(b"hello")
    )


PAYLOADS = [b"x", b"OK" * 10, os.urandom(70_000), b"\x00" * 200_000, bytes(range(256)) * 600]


# --- deflate ----------------------------------------------------------------------------------


@pytest.mark.parametrize("payload", PAYLOADS, ids=lambda p: str(len(p)))
def test_deflate_interoperates_with_raw_zlib_both_ways(payload: bytes) -> None:
    codec = DeflateCodec(level=6)
    server = zlib.decompressobj(-15)
    assert server.decompress(codec.compress(payload)) == payload  # sync-flushed: all there
    peer = zlib.compressobj(6, zlib.DEFLATED, -15)
    wire = peer.compress(payload) + peer.flush(zlib.Z_SYNC_FLUSH)
    assert drain(codec, wire) == payload


def test_deflate_decodes_any_chunking_and_each_write_alone() -> None:
    sender, receiver = DeflateCodec(), DeflateCodec()
    writes = [b"first", b"second" * 100, os.urandom(3000)]
    for write in writes:
        wire = sender.compress(write)
        got = b"".join(drain(receiver, wire[i : i + 1]) for i in range(len(wire)))
        assert got == write
    assert sender.compress(b"") == b""


def test_deflate_bomb_is_an_error_not_memory() -> None:
    peer = zlib.compressobj(9, zlib.DEFLATED, -15)
    bomb = peer.compress(b"\x00" * (8 << 20)) + peer.flush(zlib.Z_SYNC_FLUSH)
    assert len(bomb) < 16_000
    codec = DeflateCodec(max_expansion=1 << 20)
    seen = 0
    with pytest.raises(CompressionError):
        for piece in codec.decompress_iter(bomb):
            assert len(piece) <= 1 << 20
            seen += len(piece)
    assert seen <= 1 << 20


def test_deflate_pieces_are_bounded() -> None:
    peer = zlib.compressobj(9, zlib.DEFLATED, -15)
    wire = peer.compress(b"\x00" * (4 << 20)) + peer.flush(zlib.Z_SYNC_FLUSH)
    pieces = list(DeflateCodec().decompress_iter(wire))
    assert sum(map(len, pieces)) == 4 << 20
    assert max(map(len, pieces)) <= 1 << 20


def test_deflate_corrupt_and_ended_streams_are_compression_errors() -> None:
    with pytest.raises(CompressionError):
        drain(DeflateCodec(), b"\xff\xff\xff\xff garbage")
    peer = zlib.compressobj(6, zlib.DEFLATED, -15)
    ended = peer.compress(b"data") + peer.flush(zlib.Z_FINISH)
    with pytest.raises(CompressionError, match="ended"):
        drain(DeflateCodec(), ended)
    assert issubclass(CompressionError, ProtocolError)


@pytest.mark.parametrize("level", [0, 10, -1])
def test_deflate_level_is_validated(level: int) -> None:
    with pytest.raises(ConfigError):
        DeflateCodec(level)


# --- snappy -----------------------------------------------------------------------------------


@pytest.mark.parametrize("payload", PAYLOADS, ids=lambda p: str(len(p)))
def test_snappy_interoperates_with_python_snappy_and_cramjam(payload: bytes) -> None:
    codec = SnappyCodec()
    wire = codec.compress(payload)
    assert bytes(snappy.StreamDecompressor().decompress(wire)) == payload
    assert bytes(cramjam.snappy.decompress(wire)) == payload
    assert drain(SnappyCodec(), bytes(snappy.StreamCompressor().add_chunk(payload))) == payload
    assert drain(SnappyCodec(), bytes(cramjam.snappy.compress(payload))) == payload


def test_snappy_decodes_any_chunking_and_each_write_alone() -> None:
    sender, receiver = SnappyCodec(), SnappyCodec()
    for write in [b"first", b"second" * 100, os.urandom(3000)]:
        wire = sender.compress(write)
        got = b"".join(drain(receiver, wire[i : i + 3]) for i in range(0, len(wire), 3))
        assert got == write
    assert sender.compress(b"") == b""


def test_snappy_chunk_kinds() -> None:
    stream = (
        IDENTIFIER
        + compressed_chunk(b"abc" * 50)
        + chunk(0xFE, b"\x00" * 10)  # padding: skipped
        + chunk(0x80, b"skippable")  # reserved skippable: skipped
        + uncompressed_chunk(b"raw bytes")
        + IDENTIFIER  # may repeat
        + compressed_chunk(b"end")
    )
    assert drain(SnappyCodec(), stream) == b"abc" * 50 + b"raw bytes" + b"end"


@pytest.mark.parametrize(
    "stream",
    [
        compressed_chunk(b"no identifier first"),
        b"\xff\x06\x00\x00sNaPpZ",
        IDENTIFIER + chunk(0x02, b"reserved unskippable"),
        IDENTIFIER + chunk(0x00, b"\x00\x00\x00\x00" + b"\x05abc"),  # wrong CRC / short data
        IDENTIFIER + chunk(0x00, b"\x00\x00"),  # shorter than its CRC
        IDENTIFIER + chunk(0x01, b"\x00\x00"),
        IDENTIFIER + uncompressed_chunk(b"a" * 65537),
        IDENTIFIER + chunk(0x00, b"\x00" * 4 + b"\x80\x80\x80\x80\x80"),  # endless varint
        IDENTIFIER + chunk(0x00, b"\x00" * 4 + b"\x81\x80\x04" + b"x" * 20),  # announces 65537
        IDENTIFIER + chunk(0x01, b"\x00\x00\x00\x00payload"),  # bad CRC on raw data
        IDENTIFIER + compressed_chunk(b"hello")[:4] + b"\x00" * 4 + compressed_chunk(b"hello")[8:],
    ],
)
def test_snappy_corrupt_streams_are_compression_errors(stream: bytes) -> None:
    with pytest.raises(CompressionError):
        drain(SnappyCodec(), stream)


def test_snappy_oversized_chunk_refused_from_its_header() -> None:
    codec = SnappyCodec()
    drain(codec, IDENTIFIER)
    with pytest.raises(CompressionError):
        drain(codec, b"\x00\xff\xff\xff")  # 16 MiB chunk announced: nothing read beyond the header


def test_snappy_bomb_is_an_error_not_memory() -> None:
    plain = b"\x00" * 65536
    stream = IDENTIFIER + compressed_chunk(plain) * 64  # ~200 KB expanding to 4 MiB
    assert len(stream) < 300_000
    codec = SnappyCodec(max_expansion=1 << 20)
    seen = 0
    with pytest.raises(CompressionError):
        for piece in codec.decompress_iter(stream):
            seen += len(piece)
    assert seen <= 1 << 20
