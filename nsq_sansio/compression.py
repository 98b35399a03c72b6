"""Incremental compression for negotiated connections: snappy (framing format) and raw deflate.

Both directions are streams: ``compress`` flushes what it was given (so the peer can decode it
at once), ``decompress_iter`` yields plaintext in bounded pieces, so a decompression bomb costs a
:class:`CompressionError`, not memory. Snappy chunks are checked before decoding: a chunk may not
announce more than the 64 KiB the framing format allows.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from typing import Protocol

import cramjam
import snappy

from .errors import CompressionError, ConfigError

__all__ = ["DEFAULT_MAX_EXPANSION", "Codec", "DeflateCodec", "SnappyCodec"]

#: Without an explicit ``max_expansion``, one call's output may reach this much, or ``MAX_RATIO``
#: times its input, whichever is more: beyond what deflate (about 1032:1) or snappy (about 22:1)
#: can legitimately reach, so only a corrupt or hostile stream trips it. Memory is bounded
#: separately: output is produced, and decoded by the connection, in bounded pieces.
DEFAULT_MAX_EXPANSION = 64 * 1024 * 1024
MAX_RATIO = 1100
#: Deflate output is produced in pieces of at most this size.
_PIECE = 256 * 1024

_SNAPPY_IDENTIFIER = b"\xff\x06\x00\x00sNaPpY"
_SNAPPY_MAX_UNCOMPRESSED = 65536
# snappy's worst-case compressed size of 64 KiB, plus the 4-byte checksum.
_SNAPPY_MAX_CHUNK = 4 + 32 + _SNAPPY_MAX_UNCOMPRESSED + _SNAPPY_MAX_UNCOMPRESSED // 6


def _limit(max_expansion: int | None, size: int) -> int:
    """An explicit bound is absolute; the default one scales with the input."""
    if max_expansion is not None:
        return max_expansion
    return max(DEFAULT_MAX_EXPANSION, MAX_RATIO * size)


class Codec(Protocol):
    """What a connection needs from a compression scheme."""

    def compress(self, data: bytes) -> bytes:
        """The bytes to write for ``data``, flushed so that the peer can decode all of it."""
        ...

    def decompress_iter(self, data: bytes) -> Iterator[bytes]:
        """Feed bytes read from the socket; yields the decompressed bytes available so far."""
        ...


class DeflateCodec:
    """Raw deflate (RFC 1951, no zlib header), sync-flushed after every write, as nsqd uses it."""

    __slots__ = ("_compressor", "_decompressor", "level", "max_expansion")

    def __init__(self, level: int = 6, *, max_expansion: int | None = None) -> None:
        if not 1 <= level <= 9:
            raise ConfigError(f"deflate level must be within 1..9, got {level}")
        self.level = level
        self.max_expansion = max_expansion
        self._compressor = zlib.compressobj(level, zlib.DEFLATED, -15)
        self._decompressor = zlib.decompressobj(-15)

    def compress(self, data: bytes) -> bytes:
        """Deflate ``data`` and sync-flush, so nsqd can decode every byte written so far."""
        if not data:
            return b""
        return self._compressor.compress(data) + self._compressor.flush(zlib.Z_SYNC_FLUSH)

    def decompress_iter(self, data: bytes) -> Iterator[bytes]:
        """Inflate what nsqd sent; raises ``CompressionError`` on garbage or a decompression
        bomb (more output than the expansion limit allows)."""
        decompressor = self._decompressor
        limit = _limit(self.max_expansion, len(data))
        produced = 0
        pending = data
        while pending:
            try:
                piece = decompressor.decompress(pending, _PIECE)
            except zlib.error as exc:
                raise CompressionError(f"corrupt deflate stream: {exc}") from exc
            pending = decompressor.unconsumed_tail
            if decompressor.eof:
                raise CompressionError("deflate stream ended; nsqd never ends it mid-connection")
            produced += len(piece)
            if produced > limit:
                raise CompressionError(f"{len(data)} compressed bytes expanded past {limit} bytes")
            if piece:
                yield piece


class SnappyCodec:
    """Snappy's framing format (the one nsqd speaks), checked chunk by chunk.

    Compression is python-snappy's stream compressor; decompression parses chunk headers itself
    so that sizes are checked before anything is decoded, then lets cramjam decode and verify
    the checksums.
    """

    __slots__ = ("_buffer", "_compressor", "_seen_identifier", "max_expansion")

    def __init__(self, *, max_expansion: int | None = None) -> None:
        self.max_expansion = max_expansion
        self._compressor = snappy.StreamCompressor()
        self._buffer = bytearray()
        self._seen_identifier = False

    def compress(self, data: bytes) -> bytes:
        """``data`` as complete snappy frames (the framing format's chunks)."""
        if not data:
            return b""
        return bytes(self._compressor.add_chunk(data))

    def decompress_iter(self, data: bytes) -> Iterator[bytes]:
        """Decode the complete snappy frames received so far (a partial frame waits for more);
        raises ``CompressionError`` on a bad frame, a bad checksum or a decompression bomb."""
        buffer = self._buffer
        buffer += data
        produced = 0
        pos = 0
        end = len(buffer)
        batch: list[bytes] = []
        try:
            while end - pos >= 4:
                chunk_type = buffer[pos]
                length = buffer[pos + 1] | buffer[pos + 2] << 8 | buffer[pos + 3] << 16
                if length > _SNAPPY_MAX_CHUNK:
                    raise CompressionError(
                        f"snappy chunk of {length} bytes is above the framing format's limit"
                    )
                stop = pos + 4 + length
                if stop > end:
                    break
                if chunk_type == 0xFF:
                    if buffer[pos:stop] != _SNAPPY_IDENTIFIER:
                        raise CompressionError("bad snappy stream identifier")
                    self._seen_identifier = True
                elif not self._seen_identifier:
                    raise CompressionError("snappy stream does not start with its identifier")
                elif chunk_type == 0x00:
                    self._check_compressed_length(buffer, pos + 8, stop)
                    batch.append(bytes(buffer[pos:stop]))
                elif chunk_type == 0x01:
                    if length - 4 > _SNAPPY_MAX_UNCOMPRESSED or length < 4:
                        raise CompressionError(f"bad uncompressed snappy chunk of {length} bytes")
                    batch.append(bytes(buffer[pos:stop]))
                elif chunk_type <= 0x7F:
                    raise CompressionError(
                        f"reserved unskippable snappy chunk type {chunk_type:#x}"
                    )
                # 0x80..0xfe: padding and reserved skippable chunks are skipped.
                pos = stop
        finally:
            del buffer[:pos]
        limit = _limit(self.max_expansion, len(data))
        for start in range(0, len(batch), 16):
            piece = self._decode(batch[start : start + 16])
            produced += len(piece)
            if produced > limit:
                raise CompressionError(f"{len(data)} compressed bytes expanded past {limit} bytes")
            if piece:
                yield piece

    @staticmethod
    def _check_compressed_length(buffer: bytearray, start: int, stop: int) -> None:
        # A raw snappy block starts with its uncompressed length as a little-endian varint.
        value = shift = 0
        for index in range(start, min(stop, start + 5)):
            byte = buffer[index]
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                break
            shift += 7
        else:
            raise CompressionError("snappy chunk has a malformed length header")
        if value > _SNAPPY_MAX_UNCOMPRESSED:
            raise CompressionError(
                f"snappy chunk announces {value} bytes, above the {_SNAPPY_MAX_UNCOMPRESSED} limit"
            )

    @staticmethod
    def _decode(chunks: list[bytes]) -> bytes:
        try:
            return bytes(cramjam.snappy.decompress(_SNAPPY_IDENTIFIER + b"".join(chunks)))
        except Exception as exc:  # cramjam raises its own DecompressionError (and others)
            raise CompressionError(f"corrupt snappy stream: {exc}") from exc
