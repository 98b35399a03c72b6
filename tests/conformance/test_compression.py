"""Snappy (framing format) and raw deflate negotiated through IDENTIFY, byte by byte.

After the IDENTIFY answer (plain), everything in both directions is compressed; nsqd sends an
extra compressed ``OK`` first. The test client uses python-snappy and zlib, not nsq_sansio.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Callable

import pytest
import snappy

from .conftest import Target
from .wire import FRAME_MESSAGE, FRAME_RESPONSE, RawConn, unique


class CompressedConn:
    """A RawConn whose stream, after IDENTIFY, goes through a compressor pair."""

    def __init__(
        self,
        raw: RawConn,
        compress: Callable[[bytes], bytes],
        decompress: Callable[[bytes], bytes],
    ) -> None:
        self.raw = raw
        self.compress = compress
        self.decompress = decompress
        self.plain = b""

    def send(self, data: bytes) -> None:
        self.raw.send(self.compress(data))

    def read_frame(self) -> tuple[int, bytes]:
        while True:
            if len(self.plain) >= 4:
                (size,) = struct.unpack(">i", self.plain[:4])
                if len(self.plain) >= 4 + size:
                    kind = struct.unpack(">i", self.plain[4:8])[0]
                    data = self.plain[8 : 4 + size]
                    self.plain = self.plain[4 + size :]
                    if kind == FRAME_RESPONSE and data == b"_heartbeat_":
                        self.send(b"NOP\n")
                        continue
                    return kind, data
            chunk = self.raw.sock.recv(65536)
            assert chunk, "connection closed"
            self.plain += self.decompress(chunk)


def negotiate(target: Target, kind: str) -> CompressedConn:
    raw = RawConn(target.tcp)
    fields = {"feature_negotiation": True, kind: True}
    if kind == "deflate":
        fields["deflate_level"] = 3
    body = json.dumps(fields).encode()
    raw.send(b"IDENTIFY\n" + struct.pack(">i", len(body)) + body)
    # the IDENTIFY answer is plain; read exactly that frame and keep the rest compressed
    raw._fill(4)
    (size,) = struct.unpack(">i", raw.buf[:4])
    raw._fill(4 + size)
    info = json.loads(raw.buf[8 : 4 + size])
    rest = raw.buf[4 + size :]
    raw.buf = b""
    if not info.get(kind):
        raw.close()
        pytest.skip(f"server does not offer {kind}")
    if kind == "snappy":
        enc, dec = snappy.StreamCompressor(), snappy.StreamDecompressor()
        conn = CompressedConn(raw, enc.add_chunk, dec.decompress)
    else:
        co = zlib.compressobj(3, zlib.DEFLATED, -15)
        do = zlib.decompressobj(-15)
        conn = CompressedConn(
            raw, lambda d: co.compress(d) + co.flush(zlib.Z_SYNC_FLUSH), do.decompress
        )
    conn.plain = conn.decompress(rest) if rest else b""
    assert conn.read_frame() == (FRAME_RESPONSE, b"OK")
    return conn


@pytest.mark.parametrize("kind", ["snappy", "deflate"])
def test_compressed_pub_sub_round_trip(target: Target, kind: str) -> None:
    topic = unique()
    conn = negotiate(target, kind)
    try:
        body = b"compressible " * 500
        conn.send(f"PUB {topic}\n".encode() + struct.pack(">i", len(body)) + body)
        assert conn.read_frame() == (FRAME_RESPONSE, b"OK")
        conn.send(f"SUB {topic} c\nRDY 1\n".encode())
        assert conn.read_frame() == (FRAME_RESPONSE, b"OK")
        frame_kind, data = conn.read_frame()
        assert frame_kind == FRAME_MESSAGE and data[26:] == body
        conn.send(b"FIN " + data[10:26] + b"\n")
    finally:
        conn.raw.close()


def test_snappy_and_deflate_together_is_refused(target: Target) -> None:
    with RawConn(target.tcp) as raw:
        body = json.dumps({"snappy": True, "deflate": True, "feature_negotiation": True}).encode()
        raw.send(b"IDENTIFY\n" + struct.pack(">i", len(body)) + body)
        raw.expect_error("E_IDENTIFY_FAILED")
        raw.expect_closed()
