"""Core decode benchmark: messages decoded + FIN encoded per second, nsq_sansio vs pynsq.

Both sides get the SAME pre-built bytes (message frames with 100-byte bodies, as nsqd sends
them) in 64 KiB chunks, and for every message produce the FIN command bytes. No sockets, no
event loop: only the protocol work.

* nsq_sansio: ``ClientConnection.receive_data(chunk)`` -> ``Message`` events, ``finish(id)``,
  ``data_to_send()`` once per chunk (the whole core, in-flight bookkeeping included).
* nsq_sansio codec: ``FrameDecoder.feed`` + ``decode_message`` + ``encode_fin`` (codec only).
* pynsq 0.9.1: its own decoding functions ``nsq.protocol.unpack_response`` and
  ``nsq.protocol.decode_message`` plus ``nsq.protocol.finish``; pynsq leaves framing to
  tornado's ``IOStream.read_bytes(4)`` / ``read_bytes(size)``, which is replaced here by the
  cheapest equivalent loop (one buffer, slices) so that pynsq is not charged for tornado.

Run: ``python bench/bench_core.py [--messages N] [--repeat R] [--body-size B]``.
Prints msgs/s for each and the ratio nsq_sansio / pynsq (target: >= 2x).
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import struct
import sys
import time
from collections.abc import Callable
from importlib.metadata import version

from nsq_sansio import ClientConnection, ConnectionState, Message
from nsq_sansio.frames import (
    FrameDecoder,
    decode_message,
    encode_fin,
    encode_frame,
    encode_message_frame,
)

try:
    import nsq  # noqa: F401  (pynsq; its package import needs tornado)
    from nsq import protocol as pynsq_protocol
except ImportError as exc:  # pragma: no cover - environment problem, explained to the user
    sys.exit(f"pynsq is needed for the comparison: pip install pynsq tornado ({exc})")

CHUNK = 64 * 1024
PYNSQ = f"pynsq {version('pynsq')} (nsq.protocol)"


def build_stream(count: int, body_size: int) -> tuple[bytes, list[bytes]]:
    """``count`` message frames as nsqd would send them, and the 64 KiB chunks they arrive in."""
    body = os.urandom(body_size)
    frames = [
        encode_message_frame(b"%016x" % index, 1_700_000_000_000_000_000 + index, 1, body)
        for index in range(count)
    ]
    stream = b"".join(frames)
    return stream, [stream[i : i + CHUNK] for i in range(0, len(stream), CHUNK)]


def subscribed_connection() -> ClientConnection:
    conn = ClientConnection({"heartbeat_interval": -1})
    conn.receive_data(encode_frame(0, b'{"max_rdy_count": 2500}'))
    conn.subscribe("bench", "bench")
    conn.receive_data(encode_frame(0, b"OK"))
    conn.send_ready(2500)
    conn.data_to_send()
    assert conn.state is ConnectionState.SUBSCRIBED
    return conn


def run_nsq_sansio(chunks: list[bytes]) -> tuple[int, bytes]:
    conn = subscribed_connection()
    receive, finish, flush = conn.receive_data, conn.finish, conn.data_to_send
    count = 0
    out = []
    for chunk in chunks:
        for event in receive(chunk):
            if type(event) is Message:
                finish(event.id)
                count += 1
        out.append(flush())
    return count, b"".join(out)


def run_nsq_sansio_codec(chunks: list[bytes]) -> tuple[int, bytes]:
    decoder = FrameDecoder()
    feed = decoder.feed
    count = 0
    out = []
    for chunk in chunks:
        fins = []
        for frame_type, payload in feed(chunk):
            if frame_type == 2:
                fins.append(encode_fin(decode_message(payload).id))
        count += len(fins)
        out.append(b"".join(fins))
    return count, b"".join(out)


def run_pynsq(chunks: list[bytes]) -> tuple[int, bytes]:
    unpack_response = pynsq_protocol.unpack_response
    pynsq_decode = pynsq_protocol.decode_message
    fin = pynsq_protocol.finish
    message_type = pynsq_protocol.FRAME_TYPE_MESSAGE
    size_of = struct.Struct(">l").unpack_from  # pynsq's struct_l, without the 4-byte copy
    buffer = b""
    count = 0
    out = []
    for chunk in chunks:
        buffer = buffer + chunk if buffer else chunk
        pos, end = 0, len(buffer)
        fins = []
        while end - pos >= 4:
            (size,) = size_of(buffer, pos)
            if end - pos - 4 < size:
                break
            data = buffer[pos + 4 : pos + 4 + size]  # what IOStream.read_bytes(size) hands over
            pos += 4 + size
            frame, data = unpack_response(data)
            if frame == message_type:
                fins.append(fin(pynsq_decode(data).id))
        buffer = buffer[pos:]
        count += len(fins)
        out.append(b"".join(fins))
    return count, b"".join(out)


def measure(fn: Callable[[list[bytes]], tuple[int, bytes]], chunks: list[bytes]) -> float:
    gc.collect()
    start = time.perf_counter()
    count, _ = fn(chunks)
    elapsed = time.perf_counter() - start
    return count / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--body-size", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()

    stream, chunks = build_stream(args.messages, args.body_size)
    runners = {
        "nsq_sansio (ClientConnection)": run_nsq_sansio,
        "nsq_sansio (codec only)": run_nsq_sansio_codec,
        PYNSQ: run_pynsq,
    }
    # same bytes, same answers: every runner decodes every message and writes identical FINs
    expected = b"".join(b"FIN %016x\n" % index for index in range(args.messages))
    for name, fn in runners.items():
        count, fins = fn(chunks)
        assert count == args.messages and fins == expected, f"{name} decoded wrongly"

    best = dict.fromkeys(runners, 0.0)
    for _ in range(args.repeat):  # interleaved, best of N: fair against machine noise
        for name, fn in runners.items():
            best[name] = max(best[name], measure(fn, chunks))

    print(
        f"{args.messages} messages, {args.body_size}-byte bodies, {len(stream)} bytes in "
        f"{len(chunks)} chunks of {CHUNK // 1024} KiB; best of {args.repeat}; "
        f"Python {platform.python_version()} ({platform.python_implementation()})"
    )
    width = max(map(len, runners))
    for name, rate in best.items():
        print(f"  {name:<{width}}  {rate:>12,.0f} msgs/s")
    baseline = best[PYNSQ]
    ratio = best["nsq_sansio (ClientConnection)"] / baseline
    codec_ratio = best["nsq_sansio (codec only)"] / baseline
    print(f"ratio nsq_sansio / pynsq: {ratio:.2f}x (codec only: {codec_ratio:.2f}x; target >= 2x)")


if __name__ == "__main__":
    main()
