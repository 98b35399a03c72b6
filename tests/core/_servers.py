"""The server side of compression, written independently of nsq_sansio.compression."""

from __future__ import annotations

import zlib

import snappy


class ServerStream:
    """Compresses what a fake nsqd sends and decompresses what the client sent."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        if kind == "snappy":
            self._c = snappy.StreamCompressor()
            self._d = snappy.StreamDecompressor()
        elif kind == "deflate":
            self._zc = zlib.compressobj(6, zlib.DEFLATED, -15)
            self._zd = zlib.decompressobj(-15)

    def compress(self, data: bytes) -> bytes:
        if self.kind == "snappy":
            return bytes(self._c.add_chunk(data))
        if self.kind == "deflate":
            return self._zc.compress(data) + self._zc.flush(zlib.Z_SYNC_FLUSH)
        return data

    def decompress(self, data: bytes) -> bytes:
        if self.kind == "snappy":
            return bytes(self._d.decompress(data))
        if self.kind == "deflate":
            return self._zd.decompress(data)
        return data
